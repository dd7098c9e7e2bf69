#!/usr/bin/python3
"""zoe-gpt against plain PyTorch (train_gpt.py beside this file): tokens/s of both and the ratio.

One invocation runs, in this order: the PyTorch peer (one process, world x batch sequences per
step, --threads threads), then zoe-gpt at each --settings entry with the same shape, global
batch, optimizer, schedule, data and total threads (--world-size ranks x threads / world):
  stage0  ZeRO stage 0, no offload (plain data parallelism over the ranks)
  main    the main job's setting (scripts/run-main.sh): ZeRO-3, optimizer states on NVMe
tokens/s of each is taken over the steps after --timing-warmup (zoe-gpt: from its --metrics
file's elapsed_s, so start-up, the final evaluation and the sample are left out; no checkpoints).
zoe-gpt's lm_head runs in --zoe-head-precision (default fp32, torch's precision; zoe-gpt's own
default is bf16). With --json one object per line {"bench":"gpt_torch","case","value" (zoe-gpt
tokens/s),"unit","baseline" (torch tokens/s),"ratio" (zoe / torch), ...}; figures depend on the
machine's load: each line carries the load average before and after.
Without PyTorch it prints why on stderr and exits 77 (skipped). Run it with /usr/bin/python3
(Debian's python3-torch); see docs/performance.md "zoe-gpt against plain PyTorch".
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--zoe-gpt", default=os.path.join(REPO, "build", "examples", "gpt", "zoe-gpt"))
    p.add_argument("--data-dir", default=os.environ.get("ZOE_GPT_DATA", os.path.join(REPO, "data", "gpt")))
    p.add_argument("--settings", nargs="+", default=["stage0", "main"], choices=["stage0", "main"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step (torch: world x batch)")
    p.add_argument("--world-size", type=int, default=2, help="zoe-gpt ranks")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="total compute threads of each trainer")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--timing-warmup", type=int, default=5)
    p.add_argument("--zoe-head-precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--python", default="/usr/bin/python3", help="interpreter with torch for train_gpt.py")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def run(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode not in (0, 77):
        sys.stderr.write(r.stderr[-4000:])
        raise SystemExit(f"compare.py: {cmd[0]} failed with exit status {r.returncode}")
    return r


def zoe_gpt(a, setting, tmp):
    metrics = os.path.join(tmp, f"metrics-{setting}.csv")
    cmd = [a.zoe_gpt, "--data-dir", a.data_dir, "--layers", str(a.layers), "--heads", str(a.heads),
           "--width", str(a.width), "--context", str(a.context), "--batch", str(a.batch), "--micro-batches", "1",
           "--steps", str(a.steps), "--lr", "3e-3", "--warmup", "20", "--world-size", str(a.world_size),
           "--threads-per-rank", str(max(1, a.threads // a.world_size)), "--head-chunk", "1024",
           "--head-precision", a.zoe_head_precision, "--eval-interval", "0", "--eval-batches", "1",
           "--sample-length", "0", "--metrics", metrics]
    if setting == "stage0":
        cmd += ["--zero-stage", "0", "--offload-optimizer", "none"]
    else:
        nvme = os.path.join(tmp, "nvme")
        os.makedirs(nvme, exist_ok=True)
        cmd += ["--zero-stage", "3", "--offload-optimizer", "nvme", "--nvme-path", nvme]
    before = load_average()
    run(cmd)
    with open(metrics) as f:
        rows = list(csv.DictReader(f))
    # Rows are written after each step; the last step's row includes the final evaluation, so
    # the rate is taken from the end of step `warmup` to the end of step steps - 1.
    w, last = a.timing_warmup, len(rows) - 2
    if last <= w - 1:
        raise SystemExit(f"compare.py: --steps {a.steps} leaves no timed steps after --timing-warmup {w}")
    seconds = float(rows[last]["elapsed_s"]) - float(rows[w - 1]["elapsed_s"])
    tokens = (last - (w - 1)) * a.world_size * a.batch * a.context
    return {"tokens_per_s": tokens / seconds, "timed_steps": last - (w - 1), "timed_seconds": seconds,
            "first_loss": float(rows[0]["loss"]), "last_loss": float(rows[-1]["loss"]),
            "command": " ".join(cmd), "load_average_before": before, "load_average_after": load_average()}


def main():
    a = parse_args()
    torch_cmd = [a.python, os.path.join(HERE, "train_gpt.py"), "--data-dir", a.data_dir,
                 "--layers", str(a.layers), "--heads", str(a.heads), "--width", str(a.width),
                 "--context", str(a.context), "--batch", str(a.world_size * a.batch), "--steps", str(a.steps),
                 "--timing-warmup", str(a.timing_warmup), "--threads", str(a.threads)]
    if not os.path.exists(os.path.join(a.data_dir, "tokens", "train.bin")):
        # zoe-gpt builds the token cache on its first run; run it once for a step.
        run([a.zoe_gpt, "--data-dir", a.data_dir, "--steps", "1", "--zero-stage", "0", "--offload-optimizer", "none",
             "--sample-length", "0", "--eval-batches", "1", "--layers", "1", "--width", "16", "--heads", "1"])
    before = load_average()
    r = run(torch_cmd)
    if r.returncode == 77:
        sys.stderr.write(r.stderr)
        print("compare.py: skipped: PyTorch is not installed (apt-get install python3-torch libopenblas0-pthread)",
              file=sys.stderr)
        return 77
    peer = json.loads(r.stdout.strip().splitlines()[-1])
    peer.update({"command": " ".join(torch_cmd), "load_average_before": before, "load_average_after": load_average()})
    with tempfile.TemporaryDirectory(prefix="zoe-gpt-torch-") as tmp:
        for setting in a.settings:
            z = zoe_gpt(a, setting, tmp)
            ratio = z["tokens_per_s"] / peer["tokens_per_s"]
            case = (f"gpt2 L{a.layers} C{a.width} T{a.context} batch {a.world_size}x{a.batch} threads {a.threads} "
                    f"{'stage 0, no offload' if setting == 'stage0' else 'ZeRO-3, optimizer on NVMe'} "
                    f"head {a.zoe_head_precision} vs torch fp32")
            line = {"bench": "gpt_torch", "case": case, "value": z["tokens_per_s"], "unit": "tokens/s",
                    "baseline": peer["tokens_per_s"], "ratio": ratio,
                    "explain": "value: zoe-gpt tokens/s; baseline: plain PyTorch (train_gpt.py) tokens/s, same shape, "
                               "global batch, AdamW, schedule, data and threads; ratio: value / baseline",
                    "cpu": cpu_model(), "cpus": os.cpu_count(), "zoe": z, "torch": peer}
            if a.json:
                print(json.dumps(line), flush=True)
            else:
                print(f"{case}: zoe-gpt {z['tokens_per_s']:.0f} tokens/s, torch {peer['tokens_per_s']:.0f} tokens/s, "
                      f"ratio {ratio:.2f} (load {z['load_average_before']} -> {z['load_average_after']}; torch BLAS "
                      f"{peer['blas'][-1] if peer['blas'] else '?'}, core {peer.get('openblas_coretype')})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
