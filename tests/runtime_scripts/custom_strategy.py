"""A strategy added from outside the runtime: one subclass plus ``register``. It trains like DDP
and counts the runtime's collectives that go through it. Every rank writes ``STRATEGY <rank>
{...}`` to stderr: the strategy's name, its counts and what the collectives returned. Run under
torchrun (with ``DISTIFY_DEBUG=1``) by tests/test_runtime_unit.py."""

import json
import sys
from collections import Counter

import torch
from torch.utils.data import DataLoader, TensorDataset

import distify.runtime as distify
from distify.runtime import _ddp, _strategy

calls: Counter = Counter()


@_strategy.register
class CountingStrategy(_ddp.DDPStrategy):
    name = "counting"

    def all_reduce(self, tensor, op):
        calls["all_reduce"] += 1
        super().all_reduce(tensor, op)

    def all_gather(self, parts, tensor):
        calls["all_gather"] += 1
        super().all_gather(parts, tensor)

    def broadcast(self, tensor, src):
        calls["broadcast"] += 1
        super().broadcast(tensor, src)

    def barrier(self):
        calls["barrier"] += 1
        super().barrier()


distify.init(strategy="counting")
rank = distify.rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
loader = distify.prepare(DataLoader(data, batch_size=4, shuffle=True))
eval_loader = distify.prepare(DataLoader(data, batch_size=6))
model, optimizer = distify.prepare(model, optimizer)
before = dict(calls)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    distify.backward(loss)
    optimizer.step()
training = dict(calls - Counter(before))
model.eval()
seen = []
with torch.no_grad():
    for _x, y in eval_loader:
        seen.append(distify.gather_for_metrics(y))
got = {
    "strategy": _strategy.current().name,
    "sum": distify.reduce(rank + 1),
    "gather": distify.gather(torch.tensor([rank])).tolist(),
    "object": distify.broadcast_object({"rank": rank})["rank"],
    "any": distify.any_process(rank == 1),
    "evaluated": torch.cat(seen).shape[0],
}
distify.wait_for_everyone()
got["calls"] = dict(calls)
got["training"] = training
sys.stderr.write(f"STRATEGY {rank} {json.dumps(got)}\n")
