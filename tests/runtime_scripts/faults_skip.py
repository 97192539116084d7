"""A rank out of step with the other at step 3 (``python faults_skip.py MODE [STEPS [SLOW_S]]``).

- ``skip``: rank 1 ``continue``s before its backward. Gloo pairs its later all-reduces with
  rank 0's earlier ones, so rank 1 ends one backward early and rank 0 waits in its last
  backward's gradient all-reduce; the job must end (DISTIFY_TIMEOUT) with an error naming
  where each rank was, not a bare Gloo timeout.
- ``slow``: rank 1 sleeps (SLOW_S) before its backward: rank 0 waits in the all-reduce, and
  the watchdog (DISTIFY_WATCHDOG) must say where each rank is while the job goes on.

Each rank prints "STARTED <time>" before training; the main process "finished" at the end.
"""

import sys
import time

import torch
from torch import nn

import distify.runtime as distify

torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = distify.prepare(model, optimizer)
mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
SLOW_S = float(sys.argv[3]) if len(sys.argv) > 3 else 6
print(f"STARTED {time.time():.3f}", flush=True)
for step in range(steps):
    optimizer.zero_grad()
    loss = model(torch.randn(8, 4)).square().mean()
    if step == 3 and distify.rank() == 1:
        if mode == "skip":
            continue  # MARK: skip
        time.sleep(SLOW_S)  # MARK: slow
    distify.backward(loss)  # MARK: backward
    optimizer.step()
distify.print("finished")
