"""The bookkeeping of one conversion: what the rewrite families record about the nodes being
walked, in one object the driver makes per module (``self.ctx`` in every handler).

The families read and write its fields; none keeps this kind of state on the transformer itself.
What a family alone needs about the whole file (its analyses, made in its ``visit_Module``
handler) stays with that family.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst


@dataclass
class ConvertContext:
    """The mutable state of one conversion, per module."""

    # ---------------------------------------------------------------- the statement being left
    #: the simple statements (lines, or one-line suites) being visited, innermost last
    statements: list[cst.SimpleStatementLine] = field(default_factory=list)
    #: id of a statement line → the length of its first line as written (line-length checks)
    first_lines: dict[int, int] = field(default_factory=dict)
    #: per statement being visited: the models to prepare right after it
    pending_models: list[list[str]] = field(default_factory=list)
    #: per statement being visited: (name, assignment index) of the objects it builds
    built: list[list[tuple[str, int]]] = field(default_factory=list)
    #: per statement being visited: does it download a data set (grouped after it is left)
    downloads: list[bool] = field(default_factory=list)
    #: lines to add after the statement being left
    after: list[cst.SimpleStatementLine] = field(default_factory=list)
    #: (rewrite, id of the statement) where a skip was reported → that statement (kept alive,
    #: so that its id is not reused)
    skip_sites: dict[tuple[str, int], cst.CSTNode] = field(default_factory=dict)
