"""Test-only recorder: what this process trained, hashed at exit into ``$DISTIFY_TEST_REPLICAS``.

Started by ``sitecustomize`` (this folder) when ``DISTIFY_TEST_REPLICAS`` names a directory. At
exit, a process that torchrun (or ``distify launch``) started as rank ``RANK`` writes
``<dir>/rank<RANK>.json`` (atomically: a temporary file, then ``os.replace``), which
``tests/helpers.py`` (``check_replicas``) compares across the ranks:

- ``trained``: one entry (name, shape, dtype, sha256 of the bytes) per trained parameter, in the
  same order on every rank. Trained = the parameters of every optimizer that stepped (a global
  optimizer step post-hook), optimizers in the order of their first step, parameters in
  ``param_groups`` order; when no optimizer stepped (a manual update of ``p.data``), the
  parameters of the root modules that ran a training forward, in the order of their first one.
- ``inputs``: a sha256 of the input tensors of the first few root training forwards, so a test
  can assert that the ranks consumed different data.

A *root training forward* is a module call, with the module in training mode and gradients on,
made on the main thread while no other module call is running (global forward pre/post hooks
count the nesting), of a module with a parameter that requires a gradient (so not a loss). A
DistributedDataParallel root is recorded as its ``.module``, and a ``torch.compile`` wrapper as
its ``_orig_mod`` (the same parameters).

What it must not do, and how it avoids it:

- Change what the script computes: the hooks only read (no random numbers, no module changes,
  nothing returned that replaces an input or output). Under ``torch.compile`` the hooks return at
  once when Dynamo traces them (``torch.compiler.is_compiling()`` is constant there), so the
  compiled graph has the same operations as without them. (With a global module hook present,
  Dynamo traces child modules through ``__call__`` rather than ``forward``, and
  ``OptimizedModule`` warns that the hooks fire for it too: that warning is filtered out, the
  extra call is just the root being the wrapper.)
- Keep the process group alive at exit: it keeps strong references (the models of a ``main()``
  are gone by atexit time) to optimizers and root modules, but never to a DDP object, which
  holds the group: the runtime drops its DDP objects at exit so that destroying the group joins
  Gloo's threads before interpreter shutdown. A root module with a DDP object inside it is kept
  as a list of its named parameters instead.
- Run before the runtime's own exit handler: ``atexit`` runs handlers last-registered first, and
  this one is registered at start-up, before anything the script imports.
- Import torch itself: the torch hooks are installed right after the script's own
  ``import torch`` finishes (a meta path finder waits for it), so import order is unchanged.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import traceback
from typing import Any

ENV = "DISTIFY_TEST_REPLICAS"
INPUT_FORWARDS = 3  # root training forwards whose inputs are hashed

_directory = os.environ.get(ENV, "")
_pid = os.getpid()
_installed = False
_hooked = False  # the torch hooks are in place
_errors: list[str] = []
_optimizers: dict[int, list] = {}  # id -> [optimizer, steps], in the order of first step
_roots: dict[int, _Root] = {}  # id -> root module, in the order of first training forward
_inputs: list[dict] = []
_forwards = [0]  # root training forwards seen
_local = threading.local()
_torch: Any = None
_is_compiling: Any = None


def start() -> None:
    """Called by sitecustomize at start-up: write the record at exit, hook torch once imported."""
    atexit.register(_write_record)
    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _AfterTorchImport())


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it makes the real loader of ``torch`` install the hooks after it."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            _errors.append(f"cannot hook the import of torch (loader {loader!r})")
            return spec
        exec_module = loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            _install()

        loader.exec_module = exec_then_install
        return spec


def _install() -> None:
    global _installed, _hooked, _torch, _is_compiling
    if _installed:
        return
    _installed = True
    try:
        import warnings

        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        _torch = torch
        _is_compiling = torch.compiler.is_compiling
        optim_module.register_optimizer_step_post_hook(_after_step)
        nn_module.register_module_forward_pre_hook(_before_forward)
        nn_module.register_module_forward_hook(_after_forward, with_kwargs=True,
                                               always_call=True)
        warnings.filterwarnings(
            "ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
        _hooked = True
    except Exception:  # reported in the record: the test fails, the script runs on
        _errors.append("installing the hooks failed:\n" + traceback.format_exc())


# ----------------------------------------------------------------------------------- hooks


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    entry = _optimizers.get(id(optimizer))
    if entry is None:
        entry = _optimizers[id(optimizer)] = [optimizer, 0]
    entry[1] += 1


def _before_forward(module: Any, args: Any) -> None:
    if _is_compiling():
        return None
    _local.depth = getattr(_local, "depth", 0) + 1
    return None


def _after_forward(module: Any, args: Any, *rest: Any) -> None:
    # (kwargs, output) normally; (output,) when the forward raised (torch calls always_call
    # hooks without kwargs then)
    if _is_compiling():
        return None
    depth = getattr(_local, "depth", 1) - 1
    _local.depth = depth
    if depth == 0 and len(rest) == 2 and module.training and _torch.is_grad_enabled() \
            and threading.current_thread() is threading.main_thread() \
            and not _torch._C._get_tracing_state():
        try:
            _record_root(module, args, rest[0])
        except Exception:
            if len(_errors) < 5:
                _errors.append("recording a training forward failed:\n" + traceback.format_exc())
    return None


def _ddp_class() -> Any:
    distributed = sys.modules.get("torch.nn.parallel.distributed")
    return getattr(distributed, "DistributedDataParallel", None)


def _unwrap(module: Any) -> Any:
    ddp = _ddp_class()
    while True:
        if ddp is not None and isinstance(module, ddp):
            module = module.module
        elif type(module).__name__ == "OptimizedModule" and \
                isinstance(getattr(module, "_orig_mod", None), _torch.nn.Module):
            module = module._orig_mod
        else:
            return module


class _Root:
    """A root module that trained: the module itself, or its parameters if it holds a DDP."""

    def __init__(self, module: Any) -> None:
        self.name = type(module).__name__
        ddp = _ddp_class()
        if ddp is not None and any(isinstance(child, ddp) for child in module.modules()):
            self.module = None
            self.parameters = list(module.named_parameters())
        else:
            self.module = module
            self.parameters = None

    def named_parameters(self) -> list:
        if self.module is not None:
            return list(self.module.named_parameters())
        return self.parameters


def _record_root(module: Any, args: Any, kwargs: Any) -> None:
    root = _unwrap(module)
    if not any(p.requires_grad for p in root.parameters()):
        return  # a loss function, a frozen model: nothing of it trains
    _forwards[0] += 1
    if id(root) not in _roots:
        _roots[id(root)] = _Root(root)
    if len(_inputs) < INPUT_FORWARDS:
        tensors = _tensors((args, kwargs))
        digest = hashlib.sha256()
        for tensor in tensors:
            digest.update(_describe(tensor).encode())
            digest.update(_tensor_bytes(tensor))
        _inputs.append({"module": type(root).__name__, "sha256": digest.hexdigest(),
                        "shapes": [list(t.shape) for t in tensors]})


def _tensors(obj: Any, depth: int = 0) -> list:
    """The tensors in nested tuples, lists and dicts (dict keys sorted), in order."""
    if isinstance(obj, _torch.Tensor):
        return [obj]
    if depth > 8:
        return []
    if isinstance(obj, dict):
        keys = sorted(obj, key=str)
        return [t for key in keys for t in _tensors(obj[key], depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item, depth + 1)]
    return []


# ------------------------------------------------------------------------------ hashing


def _describe(tensor: Any) -> str:
    return f"{tensor.dtype}{list(tensor.shape)}"


def _tensor_bytes(tensor: Any) -> bytes:
    """The bytes of ``tensor``'s values (any dtype, bf16 included), on the CPU."""
    torch = _torch
    t = tensor.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous().reshape(-1)
    raw = t.view(torch.uint8)
    try:
        return raw.numpy().tobytes()
    except (RuntimeError, TypeError):  # numpy missing
        return bytes(raw.tolist())


