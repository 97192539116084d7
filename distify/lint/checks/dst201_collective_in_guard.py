"""DST201: a collective that only the main process (or only some ranks) reaches."""

from __future__ import annotations

from distify.lint.checks._collectives import CollectiveRule
from distify.lint.rule import Invalid, Valid


class CollectiveInGuard(CollectiveRule):
    """A collective is called inside a rank guard, so the other ranks never join it: a hang.

    ``dist.barrier()``, ``all_reduce``, ``gather``, ``broadcast``,
    ``accelerator.wait_for_everyone``, ``gather_for_metrics``, the runtime's ``distify.reduce``
    and the other ``collectives`` of ``rules/distributed.yaml`` block until every rank calls
    them. Called under ``if rank == 0:`` (or its ``else``, or in a ``@rank_zero_only`` function,
    or in a function only called from such places) the job waits forever. Saves that coordinate
    internally (``accelerator.save_state``, Lightning's ``trainer.save_checkpoint``) count as
    collectives.

    Not reported: the same collective called under both a condition and its complement in one
    function (``if rank == 0: dist.gather(t, out) else: dist.gather(t)``, or the "main process
    first" pair of barriers). No fix: where the call belongs is a human decision.
    """

    CODE = "DST201"
    CAUSES = frozenset({"if", "else", "decorator"})
    MESSAGE = ("`{name}` is reached by {who} (rank check at line {line}); the other ranks never "
               "join it and the job hangs")

    VALID = (
        Valid("""
            import torch
            import torch.distributed as dist

            if dist.get_rank() == 0:
                torch.save(model.state_dict(), "model.pt")
            dist.barrier()
        """),
        Valid("""
            from contextlib import contextmanager
            import torch.distributed as dist

            @contextmanager
            def main_process_first(local_rank):
                if local_rank not in [-1, 0]:
                    dist.barrier()
                yield
                if local_rank == 0:
                    dist.barrier()
        """),
        Valid("""
            import torch.distributed as dist

            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.barrier()
        """),
    )
    INVALID = (
        Invalid("""
            import torch.distributed as dist

            def evaluate(rank):
                if rank == 0:
                    dist.all_reduce(correct)
                    print(correct)
        """, line=5),
        Invalid("""
            from accelerate import Accelerator

            accelerator = Accelerator()
            if accelerator.is_main_process:
                accelerator.wait_for_everyone()
                accelerator.save_state("ckpt")
        """, line=5),
        Invalid("""
            import torch.distributed as dist
            from lightning.pytorch.utilities import rank_zero_only

            @rank_zero_only
            def sync():
                dist.barrier()
        """, line=6),
        Invalid("""
            import torch.distributed as dist

            def sync():
                dist.barrier()

            if dist.get_rank() == 0:
                sync()
        """, line=4),
    )
