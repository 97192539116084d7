"""Prepared models: on the device, distributed by the strategy, still the user's own object.

Instead of returning a wrapper (where ``model.fc`` or ``model.generate`` would fail and
``state_dict`` keys would gain a ``module.`` prefix), the model's class is swapped for a subclass
whose ``__call__`` routes training forwards through what the strategy made of it (``_ddp``: a
DistributedDataParallel object kept aside; ``_fsdp``: the sharded module itself). Everything else
(attributes, methods, ``state_dict`` keys, ``isinstance``) is the user's class.

After each training forward ``_buffers`` broadcasts the main process's buffers, so every rank
evaluates (and the main process saves) the same BatchNorm statistics, whatever the strategy. The
job's first training forward also compares the processes' inputs (``_same_data``): identical
ones mean every process trains on the same data, which is warned about.

This module also keeps what the guards (``_guard``) and debug mode (``_debug``) need to know
about the distributed models: how many training forwards went through them since the last
``distify.backward``, and which parameters' gradients they synchronise.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from . import _buffers, _ddp, _precision, _same_data, _state, _strategy
from ._strategy import DistributedModel
from ._subclass import (
    PicklesAsOriginal,
    original_class,
    private_state,
    set_private_state,
    swap_class,
)

_EVAL_WITH_GRAD = ("a prepared model was called in eval mode with gradients enabled: that "
                   "forward bypasses DDP, so gradients from it are not averaged across processes; "
                   "call model.train() before training, or use torch.no_grad() to evaluate")


@dataclass(frozen=True)
class SyncedModule:
    """A module whose gradients the strategy synchronises: those parameters, by name."""

    order: int  # preparation order, the same on every rank
    class_name: str
    parameters: tuple[tuple[str, nn.Parameter], ...]
    #: every rank holds the same full weights (DDP; not FSDP's shards)
    replicated: bool = True


class _Models:
    """The runtime's part (see ``_state.Runtime``) about prepared models."""

    def __init__(self) -> None:
        self.models: weakref.WeakSet = weakref.WeakSet()
        #: what ``sync_gradients`` last set
        self.sync_gradients = True
        #: training forwards through a distributed model since the last ``distify.backward``:
        #: all of them, and those that synchronise gradients (not ``sync_gradients(False)``)
        self.forwards = 0
        self.synced_forwards = 0
        #: every module whose gradients are synchronised (prepared, or the user's own DDP)
        self.synced: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.synced_ids: frozenset[int] | None = None
        self.synced_version = 0
        self.order = itertools.count()


def _book() -> _Models:
    return _state.current().part(_Models)


class _ModelState:
    """Distify's per-model state, kept in the instance ``__dict__`` (not a submodule)."""

    def __init__(self, distributed: DistributedModel | None, buffers: Any) -> None:
        self.distributed = distributed
        #: broadcasts the main process's buffers after each training forward
        self.buffers = buffers
        self.inside = False  # the strategy's wrapper is calling the module
        self.warned = False


class _PreparedModelMixin(PicklesAsOriginal):
    """Mixed into a prepared model's class: the strategy for training forwards, autocast,
    fp32 outputs, and the strategy's meaning of ``state_dict``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state: _ModelState = private_state(self)
        if state.inside:  # DDP calling its module: run the user's forward and hooks once
            return super().__call__(*args, **kwargs)
        with _precision.autocast():
            if state.distributed is None:
                outputs = super().__call__(*args, **kwargs)
            elif self.training and torch.is_grad_enabled():
                outputs = _training_forward(state, args, kwargs)
            else:
                # No collective of distify's here: evaluation shards of unequal length, or an
                # evaluation on the main process only, would hang on it; no gradient needs
                # averaging, and the buffers are already the main process's (``_buffers``).
                # (FSDP's own all-gathers of the sharded weights still run: see ``_fsdp``.)
                _warn_if_training_in_eval(state)
                outputs = super().__call__(*args, **kwargs)
        return _precision.finish_outputs(outputs)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # .to(), .cpu(), .half(), ... (checkpointing code moves a model and back): the
        # strategy re-attaches what the move detached, or refuses to train where it is now.
        result = super()._apply(fn, *args, **kwargs)
        state = private_state(self)
        if state is not None and state.distributed is not None:
            state.distributed.after_move()
        return result

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        own = super().state_dict(*args, **kwargs)
        distributed = private_state(self).distributed
        if distributed is None or args or kwargs.get("prefix"):  # a parent's call: as it is
            return own
        return distributed.state_dict(own)

    def load_state_dict(self, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        distributed = private_state(self).distributed
        if distributed is not None:
            state_dict = distributed.load_state_dict(state_dict)
        return super().load_state_dict(state_dict, *args, **kwargs)

    @property
    def module(self) -> Any:
        """The user's module: the model itself, unless its class defines its own ``module``."""
        own = _own_module_attribute(self)
        return self if own is _MISSING else own

    @module.setter
    def module(self, value: Any) -> None:
        if isinstance(value, (nn.Module, nn.Parameter)):
            nn.Module.__setattr__(self, "module", value)  # type: ignore[arg-type]
            return
        # Not through nn.Module.__setattr__: it would end in this setter again.
        for table in ("_parameters", "_modules", "_buffers"):
            if "module" in self.__dict__[table]:
                self.__dict__[table]["module"] = value
                return
        self.__dict__["module"] = value


