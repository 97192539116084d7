"""A small training script, run as the plain-PyTorch reference or (``--distify``) on the runtime.

The two paths differ only where a conversion changes a script: prepare, backward, clipping,
printing and saving. Prints one JSON line (main process) with the per-step losses and weights.
"""

import argparse
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--distify", action="store_true")
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--out", required=True)
args = parser.parse_args()
if args.distify:
    import distify.runtime as distify

torch.manual_seed(0)
data = TensorDataset(torch.randn(128, 8), torch.randint(0, 3, (128,)))
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
loader = DataLoader(data, batch_size=args.batch, shuffle=True)
if args.distify:
    model, optimizer, scheduler, loader = distify.prepare(model, optimizer, scheduler, loader)

losses, lrs, steps_per_epoch = [], [], []
for _ in range(args.epochs):
    model.train()
    steps = 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if args.distify:
            distify.backward(loss)
            distify.clip_grad_norm_(model.parameters(), 1.0)
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        value = loss.item()
        losses.append(distify.reduce(value, "mean") if args.distify else value)
        lrs.append(scheduler.get_last_lr()[0])
        steps += 1
    steps_per_epoch.append(steps)

result = {"losses": [float.hex(v) for v in losses], "lrs": lrs,
          "steps_per_epoch": steps_per_epoch, "rng_after": torch.rand(1).item(),
          "weights": [float.hex(v) for v in model.state_dict()["2.weight"].flatten().tolist()]}
checkpoint = os.path.join(args.out, "checkpoint.pt")
whole_model = os.path.join(args.out, "model.pt")
if args.distify:
    distify.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
    distify.save(model, whole_model)
    result["len_loader"] = len(loader)
    distify.print(json.dumps(result))
else:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
    torch.save(model, whole_model)
    print(json.dumps(result))
