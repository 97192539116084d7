"""Mixed precision: autocast, fp32 outputs, the fp16 GradScaler and everything it touches.

A layer below the prepared models (``_model`` runs its forwards under :func:`autocast`) and
below the training step (``_step``: ``backward`` and prepared optimizers, with their checks).

Under ``"no"`` every function here is a plain pass-through, so a single process computes exactly
what the original script computes.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from . import _state, _strategy
from ._errors import DistifyError
from ._subclass import PicklesAsOriginal, swap_class
from ._tree import map_tensors, tensors_in

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_HALF = (torch.float16, torch.bfloat16)
_PLAIN_BACKWARD = ("loss.backward() was called on the output of a prepared model under fp16 mixed "
                   "precision: call distify.backward(loss) instead, so the loss is scaled")



class _Precision:
    """The runtime's part (see ``_state.Runtime``) about loss scaling."""

    def __init__(self) -> None:
        self.scaler: torch.amp.GradScaler | None = None
        #: process-wide: CUDA runs backward hooks on the autograd engine's threads
        self.inside_backward = False
        self.optimizers: weakref.WeakSet = weakref.WeakSet()
        self.unscaled: weakref.WeakSet = weakref.WeakSet()  # unscaled since their last step


def _part() -> _Precision:
    return _state.current().part(_Precision)


def autocast() -> contextlib.AbstractContextManager[Any]:
    """A context that runs its body in the configured mixed precision (no-op for ``"no"``).

    Prepared models already run their forward under it; use it for a loss computed outside.
    """
    precision = _state.mixed_precision()
    if precision == "no":
        return contextlib.nullcontext()
    return torch.autocast(device_type=_state.device().type, dtype=_DTYPES[precision])


def finish_outputs(outputs: Any) -> Any:
    """Cast a prepared model's half-precision outputs to float32; under fp16, arm the check that
    catches a plain ``loss.backward()``."""
    precision = _state.mixed_precision()
    if precision == "no":
        return outputs
    outputs = map_tensors(outputs, _to_float32)
    if precision == "fp16" and torch.is_grad_enabled():
        for tensor in tensors_in(outputs):
            if tensor.requires_grad:
                tensor.register_hook(_require_distify_backward)
    return outputs


def scaled_backward(loss: torch.Tensor, settings: _state.Settings, kwargs: dict) -> None:
    """``loss.backward(**kwargs)``; under fp16 through the GradScaler (the loss scaled)."""
    if settings.mixed_precision != "fp16":
        loss.backward(**kwargs)
        return
    part = _part()
    part.inside_backward = True
    try:
        _grad_scaler().scale(loss).backward(**kwargs)
    finally:
        part.inside_backward = False


def clip_grad_norm_(parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float,
                    norm_type: float = 2.0, **kwargs: Any) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` that unscales fp16 gradients first.

    Args:
        parameters: a tensor or an iterable of tensors whose gradients are clipped.
        max_norm: the largest allowed total norm.
        norm_type: the p of the p-norm (``float("inf")`` for the max norm).
        **kwargs: passed on (``error_if_nonfinite``, ``foreach``).

    Returns:
        The total norm of the (unscaled) gradients before clipping.
    """
    params = _unscale_for(parameters)
    if _state.world_size() == 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, **kwargs)
    return _strategy.current().clip_grad_norm_(params, max_norm, norm_type, **kwargs)


def clip_grad_value_(parameters: torch.Tensor | Iterable[torch.Tensor], clip_value: float,
                     **kwargs: Any) -> None:
    """``torch.nn.utils.clip_grad_value_`` that unscales fp16 gradients first.

    Args:
        parameters: a tensor or an iterable of tensors whose gradients are clipped.
        clip_value: gradients are clamped to ``[-clip_value, clip_value]``.
        **kwargs: passed on (``foreach``).
    """
    torch.nn.utils.clip_grad_value_(_unscale_for(parameters), clip_value, **kwargs)


def setup_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Fit ``optimizer`` to the strategy and, under fp16, route its ``step`` through the
    GradScaler. Returns False for an optimizer already set up (nothing done)."""
    part = _part()
    if optimizer in part.optimizers:
        return False
    optimizer.step_was_skipped = False  # type: ignore[attr-defined]
    if _state.world_size() > 1:
        _strategy.current().setup_optimizer(optimizer)
    if _state.mixed_precision() == "fp16":
        _route_step_through_scaler(optimizer)
    part.optimizers.add(optimizer)
    return True


def prepare_scheduler(scheduler: Any) -> Any:
    """Return ``scheduler``; under fp16 its ``step`` does nothing after a skipped optimizer step."""
    if _state.mixed_precision() == "fp16" and not isinstance(scheduler, _SkipAwareScheduler):
        swap_class(scheduler, _SkipAwareScheduler)
    return scheduler


class _SkipAwareScheduler(PicklesAsOriginal):
    """An LR scheduler that does not advance when its optimizer's last step was skipped."""

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self.optimizer, "step_was_skipped", False):  # type: ignore[attr-defined]
            return None
        return super().step(*args, **kwargs)  # type: ignore[misc]


def loss_scaler() -> torch.amp.GradScaler | None:
    """The fp16 loss scaler, once made (None before the first fp16 backward, or without fp16)."""
    return _part().scaler


def _grad_scaler() -> torch.amp.GradScaler:
    part = _part()
    if part.scaler is None:
        part.scaler = torch.amp.GradScaler(_state.device().type) \
            if _state.world_size() == 1 else _strategy.current().grad_scaler()
    return part.scaler


def _route_step_through_scaler(optimizer: torch.optim.Optimizer) -> None:
    inner = optimizer.step  # may already be an LR scheduler's wrapper: keep calling it
    scaler = _grad_scaler()
    busy = [False]

    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        self._opt_called = True  # what torch's LR-scheduler wrapper records, for its warnings
        if busy[0]:  # GradScaler.step calls optimizer.step back for the real update
            return inner(*args, **kwargs)
        busy[0] = True
        try:
            scale = scaler.get_scale()
            result = scaler.step(self, *args, **kwargs)
            scaler.update()
        finally:
            busy[0] = False
            _part().unscaled.discard(self)
        # The scale only goes down when inf/nan gradients made the scaler skip the step.
        self.step_was_skipped = scaler.get_scale() < scale  # type: ignore[attr-defined]
        return result

    # LR schedulers created later must not wrap this step again (torch checks this marker).
    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    # A bound method, like the one it replaces: torch's LR schedulers read `step.__func__`.
    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]


def _unscale_for(parameters: torch.Tensor | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    params = _strategy.as_list(parameters)
    part = _part()
    if part.scaler is None or _state.mixed_precision() != "fp16":
        return params
    wanted = {id(param) for param in params}
    for optimizer in list(part.optimizers):
        if optimizer in part.unscaled:
            continue
        if any(id(p) in wanted for group in optimizer.param_groups for p in group["params"]):
            part.scaler.unscale_(optimizer)
            part.unscaled.add(optimizer)
    return params


def _to_float32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in _HALF else tensor


def _require_distify_backward(grad: torch.Tensor) -> None:
    if not _part().inside_backward:
        raise DistifyError(_PLAIN_BACKWARD)
