"""Shared by DST101-DST104: a call from the ``side_effects`` pack reached by every rank."""

from __future__ import annotations

import ast
from typing import ClassVar

from distify.analysis.effects import ast_shape, side_effect
from distify.lint.checks._guard_style import guard_fix
from distify.lint.engine import Site
from distify.lint.rule import LintRule
from distify.rules import Entry


class SideEffectRule(LintRule):
    """Reports calls of one ``kind`` of side effect that every rank runs.

    A call counts as guarded when every way the walk knows of reaching it passes a main-process
    guard (see :mod:`distify.analysis.guards`), including through the calls of the function it
    is in.
    The fix wraps the statement in a guard spelled in the file's own vocabulary (see
    :mod:`distify.lint.checks._guard_style`) when the statement is the call itself (or a
    ``with`` around it) and nothing after it needs what it binds.
    """

    KIND: ClassVar[str] = ""
    WHAT: ClassVar[str] = ""  # "writes a checkpoint", filled into MESSAGE

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.sites: list[tuple[ast.Call, Site, Entry]] = []

    def visit_Call(self, node: ast.Call) -> None:
        callee = self.ctx.callee(node)
        if callee is None or self.ctx.match("side_effects", callee) is None:
            return
        entry = side_effect(self.ctx.matcher, callee, ast_shape(node, self.ctx.imports))
        if entry is not None and entry.get("kind") == self.KIND:
            self.sites.append((node, self.ctx.site(), entry))

    def keep(self, node: ast.Call, entry: Entry) -> bool:
        """Last look in ``finish``, when the whole file has been seen."""
        return True

    def finish(self) -> None:
        ctx = self.ctx
        for node, site, entry in self.sites:
            if not ctx.on_every_rank(ctx.reaches(site)) or not self.keep(node, entry):
                continue
            stmt = site.stmt
            whole = (isinstance(stmt, ast.Expr) and stmt.value is node) or (
                isinstance(stmt, (ast.With, ast.AsyncWith))
                and any(item.context_expr is node for item in stmt.items))
            fix = guard_fix(ctx, site) if whole else None
            self.report(node, self.MESSAGE.format(name=self.display(node)), site=site, fix=fix)

    def display(self, node: ast.Call) -> str:
        return self.ctx.segment(node.func)

