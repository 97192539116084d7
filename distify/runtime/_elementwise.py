"""Elementwise sums of per-class counters: ``class_correct[label] += 1`` kept in a Python list, a
NumPy array, a dict or a nested list, summed over all ranks and given back in the same shape and
types, so that what the script prints after the loop is what one process would print.

Every leaf travels in one of two buffers: int64 for Python ints, bools and integer arrays, float64
for floats and float arrays (a float32 array is summed in float64 and cast back). Tensors inside
the container are summed in their own dtype. A dict may hold different keys on different ranks (a
``defaultdict(int)`` or ``Counter`` a rank's shard never filled for some class): the result holds
every key of every rank, a missing one counting as zero, the main process's keys first, in their
order, then the others' in rank order.

What it deliberately does not do: it never sums containers whose shapes differ between ranks
(lists of different lengths, arrays of different shapes): it raises instead, naming the shapes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from . import _objects, _state, _strategy
from ._errors import DistifyError, DistifyTypeError


def is_container_of_numbers(value: Any) -> bool:
    """A list, tuple, dict or NumPy array whose leaves are numbers (or arrays, or tensors)."""
    if _is_ndarray(value):
        return value.dtype.kind in "biuf"
    if isinstance(value, Mapping) or (isinstance(value, (list, tuple))
                                      and not hasattr(value, "_fields")):
        items = value.values() if isinstance(value, Mapping) else value
        return all(_is_leaf(item) or is_container_of_numbers(item) for item in items)
    return False


def reduce_elementwise(value: Any, op: str) -> Any:
    """``value`` (see :func:`is_container_of_numbers`) with every number combined over all
    ranks by ``op`` ("sum", "mean", "max", "min"); a new object of the same types."""
    keys = _union_keys(value, op)
    layout = _Layout()
    skeleton = layout.flatten(value, keys)
    signatures = _objects.all_gather_object(layout.signature, _state.comm_device())
    other = next((rank for rank, signature in enumerate(signatures)
                  if signature != signatures[0]), None)
    if other is not None:  # seen alike on every rank: they all raise
        raise DistifyError("distify.reduce: the ranks' containers differ in shape "
                           f"({signatures[0]} on rank 0, {signatures[other]} on rank {other}): "
                           "make them the same size on every rank")
    # the layouts are equal on every rank, so every rank skips the same empty buffers
    ints = _combine(torch.tensor(layout.ints, dtype=torch.int64), op) if layout.ints else None
    floats = (_combine(torch.tensor(layout.floats, dtype=torch.float64), op)
              if layout.floats else None)
    tensors = [_combine(tensor, op) for tensor in layout.tensors]
    return layout.rebuild(skeleton, [] if ints is None else ints.tolist(),
                          [] if floats is None else floats.tolist(), tensors)


def _is_leaf(value: Any) -> bool:
    return isinstance(value, (bool, int, float, torch.Tensor)) or _is_numpy_number(value) \
        or (_is_ndarray(value) and value.dtype.kind in "biuf")


def _is_ndarray(value: Any) -> bool:
    kind = type(value)
    return kind.__name__ == "ndarray" and kind.__module__ == "numpy"


def _is_numpy_number(value: Any) -> bool:
    kind = type(value)
    return kind.__module__ == "numpy" and getattr(value, "shape", None) == () \
        and hasattr(value, "item")


def _union_keys(value: Any, op: str) -> dict[int, list]:
    """For every dict inside ``value`` (by traversal number), the keys of all ranks, when
    they differ between ranks; one object collective when ``value`` holds a dict at all."""
    mine: list[list] = []
    _collect_keys(value, mine)
    if not mine:
        return {}
    everyone = _objects.all_gather_object(mine, _state.comm_device())
    if any(len(keys) != len(mine) for keys in everyone):
        raise DistifyError("distify.reduce: the ranks' containers hold different numbers of "
                           "dicts: make them the same on every rank")
    union: dict[int, list] = {}
    for index in range(len(mine)):
        merged = list(dict.fromkeys(key for rank_keys in everyone for key in rank_keys[index]))
        if any(rank_keys[index] != merged for rank_keys in everyone):  # decided alike on all
            if op != "sum":
                raise DistifyError(f"distify.reduce(op={op!r}): the ranks' dicts hold different "
                                   "keys; only a sum counts a missing key as zero")
            union[index] = merged
    return union


def _collect_keys(value: Any, found: list[list]) -> None:
    if isinstance(value, Mapping):
        found.append(list(value.keys()))
        for item in value.values():
            _collect_keys(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_keys(item, found)


class _Layout:
    """Where each leaf of a container goes in the buffers, and how to rebuild it."""

    def __init__(self) -> None:
        self.ints: list[int] = []
        self.floats: list[float] = []
        self.tensors: list[torch.Tensor] = []
        self.signature: list = []
        self._dicts = 0

    def flatten(self, value: Any, keys: dict[int, list]) -> Any:
        """A skeleton of ``value`` whose leaves are ("kind", position, like) records."""
        if isinstance(value, Mapping):
            index, self._dicts = self._dicts, self._dicts + 1
            names = keys.get(index, list(value.keys()))
            self.signature.append(("dict", len(names)))
            factory = getattr(value, "default_factory", None)
            zero = factory() if factory is not None else _zero_like(next(iter(value.values()), 0))
            return ("dict", value, [(k, self.flatten(value.get(k, zero), keys)) for k in names])
        if isinstance(value, (list, tuple)) and not _is_leaf(value):
            self.signature.append((type(value).__name__, len(value)))
            return ("seq", value, [self.flatten(item, keys) for item in value])
        if isinstance(value, torch.Tensor):
            self.signature.append(("tensor", str(value.dtype), tuple(value.shape)))
            self.tensors.append(value)
            return ("tensor", len(self.tensors) - 1, value)
        if _is_ndarray(value):
            self.signature.append(("array", str(value.dtype), tuple(value.shape)))
            return self._numbers(value.reshape(-1).tolist(), value.dtype.kind in "fc", value)
        if _is_numpy_number(value):
            return self._numbers([value.item()], isinstance(value.item(), float), value)
        if not isinstance(value, (bool, int, float)):
            raise DistifyTypeError(f"distify.reduce: a container of numbers cannot hold "
                                   f"{type(value).__name__}")
        self.signature.append(type(value).__name__)
        return self._numbers([value], isinstance(value, float), value)

    def _numbers(self, numbers: list, floating: bool, like: Any) -> tuple:
        target = self.floats if floating else self.ints
        start = len(target)
        target.extend(numbers)
        return ("float" if floating else "int", (start, len(numbers)), like)

    def rebuild(self, node: tuple, ints: list, floats: list[float],
                tensors: list[torch.Tensor]) -> Any:
        kind, where, like = node
        if kind == "dict":
            out = copy.copy(where)  # keeps a defaultdict's factory, a Counter's type
            out.clear()
            for key, child in like:
                out[key] = self.rebuild(child, ints, floats, tensors)
            return out
        if kind == "seq":
            items = [self.rebuild(child, ints, floats, tensors) for child in like]
            return type(where)(items)
        if kind == "tensor":
            return tensors[where]
        start, count = where
        values = ints[start:start + count] if kind == "int" else floats[start:start + count]
        if _is_ndarray(like):
            floating = kind == "float" or any(isinstance(v, float) for v in values)
            tensor = torch.tensor(values, dtype=torch.float64 if floating else torch.int64)
            array = tensor.numpy().reshape(like.shape)
            if like.dtype.kind == "b" or (floating and like.dtype.kind != "f"):
                return array  # counts of Trues, a mean of ints
            return array.astype(like.dtype)
        value = values[0]
        if _is_numpy_number(like):
            return type(like)(value)
        if isinstance(like, bool) or (isinstance(value, float) and not isinstance(like, float)):
            return value  # a count of Trues, a mean of ints
        return type(like)(value)


def _zero_like(value: Any) -> Any:
    """What a key missing on this rank holds: a zero of the type its other values have."""
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if _is_ndarray(value):
        return value * 0
    if isinstance(value, (list, tuple)):
        return type(value)(_zero_like(item) for item in value)
    return type(value)(0) if isinstance(value, (int, float)) else 0


def _combine(tensor: torch.Tensor, op: str) -> torch.Tensor:
    """All ranks' ``tensor`` combined by ``op``, on the tensor's device and in its dtype."""
    work = tensor.detach().to(_state.comm_device(), copy=True)
    if op == "mean" and not work.is_floating_point():
        work = work.to(torch.float64)
    _strategy.current().all_reduce(work, op={"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM,
                                             "max": dist.ReduceOp.MAX,
                                             "min": dist.ReduceOp.MIN}[op])
    if op == "mean":
        work = work / _state.world_size()
    return work.to(tensor.device)
