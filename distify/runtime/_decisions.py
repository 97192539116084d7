"""Decisions every process takes alike: the tests of data-dependent exits from a training loop.

A converted script's processes compute their own losses and rewards from their own batches, so a
test such as ``if not math.isfinite(loss_value): sys.exit(1)`` or ``while running_reward < goal``
can come out differently on each of them. A process that leaves the training loop alone leaves
the others waiting in DDP's next gradient all-reduce. These helpers decide such a test on all
processes at once (one all-reduce of one flag), in the direction that leaves: an exit is taken
by every process as soon as any one of them would take it, so none trains on alone after
another stopped on a non-finite loss, an exhausted budget or a reached target.

Every process must call them at the same point of the loop, the same number of times (``distify
convert`` places them only in tests every process reaches alike). In a single process they are
the test itself.
"""

from __future__ import annotations

from typing import Any

from ._collectives import reduce


def any_process(flag: Any) -> bool:
    """Whether ``flag`` is true on at least one process; the same answer on every process.

    For the test of an ``if`` that leaves a training loop (``if any_process(not
    math.isfinite(loss)): break``): all processes leave at the first step at which any of them
    would have left. One all-reduce (a max of 0/1) when there are several processes.

    Args:
        flag: anything ``if`` accepts (a bool, a number, a one-element tensor, ...).

    Returns:
        ``bool(flag)`` in a single process; else True on every process when any process's
        ``flag`` is true.
    """
    return bool(reduce(int(bool(flag)), op="max"))


def all_processes(flag: Any) -> bool:
    """Whether ``flag`` is true on every process; the same answer on every process.

    For the test of a ``while`` loop that trains (``while all_processes(a and b):``): the loop
    goes on while its test holds on every process, so all of them leave it at the first step at
    which any of them would have left. One all-reduce (a min of 0/1) when there are several
    processes.

    Args:
        flag: anything ``while`` accepts (a bool, a number, a one-element tensor, ...).

    Returns:
        ``bool(flag)`` in a single process; else True on every process when every process's
        ``flag`` is true.
    """
    return bool(reduce(int(bool(flag)), op="min"))
