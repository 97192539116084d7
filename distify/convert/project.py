"""Convert files and whole projects on disk: read, convert, and write outputs atomically.

Inputs are never modified unless the caller asks for in-place conversion. Every output is written
through a temporary file and a rename, and nothing is written before every input has been read
and converted, so a bad file in a project leaves no half-converted output folder behind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from distify.convert.engine import FileResult, convert_source
from distify.errors import UserError
from distify.fsutil import atomic_write_bytes
from distify.rules import RuleSet

#: folders never descended into when converting a project
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox",
             ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules", "build", "dist"}
STANDALONE_RUNTIME = "distify_runtime"


@dataclass(frozen=True)
class Planned:
    """One output to write: a converted script, or a file copied as it is."""

    source: Path
    target: Path
    result: FileResult | None  # None: a non-Python file, copied


def read_source(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError("no such file", path=str(path)) from None
    except IsADirectoryError:
        raise UserError("is a directory (give a folder to convert a project)",
                        path=str(path)) from None
    except OSError as err:
        raise UserError(f"cannot read: {err.strerror}", path=str(path)) from None


def convert_file(path: Path, rules: RuleSet, runtime_module: str) -> FileResult:
    return convert_source(read_source(path), str(path), rules, runtime_module)


def iter_project(root: Path) -> Iterator[Path]:
    """Every file under ``root``, sorted, skipping VCS, cache and virtual-env folders."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            yield Path(folder) / name


def plan_project(root: Path, out: Path | None, rules: RuleSet,
                 runtime_module: str) -> list[Planned]:
    """Convert every Python file under ``root``; other files are copied when ``out`` is set."""
    if out is not None:
        _check_outside(root, out)
    planned = []
    for path in iter_project(root):
        target = (out / path.relative_to(root)) if out is not None else path
        if path.suffix == ".py":
            planned.append(Planned(path, target, convert_file(path, rules, runtime_module)))
        elif out is not None:
            planned.append(Planned(path, target, None))
    return planned


def _check_outside(root: Path, out: Path) -> None:
    root_abs, out_abs = root.resolve(), out.resolve()
    if out_abs == root_abs or root_abs in out_abs.parents:
        raise UserError("the output folder must not be the project folder or inside it "
                        "(use -i to convert in place)", path=str(out))


def write_planned(planned: list[Planned], *, in_place: bool = False,
                  make_dirs: bool = False) -> list[Path]:
    """Write the outputs; with ``in_place`` only changed files are rewritten; ``make_dirs``
    creates missing folders (for a project). Returns the paths written."""
    written = []
    for item in planned:
        if item.result is None:
            item.target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item.source, item.target)
            written.append(item.target)
            continue
        if in_place and not item.result.changed:
            continue
        if make_dirs:
            item.target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(item.target, item.result.output)
        written.append(item.target)
    return written


def copy_runtime(folder: Path) -> Path:
    """Copy the runtime beside a standalone conversion, as the package ``distify_runtime``."""
    source = Path(__file__).resolve().parent.parent / "runtime"
    target = folder / STANDALONE_RUNTIME
    staging = folder / f".{STANDALONE_RUNTIME}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target