def _sha256(tensor: Any) -> str:
    return hashlib.sha256(_tensor_bytes(tensor)).hexdigest()


def _trained() -> tuple[str, list[dict]]:
    names: dict[int, str] = {}
    for root in _roots.values():
        for name, parameter in root.named_parameters():
            names.setdefault(id(parameter), f"{root.name}.{name}")
    if _optimizers:
        source, parameters = "optimizers", []
        for number, (optimizer, _) in enumerate(_optimizers.values()):
            for g, group in enumerate(optimizer.param_groups):
                for k, parameter in enumerate(group["params"]):
                    parameters.append((names.get(id(parameter),
                                                 f"optimizer{number}.group{g}.param{k}"),
                                       parameter))
    else:
        source = "modules" if _roots else "none"
        parameters = [(names[id(p)], p) for root in _roots.values()
                      for _, p in root.named_parameters()]
    entries, seen = [], set()
    for name, parameter in parameters:
        if id(parameter) in seen:  # shared, or in two optimizers: hashed once
            continue
        seen.add(id(parameter))
        entries.append({"name": name, "shape": list(parameter.shape),
                        "dtype": str(parameter.dtype).replace("torch.", ""),
                        "sha256": _sha256(parameter)})
    return source, entries


# ------------------------------------------------------------------------------ the record


def _spawned_child() -> bool:
    """A multiprocessing child of the rank (it inherits RANK): not the rank's record."""
    mp = sys.modules.get("multiprocessing")
    return mp is not None and mp.parent_process() is not None


def _write_record() -> None:
    rank = os.environ.get("RANK")
    if rank is None or os.getpid() != _pid or not _directory or _spawned_child():
        return  # the launcher itself, a forked or spawned child
    record: dict[str, Any] = {
        "rank": int(rank), "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "pid": _pid, "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
        "script": sys.argv[0] if sys.argv else None,
        # an uncaught exception ended the script (sys.excepthook sets sys.last_value)
        "failed": hasattr(sys, "last_value"),
        "hooked": _hooked,
        "source": "none", "trained": [], "optimizers": [], "modules": [], "inputs": _inputs,
        "training_forwards": _forwards[0], "errors": _errors,
    }
    try:
        if _hooked:
            record["source"], record["trained"] = _trained()
            record["optimizers"] = [{"type": type(optimizer).__name__, "steps": steps}
                                    for optimizer, steps in _optimizers.values()]
            record["modules"] = [root.name for root in _roots.values()]
    except Exception:
        _errors.append("hashing the trained parameters failed:\n" + traceback.format_exc())
    path = os.path.join(_directory, f"rank{rank}.json")
    temporary = f"{path}.{_pid}.tmp"
    try:
        os.makedirs(_directory, exist_ok=True)
        with open(temporary, "w") as out:
            json.dump(record, out, indent=1)
        os.replace(temporary, path)
    except OSError as err:
        print(f"replica recorder: cannot write {path}: {err}", file=sys.stderr, flush=True)
