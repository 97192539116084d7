"""No silent single-process training: refuse gradients that DDP would not average.

With more than one process, a loss that did not come through a prepared model's forward (an
unprepared model, a sub-module called directly, a method that skips ``forward``), or an
optimizer that steps parameters no prepared model owns, trains each process on its own: the
replicas drift apart and nothing says so. Two checks turn that into a :class:`DistifyError`:

- ``distify.backward`` needs at least one DDP training forward since the previous backward
  (several, for gradient accumulation or several models, are fine; forwards under
  ``sync_gradients(False)`` count, since they still go through DDP);
- a prepared optimizer's ``step`` (a step pre-hook, so it holds under fp16 too, where the
  GradScaler calls the step) refuses parameters that have a gradient but are not averaged by
  DDP. The set of averaged parameters is cached and recomputed when models are prepared; each
  optimizer's parameters are looked up again only when its param groups change.

``DISTIFY_ALLOW_UNSYNCED=1`` (for parameters meant to train per process) turns each check
into a single warning. In a single process none of this runs.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from . import _debug, _model, _state
from ._errors import DistifyError

_ALLOW = "; set DISTIFY_ALLOW_UNSYNCED=1 if they are meant to train per process"
_NO_DDP_FORWARD = (
    "distify.backward: no prepared model ran a training forward since the last backward, so "
    "these gradients are not averaged across the {n} processes and the replicas will drift "
    "apart: prepare the model that computed the loss with `model = distify.prepare(model)` (or "
    "call the prepared model itself, not one of its sub-modules or methods that skip its "
    "forward)")
_WARNED = " (DISTIFY_ALLOW_UNSYNCED is set, so training goes on; this warning is not repeated)"



class _Warned(set):
    """The runtime's part (see ``_state.Runtime``): the causes already warned about under
    DISTIFY_ALLOW_UNSYNCED."""


def _warned() -> _Warned:
    return _state.current().part(_Warned)


def before_backward(loss: torch.Tensor) -> None:
    """Called by ``distify.backward`` with more than one process, before back-propagating.

    Args:
        loss: the tensor about to be back-propagated.

    Raises:
        DistifyError: no DDP training forward made this loss (unless allowed), or, in debug
            mode, the ranks are not at the same call or their weights differ.
    """
    settings = _state.settings()
    forwards, synced = _model.take_forwards()
    if not forwards and getattr(loss, "requires_grad", False):
        _refuse("backward", _NO_DDP_FORWARD.format(n=settings.world_size), settings)
    if settings.debug:
        how = "DDP all-reduce" if synced else "no_sync" if forwards else "no DDP forward"
        _debug.before_backward(f"backward ({how})", _model.synced_modules())


def watch_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Refuse, before each step, parameters with a gradient that DDP does not average.

    Args:
        optimizer: a prepared optimizer (with more than one process).
    """
    optimizer.register_step_pre_hook(_StepCheck())


class _StepCheck:
    """An optimizer step pre-hook; keeps the optimizer's parameters outside DDP until its
    param groups (or the prepared models) change, so a step usually costs one comparison."""

    def __init__(self) -> None:
        self.key: Any = None
        self.unsynced: tuple[torch.Tensor, ...] = ()

    def __call__(self, optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        if "optimizer" in _warned():
            return
        version, synced = _model.synced_parameter_ids()
        key = (version, tuple((id(group["params"]), len(group["params"]))
                              for group in optimizer.param_groups))
        if key != self.key:
            self.key = key
            self.unsynced = tuple(param for group in optimizer.param_groups
                                  for param in group["params"] if id(param) not in synced)
        if self.unsynced:
            stray = [param for param in self.unsynced if param.grad is not None]
            if stray:
                _refuse("optimizer", _stray_message(stray), _state.settings())


def _stray_message(stray: list[torch.Tensor]) -> str:
    shapes = ", ".join(str(tuple(param.shape)) for param in stray[:3])
    shapes += ", ..." if len(stray) > 3 else ""
    count = f"{len(stray)} parameter tensor{'s' if len(stray) > 1 else ''}"
    owner = _model.parameter_name(stray[0])
    fix = (f"the first, {owner}, did not require grad when its model was prepared, and DDP "
           "only averages what did: set requires_grad before distify.prepare(model)"
           if owner else "prepare the module that owns them with "
           "`module = distify.prepare(module)` and compute the loss through its forward")
    plural = "s" if len(stray) > 1 else ""
    return (f"optimizer.step(): {count} with a gradient (shape{plural} {shapes}) belong to no "
            f"prepared model under DDP, so their gradients are not averaged across the "
            f"{_state.world_size()} processes and the replicas will drift apart: {fix}")


def _refuse(cause: str, message: str, settings: _state.Settings) -> None:
    if not settings.allow_unsynced:
        raise DistifyError(message + _ALLOW)
    warned = _warned()
    if cause not in warned:
        warned.add(cause)
        warnings.warn(message + _WARNED, stacklevel=4)
