#!/usr/bin/python3
"""The peer zoe-gpt is compared with: the same GPT-2 trained by plain PyTorch on one process.

Same shape (vocab 50257, learned positions, pre-LayerNorm blocks with eps 1e-5, tanh GELU,
causal attention, lm_head tied to wte, no dropout), same initialisation rule (N(0, 0.02^2), the
residual projections N(0, (0.02 / sqrt(2 L))^2), biases 0, LayerNorm 1 / 0), same optimizer
(torch.optim.AdamW over every parameter, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1, global
gradient-norm clip 1.0), same schedule (linear warmup, cosine to lr * min_lr_ratio), same data
(windows of `context` + 1 tokens drawn uniformly from zoe-gpt's token cache <data>/tokens/train.bin,
little-endian uint16), fp32 throughout. zoe-gpt's batch of `world` ranks x `batch` sequences is
one batch of world * batch sequences here. Not bitwise zoe-gpt: other initial draws, another
random stream, torch's own kernels.

Prints one JSON object: tokens/s over the steps after --timing-warmup, losses, and what ran
(torch version, the BLAS library libblas.so.3 resolved to, threads).
Needs python3-torch (Debian: apt-get install python3-torch; for a fair peer also
libopenblas0-pthread, else Debian's torch runs the reference BLAS). Exit 77 without torch.
"""
import argparse
import json
import math
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", required=True, help="zoe-gpt's data dir (its token cache is <dir>/tokens)")
    p.add_argument("--cache-dir", help="token cache (default <data-dir>/tokens)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="sequences per step (zoe-gpt: world size x --batch)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--timing-warmup", type=int, default=5, help="steps left out of tokens/s")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=20, help="lr warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch (and OpenBLAS) threads")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def blas_libraries():
    """The BLAS / LAPACK shared objects mapped into this process (after a matmul ran)."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if any(k in os.path.basename(path) for k in ("blas", "lapack", "mkl", "blis")):
                found.add(os.path.realpath(path))
    return sorted(found)


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def learning_rate(step, total, warmup, peak, min_lr):
    """examples/gpt/schedule.hpp's learning_rate."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if total <= warmup:
        return peak
    t = min(max((step - warmup) / (total - warmup), 0.0), 1.0)
    return min_lr + (peak - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


def main():
    a = parse_args()
    # OpenBLAS's pthreads are not torch's OpenMP threads: give both the same count.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    # OpenBLAS 0.3.21 (Debian 12) does not know newer CPU models (this build VM's Xeon, family 6
    # model 207, under KVM) and falls back to its Prescott (SSE3) kernels, 2.5-4x slower GEMMs
    # here; name the kernels the CPU's flags allow instead (an OPENBLAS_CORETYPE set outside wins).
    flags = cpu_flags()
    os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX" if "avx512f" in flags else "Haswell" if "avx2" in flags else "Prescott")
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"train_gpt.py: skipped: PyTorch is not installed ({e}); "
              "apt-get install python3-torch libopenblas0-pthread", file=sys.stderr)
        return 77
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    V, C, L, H, T = 50257, a.width, a.layers, a.heads, a.context
    cache = a.cache_dir or os.path.join(a.data_dir, "tokens")
    tokens = np.fromfile(os.path.join(cache, "train.bin"), dtype="<u2").astype(np.int64)
    if len(tokens) <= T + 1:
        print(f"train_gpt.py: {cache}/train.bin has {len(tokens)} tokens, too few for context {T}", file=sys.stderr)
        return 2
    tokens = torch.from_numpy(tokens)

    def normal(*shape, std=0.02):
        return torch.nn.Parameter(torch.randn(*shape) * std)

    def zeros(*shape):
        return torch.nn.Parameter(torch.zeros(*shape))

    def ones(*shape):
        return torch.nn.Parameter(torch.ones(*shape))

    proj_std = 0.02 / math.sqrt(2 * L)
    P = dict({"wte": normal(V, C), "wpe": normal(T, C), "ln_f.w": ones(C), "ln_f.b": zeros(C)})  # name -> parameter
    for l in range(L):  # nn.Linear layout: weight [out, in]
        P.update({f"{l}.ln1.w": ones(C), f"{l}.ln1.b": zeros(C),
                  f"{l}.attn.w": normal(3 * C, C), f"{l}.attn.b": zeros(3 * C),
                  f"{l}.proj.w": normal(C, C, std=proj_std), f"{l}.proj.b": zeros(C),
                  f"{l}.ln2.w": ones(C), f"{l}.ln2.b": zeros(C),
                  f"{l}.fc.w": normal(4 * C, C), f"{l}.fc.b": zeros(4 * C),
                  f"{l}.mlp.w": normal(C, 4 * C, std=proj_std), f"{l}.mlp.b": zeros(C)})
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    def loss_of(x_ids, y_ids):
        B = x_ids.shape[0]
        x = P["wte"][x_ids] + P["wpe"][:T]
        for l in range(L):
            h = F.layer_norm(x, (C,), P[f"{l}.ln1.w"], P[f"{l}.ln1.b"], 1e-5)
            q, k, v = F.linear(h, P[f"{l}.attn.w"], P[f"{l}.attn.b"]).split(C, dim=2)
            q, k, v = (z.view(B, T, H, C // H).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, P[f"{l}.proj.w"], P[f"{l}.proj.b"])
            h = F.layer_norm(x, (C,), P[f"{l}.ln2.w"], P[f"{l}.ln2.b"], 1e-5)
            h = F.gelu(F.linear(h, P[f"{l}.fc.w"], P[f"{l}.fc.b"]), approximate="tanh")
            x = x + F.linear(h, P[f"{l}.mlp.w"], P[f"{l}.mlp.b"])
        x = F.layer_norm(x, (C,), P["ln_f.w"], P["ln_f.b"], 1e-5)
        logits = F.linear(x, P["wte"])  # tied lm_head
        return F.cross_entropy(logits.view(-1, V), y_ids.reshape(-1))

    opt = torch.optim.AdamW(P.values(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.weight_decay)
    gen = torch.Generator().manual_seed(a.seed)
    offsets = torch.arange(T + 1)
    losses, t_start = [], None
    for step in range(a.steps):
        if step == a.timing_warmup:
            t_start, cpu_start = time.perf_counter(), time.process_time()
        lr = learning_rate(step, a.steps, a.warmup, a.lr, a.lr * a.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(tokens) - T, (a.batch,), generator=gen)
        win = tokens[starts[:, None] + offsets]
        loss = loss_of(win[:, :-1], win[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(P.values(), a.grad_clip)
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - t_start if t_start is not None else float("nan")
    cpu_seconds = time.process_time() - cpu_start if t_start is not None else float("nan")
    timed = a.steps - a.timing_warmup
    print(json.dumps({
        "tokens_per_s": timed * a.batch * T / seconds if timed > 0 else float("nan"),
        "timed_steps": timed, "timed_seconds": seconds,
        "timed_cpu_seconds": cpu_seconds,  # all of the process's threads: / timed_seconds = cores kept busy
        "first_loss": losses[0], "last_loss": losses[-1],
        "parameters": sum(p.numel() for p in P.values()),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "blas": blas_libraries(),
        "batch": a.batch, "context": T, "precision": "fp32",
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
