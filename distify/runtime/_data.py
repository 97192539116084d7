"""Prepared DataLoaders: batches on the device and, when the world size is > 1, one shard per rank.

Sharding keeps the original sampler. Each epoch it is iterated as the original loader would
iterate it (same random numbers, a fresh shuffle every epoch, no ``set_epoch`` needed), rank 0's
order is broadcast so every rank agrees, and rank r takes every world_size-th sample from r on.
So the samples of batch k over all ranks are exactly the single-process batch k of size
world_size * batch_size.

The order is never materialised: rank 0 draws it in chunks of about 65,536 samples (a whole
number of global batches) as the epoch proceeds and broadcasts each (every rank draws its own
copy alongside, discarding it, so its random numbers are consumed as the original's), and each
rank plans its batches from the chunks as they come (``_stream``). So a
``RandomSampler(replacement=True, num_samples=10**10)`` costs what is consumed, in memory
bounded by a chunk; an epoch of up to a chunk is one broadcast, as it always was.

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

An IterableDataset is sharded the same way, by stream position: every rank iterates the whole
stream (in each worker process, the worker's own stream when the dataset splits itself by
``get_worker_info``, as torch leaves it to) and keeps the samples at positions ≡ rank mod
world_size, batching and collating them where the original loader did. Every rank sees where
the stream ends, so the end is planned as above with no communication: TRAIN pads, ``drop_last``
drops, EVAL splits, per worker stream. On top, at the first batch of each epoch the ranks compare
a digest of the stream's first sample (different first samples mean the dataset already splits
itself by rank, or is random per rank: a warning says to use ``shard=False``), and in TRAIN mode
they agree at every batch whether every rank has one (one all-reduce of a flag), so a stream that
is not the same on every rank stops all ranks together instead of hanging DDP. What that drops
is warned about. With ``persistent_workers`` the workers keep the mode of the first epoch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import warnings
from collections.abc import Iterator
from itertools import islice
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, SequentialSampler

from . import _debug, _draws, _model, _objects, _random, _replicas, _state, _strategy, _stream
from ._tree import map_tensors, tensors_in

#: units per broadcast of the shuffled order (rounded to a whole number of global batches)
CHUNK = 1 << 16
_SHARD_FALSE = ("if the dataset already splits its stream by rank (distify.rank(), "
                "torch.distributed.get_rank()), prepare it with distify.prepare(loader, "
                "shard=False)")
_END = object()


class _Padding:
    """The runtime's part (see ``_state.Runtime``): repeated samples at the end of the batch
    last yielded by a prepared loader."""

    def __init__(self) -> None:
        self.repeated = 0


def current_padding() -> int:
    """How many samples at the end of the current batch are TRAIN-mode padding repeats."""
    return _state.current().part(_Padding).repeated


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a prepared loader is (see :meth:`PreparedDataLoader.position`)."""

    epochs: int
    done: int
    finished: bool
    epoch_random: Any


