"""Atomic file output: a crash or a full disk never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from distify.errors import UserError


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
