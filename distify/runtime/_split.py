"""A token stream split over the processes, for batchify/BPTT training without a DataLoader.

pytorch/examples' word_language_model and the scripts written after it lay one long token
stream out in ``bsz`` columns (``batchify``: ``data.view(bsz, -1).t()``) and train on windows
sliced along the time axis. A converted script gives each process its own contiguous share of
the stream *before* that: ``batchify(distify.shard_stream(corpus.train, bsz), bsz)``.

- Each process keeps the script's ``bsz`` columns (``model.init_hidden(bsz)`` still fits), and
  the ranks' columns together are exactly the ``N × bsz`` columns one process would cut from
  the same stream, in rank order: the global batch is ``N × bsz``, as with a sharded
  DataLoader, and rank r's window k is columns ``r × bsz`` to ``(r + 1) × bsz`` of that
  process's window k.
- Every rank gets the same length, so all take the same number of BPTT steps and DDP never
  waits for a rank that ran out.

No collective: the stream must be the same on every process, as a corpus read from disk or
built from the script's seed is.
"""

from __future__ import annotations

import operator
from typing import Any, TypeVar

from . import _state
from ._errors import DistifyError

T = TypeVar("T")


def shard_stream(stream: T, columns: int = 1) -> T:
    """This process's contiguous share of ``stream`` along its first dimension.

    Args:
        stream: a token stream, time along the first dimension: a tensor, or anything with
            ``len()`` and slicing (a NumPy array, a list).
        columns: the batch size the share is laid out in afterwards (``batchify``'s ``bsz``):
            the shares are whole multiples of it, so that what one process would trim off the
            end is what all of them together leave out.

    Returns:
        ``stream`` itself in a single process (the original, bit for bit). With N processes,
        rank r's share of ``len(stream) // (N × columns) × columns`` items, starting at r times
        that: every rank the same length, the tail no whole row of ``N × columns`` covers
        dropped. A tensor's share is a view of it (``narrow``), not a copy.

    Raises:
        DistifyError: the shares would have fewer than 2 rows of ``columns`` (no window with
            a next token to predict), or ``stream`` has no length.
    """
    world_size = _state.world_size()
    if world_size == 1:
        return stream
    columns = _columns(columns)
    length = _length(stream)
    rows = length // (world_size * columns)
    if rows < 2:
        raise DistifyError(
            f"shard_stream: a stream of {length} item(s) gives each of {world_size} processes "
            f"{rows} time step(s) of {columns} column(s), and training on it needs at least 2; "
            "use a longer stream, a smaller batch or fewer processes")
    share = rows * columns
    start = _state.rank() * share
    narrow = getattr(stream, "narrow", None)
    if narrow is not None:  # a tensor: a view, no copy
        return narrow(0, start, share)
    return stream[start:start + share]  # type: ignore[index]


def _columns(columns: Any) -> int:
    try:
        value = operator.index(columns)
    except TypeError:  # a float, None
        value = 0
    if value < 1:
        raise DistifyError("shard_stream: columns is the batch size the share is laid out in, "
                           f"a positive int, not {columns!r}")
    return value


def _length(stream: Any) -> int:
    try:
        return len(stream)
    except TypeError:  # a number, a 0-dimensional tensor
        raise DistifyError(f"shard_stream: a {type(stream).__name__} without a first dimension "
                           "is no stream; pass the 1-D tensor (or array, list) of tokens") from None
