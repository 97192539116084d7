"""The DDP strategy: every process holds the whole model; DDP averages the gradients.

The DistributedDataParallel object is kept aside (the prepared model stays the user's object,
see ``_model``) and only training forwards go through it. It does not sync buffers at the start
of each training forward: ``_buffers`` broadcasts the main process's right after it instead, so
every rank evaluates (and the main process saves) the same BatchNorm statistics.

``DISTIFY_FIND_UNUSED_PARAMETERS=1`` builds DDP with ``find_unused_parameters=True``, for models
whose forward leaves some parameters out.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import _debug
from ._strategy import DistributedModel, Strategy, register
from ._subclass import original_class

_TRUE = ("1", "true", "yes", "on")


@register
class DDPStrategy(Strategy):
    """DistributedDataParallel: replicas, gradients averaged in the backward."""

    name = "ddp"

    def distribute(self, model: nn.Module) -> DistributedModel:
        settings = self.settings
        if settings.debug:  # building DDP broadcasts the main process's weights: a collective
            _debug.check(f"prepare({original_class(model).__name__})")
        device_ids = [settings.device.index] if settings.device.type == "cuda" else None
        find_unused = os.environ.get("DISTIFY_FIND_UNUSED_PARAMETERS", "").strip().lower() \
            in _TRUE
        ddp = DistributedDataParallel(model, device_ids=device_ids,
                                      find_unused_parameters=find_unused)
        # Built with its defaults, DDP has broadcast the main process's buffers with its
        # weights; from now on ``_buffers`` syncs them after each training forward instead of
        # DDP before. (Not ``broadcast_buffers=False`` above: that would leave the buffers out
        # of that first broadcast, and torch 2.13 deprecates the argument.)
        ddp.broadcast_buffers = False
        return DDPModel(ddp)


class DDPModel(DistributedModel):
    """A prepared model's DDP object: training forwards go through it."""

    def __init__(self, ddp: DistributedDataParallel) -> None:
        self.ddp: DistributedDataParallel | None = ddp

    def forward(self, args: tuple, kwargs: dict, sync: bool) -> Any:
        ddp = self.ddp
        assert ddp is not None, "the process group was left already"
        ddp.require_backward_grad_sync = sync  # what DDP.no_sync() toggles
        return ddp(*args, **kwargs)

    def synced_parameters(self) -> tuple[tuple[str, nn.Parameter], ...]:
        assert self.ddp is not None
        return averaged_parameters(self.ddp.module)

    def release(self) -> None:
        self.ddp = None


def averaged_parameters(module: nn.Module) -> tuple[tuple[str, nn.Parameter], ...]:
    """What DDP averages: the parameters that require a gradient when it is built, minus
    those it is told to ignore."""
    ignored = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
    return tuple((name, param) for name, param in module.named_parameters()
                 if param.requires_grad and name not in ignored)
