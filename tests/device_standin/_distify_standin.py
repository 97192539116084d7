"""A test-only accelerator: tensors that say they live on ``standin:0`` but compute on the CPU.

There is no GPU on the test machines, so a conversion that leaves a model on the GPU and its data
on the CPU (or the reverse) would go unnoticed: everything is on the CPU. This module makes a
second device that behaves like a GPU where it matters here:

- torch's PrivateUse1 backend is registered from Python under the name ``standin``
  (``torch.utils.backend_registration._setup_privateuseone_for_python_backend``), so
  ``torch.accelerator.current_accelerator()`` is ``standin`` and ``distify.device()`` is
  ``standin:0`` (the runtime takes another accelerator than CUDA/MPS in a single process);
- a tensor on it is an :class:`OnStandIn`, a wrapper subclass whose ``.device`` is
  ``standin:0`` and which holds a CPU tensor; ``.to("standin")``, ``device="standin"`` and
  ``.to(other_standin_tensor.device)`` make one, ``.cpu()`` / ``.to("cpu")`` unwrap it;
- every aten op runs through :class:`_StandInMode`: an op that mixes a stand-in tensor with a CPU
  tensor (other than a 0-dim one, which CUDA accepts too) raises torch's own message, "Expected
  all tensors to be on the same device", and ``.numpy()`` on a stand-in tensor fails as on a GPU.
  Copies between devices (``copy_``, ``.to``) and CPU index tensors are allowed, as on CUDA.

What it deliberately does not do: CUDA names. ``torch.cuda.is_available()`` stays False, so a
script's own ``"cuda" if torch.cuda.is_available() else "cpu"`` still picks the CPU: a line the
conversion missed keeps its data on the CPU while the prepared model is on the stand-in, which is
the mismatch a GPU machine would show. No mixed precision, no process group (world size 1 only).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "standin"
#: ``standin:0``, once :func:`install` has named the backend
DEVICE = torch.device("cpu")
aten = torch.ops.aten

#: ops that may take tensors on two devices on a GPU too: copies between devices, CPU indices
_CROSS_DEVICE = {aten.copy_.default, aten._to_copy.default, aten.index.Tensor,
                 aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default,
                 aten.lift_fresh.default, aten.set_.source_Tensor}


class OnStandIn(torch.Tensor):
    """A tensor on the stand-in device: a CPU tensor (``inner``) that reports ``standin:0``."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> OnStandIn:
        made = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, layout=inner.layout, device=DEVICE,
            requires_grad=inner.requires_grad)
        made.inner = inner
        return made

    def __repr__(self, *, tensor_contents=None) -> str:
        return f"{self.inner!r} on {DEVICE}"

    def __format__(self, spec: str) -> str:
        return self.inner.__format__(spec)

    def tolist(self):  # works on a GPU tensor too
        return self.inner.tolist()

    def __reduce_ex__(self, proto):
        # saved as its CPU data with its device, and loaded back onto the stand-in (or where
        # map_location says), weights_only too, as a GPU tensor is
        return (_rebuild, (self.inner.detach(), str(self.device), self.requires_grad,
                           bool(getattr(self, "_is_param", False))))

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return OnStandIn(inner_tensors["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _rebuild(data: torch.Tensor, location: str, requires_grad: bool,
             is_param: bool) -> torch.Tensor:
    """A saved stand-in tensor, loaded. A ``map_location`` function counts as "where it was
    saved" (distify.load's sends accelerator tensors to ``distify.device()``, the stand-in)."""
    wanted = torch.serialization._serialization_tls.map_location
    if isinstance(wanted, dict):
        location = wanted.get(location, location)
    elif isinstance(wanted, (str, torch.device)):
        location = str(wanted)
    tensor = data.to(location)
    if is_param:
        return torch.nn.Parameter(tensor, requires_grad)
    return tensor.requires_grad_(requires_grad)


def _is_standin(device) -> bool:
    if device is None:
        return False
    if isinstance(device, int):  # `.to(0)`: an accelerator index
        return True
    return torch.device(device).type == NAME


def _mixes(func, leaves: list) -> tuple[torch.device, torch.device] | None:
    if func in _CROSS_DEVICE:
        return None
    standin = any(isinstance(leaf, OnStandIn) for leaf in leaves)
    cpu = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)
           and not isinstance(leaf, OnStandIn) and leaf.device.type == "cpu" and leaf.dim() > 0]
    return (DEVICE, cpu[0].device) if standin and cpu else None


