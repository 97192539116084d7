"""Each rank decides tests whose values differ between the ranks, and writes what it got to
stderr (``DECISIONS <rank> {...}``). Run under torchrun by tests/test_data_stops.py."""

import json
import sys

import torch

import distify.runtime as distify

rank = distify.rank()
got = {
    "any_one": distify.any_process(rank == 1),
    "any_none": distify.any_process(torch.tensor(False)),
    "all_one": distify.all_processes(rank == 1),
    "all_every": distify.all_processes(torch.tensor([1.0])),
    "mean": distify.reduce(float(rank), op="mean"),
}
# the same number of exits on every rank, however their own values go
steps = 0
for step in range(100):
    steps += 1
    if distify.any_process(step == 3 + 4 * rank):  # rank 0 wants out at 3, rank 1 at 7
        break
got["steps"] = steps
sys.stderr.write(f"DECISIONS {rank} {json.dumps(got)}\n")
