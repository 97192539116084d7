"""Prepared DataLoaders: batches on the device and, when the world size is > 1, one shard per rank.

Sharding keeps the original sampler. Each epoch it is iterated as the original loader would
iterate it (same random numbers, a fresh shuffle every epoch, no ``set_epoch`` needed), rank 0's
order is broadcast so every rank agrees, and rank r takes every world_size-th sample from r on.
So the samples of batch k over all ranks are exactly the single-process batch k of size
world_size * batch_size.

Two modes, decided when an epoch starts:

* TRAIN (the original drops the last batch, or a prepared model is training with gradients
  on): the order is padded by repeating its start, so every rank has the same number
  of batches and DDP never waits for a rank that ran out. With ``drop_last`` the tail that the
  single-process run at world_size * batch_size would drop is dropped instead, so nothing repeats.
* EVAL (otherwise): no sample is repeated, so sums reduced over ranks equal the single-process
  sums; if one rank is a batch short, its last batch is split in two so per-batch collectives
  (``gather_for_metrics``) still line up. Only with a batch size of 1 (or fewer samples than
  ranks) can the ranks then differ by one batch: gather such results after the loop instead.

The number of repeated samples in each batch is recorded so ``gather_for_metrics`` drops them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, SequentialSampler

from . import _debug, _model, _objects, _state
from ._errors import DistifyError
from ._tree import map_tensors

_ITERABLE = ("a DataLoader over an IterableDataset cannot be sharded by distify: split the stream "
             "by distify.rank() / distify.world_size() inside the dataset, then call "
             "distify.prepare(loader, shard=False)")
_padding = 0  # repeated samples at the end of the batch last yielded by a prepared loader


def current_padding() -> int:
    """How many samples at the end of the current batch are TRAIN-mode padding repeats."""
    return _padding


class PreparedDataLoader:
    """Iterates a DataLoader (the original, or its sharded copy) and moves batches to the device.

    Attributes it does not define (``dataset``, ``batch_size``, ``sampler``, ...) are the original
    loader's, so ``len(loader.dataset)`` stays the full dataset length.
    """

    def __init__(self, original: DataLoader, loader: DataLoader,
                 sampler: _ShardSampler | None, device: torch.device | None) -> None:
        self._original = original
        self._loader = loader
        self._sampler = sampler
        self._device = device

    def __iter__(self) -> Iterator[Any]:
        global _padding
        try:
            for index, batch in enumerate(self._loader):
                _padding = self._sampler.pads[index] if self._sampler is not None else 0
                yield batch if self._device is None else map_tensors(batch, self._move)
        finally:
            _padding = 0

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        original = self.__dict__.get("_original")
        if original is None:  # during copy/unpickling, before __init__ ran
            raise AttributeError(name)
        return getattr(original, name)

    def _move(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self._device, non_blocking=True)


def prepare_loader(loader: DataLoader, shard: bool = True,
                   device_placement: bool = True) -> PreparedDataLoader:
    """Shard ``loader`` over the ranks (world size > 1) and move its batches to the device."""
    if isinstance(loader, PreparedDataLoader):
        return loader
    device = _state.device() if device_placement else None
    if device is not None and device.type == "cpu":
        device = None  # DataLoader batches are already on the CPU
    if _state.world_size() == 1 or not shard:
        return PreparedDataLoader(loader, loader, None, device)
    if isinstance(loader.dataset, IterableDataset):
        raise DistifyError(_ITERABLE)
    sampler = _ShardSampler.for_loader(loader)
    return PreparedDataLoader(loader, _rebuild(loader, sampler), sampler, device)


class _ShardSampler(Sampler):
    """This rank's batches of an epoch of the original (batch) sampler; see the module docstring.

    Yields lists of indices (used as a batch_sampler), or single indices when ``flat`` (a loader
    without automatic batching).
    """

    def __init__(self, source: Any, batch_size: int | None, drop_last: bool,
                 flat: bool) -> None:
        self.source = source  # the original sampler, or batch_sampler when batch_size is None
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.flat = flat
        self.rank, self.world_size = _state.rank(), _state.world_size()
        root = source.sampler if batch_size is None and isinstance(source, BatchSampler) else source
        self.sequential = isinstance(root, SequentialSampler)
        self.pads: list[int] = []

    @classmethod
    def for_loader(cls, loader: DataLoader) -> _ShardSampler:
        if loader.batch_size is not None:
            return cls(loader.sampler, loader.batch_size, loader.drop_last, flat=False)
        if loader.batch_sampler is not None:
            return cls(loader.batch_sampler, None, False, flat=False)
        return cls(loader.sampler, 1, False, flat=True)

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.source) // (self.world_size * self.batch_size)
        return self._batches_per_rank(len(self.source))

    def __iter__(self) -> Iterator[Any]:
        batches, self.pads = self._plan()
        for batch in batches:
            yield batch[0] if self.flat else batch

    def _plan(self) -> tuple[list[list[Any]], list[int]]:
        units = list(self.source)  # consumes random numbers exactly like the original loader
        if not self.sequential:
            units = _broadcast_from_main(units)
        if not units:
            return [], []
        if self.drop_last:  # the single-process run at world_size x batch drops this tail
            units = units[:len(units) - len(units) % (self.world_size * self.batch_size)]
        # Padding is for training only: a shuffled loader evaluated under no_grad (or with the
        # model in eval mode) keeps exact shards, so reduced sums stay exact there too.
        train = self.drop_last or (torch.is_grad_enabled() and _model.any_model_training())
        own, repeated = _shard(units, self.rank, self.world_size, pad=train)
        if self.batch_size is None:  # the units are the original's batches
            batches, pads = [list(b) for b in own], [len(b) if r else 0 for b, r in
                                                     zip(own, repeated)]
        else:
            batches, pads = _chunk(own, repeated, self.batch_size, self.drop_last)
        if not train:
            _equalise(batches, pads, self._batches_per_rank(len(units)))
        return batches, pads

    def _batches_per_rank(self, count: int) -> int:
        per_rank = math.ceil(count / self.world_size)
        return per_rank if self.batch_size is None else math.ceil(per_rank / self.batch_size)


def _shard(units: list[Any], rank: int, world_size: int,
           pad: bool) -> tuple[list[Any], list[bool]]:
    """Rank ``rank``'s strided share of ``units``, optionally padded so all shares are equal."""
    count = len(units)
    repeated = [False] * count
    if pad and count % world_size:
        extra = world_size - count % world_size
        units = units + (units * math.ceil(extra / count))[:extra]
        repeated = repeated + [True] * extra
    return units[rank::world_size], repeated[rank::world_size]


