"""``syntax._code`` reads names, numbers, strings and plain dotted names from their tokens; what
it gives must be LibCST's own code for the node, on every such node of the fixtures."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from distify.convert.syntax import _code, _shift_continuations

FIXTURES = Path(__file__).parent / "fixtures"


class _Expressions(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Name, cst.Attribute, cst.Integer, cst.Float, cst.SimpleString,
                             cst.Call, cst.Subscript)):
            self.found.append(node)
        return True


def test_code_is_libcst_code_on_the_fixtures():
    checked = 0
    for path in sorted(FIXTURES.rglob("*.py"))[:120]:
        try:
            module = cst.parse_module(path.read_bytes())
        except cst.ParserSyntaxError:
            continue
        finder = _Expressions()
        module.visit(finder)
        for node in finder.found:
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

    class _Every(cst.CSTVisitor):
        def __init__(self) -> None:
            super().__init__()
            self.found: list[cst.CSTNode] = []

        def on_visit(self, node: cst.CSTNode) -> bool:
            self.found.append(node)
            return True

    checked = spanning = 0
    for path in sorted(FIXTURES.rglob("*.py"))[:80]:
        try:
            module = cst.parse_module(path.read_bytes())
        except cst.ParserSyntaxError:
            continue
        every = _Every()
        module.visit(every)
        for node in every.found:
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
