"""Collectives that only some ranks reach (argv[1]):

- ``reduce_vs_backward``: rank 0 reduces a metric where rank 1 back-propagates;
- ``skip_reduce``: rank 1 skips a reduce and reaches the end of the script.

Without debug mode both hang until DISTIFY_TIMEOUT; under DISTIFY_DEBUG=1 the runtime must
fail at once, naming each rank's call and line. The lines are marked ``# MARK: name``; each
rank prints "STARTED <time>" before them.
"""

import sys
import time

import torch
from torch import nn

import distify.runtime as distify

mode = sys.argv[1]
torch.manual_seed(0)
model = distify.prepare(nn.Linear(4, 1))
loss = model(torch.randn(8, 4)).square().mean()
print(f"STARTED {time.time():.3f}", flush=True)
if mode == "reduce_vs_backward":
    if distify.rank() == 0:
        distify.reduce(loss.detach())  # MARK: rank0_reduce
    else:
        distify.backward(loss)  # MARK: rank1_backward
elif mode == "skip_reduce":
    distify.backward(loss)
    if distify.rank() == 0:
        distify.reduce(1)  # MARK: skipped_reduce
distify.print("finished")
