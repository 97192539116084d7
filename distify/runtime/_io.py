"""One writer: printing and checkpoints happen on the main process only; saves are atomic."""

from __future__ import annotations

import builtins
import functools
import io
import os
import random
import shutil
import tempfile
from typing import IO, Any, Callable, TypeVar, Union

import torch

from . import _collectives, _state
from ._errors import DistifyError

F = TypeVar("F", bound=Callable[..., Any])
PathOrFile = Union[str, "os.PathLike[str]", IO[bytes]]


def print(*args: Any, **kwargs: Any) -> None:
    """``print`` on the main process only.

    Args:
        *args: what to print.
        **kwargs: passed to the builtin ``print`` (``sep``, ``end``, ``file``, ``flush``).
    """
    if _state.is_main_process():
        builtins.print(*args, **kwargs)


def save(obj: Any, f: PathOrFile, **kwargs: Any) -> None:
    """``torch.save`` on the main process only; to a path it is atomic.

    A path is written through a temporary file in the same folder, flushed to disk and renamed
    over the target, so a crash or an error mid-write leaves the previous file intact and no
    temporary file behind.

    Converted scripts call it on every process: a later :func:`load` of the same path on
    another process then waits until the main process has finished writing it. Calling it on
    the main process only (``if distify.is_main_process(): distify.save(...)``) is safe too:
    nothing waits for the other processes, and their loads do not wait either.

    Args:
        obj: what to save (a state dict, a whole model, ...).
        f: a path, or an open binary file (written directly, on the main process only); an
            ``io.BytesIO`` is written on every process (it is memory, not a shared file).
        **kwargs: passed to ``torch.save``.
    """
    key = _path_key(f)
    made = saves().made
    if key is not None:  # every rank numbers the saves of each path alike: see load()
        made[key] = made.get(key, 0) + 1
    if isinstance(f, io.BytesIO):  # memory, not a file: every process keeps its own copy
        torch.save(obj, f, **kwargs)
        return
    if not _state.is_main_process():
        return
    if key is None:
        torch.save(obj, f, **kwargs)
        return
    _atomic_save(obj, os.fspath(f), kwargs)  # type: ignore[arg-type]
    store = _state.shared_store()
    if store is not None:
        store.set(f"saved/{key}/{made[key]}", b"")


class Saves:
    """The runtime's part (see ``_state.Runtime``) about saves of paths, numbered alike on
    every rank: per path, how many times this process called save (or opened it for writing)
    for it, and the last of those the main process is known to have finished (other ranks)."""

    def __init__(self) -> None:
        self.made: dict[str, int] = {}
        self.seen: dict[str, int] = {}


def saves() -> Saves:
    """This process's :class:`Saves`."""
    return _state.current().part(Saves)


def load(f: PathOrFile, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` that puts GPU tensors on this process's device.

    A path that :func:`save` was called for earlier in this run is read only once the main
    process has finished writing it (no collective: the main process does not wait).

    Args:
        f: a path or an open binary file.
        map_location: as for ``torch.load``; by default tensors saved on an accelerator go to
            :func:`distify.device` and tensors saved on the CPU (RNG states, ...) stay there.
        **kwargs: passed to ``torch.load`` (``weights_only``, ``mmap``, ...).

    Raises:
        DistifyError: the main process did not finish that save within the job's timeout.
    """
    key = _path_key(f)
    known = saves()
    if key is not None and not _state.is_main_process() \
            and known.made.get(key, 0) > known.seen.get(key, 0):
        _wait_for_main_process_save(key, os.fspath(f))  # type: ignore[arg-type]
    if map_location is None:
        map_location = _to_this_device
    return torch.load(f, map_location=map_location, **kwargs)


def _path_key(f: PathOrFile) -> str | None:
    """The same string on every process for the same path argument; ``None`` for a file."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.normpath(os.fspath(f))
    return None


def _wait_for_main_process_save(key: str, shown: str) -> None:
    known = saves()
    number = known.made[key]
    store = _state.shared_store()
    if store is None:  # no store to ask: meet the main process instead (it loads too)
        _collectives.wait_for_everyone()
    else:
        try:  # blocks until the main process has published that save (the store's timeout)
            store.get(f"saved/{key}/{number}")
        except RuntimeError:
            timeout = _state.settings().timeout.total_seconds()
            raise DistifyError(
                f"waited {timeout:g} s for the main process to finish saving {shown}: it is "
                "stuck, failed, or never called distify.save for it (set DISTIFY_TIMEOUT to "
                "wait longer)") from None
    known.seen[key] = number


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy (when installed) and torch (CPU and every GPU).

    Args:
        seed: the seed; use the same one on every rank.
    """
    random.seed(seed)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed)
    torch.manual_seed(seed)  # seeds the CUDA generators too


def on_main_process(function: F) -> F:
    """Decorator: the function runs on the main process only.

    Elsewhere it returns an object that quietly accepts every attribute access and call, so
    ``writer = distify.on_main_process(SummaryWriter)(log_dir)`` followed by
    ``writer.add_scalar(...)`` logs once, from the main process, with no ``if`` at every use.

    Args:
        function: the function (or class) to guard.
    """
    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs) if _state.is_main_process() else IGNORED

    return guarded  # type: ignore[return-value]


class _Ignored:
    """Stands in for a tracker or writer on the other processes: every use is a no-op."""

    def __getattr__(self, name: str) -> "_Ignored":
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> "_Ignored":
        return self

    def __enter__(self) -> "_Ignored":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "<ignored on this process: distify.on_main_process>"


IGNORED = _Ignored()


def _atomic_save(obj: Any, path: str, kwargs: dict) -> None:
    folder, name = os.path.split(path)
    # The file is written under its own name inside a scratch folder beside the target:
    # torch.save names the archive's records after the file, so the bytes are exactly what
    # torch.save(obj, path) writes, and the final rename stays on one filesystem.
    scratch = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    try:
        tmp = os.path.join(scratch, name)
        torch.save(obj, tmp, **kwargs)
        _flush_to_disk(tmp)
        mode = _existing_mode(path)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _flush_to_disk(path: str) -> None:
    fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _existing_mode(path: str) -> int | None:
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return None


def _to_this_device(storage: Any, location: str) -> Any:
    if location.startswith("cpu"):
        return None  # torch restores it where it was saved: on the CPU
    return torch.serialization.default_restore_location(storage, str(_state.device()))
