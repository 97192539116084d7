"""Prepared models: on the device, DDP when the world size is > 1, still the user's own object.

Instead of returning a wrapper (where ``model.fc`` or ``model.generate`` would fail and
``state_dict`` keys would gain a ``module.`` prefix), the model's class is swapped for a subclass
whose ``__call__`` routes training forwards through a DistributedDataParallel object kept
aside. Everything else (attributes, methods, ``state_dict``, ``isinstance``) is the user's class.

Its DDP does not sync buffers at the start of each training forward: ``_buffers`` broadcasts
the main process's right after it instead, so every rank evaluates (and the main process
saves) the same BatchNorm statistics.

This module also keeps what the guards (``_guard``) and debug mode (``_debug``) need to know
about DDP: how many training forwards went through it since the last ``distify.backward``, and
which parameters it averages.
"""

from __future__ import annotations

import itertools
import os
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DataParallel, DistributedDataParallel

from . import _buffers, _debug, _precision, _state
from ._subclass import (
    PicklesAsOriginal,
    original_class,
    private_state,
    set_private_state,
    swap_class,
)

_models: weakref.WeakSet = weakref.WeakSet()
_sync_gradients = True
#: DDP training forwards since the last ``distify.backward``: all of them, and those that
#: average gradients (not under ``sync_gradients(False)``)
_forwards = 0
_synced_forwards = 0
_EVAL_WITH_GRAD = ("a prepared model was called in eval mode with gradients enabled: that "
                   "forward bypasses DDP, so gradients from it are not averaged across processes; "
                   "call model.train() before training, or use torch.no_grad() to evaluate")


class _Runtime:
    """Distify's per-model state, kept in the instance ``__dict__`` (not a submodule)."""

    def __init__(self, ddp: DistributedDataParallel | None) -> None:
        self.ddp = ddp
        #: broadcasts the main process's buffers after each training forward
        self.buffers = None if ddp is None else \
            _buffers.for_model(ddp.module, original_class(ddp.module).__name__)
        self.inside_ddp = False
        self.warned = False


