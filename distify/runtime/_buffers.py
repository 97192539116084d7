"""Buffers under DDP: after each training forward, every rank holds the main process's.

DDP broadcasts rank 0's buffers at the *start* of a training forward, so after the last one
each rank keeps what its own batch made of them (BatchNorm's ``running_mean``, ``running_var``
and ``num_batches_tracked``): every rank then evaluates its shard with its own statistics, and
the checkpoint the main process writes holds statistics the other ranks never used. Syncing
at evaluation time instead would put a collective where only the main process may be (sample
generation under ``if distify.is_main_process():``). So a prepared model's DDP does not sync
buffers in its forward; :class:`BufferSync` broadcasts them right *after* each training forward
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
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from . import _debug, _state, _strategy

_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


class BufferSync:
    """A prepared model's buffers, broadcast from the main process after a training forward.

    Where the buffers are (module and name, minus those DDP ignores) is found once, when the
    model is prepared, like DDP's own list of buffers; their tensors and the modules'
    training flags are read again at each broadcast.
    """

    def __init__(self, model: nn.Module, class_name: str) -> None:
        ignored = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ()))
        self.class_name = class_name
        self.places = [(module, name) for prefix, module in model.named_modules()
                       for name in module._buffers
                       if f"{prefix}.{name}".lstrip(".") not in ignored]

    def broadcast_from_main(self) -> None:
        """Overwrite this rank's training-mode buffers with the main process's."""
        buffers = [module._buffers.get(name) for module, name in self.places if module.training]
        broadcast_from_main([buffer for buffer in buffers if buffer is not None],
                            f"broadcast_buffers({self.class_name}")


def broadcast_from_main(tensors: list[torch.Tensor], what: str) -> None:
    """Overwrite ``tensors`` on this rank with the main process's, in place: one broadcast
    per device, of all their bytes (floating-point and integer tensors; others are skipped).

    Args:
        tensors: the same tensors, in the same order, on every rank.
        what: names the call in debug mode, e.g. ``"broadcast_buffers(Net"`` (the counts are
            appended).
    """
    groups: dict[torch.device, dict[torch.dtype, list[torch.Tensor]]] = {}
    for tensor in tensors:
        if tensor.layout is torch.strided and (tensor.is_floating_point()
                                               or tensor.dtype in _INTEGERS):
            groups.setdefault(tensor.device, {}).setdefault(tensor.dtype, []).append(tensor)
    for by_dtype in groups.values():
        _broadcast(by_dtype, what)


def _broadcast(by_dtype: dict[torch.dtype, list[torch.Tensor]], what: str) -> None:
    # One broadcast of bytes for every dtype. Widest elements first, so that each dtype's
    # bytes start at a multiple of its element size and can be viewed back as it.
    dtypes = sorted(by_dtype, key=lambda dtype: -by_dtype[dtype][0].element_size())
    with torch.no_grad():
        flats = [_flatten_dense_tensors(by_dtype[dtype]) for dtype in dtypes]
        packed = torch.cat([flat.view(torch.uint8) for flat in flats])
        if _state.settings().debug:
            count = sum(len(tensors) for tensors in by_dtype.values())
            _debug.check(f"{what}, {count} tensors, {packed.numel()} bytes)")
        _strategy.current().broadcast(packed, src=0)
        if _state.rank() == 0:
            return
        chunks = packed.split([flat.numel() * flat.element_size() for flat in flats])
        for dtype, chunk in zip(dtypes, chunks):
            tensors = by_dtype[dtype]
            # Through ``.data``, which autograd does not count: the forward saved these
            # buffers for its backward (BatchNorm's running statistics are inputs of its
            # backward), which would refuse a counted in-place write. In training mode
            # BatchNorm's backward uses the batch statistics, not the running ones, so
            # the new values do not change its gradients.
            torch._foreach_copy_([tensor.data for tensor in tensors],
                                 _unflatten_dense_tensors(chunk.view(dtype), tensors))


def for_model(model: nn.Module, class_name: str) -> BufferSync | None:
    """The buffer sync of a model under DDP; None when it has no buffers (it costs nothing).

    Args:
        model: the prepared model.
        class_name: the model's class, to name the broadcast in debug mode.
    """
    if next(model.buffers(), None) is None:
        return None
    return BufferSync(model, class_name)
