"""Runtime-overhead workload, distributed by hand: raw torch.distributed + DDP + DistributedSampler.

The same model, data, optimizer, schedule and loop as train_single.py, written the way a careful
engineer distributes it without a library: process group from torchrun's environment,
DistributedSampler with set_epoch, DDP, autocast for bf16, an all-reduce for the metric, prints
on rank 0 only. Run with ``python -m torch.distributed.run --standalone --nproc-per-node N``.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class MLP(nn.Module):
    def __init__(self, features, hidden, classes, depth=3):
        super().__init__()
        layers = []
        width = features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.LayerNorm(hidden), nn.GELU()]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.body(x))


def synthetic(n, features, classes, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=torch.Generator().manual_seed(1234))
    return TensorDataset(x, (x @ w).argmax(dim=1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=12800)
    parser.add_argument("--eval-samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixed-precision", choices=["no", "bf16"], default="no")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    torch.manual_seed(args.seed)

    train_set = synthetic(args.samples, args.features, args.classes, seed=1)
    eval_set = synthetic(args.eval_samples, args.features, args.classes, seed=2)
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed, drop_last=True)
    eval_sampler = DistributedSampler(eval_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler,
                              drop_last=True)
    eval_loader = DataLoader(eval_set, batch_size=256, sampler=eval_sampler)

    model = MLP(args.features, args.hidden, args.classes).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs * len(train_loader))
    use_bf16 = args.mixed_precision == "bf16"

    step = 0
    step_times = []
    start = last = cpu_start = 0.0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                output = model(x)
            loss = F.cross_entropy(output.float(), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step == args.warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = last = time.perf_counter()
                cpu_start = time.process_time()
            elif step > args.warmup:
                now = time.perf_counter()
                step_times.append(now - last)
                last = now
            if step % args.log_every == 0 and rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start

    model.eval()
    counts = torch.zeros(2, dtype=torch.long, device=device)
    with torch.no_grad():
        for x, y in eval_loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                output = model(x)
            counts[0] += (output.argmax(dim=1) == y).sum()
            counts[1] += y.size(0)
    dist.all_reduce(counts)

    if rank == 0:
        timed = len(step_times)
        print(json.dumps({"bench": "runtime", "variant": "ddp", "timed_steps": timed,
                          "step_ms_mean": 1e3 * elapsed / timed,
                          "cpu_ms_per_step": 1e3 * cpu / timed,
                          "step_ms_median": 1e3 * sorted(step_times)[timed // 2],
                          "final_loss": loss.item(), "accuracy": counts[0].item() /
                          counts[1].item(), "seen": counts[1].item()}))
    dist.barrier()  # leave together: a Gloo peer that closes first can make the other abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
