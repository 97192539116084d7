"""A prepared model moved for checkpointing and back, the way real training scripts do it.

``python replicas_checkpoint.py MODE [STEPS]``; a loop without epochs of STEPS (default 240)
steps; rank 0 prints "finished" at the end.

- ``all``: every 20 steps every rank casts the model to float64 for a checkpoint, saves it and
  casts it back (``.double()`` / ``.float()``, ``.to(torch.float64)`` / ``.to(torch.float32)``,
  alternately). The model has a BatchNorm, so its synced buffers are compared too. DDP must
  keep averaging: the job ends with identical replicas.
- ``main-half``: at step 10 only the main process saves a half-precision copy with
  ``model.half()`` and moves back with ``model.float()``: the rounding changes its weights
  alone, and the runtime's periodic replica check must stop the job.
- ``away``: every rank casts the model to float64 at step 10 and keeps training it there: the
  next training forward must stop with an error naming the line of the cast.
"""

import os
import sys

import torch
from torch import nn

import distify.runtime as distify

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 240
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model, optimizer = distify.prepare(model, optimizer)
generator = torch.Generator().manual_seed(1 + distify.rank())  # each rank's own data


def save_checkpoint(step):
    if step % 40 == 0:
        model.double()
    else:
        model.to(torch.float64)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    distify.save(state, os.path.join(os.environ.get("CKPT_DIR", "."), "ckpt.pt"))
    if step % 40 == 0:
        model.float()
    else:
        model.to(torch.float32)


for step in range(steps):
    x = torch.randn(16, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    distify.backward(loss)
    optimizer.step()
    if mode == "all" and step % 20 == 0:
        save_checkpoint(step)
    elif mode == "main-half" and step == 10 and distify.is_main_process():
        half = model.half()
        distify.save(half.state_dict(), os.path.join(os.environ.get("CKPT_DIR", "."), "h.pt"))
        model.float()
    elif mode == "away" and step == 10:
        model.double()  # MARK: away
distify.print("finished")
