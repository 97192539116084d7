"""What one process of a ``distify verify`` run did, written at exit to ``$DISTIFY_VERIFY_DIR``.

Started by ``sitecustomize`` (this folder). At exit the process writes ``rank<RANK>.json``
(``RANK`` from torchrun; 0 under plain ``python``) with:

- ``trained``: name and sha256 of every trained parameter, in the same order on every rank
  (the parameters of the optimizers that stepped, in ``param_groups`` order; without a step,
  those of the modules that ran a training forward);
- ``inputs``: sha256 of the input tensors of the first few *root training forwards* (a module
  with trainable parameters called in training mode with gradients on, outside any other
  module call), with the script line of the call;
- ``writes``: every file opened for writing (the ``open`` audit event, and ``torch.save``'s
  writer, which opens its file unaudited) by code of the script's folder, with the line of the
  innermost such frame (writes of distify's runtime, which guards its own, are left out);
- ``step_seconds``, ``threads``: the median time between consecutive optimizer steps and
  torch's intra-op threads (check 7);
- ``epochs``: at the end of each training ``DataLoader`` iteration (exhausted, capped, or
  dropped after a ``break``), the script line of its ``iter()`` and a 16-hex-digit sha256 prefix
  of every trained parameter, as in ``trained`` (check 2 compares them rank by rank);
- steps: with ``DISTIFY_VERIFY_STEPS=K``, every training ``DataLoader`` iteration stops
  after K batches (per ``iter()``, so per epoch); evaluation iterations only with
  ``DISTIFY_VERIFY_EVAL_STEPS=E``, after E. An iteration is *evaluation* when, at its ``iter()``,
  gradients are off (``torch.no_grad``, ``inference_mode``) or every model that has run a
  training forward so far is in eval mode. A training loop without a DataLoader is stopped
  after K optimizer steps of one optimizer taken outside any training ``DataLoader`` iteration:
  the process exits (``SystemExit(0)``) right after that step, saying so on stderr, and
  ``capped_steps`` records K (``DISTIFY_VERIFY_LOOSE_STEPS``, when set, is that K instead:
  check 5's frozen runs cap DataLoader loops per rank, see ``runs.Caps.spread``);
- ``evaluations``: the number of evaluation iterations begun;
- ``after_eval``: with ``DISTIFY_VERIFY_FROZEN=1`` (check 5's frozen-weights runs), the stdout
  lines printed after an evaluation iteration ended and before the next ``DataLoader``
  iteration began (``[first, end)`` line indices, end None: to the end). Such a run also
  freezes the weights: every optimizer step (``GradScaler.step``
  included, it calls the optimizer's) restores the parameters it stepped, and every BatchNorm
  gets ``momentum=0.0`` before its forwards (training forwards still normalise with batch
  statistics; the running statistics stay as built).

It never changes what the script computes (hooks only read; no random numbers), except for the
caps the user asked for with ``--steps``/``--eval-steps``, the frozen weights of check 5's
runs, and the seeds: torch's default generator and Python's ``random`` start from seed 0 in
every run (an unseeded script then draws alike in each run, as the comparisons need; a script
that seeds them replaces it; NumPy's is left alone). torch is never imported by this module:
the hooks are
installed right after the script's own ``import torch`` (a meta path finder waits for it).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.abc
import importlib.util
import json
import os
import random
import shutil
import sys
import threading
import time
import traceback
import weakref
from typing import Any

INPUT_FORWARDS = 3
SEED = 0  # every run's start: an unseeded script draws alike in every run
MAX_EPOCHS = 1000  # epoch ends recorded (check 2)
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

_directory = os.environ.get("DISTIFY_VERIFY_DIR", "")
_script = os.path.abspath(os.environ.get("DISTIFY_VERIFY_SCRIPT", sys.argv[0] or ""))
_steps = int(os.environ.get("DISTIFY_VERIFY_STEPS") or 0)
_eval_steps = int(os.environ.get("DISTIFY_VERIFY_EVAL_STEPS") or 0)
_loose_cap = int(os.environ.get("DISTIFY_VERIFY_LOOSE_STEPS") or _steps)
_frozen = os.environ.get("DISTIFY_VERIFY_FROZEN") == "1"
_saved: dict[int, list] = {}  # optimizer id -> its parameters before the step (frozen runs)
_models: Any = weakref.WeakSet()  # the models that ran a training forward
_after_eval: list[list] = []  # [first line, end line or None] printed after an evaluation loop
_evaluations = [0]
_open_training = [0]  # training DataLoader iterations begun and not ended
_epochs: list[dict] = []  # at each training iteration's end: its line, parameter digests
_loose_steps: dict[int, int] = {}  # optimizer id -> steps outside any training DataLoader loop
_stack_file: list = []  # the file faulthandler writes the stacks to
_capped = [0]  # the optimizer steps after which the process was stopped (0: not stopped)
_step_at: list[float] = []  # perf_counter() after each of the first optimizer steps
_batch_norm: Any = None
_pid = os.getpid()
_installed = False
_errors: list[str] = []
_optimizers: dict[int, Any] = {}
_roots: dict[int, Any] = {}  # id -> (name, module or its named parameters)
_inputs: list[dict] = []
_writes: list[dict] = []
_written: set[str] = set()
_local = threading.local()
_folder = os.path.dirname(_script) + os.sep
_RUNTIME = os.sep + os.path.join("distify", "runtime") + os.sep
_torch: Any = None
_ignored = tuple(p for p in (_directory, os.environ.get("DISTIFY_LOG_DIR"), "/dev/", "/proc/")
                 if p)


def start() -> None:
    """Called by sitecustomize: audit writes now, hook torch once imported, record at exit."""
    atexit.register(_write_record)
    sys.addaudithook(_audit)
    _on_request_dump_stacks()
    if _frozen:
        sys.stdout = _CountingStdout(sys.stdout)
    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _AfterTorchImport())


def _on_request_dump_stacks() -> None:
    """On ``SIGUSR2`` (sent by verify to a run it is about to stop, a hang), write every
    thread's Python stack to ``stack<RANK>-<pid>.txt`` in the records' folder: ``faulthandler``
    writes it from C, so a thread blocked in a collective is shown too. A handler the script
    installs for ``SIGUSR2`` later replaces this one (then no stack is shown)."""
    try:
        import faulthandler
        import signal

        path = os.path.join(_directory, f"stack{os.environ.get('RANK', '0')}-{_pid}.txt")
        _stack_file.append(open(path, "w"))  # noqa: SIM115 (open until the process ends)
        faulthandler.register(signal.SIGUSR2, file=_stack_file[0], all_threads=True)
    except (AttributeError, OSError, ValueError, RuntimeError) as err:  # no SIGUSR2 (Windows)
        _errors.append(f"the stack dump on a hang is not set up: {err}")


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
    global _installed, _torch, _batch_norm
    if _installed:
        return
    _installed = True
    try:
        import torch
        import torch.serialization
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module
        from torch.utils.data import DataLoader

        _torch = torch
        torch.manual_seed(SEED)  # before the script's first draw; its own seed replaces it
        random.seed(SEED)
        if _frozen:
            from torch.nn.modules.batchnorm import _BatchNorm

            _batch_norm = _BatchNorm
            optim_module.register_optimizer_step_pre_hook(_before_step)
        optim_module.register_optimizer_step_post_hook(_after_step)
        nn_module.register_module_forward_pre_hook(_before_forward)
        nn_module.register_module_forward_hook(_after_forward, with_kwargs=True,
                                               always_call=True)
        _watch_torch_save(torch.serialization)
        iterate = DataLoader.__iter__

        def hooked(self):
            evaluating = _evaluating()
            _loop_starts()
            if evaluating:
                _evaluations[0] += 1
            line = None if evaluating else _script_line(sys._getframe(1))
            return _Batches(iterate(self), _eval_steps if evaluating else _steps, evaluating,
                            line)

        DataLoader.__iter__ = hooked
    except Exception:
        _errors.append("installing the hooks failed:\n" + traceback.format_exc())


# ------------------------------------------------------- loops, evaluation, frozen weights


class _CountingStdout:
    """``sys.stdout`` as it was, counting the lines written (frozen runs only)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.lines = 0

    def write(self, text: str) -> int:
        self.lines += str(text).count("\n")
        return self._stream.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_lines() -> int | None:
    stream = sys.stdout
    return stream.lines if isinstance(stream, _CountingStdout) else None


