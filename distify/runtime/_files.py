"""``distify.open``: the builtin ``open`` for the files a training script writes, on N processes.

Converted scripts call it on every process, where the original called ``open``:

- **writing** (``"w"``, ``"wb"``, ``"x"``): the main process writes a temporary file beside the
  target and renames it over the target when the file is closed, so a crash mid-write leaves
  the previous file whole; the other processes get a file object that writes into nothing
  (so ``json.dump(obj, f)``, ``pickle.dump``, ``csv.writer(f)`` run unchanged everywhere);
- **appending** or updating in place (``"a"``, ``"r+"``): the main process only, in place;
- **reading** a file this run wrote (with :func:`open` or :func:`distify.save`, on every
  process or on the main process only): the other processes first wait until the main
  process has finished that write, so they never read a half-written or previous file (see
  ``_io.before_read``). Any other path is opened as the builtin would.

World size 1: the bytes written are the builtin's; only the rename makes the write atomic.
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import tempfile
from typing import IO, Any

from . import _io, _state


def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> IO[Any]:
    """The builtin ``open`` made safe on N processes (see the module docstring).

    Args:
        file: a path (an already open file descriptor is passed to the builtin as it is).
        mode: as for the builtin.
        *args: ``buffering``, ``encoding``, ... as for the builtin.
        **kwargs: as for the builtin.
    """
    key = _io._path_key(file)
    if key is None:
        return builtins.open(file, mode, *args, **kwargs)
    main = _state.is_main_process()
    if not any(flag in mode for flag in "wxa+"):
        _io.before_read(key, os.fspath(file))
        return builtins.open(file, mode, *args, **kwargs)
    if "a" in mode or "+" in mode:
        return builtins.open(file, mode, *args, **kwargs) if main else _sink(file, mode, kwargs)
    made = _io.saves().made
    made[key] = made.get(key, 0) + 1  # numbered alike on every rank, as saves are
    if not main:
        return _sink(file, mode, kwargs)
    path = os.fspath(file)
    if "x" in mode and os.path.lexists(path):
        raise FileExistsError(17, "File exists", path)
    return _AtomicFile(path, mode.replace("x", "w"), args, kwargs, key, made[key])


class _AtomicFile:
    """A file written under a scratch name and renamed over ``path`` when closed."""

    def __init__(self, path: str, mode: str, args: tuple, kwargs: dict, key: str,
                 number: int) -> None:
        folder, name = os.path.split(path)
        self._scratch = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
        self._tmp = os.path.join(self._scratch, name)
        try:
            self._file = builtins.open(self._tmp, mode, *args, **kwargs)  # noqa: SIM115
        except BaseException:
            shutil.rmtree(self._scratch, ignore_errors=True)
            raise
        self._path, self._key, self._number = path, key, number
        self._done = False

    @property
    def name(self) -> str:
        return self._path

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.__dict__["_file"], attribute)

    def __iter__(self):
        return iter(self._file)

    def __enter__(self) -> _AtomicFile:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self._discard()

    def close(self) -> None:
        """Finish the write: flush it to disk, rename it over the target, tell the others."""
        if self._done:
            return
        self._done = True
        try:
            self._file.close()
            _io._flush_to_disk(self._tmp)
            mode = _io._existing_mode(self._path)
            if mode is not None:
                os.chmod(self._tmp, mode)
            os.replace(self._tmp, self._path)
        finally:
            shutil.rmtree(self._scratch, ignore_errors=True)
        store = _state.shared_store()
        if store is not None:
            store.set(f"saved/{self._key}/{self._number}", b"")

    def _discard(self) -> None:
        """An error inside ``with``: the target keeps its previous content."""
        if not self._done:
            self._done = True
            self._file.close()
            shutil.rmtree(self._scratch, ignore_errors=True)

    @property
    def closed(self) -> bool:
        return self._done

    def __del__(self) -> None:  # `pickle.dump(obj, distify.open(p, "wb"))`: closed when dropped
        if "_done" in self.__dict__ and not self._done:
            self.close()


class _Nowhere(io.RawIOBase):
    """Accepts every write and keeps nothing (the other processes' side of a main-only write)."""

    def __init__(self) -> None:
        super().__init__()
        self._position = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        self._position += size
        return size

    def tell(self) -> int:
        return self._position


def _sink(file: Any, mode: str, kwargs: dict) -> IO[Any]:
    raw = _Nowhere()
    raw.name = os.fspath(file)  # `f.name` reads as on the main process
    buffered = io.BufferedWriter(raw)
    if "b" in mode:
        return buffered
    return io.TextIOWrapper(buffered, encoding=kwargs.get("encoding") or "utf-8",
                            errors=kwargs.get("errors"), newline=kwargs.get("newline"))
