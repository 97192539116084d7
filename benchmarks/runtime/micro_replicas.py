"""Cost of one replica check (``distify.runtime._replicas``) against a training step, in ONE job.

Under torchrun each process prepares a model (the runtime benchmark's MLP, ``train_single.py``'s
defaults, and micro_overhead.py's tiny model, whose step is mostly framework overhead: the worst
case for a check's fixed cost) with its optimizer, then alternates blocks of training steps and
blocks of replica checks, so both see the same machine load. Rank 0 prints one JSON line per
model: median µs per step and per check (wall and process CPU) and the K (backwards
between periodic checks) at which the check costs 0.5% of the steps.

    python -m torch.distributed.run --standalone --nproc-per-node 2 micro_replicas.py
"""
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import distify.runtime as distify
from distify.runtime import _replicas

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_single import MLP

BLOCKS, STEPS, CHECKS = 12, 40, 40
SHARE = 0.005  # the periodic check's share of step time that K is chosen for


def measure(name, model, batch, features, classes):
    model = model.to(distify.device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = distify.prepare(model, optimizer)
    g = torch.Generator().manual_seed(distify.rank())
    x = torch.randn(batch, features, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)

    def step():
        optimizer.zero_grad()
        distify.backward(F.cross_entropy(model(x), y))
        optimizer.step()

    def check():
        _replicas.check("bench", buffers=True)  # the periodic check: buffers too

    for _ in range(10):
        step()
        check()
    per_step, per_check, cpu_step, cpu_check = [], [], [], []
    for _ in range(BLOCKS):
        for fn, wall, cpu, n in ((step, per_step, cpu_step, STEPS),
                                 (check, per_check, cpu_check, CHECKS)):
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(n):
                fn()
            wall.append((time.perf_counter() - start) / n * 1e6)
            cpu.append((time.process_time() - cpu_start) / n * 1e6)
    step_us, check_us = statistics.median(per_step), statistics.median(per_check)
    tensors = len(_replicas._compared(True))
    params = sum(p.numel() for p in model.parameters())
    step_cpu, check_cpu = statistics.median(cpu_step), statistics.median(cpu_check)
    return {"bench": "replicas", "model": name, "parameters": params,
            "tensors_compared": tensors, "step_us": round(step_us, 1),
            "check_us": round(check_us, 1), "step_cpu_us": round(step_cpu, 1),
            "check_cpu_us": round(check_cpu, 1),
            "k_for_half_percent": math.ceil(check_us / (SHARE * step_us)),
            "k_for_half_percent_cpu": math.ceil(check_cpu / (SHARE * step_cpu))}


def main():
    distify.init()
    torch.manual_seed(0)
    results = [measure("runtime benchmark MLP (128-256x3-10, batch 64)",
                       MLP(128, 256, 10), 64, 128, 10),
               measure("micro_overhead tiny (32-64-10, batch 8)",
                       nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)), 8, 32, 10)]
    if distify.is_main_process():
        for result in results:
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