def _evaluating() -> bool:
    if not _torch.is_grad_enabled():
        return True
    models = list(_models)
    return bool(models) and not any(model.training for model in models)


def _loop_starts() -> None:
    if _after_eval and _after_eval[-1][1] is None:
        _after_eval[-1][1] = _stdout_lines()


class _Batches:
    """A DataLoader iteration as the script sees it (``len`` and attributes forwarded), capped
    at ``cap`` batches (0: whole); its end (exhausted, capped, or dropped after a ``break``) is
    recorded: an evaluation's for check 5's lines, a training one's parameter digests (check 2's
    epoch ends)."""

    def __init__(self, inner: Any, cap: int, evaluating: bool, line: int | None) -> None:
        self._inner, self._cap, self._evaluating, self._line = inner, cap, evaluating, line
        self._given, self._ended = 0, False
        if not evaluating:
            _open_training[0] += 1

    def __iter__(self) -> _Batches:
        return self

    def __next__(self) -> Any:
        if self._cap and self._given >= self._cap:
            self._end()
            raise StopIteration
        try:
            batch = next(self._inner)
        except StopIteration:
            self._end()
            raise
        self._given += 1
        return batch

    def __len__(self) -> int:
        length = len(self._inner)
        return min(length, self._cap) if self._cap else length

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_inner"], name)

    def __del__(self) -> None:
        try:
            self._end()
        except Exception:  # at interpreter shutdown, modules may be gone already
            return

    def _end(self) -> None:
        if self.__dict__.get("_ended", True):
            return
        self._ended = True
        if self._evaluating:
            _loop_starts()
            lines = _stdout_lines()
            if lines is not None:
                _after_eval.append([lines, None])
        else:
            _open_training[0] -= 1
            _epoch_ended(self._line)


