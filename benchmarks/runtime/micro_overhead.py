"""Per-step overhead of distify's runtime, isolated: the same tiny loop, two ways, in ONE job.

Under torchrun, each process holds two copies of a tiny model: one wrapped by hand in
DistributedDataParallel and fed by a DataLoader with a DistributedSampler, one prepared by
``distify.prepare`` (model, optimizer, DataLoader) with ``distify.backward``. Epochs of the two
alternate, so both see the same machine load, and the model is so small that a step is mostly
framework overhead plus a tiny all-reduce. Rank 0 prints one JSON line: median time per step of
each (wall and process CPU) and the difference in microseconds.

    python -m torch.distributed.run --standalone --nproc-per-node 2 micro_overhead.py
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import distify.runtime as distify


def make_model():
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=12, help="epochs of each, alternated")
    args = parser.parse_args()

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        # distify makes no process group for one process, but the hand-written DDP needs one
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    distify.init()  # the process group, from torchrun's environment
    device = distify.device()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 32), torch.randint(0, 10, (args.samples,)))

    raw_model = DDP(make_model().to(device),
                    device_ids=[device.index] if device.type == "cuda" else None)
    raw_optimizer = torch.optim.SGD(raw_model.parameters(), lr=0.01)
    sampler = DistributedSampler(data, shuffle=True, drop_last=True)
    raw_loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = distify.prepare(model, optimizer)
    loader = distify.prepare(DataLoader(data, batch_size=args.batch_size, shuffle=True,
                                        drop_last=True))

    def raw_epoch(epoch):
        sampler.set_epoch(epoch)
        raw_model.train()
        steps = 0
        for x, y in raw_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            raw_optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(raw_model(x), y)
            loss.backward()
            raw_optimizer.step()
            steps += 1
        return steps

    def distify_epoch(epoch):
        model.train()
        steps = 0
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            distify.backward(loss)
            optimizer.step()
            steps += 1
        return steps

    samples = {"ddp": ([], []), "distify": ([], [])}
    raw_epoch(0)  # warm-up
    distify_epoch(0)
    for block in range(1, args.blocks + 1):
        order = [("ddp", raw_epoch), ("distify", distify_epoch)]
        if block % 2:
            order.reverse()
        for name, run in order:
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall, cpu = time.perf_counter(), time.process_time()
            steps = run(block)
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples[name][0].append((time.perf_counter() - wall) / steps)
            samples[name][1].append((time.process_time() - cpu) / steps)

    result = {"bench": "micro", "steps_per_epoch": len(raw_loader), "blocks": args.blocks}
    for name, (wall, cpu) in samples.items():
        result[f"{name}_wall_us"] = 1e6 * statistics.median(wall)
        result[f"{name}_cpu_us"] = 1e6 * statistics.median(cpu)
    for kind in ("wall", "cpu"):
        result[f"overhead_{kind}_us"] = result[f"distify_{kind}_us"] - result[f"ddp_{kind}_us"]
        result[f"ratio_{kind}"] = result[f"distify_{kind}_us"] / result[f"ddp_{kind}_us"]
    if distify.is_main_process():
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
