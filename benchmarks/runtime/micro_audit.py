"""Cost of the write check's audit hook (``distify.runtime._audit``) per training step, in ONE
process: the hook is installed on every process but the main one, and an audit hook cannot be
removed, so this measures its two factors separately and multiplies them.

1. the audit events a training step raises (a counting hook, installed first): the runtime
   benchmark's MLP and micro_overhead.py's tiny model, each with a DataLoader, AdamW and a
   prepared model, ``distify.backward``; one epoch's events divided by its steps;
2. the time the hook adds to one audit event: blocks of ``sys.audit`` calls of an event that
   is not ``open``, and of a read ``open`` event, timed before and after ``_audit.install``
   (medians over blocks; both sides run the counting hook); a step's ``open`` events are
   priced as reads, the others as the first kind.

Prints one JSON line: events per step by kind, µs per event with and without the hook, the step
time, and the hook's share of a step. Run it as a single process (``python micro_audit.py``).
"""
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import distify.runtime as distify
from distify.runtime import _audit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_single import MLP

counts = collections.Counter()
counting = [False]


def count(event, args):
    if counting[0]:
        counts[event] += 1


sys.addaudithook(count)


def epoch_events(name, model, batch, features, classes, samples=2048):
    """(events per step, µs per step) over one epoch after a warm-up epoch."""
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, features, generator=g),
                         torch.randint(0, classes, (samples,), generator=g))
    loader = distify.prepare(DataLoader(data, batch_size=batch, shuffle=True, drop_last=True))
    model, optimizer = distify.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    for epoch in range(2):
        counts.clear()
        counting[0] = epoch == 1
        start = time.perf_counter()
        steps = 0
        for x, y in loader:
            optimizer.zero_grad()
            distify.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            steps += 1
        elapsed = time.perf_counter() - start
        counting[0] = False
    return {"model": name, "events_per_step": sum(counts.values()) / steps,
            "opens_per_step": counts["open"] / steps,
            "by_kind": {k: round(v / steps, 3) for k, v in counts.most_common(8)},
            "step_us": round(elapsed / steps * 1e6, 1)}


def event_us(event, args, blocks=15, calls=20000):
    """Median µs of one ``sys.audit(event, *args)`` over blocks."""
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            sys.audit(event, *args)
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main():
    steps = [epoch_events("mlp (runtime benchmark)", MLP(64, 256, 10), 256, 64, 10),
             epoch_events("tiny (micro_overhead)", nn.Sequential(nn.Linear(32, 64), nn.ReLU(),
                                                                 nn.Linear(64, 10)), 8, 32, 10)]
    read = ("/nonexistent/x", "r", 0)  # an ``open`` for reading: the hook's longest way out
    before = {"other": event_us("distify.bench", ()), "open_read": event_us("open", read)}
    assert _audit.install(1), "DISTIFY_WRITE_CHECK=0 is set"
    after = {"other": event_us("distify.bench", ()), "open_read": event_us("open", read)}
    added = {k: after[k] - before[k] for k in before}
    for s in steps:
        opens = s["opens_per_step"]
        s["hook_us_per_step"] = round(opens * added["open_read"]
                                      + (s["events_per_step"] - opens) * added["other"], 3)
        s["hook_share_of_step"] = s["hook_us_per_step"] / s["step_us"]
    print(json.dumps({"bench": "micro_audit", "event_us_without_hook": before,
                      "event_us_with_hook": after, "added_us_per_event": added,
                      "steps": steps}))


if __name__ == "__main__":
    main()
