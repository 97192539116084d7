"""Checking many files: in parallel worker processes, then fixing the fixable ones."""

from __future__ import annotations

import errno
import io
import multiprocessing
import os
import sys
import tokenize
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from distify.analysis.project import imported_by_parallel
from distify.errors import UserError
from distify.fsutil import SYMLINK_LOOP, atomic_write_bytes, on_deep_stack, too_deep
from distify.lint.engine import LintOptions, lint_source
from distify.lint.model import PARSE_ERROR, FileResult, Finding
from distify.notebook import cell_of, is_notebook, parse_notebook, to_script

#: Below this many files one process is faster than starting workers.
PARALLEL_MIN_FILES = 16
_OPTIONS: LintOptions | None = None


def check_file(path: str, options: LintOptions) -> FileResult:
    """Read, pre-filter and check one file; an unreadable file is a ``DST000`` finding."""
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except OSError as err:
        message = SYMLINK_LOOP if err.errno == errno.ELOOP else \
            f"cannot read: {err.strerror or err}"
        return FileResult(path, (Finding(path, 1, 1, 1, 1, PARSE_ERROR, message),))
    if options.prefilter is not None and not options.prefilter.search(source):
        return FileResult(path, skipped="no torch")
    if is_notebook(path):
        return _check_notebook(source, path, options)
    return check_file_source(source, path, options)


def check_file_source(source: bytes, path: str, options: LintOptions) -> FileResult:
    """Check one file's source (a parse error is a finding; a tree too deep for the usual
    recursion limit is checked again on a big stack)."""
    try:
        return lint_source(source, path, options)
    except RecursionError:  # a sum of thousands of terms: again, on a big stack
        pass
    try:
        return on_deep_stack(lint_source, source, path, options)
    except RecursionError:
        error = too_deep(source, path)
        return FileResult(path, (Finding(path, error.line, 1, error.line, 1, PARSE_ERROR,
                                         error.message),))


def _check_notebook(source: bytes, path: str, options: LintOptions) -> FileResult:
    """A notebook's code cells, checked as one script; findings placed by cell and line.
    Fixes are dropped: ``--fix`` edits Python files, never a notebook's JSON."""
    try:
        script = to_script(parse_notebook(source, path)).text
    except UserError as err:
        return FileResult(path, (Finding(path, err.line or 1, err.col or 1, err.line or 1,
                                         err.col or 1, PARSE_ERROR, err.message),))
    result = check_file_source(script.encode("utf-8"), path, options)
    findings = []
    for finding in result.findings:
        found = cell_of(script, finding.line)
        if found is None:
            findings.append(replace(finding, fix=None))
            continue
        shift = finding.line - found[1]
        findings.append(replace(finding, cell=found[0], line=found[1],
                                end_line=max(finding.end_line - shift, found[1]), fix=None))
    return replace(result, findings=tuple(findings))


def check_files(paths: Sequence[str], options: LintOptions, jobs: int = 0) -> list[FileResult]:
    """Check ``paths``; ``jobs`` worker processes (0: one per CPU when there are many files)."""
    if jobs <= 0:
        jobs = (os.cpu_count() or 1) if len(paths) >= PARALLEL_MIN_FILES else 1
    jobs = min(jobs, len(paths)) if paths else 1
    if jobs == 1:
        results = [check_file(path, options) for path in paths]
    else:
        chunk = max(1, len(paths) // (jobs * 4))
        with ProcessPoolExecutor(max_workers=jobs, mp_context=_context(), initializer=_init,
                                 initargs=(options,)) as pool:
            results = list(pool.map(_check, paths, chunksize=chunk))
    return results if options.check_all else _check_helpers(results, options)


def _check_helpers(results: list[FileResult], options: LintOptions) -> list[FileResult]:
    """Check the local modules a distributed script imports (nanoGPT's ``model.py``) as
    distributed code: they run in every process of its job (see
    :mod:`distify.analysis.project`, which ``convert`` uses to leave them alone)."""
    waiting = {Path(r.path): i for i, r in enumerate(results) if r.skipped == "not distributed"}
    if not waiting or len(waiting) == len(results):
        return results
    # realpath, not resolve(): a symlink loop among the files stays a finding of its own
    root = Path(os.path.commonpath([os.path.dirname(os.path.realpath(r.path)) for r in results]))
    everyone = replace(options, check_all=True)
    real: dict[Path, Path] = {}  # each file's resolve(), once for every round
    while True:
        imports = {Path(r.path): r.imports for r in results if not _loops(r)}
        distributed = [Path(r.path) for r in results if not r.skipped and r.imports]
        found = [path for path in imported_by_parallel(imports, distributed, (), root, real=real)
                 if path in waiting]
        if not found:
            return results
        for path in found:
            results[waiting.pop(path)] = check_file(str(path), everyone)


def _loops(result: FileResult) -> bool:
    """Is the file a symlink loop (it has no path to resolve, and imports nothing)?"""
    return any(f.code == PARSE_ERROR and f.message == SYMLINK_LOOP for f in result.findings)


def _context():
    # fork starts workers in milliseconds with everything already imported; macOS and
    # Windows lack a safe fork, so they get the platform default.
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _init(options: LintOptions) -> None:
    global _OPTIONS
    _OPTIONS = options


def _check(path: str) -> FileResult:
    return check_file(path, _OPTIONS)


@dataclass(frozen=True)
class FixOutcome:
    """A fixed file: its new result, and its diff (for ``--diff``)."""

    result: FileResult
    diff: str
    fixed: int


def fix_file(result: FileResult, options: LintOptions, *, write: bool) -> FixOutcome:
    """Apply the fixes of ``result``'s findings; write the file (atomically) if ``write``.

    The fixed source is checked again, so what remains is exactly what the file still has.
    """
    from distify.lint.fixer import apply_fixes, unified_diff  # LibCST only when fixing

    with open(result.path, "rb") as handle:
        source = handle.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    before = source.decode(encoding)
    fixes = [finding.fix for finding in result.findings if finding.fix is not None]
    after = apply_fixes(before, fixes)
    if after == before:
        return FixOutcome(result, "", 0)
    new = lint_source(after.encode(encoding), result.path, options)
    if any(finding.code == PARSE_ERROR for finding in new.findings):
        raise RuntimeError(f"{result.path}: the fixed source does not parse")
    if write:
        atomic_write_bytes(result.path, after.encode(encoding))
    fixed = len(result.findings) - len(new.findings)
    return FixOutcome(new, unified_diff(result.path, before, after), max(fixed, 0))
