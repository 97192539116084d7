"""``syntax._code`` reads names, numbers, strings and plain dotted names from their tokens; what
it gives must be LibCST's own code for the node, on every such node of the fixtures."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from distify.convert.syntax import _code, _shift_continuations

FIXTURES = Path(__file__).parent / "fixtures"


class _Nodes(cst.CSTVisitor):
    """Collects every node of the kinds asked for (every node: ``kinds`` None)."""

    def __init__(self, kinds: tuple[type, ...] | None) -> None:
        super().__init__()
        self.kinds = kinds
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.kinds is None or isinstance(node, self.kinds):
            self.found.append(node)
        return True


def _fixture_nodes(files: int, kinds: tuple[type, ...] | None = None):
    """(path, node) for the nodes of the first ``files`` fixtures LibCST parses."""
    for path in sorted(FIXTURES.rglob("*.py"))[:files]:
        try:
            module = cst.parse_module(path.read_bytes())
        except cst.ParserSyntaxError:
            continue
        nodes = _Nodes(kinds)
        module.visit(nodes)
        for node in nodes.found:
            yield path, node


def test_code_is_libcst_code_on_the_fixtures():
    checked = 0
    kinds = (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.SimpleString, cst.Call,
             cst.Subscript)
    for path, node in _fixture_nodes(120, kinds):
        assert _code(node) == cst.Module([]).code_for_node(node), path
        checked += 1
    assert checked > 10_000


def test_odd_spellings():
    for source in ["(a)", "a . b", "(a).b", "(a.b)", "a.b().c", "x[0].y", "(\n a\n).b",
                   "a.\\\n b", "'x' 'y'", "f'{a}'", "-1", "1j"]:
        node = cst.parse_expression(source)
        assert _code(node) == source


def test_shift_continuations_moves_aligned_lines_and_keeps_hanging_ones():
    call = cst.parse_expression("f(a,\n  b, g({\n    'k': 1}),\n  c)")
    shifted = _shift_continuations(call, 3)
    assert cst.Module([]).code_for_node(shifted) == "f(a,\n     b, g({\n    'k': 1}),\n     c)"
    assert _shift_continuations(call, 0) is call


def test_spans_lines_is_a_line_break_in_the_code_on_the_fixtures():
    from distify.convert.syntax import _spans_lines

    checked = spanning = 0
    for path, node in _fixture_nodes(80):
        if isinstance(node, cst.Module):
            continue
        try:
            expected = "\n" in cst.Module([]).code_for_node(node)
        except Exception:  # a node that needs its parent to be written (CSTCodegenError)
            continue
        assert _spans_lines(node) == expected, (path, cst.Module([]).code_for_node(node))
        checked += 1
        spanning += expected
    assert checked > 50_000 and spanning > 1_000
    for source in ["(a\n)", "a \\\n+ b", "'''x\ny'''", "f'''{a}\n'''", "f(a,  # c\n b)", "[1]"]:
        node = cst.parse_expression(source)
        assert _spans_lines(node) == ("\n" in source)
