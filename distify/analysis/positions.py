"""Line numbers for a handful of nodes, at the cost of one code generation.

LibCST's PositionProvider records a position for every node (about 1.5× a parse on a large
file). We only need the lines of the nodes a rewrite touched, so we generate the code once with
a codegen state that notes the current line when one of those nodes starts.
"""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst
from libcst._nodes.internal import CodegenState


class _LineRecorder(CodegenState):
    __slots__ = ("wanted", "lines", "_line", "_counted")

    def __init__(self, wanted: set[int], default_indent: str, default_newline: str) -> None:
        super().__init__(default_indent=default_indent, default_newline=default_newline)
        self.wanted = wanted
        self.lines: dict[int, int] = {}
        self._line = 1
        self._counted = 0

    def before_codegen(self, node: cst.CSTNode) -> None:
        if id(node) in self.wanted:
            tokens = self.tokens
            for token in tokens[self._counted:]:
                self._line += token.count("\n")
            self._counted = len(tokens)
            self.lines.setdefault(id(node), self._line)


def start_line(node: cst.CSTNode) -> cst.CSTNode:
    """The node whose start is the syntactic start of ``node`` (past leading comment lines)."""
    if isinstance(node, cst.SimpleStatementLine) and node.body:
        return node.body[0]
    if isinstance(node, (cst.For, cst.While, cst.If)):
        return node.target if isinstance(node, cst.For) else node.test
    return node


def lines_of(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> tuple[str, dict[int, int]]:
    """Generate ``module``'s code and the 1-based line where each of ``nodes`` starts.

    Returns:
        the generated code and a map from ``id(node)`` to its line.
    """
    wanted = {id(node) for node in nodes}
    state = _LineRecorder(wanted, module.default_indent, module.default_newline)
    module._codegen(state)
    return "".join(state.tokens), state.lines
