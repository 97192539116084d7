"""distify.analysis.walk calls a visitor's hooks exactly as LibCST's own ``visit`` does."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from distify.analysis.walk import walk

FIXTURES = sorted(p for p in (Path(__file__).parent / "fixtures").rglob("*.py")
                  if not p.name.endswith(".out.py"))


class _Trace(cst.CSTVisitor):
    """Records every hook call with the node's identity."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def _note(self, hook: str, node: cst.CSTNode) -> None:
        self.calls.append((hook, id(node)))


class _Expressions(_Trace):
    def visit_Call(self, node: cst.Call) -> None:
        self._note("Call", node)

    def leave_Call(self, original_node: cst.Call) -> None:
        self._note("/Call", original_node)

    def visit_Name(self, node: cst.Name) -> None:
        self._note("Name", node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self._note("Attribute", node)
        return node.attr.value != "data"  # prunes some subtrees

    def visit_FormattedStringExpression(self, node: cst.FormattedStringExpression) -> None:
        self._note("FStringExpr", node)

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self._note("Lambda", node)
        return False

    def visit_Comma(self, node: cst.Comma) -> None:  # punctuation hooked: not skipped
        self._note("Comma", node)


class _Statements(_Trace):
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._note("Line", node)

    def visit_For(self, node: cst.For) -> None:
        self._note("For", node)

    def leave_For(self, original_node: cst.For) -> None:
        self._note("/For", original_node)

    def visit_Assign(self, node: cst.Assign) -> None:
        self._note("Assign", node)

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self._note("Class", node)
        return not node.name.value.startswith("_")

    def leave_ExceptHandler(self, original_node: cst.ExceptHandler) -> None:
        self._note("/Except", original_node)


class _Generic(_Trace):
    def on_visit(self, node: cst.CSTNode) -> bool:
        self._note("on_visit", node)
        return not isinstance(node, cst.Subscript)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._note("on_leave", original_node)


def test_same_hooks_in_the_same_order_as_libcst() -> None:
    assert len(FIXTURES) > 50
    hooks = 0
    for path in FIXTURES:
        module = cst.parse_module(path.read_bytes())
        for visitor in (_Expressions, _Statements, _Generic):
            expected, got = visitor(), visitor()
            module.visit(expected)
            walk(module, got)
            assert got.calls == expected.calls, (path, visitor.__name__)
            hooks += len(got.calls)
    assert hooks > 10_000


def test_a_field_visited_only_when_set() -> None:
    """``format_spec`` of an f-string part is visited only when there is one: a type first met
    without it is learnt again when it has one."""
    module = cst.parse_module('f"{a}"\nf"{b:>{width}}"\n')
    expected, got = _Expressions(), _Expressions()
    module.visit(expected)
    walk(module, got)
    assert got.calls == expected.calls
    assert ("Name", id(module.body[1].body[0].value.parts[0].format_spec[1].expression)) \
        in got.calls


def test_attribute_hooks_are_left_to_libcst() -> None:
    class _Attributes(_Trace):
        def visit_Call_func(self, node: cst.Call) -> None:
            self._note("Call.func", node)

    module = cst.parse_module("f(g(x))\n")
    got = _Attributes()
    walk(module, got)
    assert [hook for hook, _ in got.calls] == ["Call.func", "Call.func"]


def test_read_names_reads_what_the_children_hold() -> None:
    """`read_names` follows the fields LibCST visits (not `node.children`, a visitor per node):
    the same names as the plain definition over `children`, for every statement of every
    fixture."""
    from distify.analysis.names import read_names
    from distify.analysis.walk import children

    def by_children(node: cst.CSTNode) -> set[str]:
        found, stack = set(), [node]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.Name):
                found.add(node.value)
            elif isinstance(node, cst.Attribute):
                stack.append(node.value)
            else:
                stack.extend(node.children)
        return found

    compared = 0
    for path in FIXTURES[::3]:
        for statement in cst.parse_module(path.read_bytes()).body:
            assert read_names(statement) == by_children(statement), path
            assert children(statement) == list(statement.children), path
            compared += 1
    assert compared > 500
