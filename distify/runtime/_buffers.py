"""Buffers under DDP: after each training forward, every rank holds the main process's.

DDP broadcasts rank 0's buffers at the *start* of a training forward, so after the last one
each rank keeps what its own batch made of them (BatchNorm's ``running_mean``, ``running_var``
and ``num_batches_tracked``): every rank then evaluates its shard with its own statistics, and
the checkpoint the main process writes holds statistics the other ranks never used. Syncing
at evaluation time instead would put a collective where only the main process may be (sample
generation under ``if distify.is_main_process():``). So a prepared model's DDP does not sync
buffers in its forward; :func:`broadcast_from_main` runs right *after* each training forward
instead: one collective per training forward, as DDP's own sync costs, and between forwards
every rank holds rank 0's buffers, whatever runs next (an evaluation, a save, a sample).

Which buffers: the floating-point and integer buffers of the modules in training mode (a
BatchNorm in eval mode, say a frozen one, does not update its statistics), minus those DDP is
told to ignore, all in one broadcast of their bytes. After a ``sync_gradients(False)``
micro-step too: its forward changed them as well. A model without buffers pays nothing.

What it deliberately does not do: average the statistics over the ranks (SyncBatchNorm does,
with ``DISTIFY_SYNC_BATCHNORM`` on GPUs); or touch forwards that bypass DDP (evaluation, or a
train-mode forward under ``torch.no_grad()`` such as BatchNorm recalibration): those keep what
each rank computed, since a collective there could hang.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from . import _debug, _state

_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def has_buffers(model: nn.Module) -> bool:
    """Whether ``model`` has buffers at all (DDP, too, decides that once, when it is built)."""
    return next(model.buffers(), None) is not None


def broadcast_from_main(model: nn.Module, class_name: str) -> None:
    """Overwrite this rank's training-mode buffers of ``model`` with the main process's.

    Args:
        model: a prepared model under DDP, right after a training forward.
        class_name: the model's class, to name the collective in debug mode.
    """
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for buffer in _changing_buffers(model):
        by_device.setdefault(buffer.device, []).append(buffer)
    for buffers in by_device.values():
        _broadcast(buffers, class_name)


def _changing_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The buffers a training forward may have changed, in the same order on every rank."""
    ignored = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ()))
    seen: set[int] = set()
    found = []
    for prefix, module in model.named_modules():
        if not module.training:
            continue
        for name, buffer in module._buffers.items():
            if (buffer is None or id(buffer) in seen or buffer.layout is not torch.strided
                    or not (buffer.is_floating_point() or buffer.dtype in _INTEGERS)
                    or f"{prefix}.{name}".lstrip(".") in ignored):
                continue
            seen.add(id(buffer))
            found.append(buffer)
    # Widest elements first: then each one's bytes start at a multiple of its element size
    # in the packed tensor, so they can be viewed back as their own dtype.
    found.sort(key=lambda buffer: -buffer.element_size())
    return found


def _broadcast(buffers: list[torch.Tensor], class_name: str) -> None:
    with torch.no_grad():
        packed = torch.cat([buffer.reshape(-1).view(torch.uint8) for buffer in buffers])
        if _state.state().debug:
            _debug.check(f"broadcast_buffers({class_name}, {len(buffers)} tensors, "
                         f"{packed.numel()} bytes)")
        dist.broadcast(packed, src=0)
        if _state.rank() == 0:
            return
        unpacked = [chunk.view(buffer.dtype).view(buffer.shape) for buffer, chunk in
                    zip(buffers, packed.split([b.numel() * b.element_size() for b in buffers]))]
        # Through ``.data``, which autograd does not count: the forward saved these buffers
        # for its backward (BatchNorm's running statistics are inputs of its backward), which
        # would refuse a counted in-place write. In training mode BatchNorm's backward uses
        # the batch statistics, not the running ones, so the new values do not change it.
        torch._foreach_copy_([buffer.data for buffer in buffers], unpacked)
