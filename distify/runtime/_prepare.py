"""``prepare``: one entry point for models, optimizers, LR schedulers and DataLoaders."""

from __future__ import annotations

import weakref
from typing import Any

from torch import nn
from torch.optim import Optimizer, lr_scheduler
from torch.utils.data import DataLoader

from . import _state
from ._data import PreparedDataLoader, prepare_loader
from ._errors import DistifyTypeError
from ._model import prepare_model
from ._precision import prepare_scheduler
from ._step import prepare_optimizer

_SCHEDULERS = tuple({getattr(lr_scheduler, name) for name in
                     ("LRScheduler", "_LRScheduler", "ReduceLROnPlateau")
                     if hasattr(lr_scheduler, name)})


def prepare(*objects: Any, shard: bool = True, device_placement: bool = True) -> Any:
    """Make models, optimizers, LR schedulers and DataLoaders ready for this job.

    Models move to the device (and use DDP for training forwards when the world size is > 1)
    but stay the user's objects. DataLoaders give each rank a distinct shard of every epoch of
    the original sampler (reshuffled every epoch); shards of training loaders are padded to equal
    length and ``gather_for_metrics`` drops the repeats; evaluation loaders (no shuffle, no
    model training) are not padded, so sums reduced over ranks are exact. Preparing an object
    twice returns it unchanged.

    Args:
        *objects: ``nn.Module``, ``torch.optim.Optimizer``, LR schedulers (including
            ``ReduceLROnPlateau``) and ``DataLoader`` objects, in any order; ``None`` (an
            optimizer a path does not build) comes back as ``None``.
        shard: split DataLoaders over the ranks (``False`` for a loader whose dataset already
            yields only this rank's part).
        device_placement: move models and batches to :func:`distify.device`.

    Returns:
        The prepared object, or a tuple of them in the order given.

    Raises:
        DistifyTypeError: an object of another type was given.
    """
    results = tuple(_prepare_one(obj, shard, device_placement) for obj in objects)
    return results[0] if len(results) == 1 else results


class Prepared:
    """The runtime's part (see ``_state.Runtime``): what was prepared, by kind, in order (the
    same order on every rank, and in every run of the script), for ``save_state``."""

    KINDS = ("models", "optimizers", "schedulers", "loaders")

    def __init__(self) -> None:
        self.refs: dict[str, list[weakref.ref]] = {kind: [] for kind in self.KINDS}
        self.ids: set[int] = set()

    def add(self, kind: str, obj: Any) -> None:
        if id(obj) in self.ids and any(ref() is obj for ref in self.refs[kind]):
            return
        self.ids.add(id(obj))
        self.refs[kind].append(weakref.ref(obj))

    def live(self, kind: str) -> list[Any]:
        """The prepared objects of ``kind`` still alive, in the order they were prepared."""
        return [obj for obj in (ref() for ref in self.refs[kind]) if obj is not None]


def prepared() -> Prepared:
    """This process's :class:`Prepared`."""
    return _state.current().part(Prepared)


def _prepare_one(obj: Any, shard: bool, device_placement: bool) -> Any:
    if obj is None:  # `prepare(model, optimizer)` on a path that builds no optimizer
        return None
    if isinstance(obj, nn.Module):
        kind, result = "models", prepare_model(obj, device_placement=device_placement)
    elif isinstance(obj, Optimizer):
        kind, result = "optimizers", prepare_optimizer(obj)
    elif isinstance(obj, _SCHEDULERS):
        kind, result = "schedulers", prepare_scheduler(obj)
    elif isinstance(obj, (DataLoader, PreparedDataLoader)):
        kind, result = "loaders", prepare_loader(obj, shard=shard,
                                                 device_placement=device_placement)
    else:
        raise DistifyTypeError(f"distify.prepare cannot prepare a {type(obj).__name__}: pass "
                               "models, optimizers, LR schedulers and DataLoaders")
    prepared().add(kind, result)
    return result
