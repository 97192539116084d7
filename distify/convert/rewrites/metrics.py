"""Rewrites of metrics: sums and tallies reduced over the processes, predictions gathered."""

from __future__ import annotations

from distify.convert.rewrites import Example, Rewrite


class ReduceMetrics(Rewrite):
    """Sums accumulated in a loop over a DataLoader (``correct += ...``), per-class tallies and
    running-average meters are summed over all processes after the loop (``x = rt.reduce(x)``,
    ``rt.reduce_meters(...)``), and a division by one process's count (``len(loader)``) divides
    by all processes'. The report line says when the result equals the single-process value."""

    NAME = "reduce-metrics"
    KINDS = ("reduce",)
    FACTS = ("evaluation", "read", "imports")
    NODES = ("For", "AugAssign", "BinaryOperation", "Call")
    SKIPPED = "each process's value covers its own shard of the data only"
    EXAMPLES = (
        Example(before="""
            import torch
            correct = 0
            model.eval()
            with torch.no_grad():
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
            print(correct)
            """, after="""
            import torch
            import distify.runtime as distify
            correct = 0
            model.eval()
            with torch.no_grad():
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                correct = distify.reduce(correct)
            print(correct)
            """),
    )


class GatherPredictions(Rewrite):
    """Predictions collected in an evaluation loop (``preds.append(...)``, ``np.append``,
    ``torch.cat``) are gathered from every process batch by batch
    (``rt.gather_for_metrics``); lists filled item by item are gathered once after the loop,
    rank by rank (``rt.gather_list``), so that pairs stay aligned."""

    NAME = "gather-predictions"
    KINDS = ("gather",)
    FACTS = ("evaluation", "imports")
    NODES = ("Call", "Assign", "For")
    SKIPPED = "the list holds this process's predictions only"
    EXAMPLES = (
        Example(before="""
            import torch
            preds = []
            model.eval()
            with torch.no_grad():
                for x, y in loader:
                    preds.append(model(x).argmax(1))
            """, after="""
            import torch
            import distify.runtime as distify
            preds = []
            model.eval()
            with torch.no_grad():
                for x, y in loader:
                    preds.append(distify.gather_for_metrics(model(x).argmax(1)))
            """),
    )
