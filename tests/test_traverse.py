"""The rewriting walk (distify.convert.traverse) against LibCST's own ``visit``: the same hooks, in
the same order, the same results, and a new node only where something below it changed."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

import distify.convert.engine as engine
from distify.convert import traverse
from distify.convert.engine import convert_source

FIXTURES = Path(__file__).parent / "fixtures"
SOURCES = sorted(p for p in FIXTURES.rglob("*.py") if not p.name.endswith(".out.py"))


def _by_libcst(module: cst.Module, transformer: cst.CSTTransformer):
    return module.visit(transformer)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_converts_as_under_libcsts_visit(path: Path, monkeypatch) -> None:
    data = path.read_bytes()
    ours = convert_source(data, path.name)
    monkeypatch.setattr(engine, "rewrite", _by_libcst)
    theirs = convert_source(data, path.name)
    assert ours.output == theirs.output
    assert (ours.status, ours.changes, ours.notes) == (theirs.status, theirs.changes, theirs.notes)


class _Recorder(cst.CSTTransformer):
    """Records every hook LibCST calls, attribute hooks included, and changes a few nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, str]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.calls.append(("visit", type(node).__name__, ""))
        return True

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        self.calls.append(("leave", type(original).__name__, ""))
        if isinstance(updated, cst.Name) and updated.value == "old":
            return updated.with_changes(value="new")
        if isinstance(updated, cst.SimpleStatementLine) and "drop" in cst.Module([]).code_for_node(
                updated):
            return cst.RemovalSentinel.REMOVE
        if isinstance(updated, cst.SimpleStatementLine) and "twice" in cst.Module(
                []).code_for_node(updated):
            return cst.FlattenSentinel([updated, updated.deep_clone()])
        return updated

    # the walk calls the attribute hooks around the fields that hold a node or a sequence only
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if _holds_nodes(getattr(node, attribute)):
            self.calls.append(("enter", type(node).__name__, attribute))

    def on_leave_attribute(self, original: cst.CSTNode, attribute: str) -> None:
        if _holds_nodes(getattr(original, attribute)):
            self.calls.append(("exit", type(original).__name__, attribute))


def _holds_nodes(value: object) -> bool:
    return isinstance(value, (cst.CSTNode, tuple, list))


class _Planned(_Recorder):
    """The same transformer, planned for the rewriting walk (every node, every field)."""

    @classmethod
    def traversal_step(cls, kind: type):
        def visit(self, node):
            return self.on_visit(node)

        def leave(self, original, updated):
            return self.on_leave(original, updated)

        return visit, leave, traverse.FIELDS, frozenset()


SOURCE = """\
import torch  # a comment
def f(x: int = 1, *, y=old) -> old:
    drop = 1
    twice(x)
    if x:
        return [old for old in range(3)]
    elif y:
        pass
    else:
        print(f"{x!r:>{old}}")
    return lambda a, b=old: a[1:old, ...]
"""


def test_the_walk_calls_every_hook_libcst_calls_in_its_order() -> None:
    module = cst.parse_module(SOURCE)
    theirs, ours = _Recorder(), _Planned()
    by_libcst = module.visit(theirs)
    by_walk = traverse.rewrite(module, ours)
    assert ours.calls == theirs.calls
    assert by_walk.code == by_libcst.code
    assert "drop" not in by_walk.code and by_walk.code.count("twice(x)") == 2
    assert "old" not in by_walk.code


def test_nothing_unchanged_is_rebuilt() -> None:
    module = cst.parse_module(SOURCE)
    updated = traverse.rewrite(module, _Planned())
    func = updated.body[1]
    assert updated.body[0] is module.body[0]  # the import: nothing in it changed
    assert func is not module.body[1]
    # in the function, the `if` chain's `elif` branch is kept as it was
    chain, before = func.body.body[-2], module.body[1].body.body[-2]
    assert isinstance(chain, cst.If) and chain is not before
    assert chain.orelse.body is before.orelse.body


class _Remove(cst.CSTTransformer):
    def __init__(self, kind: type) -> None:
        super().__init__()
        self.kind = kind

    def on_leave(self, original, updated):
        return cst.RemovalSentinel.REMOVE if isinstance(original, self.kind) else updated


class _PlannedRemove(_Remove):
    @classmethod
    def traversal_step(cls, kind: type):
        return None, lambda self, o, u: self.on_leave(o, u), traverse.CHILDREN, frozenset()


@pytest.mark.parametrize("source, kind", [
    ("def f(x: int): pass\n", cst.Annotation),  # an optional field: None
    ("f(a, b,)\n", cst.Comma),  # a sentinel field: MaybeSentinel.DEFAULT
    ("x = y\n", cst.Name),  # a required field: an error, as in LibCST
])
def test_a_removal_is_what_libcst_makes_of_it(source: str, kind: type) -> None:
    module = cst.parse_module(source)
    try:
        expected = module.visit(_Remove(kind)).code
    except Exception as err:
        with pytest.raises(type(err)):
            traverse.rewrite(module, _PlannedRemove(kind))
        return
    assert traverse.rewrite(module, _PlannedRemove(kind)).code == expected


def test_a_transformer_with_generic_hooks_goes_to_libcst() -> None:
    module = cst.parse_module(SOURCE)
    recorder = _Recorder()  # on_visit/on_leave, no plan of its own
    assert traverse.rewrite(module, recorder).code == module.visit(_Recorder()).code
    assert recorder.calls  # LibCST's visit ran it


def test_inert_fields_are_only_those_no_hook_can_be_below() -> None:
    from distify.convert.base import _LEAVES, _PUNCTUATION
    from distify.convert.transformer import DistifyTransformer

    inert_types = _PUNCTUATION + _LEAVES
    hooked = DistifyTransformer._hooked_types()
    call = traverse.inert_fields(cst.Call, inert_types, hooked)
    assert call == {"lpar", "rpar", "whitespace_after_func", "whitespace_before_args"}
    function = traverse.inert_fields(cst.FunctionDef, inert_types, hooked)
    # a forward reference (`type_parameters`) and any field that may hold an expression or a
    # statement are visited
    assert not function & {"type_parameters", "params", "body", "decorators", "returns",
                           "asynchronous"}
    assert "name" in function and "attr" in traverse.inert_fields(cst.Attribute, inert_types,
                                                                   hooked)
    # a hook on names makes every field that can hold a name worth visiting
    assert "attr" not in traverse.inert_fields(cst.Attribute, inert_types, (*hooked, cst.Name))
    assert "name" not in traverse.inert_fields(cst.FunctionDef, inert_types, (cst.Name,))
