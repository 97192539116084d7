"""Shared by DST201-DST202: collectives reached by only some ranks."""

from __future__ import annotations

import ast
from typing import ClassVar

from distify.analysis.guards import ALL, MAIN, NOT_MAIN
from distify.lint.engine import Site, State
from distify.lint.rule import LintRule


class CollectiveRule(LintRule):
    """Reports collectives whose every-rank-ness is broken by a cause of the kinds in CAUSES.

    A collective under a main-only condition is not reported when the same function also calls
    it under the complementary condition (``if rank == 0: dist.gather(t, lst) else:
    dist.gather(t)``, or the "main process first" barrier pair): every rank then reaches one.
    """

    CAUSES: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.sites: list[tuple[ast.Call, Site, str]] = []

    def visit_Call(self, node: ast.Call) -> None:
        name = self.ctx.callee(node)
        if self.ctx.match("collectives", name):
            self.sites.append((node, self.ctx.site(), name))

    def finish(self) -> None:
        paired = self._paired()
        for node, site, name in self.sites:
            if (site.function, name) in paired:
                continue
            bad = [state for state in self.ctx.reaches(site)
                   if state.reach is not ALL and state.cause.kind in self.CAUSES]
            if bad:
                state = min(bad, key=lambda state: state.cause.line)
                self.report(node, self.message(node, state), site=site)

    def message(self, node: ast.Call, state: State) -> str:
        return self.MESSAGE.format(name=self.ctx.segment(node.func), who=state.reach.value,
                                   line=state.cause.line)

    def _paired(self) -> set[tuple[ast.AST | None, str]]:
        seen: dict[tuple[ast.AST | None, str], set] = {}
        for _, site, name in self.sites:
            seen.setdefault((site.function, name), set()).add(site.state.reach)
        return {key for key, reaches in seen.items() if {MAIN, NOT_MAIN} <= reaches}