def _run(func, args, kwargs):
    leaves, _ = tree_flatten((args, kwargs))
    mixed = _mixes(func, leaves)
    if mixed is not None:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least "
                           f"two devices, {mixed[0]} and {mixed[1]}! (when checking argument "
                           f"for {func}; device stand-in, tests/device_standin)")
    target = kwargs.get("device")
    on_standin = _is_standin(target) if "device" in kwargs and target is not None else any(
        isinstance(leaf, OnStandIn) for leaf in leaves)
    if "device" in kwargs and _is_standin(target):
        kwargs = {**kwargs, "device": torch.device("cpu")}
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    if _writes_first(func) and args and isinstance(args[0], torch.Tensor):
        return args[0]  # an in-place op returns its own argument
    return tree_map(_wrap, out) if on_standin else out


def _writes_first(func) -> bool:
    arguments = func._schema.arguments
    return bool(arguments) and arguments[0].alias_info is not None \
        and arguments[0].alias_info.is_write


def _unwrap(value):
    return value.inner if isinstance(value, OnStandIn) else value


def _wrap(value):
    if isinstance(value, torch.Tensor) and not isinstance(value, OnStandIn):
        return OnStandIn(value)
    return value


class _Module(torch.utils.backend_registration._DummyBackendModule):
    """``torch.standin``: what torch asks of a backend's module (autocast's dtypes too)."""

    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    def is_autocast_enabled(self) -> bool:
        return False

    def get_autocast_dtype(self) -> torch.dtype:
        return torch.float16

    def set_autocast_enabled(self, enabled: bool) -> None:
        pass

    def set_autocast_dtype(self, dtype: torch.dtype) -> None:
        pass


class _StandInMode(TorchDispatchMode):
    """Sees every aten op, so factories (``torch.zeros(..., device="standin")``) and moves of
    CPU tensors (``x.to("standin")``) make stand-in tensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


_MODE: _StandInMode | None = None
_LIBRARY: torch.library.Library | None = None


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return OnStandIn(torch.empty_strided(size, stride, dtype=dtype, device="cpu"))


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return OnStandIn(torch.empty(size, dtype=dtype, device="cpu"))


def _register_factories() -> None:
    """Tensors torch makes in C++ past the mode (a list index ``x[:, [-1]]`` becomes an index
    tensor on ``x``'s device): the backend's own empty tensors (stand-in tensors) and copy."""
    global _LIBRARY
    _LIBRARY = torch.library.Library("aten", "IMPL")
    _LIBRARY.impl("empty_strided", _empty_strided, "PrivateUse1")
    _LIBRARY.impl("empty.memory_format", _empty, "PrivateUse1")
    _LIBRARY.impl("_copy_from", _copy_from, "PrivateUse1")


def _copy_from(source, destination, non_blocking=False):
    _unwrap(destination).copy_(_unwrap(source))
    return destination


def install() -> None:
    """Register the stand-in accelerator and route every op of this process through it."""
    global _MODE, DEVICE
    if _MODE is not None:
        return
    torch.utils.backend_registration._setup_privateuseone_for_python_backend(
        NAME, backend_module=_Module())
    torch.serialization.add_safe_globals([_rebuild])
    _register_factories()
    # DataLoader(pin_memory=True) pins for the accelerator; the stand-in's memory is the CPU's
    pin_memory = torch.utils.data._utils.pin_memory
    pin_memory.pin_memory = lambda data, device=None: data
    DEVICE = torch.device(NAME, 0)
    _MODE = _StandInMode()
    _MODE.__enter__()
