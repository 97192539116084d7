"""Gradients that DDP would not average, in the ways a script can make them (argv[1]):

- ``unprepared``: the loss comes from a model that was never prepared;
- ``submodule``: from a sub-module of a prepared model, called directly;
- ``method``: from a method of a prepared model that skips its forward;
- ``extra_params``: the optimizer also steps an unprepared module's parameters;
- ``unfrozen``: the optimizer steps a layer that was frozen when its model was prepared.

At world size 1 each trains like the original script; with more than one process the runtime
must refuse it with a DistifyError (or warn once per cause under DISTIFY_ALLOW_UNSYNCED=1).
The main process prints "trained N steps" at the end.
"""

import sys

import torch
from torch import nn

import distify.runtime as distify


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(self.fc(x).relu())

    def score(self, x):  # the same computation, without going through forward
        return self.out(self.fc(x).relu())


mode = sys.argv[1]
torch.manual_seed(0)
net = Net()
extra = nn.Linear(1, 1)  # never prepared
if mode == "unfrozen":
    net.out.requires_grad_(False)
params = [*net.parameters(), *extra.parameters()] if mode == "extra_params" else net.parameters()
optimizer = torch.optim.SGD(params, lr=0.1)
model = net if mode == "unprepared" else distify.prepare(net)
optimizer = distify.prepare(optimizer)
if mode == "unfrozen":
    net.out.requires_grad_(True)

trained = 0
for _ in range(5):
    optimizer.zero_grad()
    x = torch.randn(8, 4)
    if mode == "submodule":
        y = model.out(model.fc(x).relu())
    elif mode == "method":
        y = model.score(x)
    elif mode == "extra_params":
        y = extra(model(x))
    else:
        y = model(x)
    distify.backward(y.square().mean())
    optimizer.step()
    trained += 1
distify.print(f"trained {trained} steps")
