"""Rewrites of the training step: backward, gradient accumulation, exits from training loops,
and full-batch loops."""

from __future__ import annotations

from distify.convert.rewrites import Example, Rewrite


class Backward(Rewrite):
    """``loss.backward()`` → ``rt.backward(loss)``: loss scaling under fp16, and the runtime's
    checks that the loss comes from a prepared model. A script's own ``scaler.scale(loss)
    .backward()`` and an autograd demo's plain-tensor backward are left as written."""

    NAME = "backward"
    KINDS = ("backward",)
    FACTS = ("training",)
    NODES = ("Call",)
    SKIPPED = "torch's own backward runs: right without fp16 (under fp16 the loss is not scaled)"
    EXAMPLES = (
        Example(before="""
            import torch
            loss = criterion(model(x), y)
            loss.backward()
            """, after="""
            import torch
            import distify.runtime as distify
            loss = criterion(model(x), y)
            distify.backward(loss)
            """),
    )


class Accumulation(Rewrite):
    """Gradient accumulation: gradients are averaged across processes on the micro-step that
    steps the optimizer only (``rt.sync_gradients(...)``); a count declared as a total batch is
    shared out over the processes (``rt.split_accumulation``); the logged accumulated loss is
    the mean over processes; token counters count every process."""

    NAME = "accumulation"
    KINDS = ("accumulation", "throughput", "reduce")  # reduce: the accumulated loss's mean
    FACTS = ("training", "imports")
    NODES = ("For", "If", "Assign", "BinaryOperation")
    SKIPPED = ("gradients are averaged on every micro-step (correct, with an all-reduce per "
               "micro-step), and a count meant as a total is kept on every process")
    EXAMPLES = (
        Example(before="""
            import torch
            for i, (x, y) in enumerate(loader):
                loss = model(x, y) / accum
                loss.backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """, after="""
            import torch
            import distify.runtime as distify
            for i, (x, y) in enumerate(loader):
                distify.sync_gradients((i + 1) % accum == 0)
                loss = model(x, y) / accum
                loss.backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """),
    )


class Stops(Rewrite):
    """A data-dependent exit from a training loop (``if loss < target: break``, a NaN check that
    ends the run) is decided alike on every process, through a collective placed where every
    process reaches it; an exit that cannot be decided so is reported."""

    NAME = "stops"
    KINDS = ("stop",)
    FACTS = ("training", "imports")
    NODES = ("For", "While", "If", "Module")
    SKIPPED = ("each process decides alone: one that stops leaves the others waiting in their "
               "next collective (a hang)")
    EXAMPLES = (
        Example(before="""
            import torch
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                if loss.item() < 0.01:
                    break
            """, note="is decided"),
    )


class FullBatch(Rewrite):
    """A loop that trains on the whole data set at every step (a graph model's forward over all
    nodes) is said to be right as it is: every process computes the same gradient."""

    NAME = "full-batch"
    KINDS = ("full-batch",)
    FACTS = ("training",)
    NODES = ("For", "While")
    SKIPPED = "the loop gets the general note that it is not fed by a DataLoader"
    EXAMPLES = (
        Example(before="""
            import torch
            import torch.nn as nn


            class GCN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lin = nn.Linear(16, 3)

                def forward(self, x, adj):
                    return self.lin(adj @ x)


            features, adjacency = torch.randn(100, 16), torch.eye(100)
            labels = torch.randint(0, 3, (100,))
            model = GCN()
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            for epoch in range(200):
                loss = nn.functional.cross_entropy(model(features, adjacency), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """, note="full-batch training", line=22),
    )
