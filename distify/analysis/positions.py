"""Line numbers for a handful of nodes of a generated module, with LibCST's public API only.

LibCST's ``WhitespaceInclusivePositionProvider`` records a position for every node (about five
times a code generation on a large file), and a codegen state that notes the line where one
node starts would subclass LibCST's private ``CodegenState``. We need the lines of the few nodes
a rewrite touched: the code comes from ``Module.code``, and one read-only walk in code order
counts the newlines the tokens hold, which only whitespace, comments, strings and the newline
nodes can. The line of a node is where its code starts, leading comment and blank lines
included, as the whitespace-inclusive provider has it (``tests/test_positions.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from distify.analysis.walk import child_fields, is_node_type

#: the nodes whose one token is their ``value``: the only text, with :class:`libcst.Newline`,
#: that can hold a line break (a backslash continuation, a triple-quoted string)
_TEXT = frozenset({cst.SimpleWhitespace, cst.SimpleString, cst.FormattedStringText,
                   cst.Comment, *([cst.TemplatedStringText]
                                  if hasattr(cst, "TemplatedStringText") else [])})
#: one token and parentheses: nothing below them when they have no parentheses
_ATOMS = frozenset({cst.Name, cst.Integer, cst.Float, cst.Imaginary})


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
        the generated code and a map from ``id(node)`` to its line (a node that is not in
        ``module`` has none; a node that is there twice, its first line).
    """
    wanted = {id(node) for node in nodes}
    default = module.default_newline.count("\n")
    lines: dict[int, int] = {}
    line = 1
    sequence = (tuple, list)
    newline, block = cst.Newline, cst.IndentedBlock

    def visit(node: cst.CSTNode) -> None:
        nonlocal line
        kind = type(node)
        if id(node) in wanted and id(node) not in lines:
            lines[id(node)] = line
        if kind in _TEXT:
            if kind is cst.SimpleString and (node.lpar or node.rpar):  # `(\n "text"\n)`
                for paren in node.lpar:
                    visit(paren)
                line += node.value.count("\n")
                for paren in node.rpar:
                    visit(paren)
            else:
                line += node.value.count("\n")
        elif kind in _ATOMS and not node.lpar and not node.rpar:
            pass
        elif kind is newline:
            line += default if node.value is None else node.value.count("\n")
        elif kind is block and not node.body:  # LibCST writes `pass` and a newline
            visit(node.header)
            line += default
            for empty in node.footer:
                visit(empty)
        else:
            for name in child_fields(node):
                value = getattr(node, name)
                if type(value) in sequence:
                    for child in value:
                        visit(child)
                elif is_node_type(type(value)):
                    visit(value)
                elif isinstance(value, sequence):
                    for child in value:
                        visit(child)

    visit(module)
    return module.code, lines
