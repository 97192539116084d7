"""DST202: a collective after a rank-dependent return, continue or break."""

from __future__ import annotations

from distify.lint.checks._collectives import CollectiveRule
from distify.lint.rule import Invalid, Valid


class CollectiveAfterRankExit(CollectiveRule):
    """A collective comes after a ``return`` / ``continue`` / ``break`` / ``sys.exit()`` that only
    some ranks take, so the ranks that left never join it: a hang.

    ``if rank != 0: return`` makes the rest of the function main-only; a collective there (a
    barrier after saving, an ``all_reduce`` of a metric) waits for ranks that already returned.
    The same goes for the rest of a loop body after a rank-dependent ``continue`` or ``break``
    (``if rank == 0 and loss < target: break``): the ranks that stayed wait in the next
    collective for the one that left.

    Not reported: exits taken on every rank alike (``if step >= max_steps: break``). No fix.
    """

    CODE = "DST202"
    CAUSES = frozenset({"exit"})
    MESSAGE = ("`{name}` is reached by {who} after the rank-dependent exit at line {line}; the "
               "ranks that left never join it and the job hangs")

    VALID = (
        Valid("""
            import torch
            import torch.distributed as dist

            def save(rank):
                dist.barrier()
                if rank != 0:
                    return
                torch.save(model.state_dict(), "model.pt")
        """),
        Valid("""
            import torch.distributed as dist

            for step, batch in enumerate(loader):
                if step >= max_steps:
                    break
                dist.all_reduce(loss)
        """),
    )
    INVALID = (
        Invalid("""
            import torch
            import torch.distributed as dist

            def save(rank):
                if rank != 0:
                    return
                torch.save(model.state_dict(), "model.pt")
                dist.barrier()
        """, line=8),
        Invalid("""
            import torch.distributed as dist

            for epoch in range(epochs):
                loss = train(epoch)
                if dist.get_rank() == 0 and loss < target:
                    break
                dist.all_reduce(loss)
        """, line=7),
        Invalid("""
            import sys
            import torch.distributed as dist

            if dist.get_rank() > 0:
                sys.exit(0)
            dist.barrier()
        """, line=6),
    )