def _epoch_ended(line: int | None) -> None:
    """Check 2's evidence at the end of a training DataLoader iteration: a short digest of
    every trained parameter (none before anything trained)."""
    if (not _optimizers and not _roots) or len(_epochs) >= MAX_EPOCHS:
        return
    try:
        _epochs.append({"line": line, "params": [[entry["name"], entry["sha256"][:16]]
                                                 for entry in _trained()]})
    except Exception:
        _errors.append("hashing the parameters at an epoch end failed:\n"
                       + traceback.format_exc())


def _before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    with _torch.no_grad():
        _saved[id(optimizer)] = [p.detach().clone() for group in optimizer.param_groups
                                 for p in group["params"]]


def _restore(optimizer: Any) -> None:
    saved = _saved.pop(id(optimizer), None)
    if saved is None:
        return
    with _torch.no_grad():
        parameters = [p for group in optimizer.param_groups for p in group["params"]]
        for parameter, before in zip(parameters, saved):
            parameter.copy_(before)


# ----------------------------------------------------------------------------------- writes


def _user_call(frame):
    """The innermost frame of code in the run's folder (the script or its local modules) and
    whether what it called is distify's runtime: ``distify.save`` writes on the main process
    on purpose, a guard the runtime's own tests cover. (The runtime also wraps torch.save's
    writer on other ranks to warn: that wrapper, deeper in the stack, is not the call.)"""
    callee = None
    while frame is not None:
        if os.path.abspath(frame.f_code.co_filename).startswith(_folder):
            return frame, callee is not None and _RUNTIME in callee.f_code.co_filename
        callee, frame = frame, frame.f_back
    return None, False


def _script_line(frame) -> int | None:
    while frame is not None:
        if frame.f_code.co_filename == _script:
            return frame.f_lineno
        frame = frame.f_back
    return None


def _audit(event: str, args: tuple) -> None:
    if event != "open":
        return
    flags = args[2]
    if type(flags) is int and flags & _WRITE and not isinstance(args[0], int):
        _detach(args[0])
        _note_write(args[0], sys._getframe(1))


