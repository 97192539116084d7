"""Files written on a process other than the main one, reported with the path and script line.

A converted script writes its files through ``distify.open``/``distify.save`` or under a
main-process guard. A write the conversion did not see (a helper's ``open(path, "w")``,
``torch.save(obj, path)``, ``np.save(path, a)``) runs on every process: N processes racing to
write one file. On every process but the main one, :func:`install` adds an audit hook
(``sys.addaudithook``: the ``open`` event carries the flags of every file Python, ``os.open``
or an auditing extension opens) and reports each path opened for writing once, as a warning
naming the path and the line of the script (the innermost frame outside the standard library,
installed packages and this runtime). ``torch.save`` to a path opens its file in C++ without
an audit event: its writer class is wrapped instead.

Let through without a word: the runtime's own writes (a frame in this package on the stack),
writes with no script frame on the stack (a library's background thread), temporary folders,
the launch's log folder (``DISTIFY_LOG_DIR``), caches (``~/.cache`` or ``XDG_CACHE_HOME``,
``TORCH_HOME``, ``HF_HOME``, ``HF_DATASETS_CACHE``, ``TRANSFORMERS_CACHE``, ``HF_HUB_CACHE``,
``TRITON_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``), ``/dev``, ``/proc`` and bytecode caches.

An audit hook cannot be removed, so it is never installed where it has nothing to do: not with
one process, not on the main process, not with ``DISTIFY_WRITE_CHECK=0``; and it returns at
its first test for every event but ``open``.

What it deliberately does not do: stop the write (per-rank logs and caches are legitimate),
see files that native code opens without auditing (beyond ``torch.save``), or report the same
path twice in one process (each non-main process reports its own writes).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
import threading
import warnings
from typing import Any

_WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_CACHE_VARIABLES = ("TORCH_HOME", "HF_HOME", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE",
                    "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRITON_CACHE_DIR",
                    "TORCHINDUCTOR_CACHE_DIR", "DISTIFY_LOG_DIR")
_OFF = ("0", "false", "no", "off")


class _Watch:
    """What the hook needs, made once by :func:`install`."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.allowed = _known_places()
        self.libraries = _library_places()
        self.reported: set[str] = set()
        self.busy = threading.local()  # a report's own reads (linecache) are not reports


_watch: _Watch | None = None


def install(rank: int) -> bool:
    """Report this process's writes from now on (once per process; a no-op on a second call
    or with ``DISTIFY_WRITE_CHECK=0``). Returns whether the hook is in place."""
    global _watch
    if _watch is not None:
        return True
    if os.environ.get("DISTIFY_WRITE_CHECK", "1").strip().lower() in _OFF:
        return False
    _watch = _Watch(rank)
    sys.addaudithook(_hook)
    _watch_torch_save()
    return True


def _hook(event: str, args: tuple) -> None:
    if event != "open":
        return
    flags = args[2]
    if type(flags) is int and flags & _WRITE and not isinstance(args[0], int):
        written(args[0])


def written(path: Any) -> None:
    """Report ``path``, opened for writing by the code that called our caller, if it should."""
    watch = _watch
    if watch is None or getattr(watch.busy, "on", False):
        return
    watch.busy.on = True
    try:
        full = os.path.abspath(os.fsdecode(path))
        if (full in watch.reported or full.startswith(watch.allowed)
                or f"{os.sep}__pycache__{os.sep}" in full):
            return
        frame = _script_frame(sys._getframe(2), watch.libraries)
        if frame is None:
            return
        watch.reported.add(full)
        _warn(watch.rank, os.fsdecode(path), frame)
    except (TypeError, ValueError):  # a path os.fsdecode cannot read: not ours to judge
        return
    finally:
        watch.busy.on = False


def _script_frame(frame, libraries: tuple[str, ...]):
    """The innermost frame of the user's code, or None if the runtime itself writes (or no
    user code is on the stack)."""
    found = None
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_RUNTIME_DIR):
            return None
        if found is None and not name.startswith(libraries) and not name.startswith("<frozen"):
            found = frame
        frame = frame.f_back
    return found


def _warn(rank: int, path: str, frame) -> None:
    filename, line = frame.f_code.co_filename, frame.f_lineno
    shown = os.path.relpath(filename) if filename.startswith(os.getcwd() + os.sep) else filename
    message = (f"distify: rank {rank} writes {path} ({shown}:{line}) outside distify.open/"
               "distify.save; only the main process should: guard it with `if "
               "distify.is_main_process():`, or name the file per rank if that is meant (said "
               "once per path; DISTIFY_WRITE_CHECK=0 silences it)")
    try:
        warnings.warn_explicit(message, UserWarning, filename, line,
                               module=frame.f_globals.get("__name__"))
    except Warning:  # warnings made errors: raised here, it would fail the open() itself
        print(f"{shown}:{line}: {message}", file=sys.stderr)


def _known_places() -> tuple[str, ...]:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    places = [tempfile.gettempdir(), cache, *(os.environ.get(name) for name in _CACHE_VARIABLES)]
    found = {"/dev/", "/proc/"}
    for place in filter(None, places):
        for form in (os.path.abspath(place), os.path.realpath(place)):
            found.add(form.rstrip(os.sep) + os.sep)
    return tuple(found)


def _library_places() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {os.path.abspath(paths[key]) + os.sep
             for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    return tuple(found)


def _watch_torch_save() -> None:
    """``torch.save(obj, path)``: its C++ writer opens the file unaudited; report at the
    writer's creation instead (a private class of torch: left alone where it is missing)."""
    serialization = sys.modules.get("torch.serialization")
    writer = getattr(serialization, "_open_zipfile_writer_file", None)
    if not isinstance(writer, type):
        return

    class _Reported(writer):
        def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
            written(name)
            super().__init__(name, *args, **kwargs)

    serialization._open_zipfile_writer_file = _Reported
