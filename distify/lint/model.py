"""What a check produces: findings, and the fixes some of them carry (frozen, picklable)."""

from __future__ import annotations

from dataclasses import dataclass

#: The code of a file that could not be read or parsed (always reported, never suppressed).
PARSE_ERROR = "DST000"


@dataclass(frozen=True)
class Fix:
    """A safe edit for one finding, applied with LibCST by :mod:`distify.lint.fixer`.

    ``kind`` is ``"guard"`` (wrap the statement starting at ``line``/``col`` in
    ``if <guard>:``) or ``"backward"`` (turn the call at ``line``/``col`` into
    ``<receiver>.backward(<its receiver>, ...)``). ``col`` counts characters from 0.
    ``import_runtime`` is the alias under which ``distify.runtime`` must be imported for the
    guard to work, or ``""`` when the file already has what the guard uses.
    """

    kind: str
    line: int
    col: int
    guard: str = ""
    receiver: str = ""
    import_runtime: str = ""


@dataclass(frozen=True)
class Finding:
    """One problem at ``path:line:col`` (1-based; ``col`` counts characters); in a notebook,
    ``cell`` is its cell (1-based, over all cells) and ``line`` a line of that cell."""

    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    code: str
    message: str
    fix: Fix | None = None
    cell: int = 0

    @property
    def fixable(self) -> bool:
        return self.fix is not None

    def sort_key(self) -> tuple:
        return (self.path, self.cell, self.line, self.col, self.code)


@dataclass(frozen=True)
class FileResult:
    """The outcome of checking one file. ``skipped`` says why it was not analysed, if it wasn't."""

    path: str
    findings: tuple[Finding, ...] = ()
    skipped: str = ""
    #: the modules a checked file imports, to check the local helpers a distributed one runs
    imports: tuple[str, ...] = ()
