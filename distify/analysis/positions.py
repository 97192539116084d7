"""Line numbers for a handful of nodes of a generated module, with LibCST's public API only.

LibCST's ``WhitespaceInclusivePositionProvider`` records a position for every node (about five
times a code generation on a large file), and a codegen state that notes the line where one
node starts would subclass LibCST's private ``CodegenState``. We need the lines of the few nodes
a rewrite touched: the code comes from ``Module.code``, and one read-only walk in code order
counts the newlines the tokens hold, which only whitespace, comments, strings and the newline
nodes can. The line of a node is where its code starts, leading comment and blank lines
included, as the whitespace-inclusive provider has it (``tests/test_positions.py``).

The walk visits only the nodes that can be wanted or hold a wanted node: when no wanted node is
whitespace, punctuation, a name, a number or a string (report lines are anchored to statements,
calls, attributes, ...), those (about four in five of a module's nodes) are not visited but
their newlines counted where the walk meets them.
"""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from distify.analysis.walk import PUNCTUATION, child_fields, is_a, is_node_type

#: the nodes whose one token is their ``value``: the only text, with :class:`libcst.Newline`,
#: that can hold a line break (a backslash continuation, a triple-quoted string)
_TEXT = frozenset({cst.SimpleWhitespace, cst.SimpleString, cst.FormattedStringText,
                   cst.Comment, *([cst.TemplatedStringText]
                                  if hasattr(cst, "TemplatedStringText") else [])})
#: one token and parentheses: nothing below them when they have no parentheses
_ATOMS = frozenset({cst.Name, cst.Integer, cst.Float, cst.Imaginary})


def start_line(node: cst.CSTNode) -> cst.CSTNode:
    """The node whose start is the syntactic start of ``node`` (past leading comment lines)."""
    if type(node) is cst.SimpleStatementLine and node.body:
        return node.body[0]
    if type(node) in (cst.For, cst.While, cst.If):
        return node.target if type(node) is cst.For else node.test
    return node


def lines_of(module: cst.Module, nodes: Iterable[cst.CSTNode],
             code: str | None = None) -> tuple[str, dict[int, int]]:
    """Generate ``module``'s code and the 1-based line where each of ``nodes`` starts.

    ``code``: the module's code, when the caller has it another way (copied in part from the
    source, see :meth:`distify.convert.starts.StatementStarts.code`). It is used when it holds
    as many line breaks as the walk counted in the module's tokens, and the module's own code
    is generated otherwise: a line too many or too few would put every report line after it
    in the wrong place, and the output itself would be wrong.

    Returns:
        the code and a map from ``id(node)`` to its line (a node that is not in ``module`` has
        none; a node that is there twice, its first line).
    """
    nodes = list(nodes)
    wanted = {id(node) for node in nodes}
    lines: dict[int, int] = {}
    if any(_how(type(node)) != _VISIT for node in nodes):
        last = _every_node(module, wanted, lines)
    else:
        last = _statements_and_expressions(module, wanted, lines)
    if code is not None and module.has_trailing_newline and code.count("\n") == last - 1:
        return code, lines
    return module.code, lines


#: how :func:`_statements_and_expressions` treats a child of a node it visits, by the child's
#: type: not a node (None, a sentinel); a node that may be wanted, visited; a name or number
#: (newlines only in its parentheses); one token of text; punctuation between two whitespaces
#: (a comma, an operator); the end of a line (``EmptyLine``, ``TrailingWhitespace``); any other
#: whitespace, punctuation or string (its newlines counted, in :func:`_newlines`)
_NO_NODE, _VISIT, _ATOM, _ONE_TOKEN, _BETWEEN, _LINE_END, _OTHER = range(7)
_HOW: dict[type, int] = {}


