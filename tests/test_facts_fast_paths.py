"""The whole-file analysis's fast paths find what the plain per-node walks find.

``gather_facts`` shows the parallelism markers and the evaluation flow only the node types they
read (``SEEN``), and :func:`~distify.analysis.draws.may_draw_batches` reads expressions whole,
carrying its function and loop context through statements only. Each is checked here against
the plain version over every committed fixture and a few shapes written for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from distify.analysis import parallelism
from distify.analysis.draws import TORCH_LOOP_DRAWS, _last_name, draw_family, may_draw_batches
from distify.analysis.evaluation import FlowFinder
from distify.analysis.names import ImportMap, ast_dotted_name
from distify.rules import default_rules

_FIXTURES = sorted((Path(__file__).parent / "fixtures").rglob("*.py"))

_SHAPES = {
    "decorator draws": """\
import random, torch
@cache(random.random())
def pick(): pass
for x in loader:
    pick()
""",
    "default draws": """\
import numpy as np
def noise(n=np.random.randn(3)): return n
while True:
    noise()
""",
    "lambda in a loop": """\
import torch
for x in loader:
    f = lambda: torch.randn(3)
    loss.backward()
""",
    "except and match bodies": """\
import random
def draw():
    try:
        pass
    except ValueError:
        return random.choice([1, 2])
def other():
    match x:
        case 1:
            draw()
for batch in loader:
    other()
""",
    "a loop in an except handler": """\
import torch
try:
    pass
except ValueError:
    for b in loader:
        torch.randn(2).backward()
""",
    "a function in a match case": """\
import random
match mode:
    case "train":
        def pick():
            return random.random()
for b in loader:
    pick()
""",
    "a loop in a function in a loop": """\
import torch
for epoch in range(3):
    def step():
        for b in loader:
            y = torch.rand(2)
            y.backward()
    step()
""",
    "a loop header draws": """\
import torch
async def main():
    async for b in stream(torch.randint(3, (2,))):
        b.backward()
""",
    "an aliased draw": """\
from torch import randn as noise
for b in loader:
    model(b + noise(3)).sum().backward()
""",
    "no draw": """\
import torch
for x in loader:
    loss = model(x)
    loss.backward()