def _detach(path: Any) -> None:
    """Before a write through a link in the run's folder to a file outside it (verify links
    big files into its copies instead of copying them; a user's own link may point out too),
    put a copy of the file in the link's place: the run writes its copy, never the user's
    file."""
    if getattr(_local, "busy", False):
        return
    _local.busy = True
    try:
        full = os.path.abspath(os.fsdecode(path))
        if not full.startswith(_folder) or not os.path.islink(full):
            return
        real = os.path.realpath(full)
        if real.startswith(os.path.realpath(_folder) + os.sep):
            return
        spare = f"{full}.distify-verify-{os.getpid()}"
        if os.path.isfile(real):
            shutil.copy2(real, spare)
            os.replace(spare, full)
        else:
            os.unlink(full)
    except (TypeError, ValueError, OSError):
        return
    finally:
        _local.busy = False


def _note_write(path: Any, frame) -> None:
    if getattr(_local, "busy", False):
        return
    _local.busy = True
    try:
        full = os.path.abspath(os.fsdecode(path))
        if full in _written or full.startswith(_ignored) or "__pycache__" in full:
            return
        user, by_runtime = _user_call(frame)
        if user is None or by_runtime:  # a library's own file, or the runtime's
            return
        _written.add(full)
        _writes.append({"path": full, "at": f"{os.path.relpath(user.f_code.co_filename, _folder)}"
                                             f":{user.f_lineno}"})
    except (TypeError, ValueError):
        return
    finally:
        _local.busy = False


def _watch_torch_save(serialization: Any) -> None:
    writer = getattr(serialization, "_open_zipfile_writer_file", None)
    if not isinstance(writer, type):
        _errors.append("torch.save's writer class not found: its writes are not audited")
        return

    class _Audited(writer):
        def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
            _detach(name)
            _note_write(name, sys._getframe(1))
            super().__init__(name, *args, **kwargs)

    serialization._open_zipfile_writer_file = _Audited


# ----------------------------------------------------------------------------------- hooks


def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _optimizers.setdefault(id(optimizer), optimizer)
    if len(_step_at) < 10_000:
        _step_at.append(time.perf_counter())
    if _frozen:
        _restore(optimizer)
    if _loose_cap > 0 and not _open_training[0]:
        _cap_loose_steps(optimizer)


def _cap_loose_steps(optimizer: Any) -> None:
    """``--steps K`` for a training loop without a DataLoader (``while True: get_batch()``,
    ``for it in range(max_iters)``): end the process cleanly right after the K-th step of one
    optimizer outside any training DataLoader iteration. Every rank steps in the same order, so
    every rank ends at the same step, after the step's collectives (DDP's all-reduce ran in the
    backward); the record is written at exit."""
    steps = _loose_steps[id(optimizer)] = _loose_steps.get(id(optimizer), 0) + 1
    if steps >= _loose_cap:
        _capped[0] = steps
        print(f"distify verify: stopped after {steps} optimizer steps (--steps {_loose_cap}: a "
              "training loop without a DataLoader)", file=sys.stderr, flush=True)
        raise SystemExit(0)


def _before_forward(module: Any, args: Any) -> None:
    if _torch.compiler.is_compiling():
        return None
    if _batch_norm is not None and isinstance(module, _batch_norm) and module.momentum != 0.0:
        module.momentum = 0.0  # frozen runs: running statistics stay as built
    _local.depth = getattr(_local, "depth", 0) + 1
    return None


def _after_forward(module: Any, args: Any, *rest: Any) -> None:
    if _torch.compiler.is_compiling():
        return None
    depth = getattr(_local, "depth", 1) - 1
    _local.depth = depth
    if depth == 0 and len(rest) == 2 and module.training and _torch.is_grad_enabled() \
            and threading.current_thread() is threading.main_thread():
        try:
            _record_root(module, args, rest[0])
        except Exception:
            if len(_errors) < 5:
                _errors.append("recording a training forward failed:\n" + traceback.format_exc())
    return None


def _unwrap(module: Any) -> Any:
    distributed = sys.modules.get("torch.nn.parallel.distributed")
    ddp = getattr(distributed, "DistributedDataParallel", None)
    while True:
        if ddp is not None and isinstance(module, ddp):
            module = module.module
        elif type(module).__name__ == "OptimizedModule" and \
                isinstance(getattr(module, "_orig_mod", None), _torch.nn.Module):
            module = module._orig_mod
        else:
            return module


