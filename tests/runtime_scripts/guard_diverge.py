"""Replicas that drift apart: after 3 steps, rank 1 alone edits a weight in place.

Under DISTIFY_DEBUG=1 the runtime must stop the job at its next weight comparison (every
DISTIFY_DEBUG_EVERY backward calls) with "replicas diverged", naming ``Net.head.weight``.
Without debug mode the job would finish with different weights on each rank; the main process
prints "finished" at the end. Each rank prints "STARTED <time>" before training.
"""

import time

import torch
from torch import nn

import distify.runtime as distify


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.body(x).tanh())


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = distify.prepare(model, optimizer)
print(f"STARTED {time.time():.3f}", flush=True)
for step in range(30):
    optimizer.zero_grad()
    distify.backward(model(torch.randn(8, 4)).square().mean())  # MARK: backward
    optimizer.step()
    if step == 3 and distify.rank() == 1:
        with torch.no_grad():
            model.head.weight[0, 0] += 1e-3
distify.print("finished")
