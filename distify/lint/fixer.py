"""Applying ``--fix``: LibCST rewrites that keep every untouched byte as it was.

The analysis runs on the stdlib ``ast``; only files with fixable findings are parsed again with
LibCST here, and ``PositionProvider`` (the one metadata we need) finds the statements and calls
the fixes name by their line and column. Adjacent statements wrapped with the same guard share
one ``if`` (across comments and blank lines, which move inside it); a fix inside a statement that
another fix already wraps is dropped. The edits themselves are convert's
(:mod:`distify.analysis.codemods`).

A fix never adds an import: the guards are spelled in the file's own vocabulary (see
:mod:`distify.lint.checks._guard_style`), so a fixed script runs wherever it ran before. A fix
that asks for the distify runtime to be imported (``Fix.import_runtime``) is not applied.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from distify.analysis.codemods import backward_through, guarded, merge_guards
from distify.lint.model import Fix


def apply_fixes(text: str, fixes: Sequence[Fix]) -> str:
    """The source ``text`` with ``fixes`` applied (unchanged if none applies).

    Args:
        text: the file's source.
        fixes: fixes of findings in that source, as the checks produced them.
    """
    fixes = [fix for fix in fixes if not fix.import_runtime]
    if not fixes:
        return text
    wrapper = MetadataWrapper(cst.parse_module(text), unsafe_skip_copy=True)
    return wrapper.module.visit(_Fixer(fixes, wrapper.resolve(PositionProvider))).code


def unified_diff(path: str, before: str, after: str) -> str:
    """A ``git diff``-style patch from ``before`` to ``after`` ('' when equal)."""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True),
                                        after.splitlines(keepends=True),
                                        fromfile=f"a/{path}", tofile=f"b/{path}"))


class _Fixer(cst.CSTTransformer):
    def __init__(self, fixes: Sequence[Fix], positions) -> None:
        super().__init__()
        self.positions = positions
        self.guards = {(fix.line, fix.col): fix for fix in fixes if fix.kind == "guard"}
        self.calls = {(fix.line, fix.col): fix for fix in fixes if fix.kind == "backward"}
        self._open: list[cst.CSTNode] = []  # target statements being visited
        self._skip: set[int] = set()  # targets inside another target

    def _where(self, node: cst.CSTNode) -> tuple[int, int] | None:
        position = self.positions.get(node)
        return (position.start.line, position.start.column) if position else None

    def _guard(self, node: cst.CSTNode) -> Fix | None:
        if type(node) in (cst.SimpleStatementLine, cst.With) and id(node) not in self._skip:
            return self.guards.get(self._where(node))
        return None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._guard(node) is not None:
            if self._open:
                self._skip.add(id(node))
            else:
                self._open.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):
        if self._open and self._open[-1] is original_node:
            self._open.pop()
        return super().on_leave(original_node, updated_node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        fix = self.calls.get(self._where(original_node))
        func = updated_node.func
        if fix is None or type(func) is not cst.Attribute:
            return updated_node
        return backward_through(updated_node, cst.parse_expression(fix.receiver))

    def leave_IndentedBlock(self, original_node, updated_node):
        return updated_node.with_changes(body=self._wrap(original_node.body, updated_node.body))

    def leave_Module(self, original_node, updated_node):
        return updated_node.with_changes(body=self._wrap(original_node.body, updated_node.body))

    def _wrap(self, originals, updated) -> list:
        tests: dict[int, str] = {}  # id of each `if` added here → its test
        out: list = []
        for original, new in zip(originals, updated):
            fix = self._guard(original)
            if fix is not None:
                new = guarded([new], cst.parse_expression(fix.guard))
                tests[id(new)] = fix.guard
            out.append(new)
        if not tests:
            return out
        return merge_guards(out, lambda stmt: tests.get(id(stmt)), across_comments=True)