def _record_root(module: Any, args: Any, kwargs: Any) -> None:
    root = _unwrap(module)
    if not any(p.requires_grad for p in root.parameters()):
        return  # a loss function or a frozen model: nothing of it trains
    # parameters, not the module: a module holding a DDP object would keep the group alive
    if id(root) not in _roots:  # once: listing the parameters every step would cost
        _roots[id(root)] = (type(root).__name__, list(root.named_parameters()))
    _models.add(module)
    if len(_inputs) < INPUT_FORWARDS:
        digest = hashlib.sha256()
        tensors = _tensors((args, kwargs))
        for tensor in tensors:
            digest.update(f"{tensor.dtype}{list(tensor.shape)}".encode())
            digest.update(_tensor_bytes(tensor))
        _inputs.append({"module": type(root).__name__, "sha256": digest.hexdigest(),
                        "tensors": len(tensors), "line": _script_line(sys._getframe(1))})


def _tensors(obj: Any, depth: int = 0) -> list:
    if isinstance(obj, _torch.Tensor):
        return [obj]
    if depth > 8:
        return []
    if isinstance(obj, dict):
        return [t for key in sorted(obj, key=str) for t in _tensors(obj[key], depth + 1)]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item, depth + 1)]
    return []


def _tensor_bytes(tensor: Any) -> bytes:
    t = tensor.detach()
    if t.layout != _torch.strided:
        t = t.to_dense()
    t = t.cpu().resolve_conj().resolve_neg().contiguous().reshape(-1).view(_torch.uint8)
    try:
        return t.numpy().tobytes()
    except (RuntimeError, TypeError):  # numpy missing
        return bytes(t.tolist())


def _trained() -> list[dict]:
    names: dict[int, str] = {}
    for name, parameters in _roots.values():
        for sub, parameter in parameters:
            names.setdefault(id(parameter), f"{name}.{sub}")
    if _optimizers:
        parameters = [(names.get(id(p), f"optimizer{n}.group{g}.param{k}"), p)
                      for n, optimizer in enumerate(_optimizers.values())
                      for g, group in enumerate(optimizer.param_groups)
                      for k, p in enumerate(group["params"])]
    else:
        parameters = [(names[id(p)], p) for _, named in _roots.values() for _, p in named]
    entries, seen = [], set()
    for name, parameter in parameters:
        if id(parameter) not in seen:
            seen.add(id(parameter))
            entries.append({"name": name, "shape": list(parameter.shape),
                            "sha256": hashlib.sha256(_tensor_bytes(parameter)).hexdigest()})
    return entries


# ------------------------------------------------------------------------------ the record


def _median_step() -> float | None:
    """The median time between consecutive optimizer steps (None: fewer than 2 steps)."""
    gaps = sorted(b - a for a, b in zip(_step_at, _step_at[1:]))
    return gaps[len(gaps) // 2] if gaps else None


def _write_record() -> None:
    mp = sys.modules.get("multiprocessing")
    if os.getpid() != _pid or (mp is not None and mp.parent_process() is not None):
        return  # a forked or spawned child (a DataLoader worker): not the rank's record
    rank = os.environ.get("RANK", "0")
    record: dict[str, Any] = {
        "rank": int(rank), "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "failed": hasattr(sys, "last_value"), "hooked": _torch is not None,
        "trained": [], "inputs": _inputs, "writes": _writes, "errors": _errors,
        "evaluations": _evaluations[0], "after_eval": _after_eval, "epochs": _epochs,
        "capped_steps": _capped[0],
        "step_seconds": _median_step(),
        "threads": _torch.get_num_threads() if _torch is not None else None,
    }
    try:
        if _torch is not None:
            record["trained"] = _trained()
    except Exception:
        _errors.append("hashing the trained parameters failed:\n" + traceback.format_exc())
    path = os.path.join(_directory, f"rank{rank}.json")
    try:
        with open(f"{path}.tmp", "w") as out:
            json.dump(record, out, indent=1)
        os.replace(f"{path}.tmp", path)
    except OSError as err:
        print(f"distify verify: cannot write {path}: {err}", file=sys.stderr, flush=True)
