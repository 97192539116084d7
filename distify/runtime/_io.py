"""One writer: printing and checkpoints happen on the main process only; saves are atomic."""

from __future__ import annotations

import builtins
import functools
import io
import os
import random
import shutil
import sys
import tempfile
import time
from typing import IO, Any, Callable, TypeVar, Union

import torch

from . import _collectives, _progress, _state
from ._errors import DistifyError

F = TypeVar("F", bound=Callable[..., Any])
_POLL_S = 1.0  # a wait for the main process's read checks this often whether it left
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

    Converted scripts call it on every process; calling it on the main process only (``if
    distify.is_main_process(): distify.save(...)``) works too. Either way a later
    :func:`load` of the same file on another process (however its path is spelled) waits
    until the main process has finished writing it (see :func:`before_read`); nothing waits
    for the other processes.

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
    """The runtime's part (see ``_state.Runtime``) about saves of paths (keyed by
    :func:`_path_key`): per path, how many times this process called save (or opened it for
    writing) for it, the last of the main process's saves of it this process waited for
    (other ranks), and how many times this process read it (:func:`before_read`)."""

    def __init__(self) -> None:
        self.made: dict[str, int] = {}
        self.seen: dict[str, int] = {}
        self.reads: dict[str, int] = {}


def saves() -> Saves:
    """This process's :class:`Saves`."""
    return _state.current().part(Saves)


def load(f: PathOrFile, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` that puts GPU tensors on this process's device.

    A file that the main process saved earlier in the script is read only once the main
    process has finished writing it, whether every rank or only the main process called
    :func:`save`, whatever the path's spelling, and through an open file object of it too (no
    collective: the main process does not wait; see :func:`before_read`).

    Args:
        f: a path or an open binary file.
        map_location: as for ``torch.load``; by default tensors saved on an accelerator go to
            :func:`distify.device` and tensors saved on the CPU (RNG states, ...) stay there.
        **kwargs: passed to ``torch.load`` (``weights_only``, ``mmap``, ...).

    Raises:
        DistifyError: the main process did not finish that save within the job's timeout.
    """
    key = _path_key(f)
    shown = os.fspath(f) if key is not None else None  # type: ignore[arg-type]
    if key is None:  # an open file of a path: wait for that path, as for the path itself
        shown = _file_path(f)
        key = _path_key(shown) if shown is not None else None
    waited = key is not None and before_read(key, shown)  # type: ignore[arg-type]
    if map_location is None:
        map_location = _to_this_device
    if waited and not isinstance(f, (str, os.PathLike)):
        fresh = _reopened_if_replaced(f, shown)
        if fresh is not None:  # opened before the main process renamed its file over it
            with fresh:
                return torch.load(fresh, map_location=map_location, **kwargs)
    return torch.load(f, map_location=map_location, **kwargs)


def _path_key(f: PathOrFile) -> str | None:
    """The same string on every process for the same file, however the path is spelled
    (relative or absolute, through a symbolic link): its resolved path. ``None`` for a file
    object."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.realpath(os.fspath(f))
    return None


def _file_path(f: Any) -> str | None:
    """The path an open file object was opened with (its ``name``), if it has one."""
    name = getattr(f, "name", None)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    return name if isinstance(name, str) and name else None


def _reopened_if_replaced(f: Any, path: str) -> Any:
    """``path`` opened again when ``f``, still at its start, is an older file than ``path``
    now is (the main process renames its finished write over the path); else None."""
    try:
        if f.tell() != 0 or os.path.samestat(os.fstat(f.fileno()), os.stat(path)):
            return None
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return builtins.open(path, "rb")


def before_read(key: str, shown: str) -> bool:
    """Before this process reads the file ``key``: wait until the main process has finished
    every save of it that comes earlier in the script. Returns whether it waited.

    The reads of a path outside data loading are numbered alike on every rank: a converted
    script reads the same files in the same order everywhere. At its n-th read of a path the
    main process publishes how many saves of it it has made (it never waits); the n-th read on
    another rank waits for that number, then for that save to be finished. (A read under
    ``if distify.is_main_process():`` before a save shifts the numbers: the other ranks' reads
    then wait for an earlier save only, as they did before this numbering.)
    So ``if distify.is_main_process(): distify.save(state, path)`` followed by
    ``distify.load(path)`` on every rank reads the new file, with no collective. A rank whose
    main process left the script without that read waits no longer. Reads inside a
    DataLoader (a Dataset's ``__getitem__``, worker processes) differ between the ranks and
    are not numbered; there only saves this process made itself are waited for.
    """
    if _state.world_size() == 1:
        return False
    known = saves()
    store = _state.shared_store()
    numbered = store is not None and not _inside_data_loading()
    if numbered:
        known.reads[key] = number = known.reads.get(key, 0) + 1
        if _state.is_main_process():
            store.set(f"read/{key}/{number}", str(known.made.get(key, 0)).encode())
            return False
    if _state.is_main_process():
        return False
    wanted = known.made.get(key, 0)
    if numbered:
        wanted = max(wanted, _main_saves_before_read(store, key, number, shown))
    if wanted <= known.seen.get(key, 0):
        return False
    _wait_for_main_process_save(key, shown, wanted)
    return True


def _main_saves_before_read(store: Any, key: str, number: int, shown: str) -> int:
    """How many saves of ``key`` the main process had made at its ``number``-th read of it
    (0 when it left the script before that read)."""
    marker = f"read/{key}/{number}"
    timeout = _state.settings().timeout.total_seconds()
    deadline = time.monotonic() + timeout
    pause, checked = 0.001, time.monotonic()
    while time.monotonic() < deadline:
        try:  # polled: a store wait that times out logs a warning each time
            if store.check([marker]):
                return int(store.get(marker).decode())
        except RuntimeError:  # the store is gone, and with it the main process
            return 0
        if time.monotonic() - checked > _POLL_S:  # has the main process left the script?
            if _progress.has_left(store, 0):
                return 0
            checked = time.monotonic()
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    raise DistifyError(
        f"waited {timeout:g} s for the main process to reach its read number {number} of "
        f"{shown} (every rank reads a path in the same order, so that each read after a "
        "save on the main process waits for it): it is stuck, or reads it fewer times "
        "than this rank (set DISTIFY_TIMEOUT to wait longer)")


def _inside_data_loading() -> bool:
    """A read made by a DataLoader (a Dataset's ``__getitem__``, in a worker or not)."""
    if torch.utils.data.get_worker_info() is not None:
        return True
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("torch.utils.data"):
            return True
        frame = frame.f_back
    return False


def _wait_for_main_process_save(key: str, shown: str, number: int) -> None:
    known = saves()
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
