"""Object collectives that work without NumPy.

torch.distributed's own ``broadcast_object_list`` / ``all_gather_object`` turn the received
bytes back into an object with ``tensor.numpy()``, so on an install without NumPy (torch's CPU
wheel does not bring it) every rank but the sender fails with ``Numpy is not available``. These
pickle the same way, move the bytes as uint8 tensors with plain collectives, and copy them back
into a ``bytearray`` through ``torch.frombuffer`` (one memcpy, exact)."""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

from . import _strategy


def broadcast_object(obj: Any, src: int, device: torch.device) -> Any:
    """``src``'s ``obj`` on every rank (only ``src``'s value is used)."""
    sender = dist.get_rank() == src
    data = _dumps(obj) if sender else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    _strategy.current().broadcast(size, src=src)
    if sender:
        payload = _to_tensor(data, device)
    else:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    _strategy.current().broadcast(payload, src=src)
    return obj if sender else pickle.loads(_to_bytes(payload))


def all_gather_object(obj: Any, device: torch.device) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    data = _dumps(obj)
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(dist.get_world_size())]
    _strategy.current().all_gather(sizes, size)
    lengths = [int(s.item()) for s in sizes]
    local = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    local[: len(data)] = _to_tensor(data, device)
    parts = [torch.empty_like(local) for _ in lengths]
    _strategy.current().all_gather(parts, local)
    return [pickle.loads(_to_bytes(part[:length])) for part, length in zip(parts, lengths)]


def _dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _to_tensor(data: bytes, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def _to_bytes(tensor: torch.Tensor) -> bytes:
    buffer = bytearray(tensor.numel())
    torch.frombuffer(buffer, dtype=torch.uint8).copy_(tensor.reshape(-1))
    return bytes(buffer)
