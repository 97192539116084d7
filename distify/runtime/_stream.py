"""One rank's batches of a stream of units, planned as the stream goes: nothing is materialised.

A *unit* is what a batch is made of: a sampler's index, a batch sampler's list of indices, or a
sample of an IterableDataset. Every rank reads the same stream (``_data`` makes sure of that:
rank 0's order is broadcast, or the stream is the same by construction). Position p goes to rank
``p % world_size``, so global batch k (positions ``k*G .. k*G+G-1``, ``G = world_size *
batch_size``) over all ranks is the single-process batch k of size G.

Only the end of the stream needs to know where the stream ends (TRAIN padding, ``drop_last``,
EVAL splitting; see ``_data``). So each global batch is held until the next one is read: when
that one holds a unit for every rank, the held batch is nobody's last and is yielded as it is;
otherwise the stream has ended and the last one or two global batches (the *tail*) are planned
exactly as a whole epoch used to be. Memory: two global batches of this rank's units, plus the
stream's first ``world_size - 1`` units, which TRAIN padding repeats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any


@dataclass(frozen=True)
class Layout:
    """How one rank cuts an epoch of the stream into its batches."""

    rank: int
    world_size: int
    batch_size: int  # units per batch (1 when each unit is a batch)
    drop_last: bool
    train: bool  # pad the end by repeating the stream's start (else EVAL: split, never repeat)
    units_are_batches: bool = False  # a unit is a list of indices (a batch sampler's batch)

    @property
    def span(self) -> int:
        """Units in one global batch (all ranks' batch k together)."""
        return self.world_size * self.batch_size

    def batches_per_rank(self, count: int) -> int:
        """How many batches every rank gets from ``count`` units (the EVAL target, ``len``)."""
        if self.drop_last:
            return count // self.span
        return math.ceil(math.ceil(count / self.world_size) / self.batch_size)


def from_chunks(chunks: Iterable[list[Any]], head: list[Any],
                layout: Layout) -> Iterator[tuple[list[Any], int]]:
    """This rank's units of each global batch, and its size, from lists of the stream's units.

    Every chunk but the last must hold a whole number of global batches. The stream's first
    ``world_size - 1`` units are appended to ``head`` as they pass.
    """
    span, rank, world = layout.span, layout.rank, layout.world_size
    for chunk in chunks:
        if len(head) < world - 1:
            head.extend(chunk[:world - 1 - len(head)])
        for start in range(0, len(chunk), span):
            yield chunk[start + rank:start + span:world], min(span, len(chunk) - start)


def from_iterator(units: Iterator[Any], head: list[Any],
                  layout: Layout) -> Iterator[tuple[list[Any], int]]:
    """:func:`from_chunks` for an iterator whose units are kept only by the rank they go to
    (samples of an IterableDataset: the other ranks' samples are dropped as they are read)."""
    span, rank, world = layout.span, layout.rank, layout.world_size
    while True:
        own, size = [], 0
        for size, unit in enumerate(islice(units, span), 1):
            if (size - 1) % world == rank:
                own.append(unit)
            if len(head) < world - 1:
                head.append(unit)
        if size:
            yield own, size
        if size < span:
            return


def plan(global_batches: Iterator[tuple[list[Any], int]], head: list[Any],
         layout: Layout) -> Iterator[tuple[list[Any], int]]:
    """This rank's batches, each with how many of its units (at its end) repeat the start.

    ``global_batches`` is :func:`from_chunks` or :func:`from_iterator` over the epoch, filling
    ``head``; see the module docstring.
    """
    held = next(global_batches, None)
    if held is None:
        return
    for following in global_batches:
        if following[1] < layout.world_size:  # the stream ended: some rank has no unit there
            yield from _tail(held[0] + following[0], held[1] + following[1], head, layout)
            return
        yield _batch(held[0], 0, layout)
        held = following
    yield from _tail(held[0], held[1], head, layout)


def _batch(units: list[Any], repeated: int, layout: Layout) -> tuple[list[Any], int]:
    if layout.units_are_batches:  # one unit, itself a batch; a repeated one is all padding
        return list(units[0]), len(units[0]) if repeated else 0
    return units, repeated


def _tail(own: list[Any], count: int, head: list[Any],
          layout: Layout) -> list[tuple[list[Any], int]]:
    """The last batches: ``own`` is this rank's share of the stream's last ``count`` units,
    which start at a multiple of the global batch."""
    world, size = layout.world_size, layout.batch_size
    if layout.drop_last:  # the single-process run at world_size x batch drops this part
        count -= count % layout.span
        own = own[:count // world]
    repeated = [False] * len(own)
    if layout.train and count % world and layout.rank >= count % world:
        # TRAIN: every rank the same number of units, the missing ones repeat the stream's start
        own = [*own, head[(layout.rank - count % world) % len(head)]]
        repeated.append(True)
    if layout.units_are_batches:
        batches = [_batch([unit], flag, layout) for unit, flag in zip(own, repeated)]
    else:
        batches = [(own[i:i + size], sum(repeated[i:i + size]))
                   for i in range(0, len(own), size)]
    if not layout.train:
        _equalise(batches, layout.batches_per_rank(count))
    return batches


def _equalise(batches: list[tuple[list[Any], int]], target: int) -> None:
    """Give a rank that is one batch short as many batches as the others (EVAL mode) by
    splitting its last batch. Batches of one sample cannot be split, and repeating a sample
    would make reduced sums wrong: then the rank stays one batch short (see ``prepare``)."""
    if len(batches) < target and batches and len(batches[-1][0]) > 1:
        last, _ = batches.pop()
        batches += [(last[:-1], 0), (last[-1:], 0)]
