"""Apply a function to every tensor inside a nested batch or model output, keeping its types."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, MutableMapping
from typing import Any, Callable

import torch


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Return ``obj`` with ``fn`` applied to each tensor; other leaves are returned untouched.

    Handles tuples, lists, namedtuples, dicts (and dict-like outputs such as Hugging Face's
    ``ModelOutput``/``BatchEncoding``) and dataclasses.
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        return _map_mapping(obj, fn)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(item, fn) for item in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(item, fn) for item in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _map_dataclass(obj, fn)
    return obj


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside ``obj``, in traversal order."""
    found: list[torch.Tensor] = []
    map_tensors(obj, found.append)
    return found


def _map_mapping(obj: Mapping, fn: Callable[[torch.Tensor], Any]) -> Any:
    if type(obj) is dict:
        return {key: map_tensors(value, fn) for key, value in obj.items()}
    if isinstance(obj, MutableMapping):
        # A shallow copy keeps the subclass and its extra state (defaultdict's factory,
        # ModelOutput's attributes); assigning through it keeps both views in sync.
        out = copy.copy(obj)
        for key, value in obj.items():
            out[key] = map_tensors(value, fn)
        return out
    return {key: map_tensors(value, fn) for key, value in obj.items()}


def _map_dataclass(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    out = copy.copy(obj)
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        new = map_tensors(value, fn)
        if new is not value:
            object.__setattr__(out, field.name, new)  # works for frozen dataclasses too
    return out
