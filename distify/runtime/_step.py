"""The training step: ``distify.backward`` and prepared optimizers, with the checks around them.

Above the prepared models (``_model``) and mixed precision (``_precision``): a backward first
asks ``_guard`` whether a prepared model made the loss, then runs the (scaled) backward while
``_progress`` tracks its gradient all-reduce, then lets ``_replicas`` count it towards the next
replica check; a prepared optimizer is fitted to the strategy and the loss scaler, and watched
by the same two checks. In a single process none of the checks runs: the script computes exactly
what the original does.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _guard, _precision, _progress, _replicas, _state

#: how the runtime's messages name the wait in a backward (``_progress``)
_GRADIENT_WAIT = "the gradient all-reduce of backward #{n}"


def backward(loss: torch.Tensor, **kwargs: Any) -> None:
    """Back-propagate ``loss``; under fp16 the loss is scaled by the GradScaler first.

    With more than one process, a loss that no prepared model's training forward produced
    since the previous backward is refused: its gradients would not be averaged across the
    processes (``DISTIFY_ALLOW_UNSYNCED=1`` makes that one warning instead).

    Args:
        loss: the scalar loss (or any tensor ``Tensor.backward`` accepts).
        **kwargs: passed to ``Tensor.backward`` (``retain_graph``, ``gradient``, ...).

    Raises:
        DistifyError: with more than one process, no prepared model's DDP forward made the
            loss; in debug mode (``DISTIFY_DEBUG=1``), the ranks are at different calls or
            their weights differ.
    """
    settings = _state.settings()
    if settings.world_size == 1:
        _precision.scaled_backward(loss, settings, kwargs)
        return
    _guard.before_backward(loss)
    with _progress.waiting("backward", _GRADIENT_WAIT):
        _precision.scaled_backward(loss, settings, kwargs)
    _replicas.after_backward()  # every rank is here as often: DDP pairs the backwards


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Return ``optimizer`` itself; under fp16 its ``step`` goes through the GradScaler.

    With more than one process, its ``step`` refuses to update parameters that have a gradient
    but belong to no prepared model under DDP (``DISTIFY_ALLOW_UNSYNCED=1``: one warning).
    """
    if _precision.setup_optimizer(optimizer) and _state.world_size() > 1:
        _guard.watch_optimizer(optimizer)
        _replicas.watch_optimizer(optimizer)
    return optimizer
