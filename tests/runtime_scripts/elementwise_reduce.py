"""distify.reduce of containers of numbers and distify.gather_list on every rank: each rank
prints one JSON line of what it got (tests/test_metrics_tail.py checks them)."""
import collections
import json
import sys

import numpy as np
import torch

import distify.runtime as distify

rank = distify.rank()
tallies = collections.defaultdict(int)
tallies["odd" if rank else "even"] += 1  # a key only one rank has
tallies["all"] += 2
got = {
    "floats": distify.reduce([float(rank + 1), 0.5]),
    "ints": distify.reduce([rank, 1]),
    "grid": distify.reduce([[rank, 0], [1, 1]]),
    "array": distify.reduce(np.array([[rank, 1], [2, 3]], dtype=np.int32)).tolist(),
    "array_dtype": str(distify.reduce(np.zeros(2, dtype=np.float32)).dtype),
    "dict": distify.reduce({"a": rank, "b": 1.5}),
    "defaultdict": list(distify.reduce(tallies).items()),
    "defaultdict_type": type(distify.reduce(tallies)).__name__,
    "counter": distify.reduce(collections.Counter({"x": rank + 1})),
    "mixed": [x.tolist() if torch.is_tensor(x) else x
              for x in distify.reduce([torch.tensor([rank, 1.0]), 2])],
    "max": distify.reduce([rank, -rank], op="max"),
    "gathered": distify.gather_list([f"r{rank}-{i}" for i in range(rank + 1)]),
    "gathered_tensors": [t.tolist() for t in distify.gather_list([torch.tensor([rank])])],
}
try:
    distify.reduce([0] * (rank + 1))
except distify.DistifyError as err:
    got["error"] = str(err)
sys.stdout.write(json.dumps({"rank": rank, **got}) + "\n")