""",
}


def _sources() -> list[tuple[str, str]]:
    found = [(path.relative_to(path.parent.parent).as_posix(),
              path.read_text(encoding="utf-8", errors="replace")) for path in _FIXTURES]
    return found + sorted(_SHAPES.items())


def _trees() -> list[tuple[str, ast.Module]]:
    """(name, tree) of every source that parses."""
    found = []
    for name, text in _sources():
        try:
            found.append((name, ast.parse(text)))
        except SyntaxError:
            continue
    return found


def _may_draw_per_node(tree: ast.Module, imports: ImportMap) -> bool:
    """The plain version: every node walked with its function and enclosing loops."""
    calls_of: dict[str | None, set[str | None]] = {}
    drawing: set[str | None] = set()
    loops: list[list] = []
    stack: list[tuple[ast.AST, str | None, tuple[int, ...]]] = [(tree, None, ())]
    while stack:
        node, function, inside = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function, inside = node.name, ()
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            loops.append([set(), False, False])
            inside = (*inside, len(loops) - 1)
        elif isinstance(node, ast.Call):
            name = _last_name(node.func)
            calls_of.setdefault(function, set()).add(name)
            qual = imports.ast_qualname(node.func)
            if draw_family(qual) is not None:
                drawing.add(function)
            for index in inside:
                loops[index][0].add(name)
                loops[index][2] = loops[index][2] or name == "backward"
                loops[index][1] = loops[index][1] or qual in TORCH_LOOP_DRAWS
        stack.extend((child, function, inside) for child in ast.iter_child_nodes(node))
    drawing.discard(None)
    changed = bool(drawing)
    while changed:
        grown = {name for name, called in calls_of.items() if called & drawing} - {None}
        changed = not grown <= drawing
        drawing |= grown
    return any(called & drawing or (draws and backward) for called, draws, backward in loops)


def test_may_draw_batches_answers_as_the_per_node_walk() -> None:
    answers = {True: 0, False: 0}
    for name, tree in _trees():
        imports = ImportMap.from_ast(tree)
        expected = _may_draw_per_node(tree, imports)
        assert may_draw_batches(tree, imports) == expected, name
        answers[expected] += 1
    assert answers[True] >= 10 and answers[False] >= 10  # both answers were tested


@pytest.mark.parametrize("name", sorted(set(_SHAPES) - {"no draw"}))
def test_may_draw_batches_finds_the_draws_written_for_it(name: str) -> None:
    tree = ast.parse(_SHAPES[name])
    assert may_draw_batches(tree, ImportMap.from_ast(tree))


def test_may_draw_batches_finds_no_draw_where_there_is_none() -> None:
    tree = ast.parse(_SHAPES["no draw"])
    assert not may_draw_batches(tree, ImportMap.from_ast(tree))


def _state(obj: object) -> dict[str, object]:
    return {key: repr(value) for key, value in vars(obj).items()}


def test_the_markers_and_the_flow_read_only_the_node_types_they_name() -> None:
    """Shown every node, or only those of ``SEEN``: the same answers; and the nodes outside
    ``SEEN`` change nothing."""
    rules = default_rules()
    distributed = 0
    for name, tree in _trees():
        imports = ImportMap.from_ast(tree)
        nodes = list(ast.walk(tree))
        every, some = parallelism.Finder(imports, rules), parallelism.Finder(imports, rules)
        others = parallelism.Finder(imports, rules)
        untouched = _state(parallelism.Finder(imports, rules))
        flow_every, flow_some = FlowFinder(imports, rules), FlowFinder(imports, rules)
        flow_others = FlowFinder(imports, rules)
        flow_untouched = _state(FlowFinder(imports, rules))
        for node in nodes:
            every.see(node)
            (some if type(node) in parallelism.SEEN else others).see(node)
            flow_every.see(node)
            (flow_some if type(node) in FlowFinder.SEEN else flow_others).see(node)
        assert every.result() == some.result(), name
        assert _state(others) == untouched, name
        assert flow_every.result(tree) == flow_some.result(tree), name
        assert _state(flow_others) == flow_untouched, name
        distributed += every.result() is not None
    assert distributed >= 5  # markers were found, and found alike


def test_the_losses_are_those_of_every_binding_read() -> None:
    """The evaluation flow stops reading the values bound to a name once no binding can make
    it a batch's loss (one reduces by no known loss, or two differ); the losses found are
    those of reading every binding."""
    rules = default_rules()
    found = 0
    for name, tree in _trees():
        finder = FlowFinder(ImportMap.from_ast(tree), rules)
        for node in ast.walk(tree):
            finder.see(node)
        flow = finder.result(tree)
        every: dict[str, set[str]] = {}
        for node in finder.assigns:
            if any(isinstance(t, ast.Name) and t.id in flow.criteria for t in node.targets):
                continue
            reduction = finder.reduction_of(node.value)
            for target in node.targets:
                if isinstance(target, ast.Name):
                    every.setdefault(target.id, set()).add(reduction or "?")
        assert flow.batch_losses == {n for n, seen in every.items() if seen == {"mean"}}, name
        assert flow.sum_losses == {n for n, seen in every.items() if seen == {"sum"}}, name
        found += len(flow.batch_losses) + len(flow.sum_losses)
    assert found >= 20  # losses were found, and found alike


def test_ast_qualname_resolves_the_dotted_name() -> None:
    """``ImportMap.ast_qualname`` in one pass equals resolving the dotted name, on every
    expression of the fixtures."""
    compared = 0
    for name, tree in _trees():
        imports = ImportMap.from_ast(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.expr):
                assert imports.ast_qualname(node) == imports.resolve(ast_dotted_name(node)), name
                compared += isinstance(node, ast.Attribute)
    assert compared > 1000
