"""Atomic file output: a crash or a full disk never leaves a half-written file behind; paths
resolved with a one-line error for a symlink loop; deep syntax trees walked on a big stack."""

from __future__ import annotations

import ast
import contextlib
import errno
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from distify.errors import UserError

_T = TypeVar("_T")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    Args:
        path: destination; its folder must exist.
        data: the complete new content.

    Raises:
        UserError: the folder does not exist or cannot be written (nothing is left behind).
    """
    target = Path(path)
    if target.is_symlink():  # write through the link: the link stays, its file is updated
        target = Path(os.path.realpath(target))
    if target.exists() and not target.is_file():
        raise UserError("not a regular file: refusing to replace it", path=str(path))
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise UserError(f"output folder does not exist: {folder}", path=str(target))
    mode = _existing_mode(target)
    if mode is None:  # a new file gets the usual permissions, not mkstemp's private 0600
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as err:
        raise UserError(f"cannot write here: {err.strerror}", path=str(target)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise UserError(f"cannot write: {err.strerror}", path=str(target)) from None
        raise


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """Like :func:`atomic_write_bytes` for text; line endings are written as given."""
    atomic_write_bytes(path, text.encode(encoding))


def _existing_mode(target: Path) -> int | None:
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        return None


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


SYMLINK_LOOP = "symlink loop: the link never reaches a file or folder"


def is_symlink_loop(path: str | os.PathLike) -> bool:
    """Does ``path`` (or a link on the way to it) loop back on itself?"""
    try:
        os.stat(path)
    except OSError as err:
        return err.errno == errno.ELOOP
    return False


def resolved(path: Path) -> Path:
    """``path.resolve()``; a symlink loop is a one-line :class:`UserError`, not a
    ``RuntimeError``."""
    try:
        return path.resolve()
    except RuntimeError:  # pathlib's "Symlink loop from ..." (Python < 3.13)
        raise UserError(SYMLINK_LOOP, path=str(path)) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserError(SYMLINK_LOOP, path=str(path)) from None
        raise


#: a walk of a syntax tree as deep as Python's parser accepts (a sum of a few thousand terms)
#: needs about this many frames; it runs on a thread whose stack holds them
DEEP_RECURSION_LIMIT = 40_000
_DEEP_STACK_BYTES = 512 * 1024 * 1024


def on_deep_stack(function: Callable[..., _T], *args, **kwargs) -> _T:
    """``function(*args, **kwargs)`` on a thread with a big stack and a recursion limit of
    :data:`DEEP_RECURSION_LIMIT`, for a tree too deep for the default limit (1,000 frames).
    Its exceptions (a ``RecursionError`` past even that) are raised here."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, function(*args, **kwargs)))
        except BaseException as err:  # handed to the caller's thread
            outcome.append((False, err))

    with _DEEP_LOCK:
        limit = sys.getrecursionlimit()
        previous = threading.stack_size()
        sys.setrecursionlimit(max(limit, DEEP_RECURSION_LIMIT))
        try:
            threading.stack_size(_DEEP_STACK_BYTES)  # read when the thread starts
            try:
                worker = threading.Thread(target=run, name="distify-deep-tree")
                worker.start()
            finally:
                threading.stack_size(previous)
            worker.join()
        finally:
            sys.setrecursionlimit(limit)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


_DEEP_LOCK = threading.Lock()


def deepest(source: bytes) -> tuple[int, int]:
    """How many levels the syntax tree of ``source`` has, and the line of its deepest node
    (walked without recursion); (0, 1) when it does not parse."""
    try:
        tree = on_deep_stack(ast.parse, source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 0, 1
    levels, line = 0, 1
    stack: list[tuple[ast.AST, int, int]] = [(tree, 1, 1)]
    while stack:
        node, depth, where = stack.pop()
        where = getattr(node, "lineno", where)
        if depth > levels:
            levels, line = depth, where
        stack.extend((child, depth + 1, where) for child in ast.iter_child_nodes(node))
    return levels, line


def too_deep(source: bytes, path: str) -> UserError:
    """The one-line error for a file whose syntax tree is too deep for distify's walks."""
    levels, line = deepest(source)
    return UserError(f"expression nested too deeply for distify ({levels} levels); split it "
                     "over a few statements", path=path, line=line)