_MISSING = object()


def prepare_model(model: nn.Module, device_placement: bool = True) -> nn.Module:
    """Move ``model`` to the device and, when the world size is > 1, distribute it with the
    strategy (DDP by default)."""
    if isinstance(model, DistributedDataParallel):
        _watch_user_module(model, model.module)
        return model
    if _is_user_fsdp(model):
        _watch_user_module(model, model)
        return model
    if isinstance(model, _PreparedModelMixin):
        return model
    if isinstance(model, DataParallel):
        # Keep the user's DataParallel, so its state_dict keys (``module.``) and ``.module``
        # stay as they were, but with one device per process: it just calls the wrapped module,
        # which runs under the strategy.
        model.device_ids = []
        prepare_model(model.module, device_placement)
        return model
    for child in model.modules():  # a DataParallel sub-module: the same, one device
        if isinstance(child, DataParallel):
            child.device_ids = []
    settings = _state.settings()
    if settings.world_size > 1 and settings.sync_batchnorm:
        model = _sync_batchnorm(model, settings.device)
    if device_placement:
        model.to(settings.device)
    user_class = original_class(model)
    # A module with nothing to train (a frozen teacher, an EMA copy) is not distributed: DDP
    # refuses it, and nothing needs synchronising.
    distributed = _strategy.current().distribute(model) if settings.world_size > 1 and any(
        p.requires_grad for p in model.parameters()) else None
    swap_class(model, _PreparedModelMixin, original=user_class)
    if hasattr(type(model), "_orig_cls_mro_index"):
        # FSDP's class (``FSDP<Class>``) finds the user's class by its place in the MRO, to
        # build a plain one (indexing a sharded Sequential): one place further now.
        type(model)._orig_cls_mro_index = type(model).__mro__.index(user_class)
    buffers = None if distributed is None else _buffers.for_model(model, user_class.__name__)
    set_private_state(model, _ModelState(distributed, buffers))
    _book().models.add(model)
    if distributed is not None:
        _add_synced(model, user_class.__name__, distributed.synced_parameters(),
                    distributed.replicated)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a prepared model, or inside DDP / DataParallel / torch.compile.

    Args:
        model: a prepared model or any (nested) wrapper around a module.

    Returns:
        The innermost user module (a prepared model is already the user's module).
    """
    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile
            model = model._orig_mod  # type: ignore[assignment]
        else:
            return model


def sync_gradients(sync: bool) -> None:
    """Whether the next training forward/backward passes average gradients across processes.

    For gradient accumulation: call it with ``False`` on micro-steps that do not step the
    optimizer (no communication) and ``True`` on the one that does. It holds until called again.

    Args:
        sync: ``True`` to average gradients (the default), ``False`` to only accumulate them.
    """
    _book().sync_gradients = bool(sync)


def take_forwards() -> tuple[int, int]:
    """The distributed training forwards since the last call (all, and those synchronising
    gradients)."""
    book = _book()
    counts = book.forwards, book.synced_forwards
    book.forwards = book.synced_forwards = 0
    return counts


def synced_parameter_ids() -> tuple[int, frozenset[int]]:
    """A version number that changes whenever models are prepared, and the ids of the
    parameters whose gradients the strategy synchronises."""
    book = _book()
    if book.synced_ids is None:
        book.synced_ids = frozenset(id(param) for module in book.synced.values()
                                    for _, param in module.parameters)
    return book.synced_version, book.synced_ids


def synced_modules() -> list[SyncedModule]:
    """The modules whose gradients are synchronised, in the order they were prepared."""
    return sorted(_book().synced.values(), key=lambda module: module.order)


def synced_models() -> list[tuple[nn.Module, SyncedModule]]:
    """The modules whose gradients are synchronised, each with its key (the prepared model,
    or the user's DDP), in the order they were prepared."""
    return sorted(_book().synced.items(), key=lambda item: item[1].order)


def parameter_name(param: torch.Tensor) -> str | None:
    """``Class.name`` of ``param`` in a prepared model, if it belongs to one."""
    for model in list(_book().models):
        for name, candidate in model.named_parameters():
            if candidate is param:
                return f"{original_class(model).__name__}.{name}"
    return None


def any_model_training() -> bool:
    """True when some prepared model is in training mode."""
    return any(model.training for model in list(_book().models))


def _add_synced(key: nn.Module, class_name: str,
                params: tuple[tuple[str, nn.Parameter], ...], replicated: bool) -> None:
    book = _book()
    book.synced[key] = SyncedModule(next(book.order), class_name, params, replicated)
    _synced_changed(book)
    weakref.finalize(key, _synced_changed, book)


def _synced_changed(book: _Models) -> None:
    book.synced_ids = None
    book.synced_version += 1


def _is_user_fsdp(model: nn.Module) -> bool:
    """A module the user sharded with ``fully_shard`` themselves (not one distify prepared)."""
    if isinstance(model, _PreparedModelMixin):
        return False
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


def _watch_user_module(wrapper: nn.Module, module: nn.Module) -> None:
    """A DDP (or FSDP module) the user built: count its training forwards, know its
    parameters."""
    if wrapper in _book().synced:
        return
    wrapper.register_forward_pre_hook(_count_user_forward)
    replicated = isinstance(wrapper, DistributedDataParallel)
    params = _ddp.averaged_parameters(module) if replicated else tuple(
        (name, param) for name, param in module.named_parameters() if param.requires_grad)
    _add_synced(wrapper, original_class(module).__name__, params, replicated)


def _count_user_forward(wrapper: nn.Module, _args: Any) -> None:
    if torch.is_grad_enabled():
        book = _book()
        book.forwards += 1
        sync = getattr(wrapper, "require_backward_grad_sync", True)
        book.synced_forwards += bool(sync)


def _release_models() -> None:
    """At exit: what the strategy made holds the process group, so let it go first."""
    for model in list(_book().models):
        distributed = private_state(model).distributed
        if distributed is not None:
            distributed.release()


_state.before_leaving(_release_models)


def _sync_batchnorm(model: nn.Module, device: torch.device) -> nn.Module:
    if device.type == "cpu":  # torch's SyncBatchNorm refuses CPU tensors in forward
        warnings.warn("DISTIFY_SYNC_BATCHNORM is ignored on CPU: SyncBatchNorm needs GPUs; "
                      "each process keeps its own BatchNorm statistics", stacklevel=4)
        return model
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def _training_forward(state: _ModelState, args: tuple, kwargs: dict) -> Any:
    book = _book()
    sync = book.sync_gradients
    book.forwards += 1
    book.synced_forwards += sync
    assert state.distributed is not None
    _same_data.check_first_batch(args, kwargs)
    state.inside = True
    try:
        outputs = state.distributed.forward(args, kwargs, sync)
    finally:
        state.inside = False
    if state.buffers is not None:
        state.buffers.broadcast_from_main()
    return outputs


def _warn_if_training_in_eval(state: _ModelState) -> None:
    if torch.is_grad_enabled() and not state.warned:
        state.warned = True
        warnings.warn(_EVAL_WITH_GRAD, stacklevel=4)


def _own_module_attribute(model: nn.Module) -> Any:
    """The user's own ``module`` (a child, parameter, attribute or class member), if any."""
    for table in ("_modules", "_parameters", "_buffers"):
        members = model.__dict__.get(table, {})
        if "module" in members:
            return members["module"]
    if "module" in model.__dict__:
        return model.__dict__["module"]
    for klass in type(model).__mro__:
        if klass is _PreparedModelMixin or "module" not in vars(klass):
            continue
        member = vars(klass)["module"]
        return member.__get__(model, type(model)) if hasattr(member, "__get__") else member
    return _MISSING
