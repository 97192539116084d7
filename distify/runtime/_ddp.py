"""The DDP strategy: every process holds the whole model; DDP averages the gradients.

The DistributedDataParallel object is kept aside (the prepared model stays the user's object,
see ``_model``) and only training forwards go through it. It does not sync buffers at the start
of each training forward: ``_buffers`` broadcasts the main process's right after it instead, so
every rank evaluates (and the main process saves) the same BatchNorm statistics.

A prepared model that is moved or cast and back (checkpointing code calls ``model.cpu()``,
``.half()`` or ``.to(other)``, saves, and moves it back) loses DDP's gradient hooks: torch gives
a parameter whose dtype or device changed a new gradient accumulator, and DDP's reducer hooked
the old one, so gradients would silently stop being averaged. :meth:`DDPModel.after_move` hooks
the new accumulators to the reducer (as DDP itself does for its mixed precision), and a training
forward while the parameters are still away from where DDP was built stops with an error naming
the line of the move.

``DISTIFY_FIND_UNUSED_PARAMETERS=1`` builds DDP with ``find_unused_parameters=True``, for models
whose forward leaves some parameters out.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import _debug
from ._errors import DistifyError
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
        # The reducer's parameters in its order, where they were when DDP was built, and the
        # gradient accumulators its hooks are on (the reducer keeps these alive anyway).
        self.params = [param for _, param in averaged_parameters(ddp.module)]
        self.places = [(param.dtype, param.device) for param in self.params]
        self.accumulators = [_accumulator(param) for param in self.params]
        #: why the next training forward must not run (a move away from the places above)
        self.moved: str | None = None

    def forward(self, args: tuple, kwargs: dict, sync: bool) -> Any:
        ddp = self.ddp
        assert ddp is not None, "the process group was left already"
        if self.moved is not None:
            raise DistifyError(self.moved)
        ddp.require_backward_grad_sync = sync  # what DDP.no_sync() toggles
        return ddp(*args, **kwargs)

    def synced_parameters(self) -> tuple[tuple[str, nn.Parameter], ...]:
        assert self.ddp is not None
        return averaged_parameters(self.ddp.module)

    def after_move(self) -> None:
        ddp = self.ddp
        if ddp is None:
            return
        name = _original_name(ddp.module)
        for param, (dtype, device) in zip(self.params, self.places):
            if (param.dtype, param.device) != (dtype, device):
                self.moved = (
                    f"distify: {name} was moved to {param.dtype} on {param.device} at "
                    f"{_debug.call_site()} after distify.prepare and is trained there, where DDP "
                    f"does not average its gradients: move it back first (to {dtype} on "
                    f"{device}, e.g. model.to(distify.device()) or model.float()), or convert "
                    "it before distify.prepare")
                return
        self.moved = None
        for index, param in enumerate(self.params):
            node = _accumulator(param)
            if node is self.accumulators[index]:
                continue
            if ddp.find_unused_parameters:  # the reducer looks for its own accumulators
                self.moved = (
                    f"distify: {name} was cast or moved and back at {_debug.call_site()} after "
                    "distify.prepare, which detaches DDP's gradient hooks, and with "
                    "DISTIFY_FIND_UNUSED_PARAMETERS=1 they cannot be re-attached: save a copy "
                    "instead (e.g. {k: v.cpu() for k, v in model.state_dict().items()})")
                return
            node.register_hook(_ReducerHook(ddp.reducer, index))
            self.accumulators[index] = node  # hooks live on the node: keep it alive

    def release(self) -> None:
        self.ddp = None
        self.accumulators = []


class _ReducerHook:
    """A post-hook on a parameter's new gradient accumulator: tell DDP's reducer the
    gradient is ready, as the hook DDP put on the old accumulator did."""

    def __init__(self, reducer: Any, index: int) -> None:
        self.reducer = reducer
        self.index = index

    def __call__(self, *_: Any) -> None:
        self.reducer._autograd_hook(self.index)


def _accumulator(param: nn.Parameter) -> Any:
    """The autograd node that accumulates ``param``'s gradient (made if there is none)."""
    with torch.inference_mode(False), torch.enable_grad():
        return param.view_as(param).grad_fn.next_functions[0][0]


def _original_name(module: nn.Module) -> str:
    return original_class(module).__name__


def averaged_parameters(module: nn.Module) -> tuple[tuple[str, nn.Parameter], ...]:
    """What DDP averages: the parameters that require a gradient when it is built, minus
    those it is told to ignore."""
    ignored = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
    return tuple((name, param) for name, param in module.named_parameters()
                 if param.requires_grad and name not in ignored)
