"""``analysis.astwalk``: the same children and the same breadth-first order as the stdlib's
``ast.iter_child_nodes``/``ast.walk``, less the context and operator singletons."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from distify.analysis.astwalk import child_nodes, iter_walk, walk

_LEAVES = (ast.expr_context, ast.operator, ast.boolop, ast.cmpop, ast.unaryop)
_SOURCES = sorted((Path(__file__).parent / "fixtures").rglob("*.py"))[:60] + [
    Path(ast.__file__)]
_EVERY_KIND = """\
from __future__ import annotations
import a.b as c
x: int = -1 + 2 * (3 if y else 4) < 5 != 6
del x[0], y.z
global g
async def f(p, /, q=1, *r, s, **t) -> None:
    async with u as (v, w):
        async for i in j:
            await k
    nonlocal n
    yield from m
    return [l for l in o if l] or {a: b for a, b in c} and {*d} and (e for e in f)
match p:
    case {"k": 1, **rest} | [1, *others] | Point(x=0) as pt if pt: pass
    case None: pass
try:
    raise E from F
except* G as h:
    lambda z=1: z
t = f"{a!r:>{b}}" ; assert q, "msg"
"""


def _cases() -> list[tuple[str, str]]:
    return [(str(path), path.read_text(encoding="utf-8", errors="replace"))
            for path in _SOURCES] + [("every-kind", _EVERY_KIND)]


@pytest.mark.parametrize(("name", "text"), _cases(), ids=[name[-40:] for name, _ in _cases()])
def test_the_same_nodes_in_the_same_order_without_the_singletons(name: str, text: str) -> None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        pytest.skip("not Python 3.11 source")
    for node in ast.walk(tree):
        expected = [c for c in ast.iter_child_nodes(node) if not isinstance(c, _LEAVES)]
        assert child_nodes(node) == expected
    assert walk(tree) == [n for n in ast.walk(tree) if not isinstance(n, _LEAVES)]
    assert list(iter_walk(tree)) == walk(tree)
    assert any(isinstance(n, _LEAVES) for n in ast.walk(tree))  # there were some to leave out
