#!/usr/bin/python3
"""Golden values for tests/optim: 100 steps of torch.optim.AdamW and torch.optim.Adam.

Made once with Debian's python3-torch 1.13 (CPU, foreach=False: torch's single-tensor loop):
    /usr/bin/python3 tests/data/adam_golden.py > tests/data/adam_golden.txt
Hyper-parameters: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01.
Inputs are exact binary fractions from an integer hash, so the C++ test (test_golden.cpp)
rebuilds them bit for bit without torch:
    param0[i]     = k(0, i) / 256
    grad[t][i]    = k(t, i) / 1024 * 2^-(t % 7)      (t = 1..100; every 13th element 0)
    k(t, i)       = ((((i * 2654435761 + t * 40503 + 12345) mod 2^32) >> 8) mod 2049) - 1024
Output lines: "<adam|adamw> <param|exp_avg|exp_avg_sq> <hex float32 bits...>" after 100 steps.
"""
import torch

N = 37
STEPS = 100


def k(t, i):
    h = (i * 2654435761 + t * 40503 + 12345) % (1 << 32)
    return ((h >> 8) % 2049) - 1024


def grad(t):
    g = [0.0 if i % 13 == 0 else k(t, i) / 1024.0 * 2.0 ** -(t % 7) for i in range(N)]
    return torch.tensor(g, dtype=torch.float32)


def bits(tensor):
    return " ".join("%08x" % (v & 0xFFFFFFFF) for v in tensor.view(torch.int32).tolist())


def run(name, cls):
    p = torch.tensor([k(0, i) / 256.0 for i in range(N)], dtype=torch.float32, requires_grad=True)
    opt = cls([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=False)
    for t in range(1, STEPS + 1):
        p.grad = grad(t)
        opt.step()
    state = opt.state[p]
    print(name, "param", bits(p.detach()))
    print(name, "exp_avg", bits(state["exp_avg"]))
    print(name, "exp_avg_sq", bits(state["exp_avg_sq"]))


torch.set_num_threads(1)
run("adamw", torch.optim.AdamW)
run("adam", torch.optim.Adam)
