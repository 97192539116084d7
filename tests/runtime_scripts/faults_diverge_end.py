"""Replicas that drift apart after the last weight comparison of debug mode.

Debug mode compares the weights on the first backward and every DISTIFY_DEBUG_EVERY (10)
after; this job makes 5, and after the 3rd rank 1 alone edits a weight in place. The check at
exit must catch it: every rank exits with status 1 and "replicas diverged" names
``Net.head.weight``. The main process prints "trained" after the loop.
"""

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
for step in range(5):
    optimizer.zero_grad()
    distify.backward(model(torch.randn(8, 4)).square().mean())
    optimizer.step()
    if step == 2 and distify.rank() == 1:
        with torch.no_grad():
            model.head.weight[0, 0] += 1e-3
distify.print("trained", flush=True)