class _PreparedModelMixin(PicklesAsOriginal):
    """Mixed into a prepared model's class: DDP for training forwards, autocast, fp32 outputs."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        runtime: _Runtime = private_state(self)
        if runtime.inside_ddp:  # DDP calling its module: run the user's forward and hooks once
            return super().__call__(*args, **kwargs)
        with _precision.autocast():
            if runtime.ddp is None:
                outputs = super().__call__(*args, **kwargs)
            elif self.training and torch.is_grad_enabled():
                outputs = _call_through_ddp(runtime, args, kwargs)
            else:
                # No collective here: evaluation shards of unequal length, or an evaluation on
                # the main process only, would hang on it; no gradient needs averaging, and
                # the buffers are already the main process's (``_buffers``).
                _warn_if_training_in_eval(runtime)
                outputs = super().__call__(*args, **kwargs)
        return _precision.finish_outputs(outputs)

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


@dataclass(frozen=True)
class SyncedModule:
    """A module whose gradients DDP averages: the parameters it averages, by name."""

    order: int  # preparation order, the same on every rank
    class_name: str
    parameters: tuple[tuple[str, nn.Parameter], ...]


#: every module under DDP (prepared, or the user's own DDP given to prepare)
_synced: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_synced_ids: frozenset[int] | None = None
_synced_version = 0
_order = itertools.count()


def prepare_model(model: nn.Module, device_placement: bool = True) -> nn.Module:
    """Move ``model`` to the device and, when the world size is > 1, set up DDP for it."""
    if isinstance(model, DistributedDataParallel):
        _watch_user_ddp(model)
        return model
    if isinstance(model, _PreparedModelMixin):
        return model
    if isinstance(model, DataParallel):
        # Keep the user's DataParallel, so its state_dict keys (``module.``) and ``.module``
        # stay as they were, but with one device per process: it just calls the wrapped module,
        # which runs under DDP.
        model.device_ids = []
        prepare_model(model.module, device_placement)
        return model
    for child in model.modules():  # a DataParallel sub-module: the same, one device
        if isinstance(child, DataParallel):
            child.device_ids = []
    state = _state.state()
    if state.world_size > 1 and state.sync_batchnorm:
        model = _sync_batchnorm(model, state.device)
    if device_placement:
        model.to(state.device)
    swap_class(model, _PreparedModelMixin)
    ddp = _make_ddp(model, state)
    set_private_state(model, _Runtime(ddp))
    _models.add(model)
    if ddp is not None:
        _add_synced(model, original_class(model).__name__, model)
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
    global _sync_gradients
    _sync_gradients = bool(sync)


def take_forwards() -> tuple[int, int]:
    """The DDP training forwards since the last call (all, and those averaging gradients)."""
    global _forwards, _synced_forwards
    counts = _forwards, _synced_forwards
    _forwards = _synced_forwards = 0
    return counts


def synced_parameter_ids() -> tuple[int, frozenset[int]]:
    """A version number that changes whenever models are prepared, and the ids of the
    parameters whose gradients DDP averages."""
    global _synced_ids
    if _synced_ids is None:
        _synced_ids = frozenset(id(param) for module in _synced.values()
                                for _, param in module.parameters)
    return _synced_version, _synced_ids


def synced_modules() -> list[SyncedModule]:
    """The modules under DDP, in the order they were prepared."""
    return sorted(_synced.values(), key=lambda module: module.order)


def parameter_name(param: torch.Tensor) -> str | None:
    """``Class.name`` of ``param`` in a prepared model, if it belongs to one."""
    for model in list(_models):
        for name, candidate in model.named_parameters():
            if candidate is param:
                return f"{original_class(model).__name__}.{name}"
    return None


def _add_synced(key: nn.Module, class_name: str, module: nn.Module) -> None:
    # What DDP averages: the parameters that require a gradient when it is built.
    ignored = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
    params = tuple((name, param) for name, param in module.named_parameters()
                   if param.requires_grad and name not in ignored)
    _synced[key] = SyncedModule(next(_order), class_name, params)
    _synced_changed()
    weakref.finalize(key, _synced_changed)


def _synced_changed() -> None:
    global _synced_ids, _synced_version
    _synced_ids = None
    _synced_version += 1


def _watch_user_ddp(ddp: DistributedDataParallel) -> None:
    """A DDP the user built: count its training forwards and know its parameters too."""
    if ddp in _synced:
        return
    ddp.register_forward_pre_hook(_count_user_ddp_forward)
    _add_synced(ddp, original_class(ddp.module).__name__, ddp.module)


def _count_user_ddp_forward(ddp: nn.Module, _args: Any) -> None:
    global _forwards, _synced_forwards
    if torch.is_grad_enabled():
        _forwards += 1
        _synced_forwards += bool(ddp.require_backward_grad_sync)


def _release_ddp() -> None:
    """At exit: the DDP objects hold the process group, so let them go before it is destroyed."""
    for model in list(_models):
        private_state(model).ddp = None


_state.before_leaving(_release_ddp)


def any_model_training() -> bool:
    """True when some prepared model is in training mode."""
    return any(model.training for model in list(_models))


def _make_ddp(model: nn.Module, state: _state.State) -> DistributedDataParallel | None:
    # DDP refuses modules with nothing to train (a frozen teacher, an EMA copy): skip them.
    if state.world_size == 1 or not any(p.requires_grad for p in model.parameters()):
        return None
    if state.debug:  # building DDP broadcasts the main process's weights: a collective
        _debug.check(f"prepare({original_class(model).__name__})")
    device_ids = [state.device.index] if state.device.type == "cuda" else None
    find_unused = os.environ.get("DISTIFY_FIND_UNUSED_PARAMETERS", "").strip().lower() in \
        ("1", "true", "yes", "on")
    ddp = DistributedDataParallel(model, device_ids=device_ids,
                                  find_unused_parameters=find_unused)
    # Built with its defaults, DDP has broadcast the main process's buffers with its weights;
    # from now on ``_buffers`` syncs them after each training forward instead of DDP before.
    # (Not ``broadcast_buffers=False`` above: that would leave the buffers out of that first
    # broadcast, and torch 2.13 deprecates the argument.)
    ddp.broadcast_buffers = False
    return ddp


def _sync_batchnorm(model: nn.Module, device: torch.device) -> nn.Module:
    if device.type == "cpu":  # torch's SyncBatchNorm refuses CPU tensors in forward
        warnings.warn("DISTIFY_SYNC_BATCHNORM is ignored on CPU: SyncBatchNorm needs GPUs; "
                      "each process keeps its own BatchNorm statistics", stacklevel=4)
        return model
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def _call_through_ddp(runtime: _Runtime, args: tuple, kwargs: dict) -> Any:
    global _forwards, _synced_forwards
    assert runtime.ddp is not None
    _forwards += 1
    _synced_forwards += _sync_gradients
    runtime.ddp.require_backward_grad_sync = _sync_gradients  # what DDP.no_sync() toggles
    runtime.inside_ddp = True
    try:
        outputs = runtime.ddp(*args, **kwargs)
    finally:
        runtime.inside_ddp = False
    if runtime.buffers is not None:
        runtime.buffers.broadcast_from_main()
    return outputs


def _warn_if_training_in_eval(runtime: _Runtime) -> None:
    if torch.is_grad_enabled() and not runtime.warned:
        runtime.warned = True
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
