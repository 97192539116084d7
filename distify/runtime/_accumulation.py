"""Gradient accumulation declared for the whole job, shared out over its processes.

A GPT trainer derives its micro-steps per optimizer step from a total batch
(``grad_accum_steps = total_batch_size // (B * T)``). On N processes each runs 1/N of them, so
that one optimizer step still covers that total, which is what people write by hand
(``assert grad_accum_steps % ddp_world_size == 0; grad_accum_steps //= ddp_world_size``). Where
N does not divide the count, no share keeps the total: the job stops, before it trains, with
the numbers in the message.
"""

from __future__ import annotations

import operator

from . import _state
from ._errors import DistifyError, DistifyTypeError


def split_accumulation(steps: int) -> int:
    """This process's share of ``steps`` micro-steps per optimizer step declared for one process.

    Args:
        steps: the script's micro-steps per optimizer step (a positive int).

    Returns:
        ``steps // world_size()``; ``steps`` itself in a single process.

    Raises:
        DistifyError: when the world size does not divide ``steps``.
    """
    try:
        count = operator.index(steps)
    except TypeError:
        raise DistifyTypeError(f"split_accumulation takes an int count of micro-steps, not "
                               f"{type(steps).__name__}") from None
    world = _state.world_size()
    if count < 1 or count % world:
        raise DistifyError(f"gradient accumulation: {count} micro-steps per optimizer step do not "
                           f"split evenly over {world} processes, so no share keeps the script's "
                           f"total batch; launch a number of processes that divides {count}, or "
                           "change the total batch")
    return count // world
