"""Which files to check, and the byte-level pre-filter that skips files without torch unread."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from fnmatch import fnmatch
from pathlib import Path

from distify.errors import UserError
from distify.fsutil import SYMLINK_LOOP, is_symlink_loop
from distify.rules import RuleSet

#: Folders never entered when walking a folder (explicitly named files are still checked).
DEFAULT_EXCLUDES = frozenset({
    ".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", "__pycache__", "build", "dist",
    "node_modules", ".eggs", ".mypy_cache", ".ruff_cache", ".pytest_cache", "site-packages",
})
SUFFIXES = (".py", ".pyi", ".ipynb")


def discover(paths: Sequence[str], exclude: Sequence[str] = (),
             root: Path | None = None) -> list[str]:
    """The files under ``paths`` to check, in a stable order, each once.

    Args:
        paths: files and folders as the user gave them.
        exclude: glob patterns (``legacy/``, ``*_pb2.py``) matched against paths relative to
            ``root`` and against each file or folder name; they apply to named files too, so a
            pre-commit hook honours them.
        root: the folder ``exclude`` patterns are relative to (the pyproject.toml's).

    Raises:
        UserError: a path does not exist.
    """
    found: dict[str, None] = {}
    for given in paths:
        if os.path.isfile(given):
            if not _excluded(given, exclude, root):
                found[os.path.normpath(given)] = None
        elif os.path.isdir(given):
            for path in _walk(given, exclude, root):
                found[path] = None
        elif is_symlink_loop(given):
            raise UserError(SYMLINK_LOOP, path=given)
        else:
            raise UserError("no such file or folder", path=given)
    return list(found)


def _walk(folder: str, exclude: Sequence[str], root: Path | None) -> Iterable[str]:
    for current, dirs, files in os.walk(folder):
        dirs[:] = sorted(name for name in dirs
                         if name not in DEFAULT_EXCLUDES and not name.startswith(".")
                         and not _excluded(os.path.join(current, name), exclude, root))
        for name in sorted(files):
            path = os.path.normpath(os.path.join(current, name))
            if name.endswith(SUFFIXES) and not _excluded(path, exclude, root):
                yield path


def _excluded(path: str, patterns: Sequence[str], root: Path | None) -> bool:
    if not patterns:
        return False
    absolute = Path(os.path.realpath(path))  # not resolve(): it raises on a symlink loop
    relative = Path(path).as_posix()
    if root is not None and absolute.is_relative_to(root.resolve()):
        relative = absolute.relative_to(root.resolve()).as_posix()
    for pattern in patterns:
        folder = pattern.rstrip("/")
        if (fnmatch(relative, pattern) or fnmatch(absolute.name, pattern)
                or relative == folder or relative.startswith(folder + "/")):
            return True
    return False


def prefilter(rules: RuleSet) -> re.Pattern[bytes]:
    """A regex that a file's bytes must match to be worth parsing: a word naming torch or a
    distributed API root (the first segment of every ``distributed_markers`` entry)."""
    roots = {"torch"}
    for pattern in rules.names("distributed_markers"):
        root = pattern.split(".")[0]
        if root and "*" not in root:
            roots.add(root)
    words = "|".join(sorted(re.escape(root) for root in roots))
    return re.compile(rf"\b(?:{words})\b".encode())