def _chunk(items: list[Any], repeated: list[bool], size: int,
           drop_last: bool) -> tuple[list[list[Any]], list[int]]:
    stop = len(items) - len(items) % size if drop_last else len(items)
    starts = range(0, stop, size)
    return ([items[i:i + size] for i in starts], [sum(repeated[i:i + size]) for i in starts])


def _equalise(batches: list[list[Any]], pads: list[int], target: int) -> None:
    """Give a rank that is one batch short as many batches as the others (EVAL mode) by
    splitting its last batch. Batches of one sample cannot be split, and repeating a sample
    would make reduced sums wrong: then the rank stays one batch short (see ``prepare``)."""
    if len(batches) < target and batches and len(batches[-1]) > 1:
        last = batches.pop()
        batches += [last[:-1], last[-1:]]
        pads += [0]


def _broadcast_from_main(units: list[Any]) -> list[Any]:
    if _state.state().debug:
        _debug.check("DataLoader epoch (the main process's shuffled order)")
    device = _state.device() if dist.get_backend() == "nccl" else torch.device("cpu")
    return _objects.broadcast_object(units if _state.rank() == 0 else None, 0, device)


def _rebuild(loader: DataLoader, sampler: _ShardSampler) -> DataLoader:
    """A DataLoader like ``loader`` (same workers, collate_fn, generator, ...) over ``sampler``."""
    options: dict[str, Any] = {
        "num_workers": loader.num_workers, "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory, "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn, "generator": loader.generator,
        "persistent_workers": loader.persistent_workers}
    if loader.num_workers > 0:
        options.update(prefetch_factor=loader.prefetch_factor,
                       multiprocessing_context=loader.multiprocessing_context)
    if getattr(loader, "pin_memory_device", ""):
        options["pin_memory_device"] = loader.pin_memory_device
    if hasattr(loader, "in_order"):
        options["in_order"] = loader.in_order
    if sampler.flat:
        return DataLoader(loader.dataset, batch_size=None, sampler=sampler, **options)
    return DataLoader(loader.dataset, batch_sampler=sampler, **options)
