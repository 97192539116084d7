"""analysis/literals: ``literal_value`` is LibCST's ``evaluated_value`` (same value, same type)
on every literal of the fixtures and on the spellings Python allows."""

from __future__ import annotations

import math
from pathlib import Path

import libcst as cst
import pytest

from distify.analysis.literals import literal_value

FIXTURES = Path(__file__).parent / "fixtures"
_LITERALS = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.ConcatenatedString)


def _same(node: cst.BaseExpression) -> None:
    ours, theirs = literal_value(node), node.evaluated_value
    code = cst.Module([]).code_for_node(node)
    assert type(ours) is type(theirs), code
    assert ours == theirs or (isinstance(ours, float) and math.isnan(ours)), code


def test_every_literal_of_the_fixtures() -> None:
    found: list[cst.BaseExpression] = []

    class _Literals(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, _LITERALS):
                found.append(node)
            return True

    for path in sorted(FIXTURES.rglob("*.py")):
        try:
            cst.parse_module(path.read_bytes()).visit(_Literals())
        except cst.ParserSyntaxError:
            continue
    for node in found:
        _same(node)
    assert len(found) > 5_000


@pytest.mark.parametrize("code", [
    "0", "00", "7", "1_000", "0x1F", "0X_ff", "0o17", "0b1010", "0B_1",
    "1.5", "1.", ".5", "1e3", "1E-3", "1_000.000_1", "1e1_0", "0.0",
    "2j", "1.5J",
    "'a'", '"a"', "''", "'''a\nb'''", '"""x"""', "r'a\\b'", "R'\\n'", "u'é'", "U'x'",
    "'a\\nb'", "'\\x41'", "'\\N{BULLET}'", "b'a'", "rb'\\x'", "Br'a'", "'a\\\nb'",
    "'a' 'b'", "'a' r'\\b'", "f'{x}' 'y'",
])
def test_spellings(code: str) -> None:
    node = cst.parse_expression(code)
    assert isinstance(node, _LITERALS)
    _same(node)


def test_a_string_with_a_carriage_return_in_it() -> None:
    module = cst.parse_module(b"x = '''a\r\nb'''\r\n")
    _same(module.body[0].body[0].value)