def _how(kind: type) -> int:
    found = _HOW.get(kind)
    if found is not None:
        return found
    if not is_node_type(kind):
        found = _NO_NODE
    elif kind in _ATOMS or kind is cst.Ellipsis:
        found = _ATOM
    elif kind in _TEXT and kind is not cst.SimpleString:
        found = _ONE_TOKEN
    elif kind in (cst.EmptyLine, cst.TrailingWhitespace):
        found = _LINE_END
    elif is_a(kind, PUNCTUATION) and set(kind.__dataclass_fields__) - {"__slots__"} == {
            "whitespace_before", "whitespace_after"}:
        found = _BETWEEN
    elif is_a(kind, PUNCTUATION) or kind is cst.SimpleString:
        found = _OTHER
    else:
        found = _VISIT
    _HOW[kind] = found
    return found


def _statements_and_expressions(module: cst.Module, wanted: set[int],
                                lines: dict[int, int]) -> int:
    """:func:`_every_node` for wanted nodes that are neither whitespace, punctuation, names,
    numbers nor strings (what a rewrite anchors its report lines to): those hold no such node,
    so the walk visits only the others (a fifth of a module's nodes) and counts the newlines
    of the rest where it meets them, mostly without a call."""
    default = module.default_newline.count("\n")
    line = 1
    how_of, block, simple = _HOW, cst.IndentedBlock, cst.SimpleWhitespace

    def visit(node: cst.CSTNode) -> None:
        nonlocal line
        key = id(node)
        if key in wanted and key not in lines:
            lines[key] = line
        if type(node) is block and not node.body:  # LibCST writes `pass` and a newline
            line += _newlines(node.header, default) + default
            for empty in node.footer:
                line += _newlines(empty, default)
            return
        for name in child_fields(node):
            value = getattr(node, name)
            kind = type(value)
            for child in value if kind is tuple or kind is list else (value,):
                kind = type(child)
                how = how_of.get(kind)
                if how is None:
                    how = _how(kind)
                if how == _ONE_TOKEN:
                    line += child.value.count("\n")
                elif how == _VISIT:
                    visit(child)
                elif how == _ATOM:
                    if child.lpar or child.rpar:
                        line += _newlines(child, default)
                elif how == _BETWEEN:
                    space = child.whitespace_before
                    line += space.value.count("\n") if type(space) is simple else \
                        _newlines(space, default)
                    space = child.whitespace_after
                    line += space.value.count("\n") if type(space) is simple else \
                        _newlines(space, default)
                elif how == _LINE_END:
                    newline = child.newline
                    line += (default if newline.value is None else newline.value.count("\n")) \
                        + child.whitespace.value.count("\n")
                    if child.comment is not None:
                        line += child.comment.value.count("\n")
                elif how == _OTHER:
                    line += _newlines(child, default)

    visit(module)
    visit = None  # the recursive closure refers to itself: the cycle ends here, not in the GC
    return line  # the line after the last line break


def _newlines(node: cst.CSTNode, default: int) -> int:
    """The newlines in the code of ``node``, whitespace, punctuation or a leaf (``default``:
    those of the module's newline, which a ``Newline`` without a value stands for)."""
    kind = type(node)
    if kind in _TEXT:
        count = node.value.count("\n")
        if kind is cst.SimpleString:
            for paren in (*node.lpar, *node.rpar):
                count += _newlines(paren, default)
        return count
    if kind is cst.Newline:
        return default if node.value is None else node.value.count("\n")
    count = 0
    for name in child_fields(node):
        value = getattr(node, name)
        if type(value) in (tuple, list):
            for child in value:
                count += _newlines(child, default)
        elif is_node_type(type(value)):
            count += _newlines(value, default)
    return count


def _every_node(module: cst.Module, wanted: set[int], lines: dict[int, int]) -> int:
    """The lines of the wanted nodes, from a walk in code order that visits every node and
    counts the newlines its tokens hold, which only whitespace, comments, strings and the
    newline nodes can."""
    default = module.default_newline.count("\n")
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
    visit = None  # (as above)
    return line
