"""Runtime-overhead workload, written for Hugging Face Accelerate (its 4-step recipe).

The same model, data, optimizer, schedule and loop as train_single.py: an Accelerator,
``prepare(model, optimizer, loaders, scheduler)``, ``accelerator.backward(loss)``,
``gather_for_metrics`` for the metric, ``accelerator.print``. Run under torchrun like the others.
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


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

    accelerator = Accelerator(mixed_precision=args.mixed_precision,
                              cpu=not torch.cuda.is_available())
    device = accelerator.device
    torch.manual_seed(args.seed)

    train_loader = DataLoader(synthetic(args.samples, args.features, args.classes, seed=1),
                              batch_size=args.batch_size, shuffle=True, drop_last=True)
    eval_loader = DataLoader(synthetic(args.eval_samples, args.features, args.classes, seed=2),
                             batch_size=256)
    model = MLP(args.features, args.hidden, args.classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # T_max as the single-process script computes it (len() before prepare): the prepared
    # scheduler steps once per process per call, as Accelerate documents.
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs * len(train_loader))
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)

    step = 0
    step_times = []
    start = last = cpu_start = 0.0
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
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
            if step % args.log_every == 0:
                accelerator.print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start

    model.eval()
    correct = 0
    seen = 0
    with torch.no_grad():
        for x, y in eval_loader:
            predictions, targets = accelerator.gather_for_metrics((model(x).argmax(dim=1), y))
            correct += (predictions == targets).sum().item()
            seen += targets.size(0)

    timed = len(step_times)
    accelerator.print(json.dumps({"bench": "runtime", "variant": "accelerate",
                                  "timed_steps": timed, "step_ms_mean": 1e3 * elapsed / timed,
                                  "cpu_ms_per_step": 1e3 * cpu / timed,
                                  "step_ms_median": 1e3 * sorted(step_times)[timed // 2],
                                  "final_loss": loss.item(), "accuracy": correct / seen,
                                  "seen": seen}))
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