class PreparedDataLoader:
    """Iterates a DataLoader (the original, or its sharded copy) and moves batches to the device.

    Attributes it does not define (``dataset``, ``batch_size``, ``sampler``, ...) are the original
    loader's, so ``len(loader.dataset)`` stays the full dataset length.
    """

    def __init__(self, original: DataLoader, loader: DataLoader,
                 sampler: _ShardSampler | None, device: torch.device | None,
                 stream: _RankStream | None = None) -> None:
        self._original = original
        self._loader = loader
        self._sampler = sampler
        self._stream = stream
        self._device = device
        #: where the loader is, for ``distify.save_state``: see :meth:`position`
        self._epochs = 0
        self._done = 0
        self._finished = True
        self._epoch_random: Any = None
        self._resume: Position | None = None

    def __iter__(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None
        now = _random.snapshot(self._original.generator)
        start = resume.epoch_random if resume is not None else now
        if resume is not None:  # draw this epoch's order as the interrupted run did
            _random.restore(start, self._original.generator)
        self._epoch_random, self._epochs, self._done, self._finished = \
            start, self._epochs + 1, 0, False
        batches = self._stream_batches() if self._stream is not None else self._batches()
        if resume is not None:
            # Read past what the interrupted run had trained on (loading it, so that workers
            # and in-process augmentations draw what they drew then), then continue from this
            # process's random state as it was when the loop asked for the batches.
            for _ in islice(batches, resume.done):
                self._done += 1
            _random.restore(now, self._original.generator)
        padding = _state.current().part(_Padding)
        trained = _replicas.backwards()
        try:
            for batch, repeated in batches:
                padding.repeated = repeated
                self._done += 1
                yield batch if self._device is None else map_tensors(batch, self._move)
            self._finished = True
        finally:
            padding.repeated = 0
        _replicas.epoch_ended(trained)  # compare the replicas if a model trained on it

    def position(self) -> Position:
        """Where this loader is: epochs started, batches given in the current one (and whether
        it ended), and the random state at its start (this process's)."""
        return Position(self._epochs, self._done, self._finished, self._epoch_random)

    def resume_from(self, position: Position) -> None:
        """Make the next ``iter()`` continue the epoch ``position`` was taken in (when it had
        not ended), with the same order and the same batches, skipping those given already."""
        self._epochs = position.epochs - (0 if position.finished else 1)
        self._resume = None if position.finished else position

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        original = self.__dict__.get("_original")
        if original is None:  # during copy/unpickling, before __init__ ran
            raise AttributeError(name)
        return getattr(original, name)

    def _batches(self) -> Iterator[tuple[Any, int]]:
        if self._sampler is not None:
            _draws.seed_workers(self._original, self._loader)
        for index, batch in enumerate(self._loader):
            yield batch, self._sampler.pad(index) if self._sampler is not None else 0

    def _stream_batches(self) -> Iterator[tuple[Any, int]]:
        """The sharded IterableDataset's batches; see the module docstring."""
        train = _train_mode(self._original.drop_last)
        stream = self._stream.__dict__  # set before the workers start: they copy the dataset
        stream["layout"] = dataclasses.replace(stream["layout"], train=train)
        iterator = iter(self._loader)
        item = next(iterator, _END)
        _compare_first_samples(None if item is _END else item[2])
        while True:
            if train and not _every_rank_has(item is not _END):
                if item is not _END:
                    warnings.warn("distify: another rank's share of the IterableDataset stream "
                                  f"ran out first; all ranks stopped, rank {_state.rank()} "
                                  f"dropped the rest of its share: {_SHARD_FALSE}",
                                  stacklevel=3)
                return
            if item is _END:
                return
            yield item[0], item[1]
            item = next(iterator, _END)

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
        stream = _RankStream(loader)
        return PreparedDataLoader(loader, _rebuild(loader, dataset=stream), None, device, stream)
    sampler = _ShardSampler.for_loader(loader)
    rebuilt = _rebuild(loader, sampler=sampler)
    rebuilt.generator = torch.Generator()  # its workers' seeds, per rank: _draws.seed_workers
    return PreparedDataLoader(loader, rebuilt, sampler, device)


def _train_mode(drop_last: bool) -> bool:
    # Padding is for training only: a shuffled loader evaluated under no_grad (or with the
    # model in eval mode) keeps exact shards, so reduced sums stay exact there too.
    return drop_last or (torch.is_grad_enabled() and _model.any_model_training())


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
        self._pads: dict[int, int] = {}  # batch number -> repeated samples, where not 0
        self._planned = 0  # batches planned so far this epoch

    @classmethod
    def for_loader(cls, loader: DataLoader) -> _ShardSampler:
        if loader.batch_size is not None:
            return cls(loader.sampler, loader.batch_size, loader.drop_last, flat=False)
        if loader.batch_sampler is not None:
            return cls(loader.batch_sampler, None, False, flat=False)
        return cls(loader.sampler, 1, False, flat=True)

    def __len__(self) -> int:
        return self._layout(train=False).batches_per_rank(len(self.source))

    def __iter__(self) -> Iterator[Any]:
        layout = self._layout(_train_mode(self.drop_last))
        self._pads, self._planned = {}, 0
        head: list[Any] = []
        units = _stream.from_chunks(self._chunks(layout), head, layout)
        for batch, repeated in _stream.plan(units, head, layout):
            if repeated:
                self._pads[self._planned] = repeated
            self._planned += 1
            yield batch[0] if self.flat else batch

    def pad(self, index: int) -> int:
        """How many samples at the end of this epoch's batch ``index`` repeat others."""
        return self._pads.get(index, 0)

    @property
    def pads(self) -> list[int]:
        """:meth:`pad` of every batch planned so far this epoch."""
        return [self.pad(index) for index in range(self._planned)]

    def _layout(self, train: bool) -> _stream.Layout:
        return _stream.Layout(self.rank, self.world_size, self.batch_size or 1, self.drop_last,
                              train, units_are_batches=self.batch_size is None)

    def _chunks(self, layout: _stream.Layout) -> Iterator[list[Any]]:
        """The epoch's order in chunks of whole global batches, the same on every rank."""
        size = max(1, CHUNK // layout.span) * layout.span
        units = iter(self.source)
        while True:
            chunk = list(islice(units, size))  # the random numbers the original loader draws
            if not self.sequential:
                chunk = _broadcast_from_main(chunk)
            if chunk:
                yield chunk
            if len(chunk) < size:
                return


def _broadcast_from_main(units: list[Any]) -> list[Any]:
    if _state.settings().debug:
        _debug.check("DataLoader epoch (the main process's shuffled order)")
    return _objects.broadcast_object(units if _state.rank() == 0 else None, 0, _state.comm_device())


class _RankStream(IterableDataset):
    """An IterableDataset as one rank sees it: the samples at its stream positions, batched and
    collated (the loader around it has ``batch_size=None``), each batch yielded as ``(batch,
    repeated samples at its end, digest of the stream's first sample or None)``.

    Attributes it does not define are the user's dataset's, read and set, so a ``worker_init_fn``
    that configures ``get_worker_info().dataset`` configures the user's dataset.
    """

    def __init__(self, loader: DataLoader) -> None:
        self.__dict__.update(
            dataset=loader.dataset, collate_fn=loader.collate_fn, flat=loader.batch_size is None,
            layout=_stream.Layout(_state.rank(), _state.world_size(), loader.batch_size or 1,
                                  loader.drop_last, train=False))

    def __iter__(self) -> Iterator[tuple[Any, int, int | None]]:
        state = self.__dict__
        layout = state["layout"]
        samples = iter(state["dataset"])  # in a worker: that worker's stream
        first = next(samples, _END)
        if first is _END:
            return
        digest: int | None = _digest(first)
        samples = _chain_first(first, samples)
        head: list[Any] = []
        for batch, repeated in _stream.plan(_stream.from_iterator(samples, head, layout), head,
                                            layout):
            data = state["collate_fn"](batch[0] if state["flat"] else batch)
            if repeated and state["flat"]:  # the dataset's own item repeated: all of it
                repeated = _rows(data)
            yield data, repeated, digest
            digest = None

    def __len__(self) -> int:
        return self.__dict__["layout"].batches_per_rank(len(self.__dict__["dataset"]))

    def __getattr__(self, name: str) -> Any:
        dataset = self.__dict__.get("dataset")
        if dataset is None:  # during unpickling in a worker, before the state is back
            raise AttributeError(name)
        return getattr(dataset, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.__dict__["dataset"], name, value)


def _chain_first(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _rows(data: Any) -> int:
    tensors = tensors_in(data)
    if tensors and tensors[0].dim():
        return tensors[0].shape[0]
    return len(data) if isinstance(data, (list, tuple)) else 1


def _digest(sample: Any) -> int | None:
    """The same number on every rank for equal samples (tensors by their bytes); None when the
    sample cannot be read that way."""
    hasher = hashlib.blake2b(digest_size=7)
    try:
        tensors = tensors_in(sample)
        for tensor in tensors:
            flat = tensor.detach().cpu().contiguous().reshape(-1)
            hasher.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
            hasher.update(_objects._to_bytes(flat.view(torch.uint8)))
        if not tensors:
            hasher.update(pickle.dumps(sample, protocol=4))
    except Exception:  # an object pickle cannot write: no comparison
        return None
    return int.from_bytes(hasher.digest(), "little")


def _compare_first_samples(digest: int | None) -> None:
    """Warn (on the main process) when the ranks' streams start with different samples."""
    if _state.settings().debug:
        _debug.check("DataLoader epoch (the first sample of the IterableDataset stream)")
    mine = torch.tensor([-1 if digest is None else digest], dtype=torch.int64,
                        device=_state.comm_device())
    everyone = [torch.empty_like(mine) for _ in range(_state.world_size())]
    _strategy.current().all_gather(everyone, mine)
    digests = {int(d.item()) for d in everyone} - {-1}
    if len(digests) > 1 and _state.is_main_process():
        warnings.warn("distify: the DataLoader's IterableDataset starts with different samples "
                      "on different ranks, and each rank keeps one sample in "
                      f"{_state.world_size()} of its own stream: {_SHARD_FALSE}; a "
                      "random stream needs the same seed on every rank", stacklevel=4)


def _every_rank_has(has_batch: bool) -> bool:
    if _state.settings().debug:
        _debug.check("DataLoader batch (whether every rank has one)")
    flag = torch.tensor([int(has_batch)], dtype=torch.int64, device=_state.comm_device())
    _strategy.current().all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _keep(item: Any) -> Any:
    """The collate_fn of a loader over :class:`_RankStream`: batches are collated already."""
    return item


def _rebuild(loader: DataLoader, sampler: _ShardSampler | None = None,
             dataset: _RankStream | None = None) -> DataLoader:
    """A DataLoader like ``loader`` (same workers, collate_fn, generator, ...) over ``sampler``,
    or over the sharded stream ``dataset``."""
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
    if dataset is not None:
        return DataLoader(dataset, batch_size=None, **{**options, "collate_fn": _keep})
    if sampler.flat:
        return DataLoader(loader.dataset, batch_size=None, sampler=sampler, **options)
    return DataLoader(loader.dataset, batch_sampler=sampler, **options)
