"""Mixed-precision checks; the precision comes from DISTIFY_MIXED_PRECISION (bf16 or fp16).

Runs with plain python or under torchrun; every rank appends JSON lines to
``OUT/results-rankN.jsonl``.
"""

import json
import os
import sys

import torch
from torch import nn

import distify.runtime as distify

OUT = sys.argv[1]


def report(check, **values):
    with open(os.path.join(OUT, f"results-rank{distify.rank()}.jsonl"), "a") as results:
        results.write(json.dumps({"check": check, "rank": distify.rank(), **values}) + "\n")


torch.manual_seed(0)
inner_dtypes = []
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
model[0].register_forward_hook(lambda module, args, out: inner_dtypes.append(str(out.dtype)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
model, optimizer, scheduler = distify.prepare(model, optimizer, scheduler)
x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))


def train_step(scale=1.0):
    optimizer.zero_grad()
    out = model(x)
    loss = nn.functional.cross_entropy(out, y) * scale
    distify.backward(loss)
    norm = distify.clip_grad_norm_(model.parameters(), 1e6)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.step()
    scheduler.step()
    changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    return {"out_dtype": str(out.dtype), "loss_finite": bool(torch.isfinite(loss)),
            "norm": float(norm), "skipped": optimizer.step_was_skipped, "changed": changed,
            "last_epoch": scheduler.last_epoch, "lr": scheduler.get_last_lr()[0]}


first = train_step()
report("normal_step", precision=distify.mixed_precision(), inner_dtype=inner_dtypes[-1], **first)
# An overflow: infinite gradients (on rank 0 only: DDP's averaging spreads them to every rank).
report("overflow_step", **train_step(scale=float("inf") if distify.rank() == 0 else 1.0))
report("after_overflow", **train_step())

with distify.autocast():
    autocast_dtype = str(model[0](x).dtype)  # a raw submodule call: autocast only
error = None
try:
    nn.functional.cross_entropy(model(x), y).backward()
except Exception as err:
    error = f"{type(err).__name__}: {err}"
report("plain_backward", error=error, autocast_dtype=autocast_dtype)
