"""The rewriting pass's walk: LibCST's transformer protocol, without rebuilding what did not change.

``module.visit(transformer)`` rebuilds every node it descends into (a new node, validated, per
node), whether or not anything below it changed, and calls the attribute hooks for every field.
In a conversion most of a module is left as written, so most of that work is thrown away: it was
the largest single cost of ``distify convert`` after LibCST's parse
(``benchmarks/results/convert.md``). :func:`rewrite` calls the same hooks, on the same nodes, in
the same order, with the same results, and makes a new node only where a child came back as
another object (through ``with_changes``, LibCST's public way to copy a node).

It keeps LibCST's rules for what a hook may return: a node; ``RemovalSentinel.REMOVE`` (dropped
from a sequence; ``None`` in an optional field; ``MaybeSentinel.DEFAULT`` in a sentinel field; an
error in a required one); a ``FlattenSentinel`` (spliced into a sequence; an error elsewhere).

The differences a hook can see: ``updated_node`` *is* ``original_node`` when nothing below it
changed (LibCST hands a fresh copy), and the attribute hooks run only around fields that hold a
node or a sequence, and only at the node types a plan asks for (:data:`FIELDS`). Every fixture's
conversion and report are the same as under LibCST's ``visit`` (``tests/test_traverse.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import typing
from typing import Any

import libcst as cst

from distify.analysis.walk import child_fields, is_a, is_node_type, own_hook, varies

_REMOVE = cst.RemovalSentinel
_FLATTEN = cst.FlattenSentinel


#: what to do at a node type: nothing (it holds nothing a hook reads, and has no hook of its
#: own), call its hooks only, also visit its children, or visit them with the attribute hooks
#: (``on_visit_attribute``/``on_leave_attribute``) called around each field
SKIP, HOOKS_ONLY, CHILDREN, FIELDS = 0, 1, 2, 3


class Plan:
    """Per node type, for one transformer class: its visit hook (called as ``visit(transformer,
    node)``, may answer False: do not visit the children), its leave hook
    (``leave(transformer, original, updated)``), and SKIP / HOOKS_ONLY / CHILDREN / FIELDS. A
    class that wants its own plans defines ``traversal_step(kind)`` (:class:`~distify.convert.
    base.TransformerBase` does); by default a type's step is its ``visit_``/``leave_`` hooks and
    CHILDREN, or FIELDS when the class has attribute hooks."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        #: node type → (visit hook, leave hook, SKIP / HOOKS_ONLY / CHILDREN / FIELDS, the
        #: fields to visit in LibCST's order or None where that order varies per node)
        self.steps: dict[type, tuple[Any, Any, int, tuple[str, ...] | None]] = {}
        self._custom = getattr(cls, "traversal_step", None)
        #: node type → the fields never worth visiting (see :func:`inert_fields`)
        self.inert: dict[type, frozenset[str]] = {}

    def step(self, node: cst.CSTNode) -> tuple[Any, Any, int, tuple[str, ...] | None]:
        kind = type(node)
        if self._custom is not None:
            visit, leave, what, inert = self._custom(kind)
        else:
            fields = own_hook(self.cls, "on_visit_attribute") is not None or \
                own_hook(self.cls, "on_leave_attribute") is not None
            visit = own_hook(self.cls, f"visit_{kind.__name__}")
            leave = own_hook(self.cls, f"leave_{kind.__name__}")
            what, inert = FIELDS if fields else CHILDREN, frozenset()
        self.inert[kind] = inert
        order = child_fields(node)
        names = None if varies(kind) else tuple(name for name in order if name not in inert)
        found = self.steps[kind] = (visit, leave, what, names)
        return found

    def fields(self, node: cst.CSTNode) -> tuple[str, ...]:
        """The fields of ``node`` to visit, for a type whose order varies per node."""
        inert = self.inert[type(node)]
        return tuple(name for name in child_fields(node) if name not in inert)


def inert_fields(kind: type, inert_types: tuple[type, ...], hooked: tuple[type, ...]
                 ) -> frozenset[str]:
    """The fields of node type ``kind`` that can hold only strings, flags, sentinels and nodes
    of ``inert_types`` (types whose subtrees a walk skips), none of them hooked: visiting them
    could never call a hook, so the walk does not even read them (a call's parentheses, an
    attribute's dot and name, an argument's keyword). Read from LibCST's field annotations;
    anything an annotation does not say for sure (a forward reference) is visited."""
    return frozenset(spec.name for spec in dataclasses.fields(kind)
                     if _inert(spec.type, inert_types, hooked))


#: what a field holds that is no node
_VALUES = (str, bool, int, type(None), cst.MaybeSentinel)


@functools.cache
def _inert(annotation: Any, inert_types: tuple[type, ...], hooked: tuple[type, ...]) -> bool:
    args = typing.get_args(annotation)
    if args:
        if typing.get_origin(annotation) is typing.Literal:
            return all(isinstance(arg, _VALUES) for arg in args)
        return all(_inert(arg, inert_types, hooked) for arg in args)
    if not isinstance(annotation, type):
        return False  # a forward reference, a type variable: not known here
    # (class ancestry read from the MRO: LibCST's node classes are ABCs, whose issubclass
    # machinery costs more than this whole test; none of them is registered virtually)
    if cst.CSTNode not in annotation.__mro__:
        return any(value in annotation.__mro__ for value in _VALUES)
    kinds = [annotation, *_subclasses(annotation)]
    return all(is_a(k, inert_types) for k in kinds if not k.__abstractmethods__) \
        and not any(k in hooked for k in kinds)


@functools.cache
def _subclasses(kind: type) -> tuple[type, ...]:
    """The node types below ``kind`` (LibCST's own: the slot-less class its ``add_slots`` left
    behind for each node type is no type a node has)."""
    found: list[type] = []
    for sub in kind.__subclasses__():
        if getattr(sys.modules.get(sub.__module__), sub.__name__, None) is sub:
            found += [sub, *_subclasses(sub)]
    return tuple(found)


_PLANS: dict[type, Plan] = {}


def rewrite(node: cst.CSTNode, transformer: cst.CSTTransformer) -> Any:
    """``node.visit(transformer)``, rebuilding only the nodes whose children changed.

    A transformer that overrides ``on_visit``/``on_leave`` without ``traversal_step`` (its
    generic hooks see every node) or defines attribute hooks is handed to LibCST's ``visit``."""
    cls = type(transformer)
    plan = _PLANS.get(cls)
    if plan is None:
        if getattr(cls, "traversal_step", None) is None and (
                own_hook(cls, "on_visit") is not None or own_hook(cls, "on_leave") is not None):
            return node.visit(transformer)
        plan = _PLANS[cls] = Plan(cls)
    return _visit(node, transformer, plan.steps, plan)


def _visit(node: cst.CSTNode, transformer: Any, steps: dict, plan: Plan) -> Any:
    step = steps.get(type(node))
    if step is None:
        step = plan.step(node)
    visit, leave, what, names = step
    if what == SKIP:
        return node
    updated = node
    if (visit is None or visit(transformer, node) is not False) and what >= CHILDREN:
        if names is None:
            names = plan.fields(node)
        if what == FIELDS:
            return _leave(node, _fields(node, names, transformer, steps, plan), leave,
                          transformer)
        changes: dict[str, Any] | None = None
        for name in names:
            value = getattr(node, name)
            kind = type(value)
            if kind is tuple or kind is list:
                new = _sequence(value, transformer, steps, plan)
                if new is not None:
                    if changes is None:
                        changes = {}
                    changes[name] = new
                continue
            known = steps.get(kind)
            if known is not None:
                if known[2] == SKIP:
                    continue
            elif not is_node_type(kind):
                continue
            result = _visit(value, transformer, steps, plan)
            if result is not value:
                if changes is None:
                    changes = {}
                changes[name] = _single(node, name, value, result)
        if changes is not None:
            updated = node.with_changes(**changes)
    if leave is None:  # (most nodes: no call for them)
        return updated
    return _leave(node, updated, leave, transformer)


def _leave(node: cst.CSTNode, updated: cst.CSTNode, leave: Any, transformer: Any) -> Any:
    if leave is None:
        return updated
    result = leave(transformer, node, updated)
    if not (is_node_type(type(result)) or isinstance(result, (_REMOVE, _FLATTEN))):
        raise TypeError("Expected a node of type CSTNode or a RemovalSentinel, "
                        f"but got a return value of {type(result).__name__}")
    return result


def _fields(node: cst.CSTNode, names: tuple[str, ...], transformer: Any, steps: dict,
            plan: Plan) -> cst.CSTNode:
    """``node`` with its children visited, each field that holds a node or a sequence between
    the attribute hooks (LibCST also calls them around a field holding None or a
    ``MaybeSentinel``; a hook that needs those is better written as a node hook)."""
    changes: dict[str, Any] = {}
    enter, leave = transformer.on_visit_attribute, transformer.on_leave_attribute
    for name in names:
        value = getattr(node, name)
        if isinstance(value, (tuple, list)):
            enter(node, name)
            new = _sequence(value, transformer, steps, plan)
            if new is not None:
                changes[name] = new
        elif is_node_type(type(value)):
            enter(node, name)
            result = _visit(value, transformer, steps, plan)
            if result is not value:
                changes[name] = _single(node, name, value, result)
        else:
            continue
        leave(node, name)
    return node.with_changes(**changes) if changes else node


def _sequence(children: tuple | list, transformer: Any, steps: dict, plan: Plan) -> tuple | None:
    """The children visited, flattened and with the removed ones left out; None when each
    came back as itself."""
    results = None
    for index, child in enumerate(children):
        known = steps.get(type(child))
        if known is not None and known[2] == SKIP:
            if results is not None:
                results.append(child)
            continue
        result = _visit(child, transformer, steps, plan)
        if results is None:
            if result is child:
                continue
            results = list(children[:index])
        if isinstance(result, _FLATTEN):
            results.extend(result)
        elif not isinstance(result, _REMOVE):
            results.append(result)
    return None if results is None else tuple(results)


def _single(parent: cst.CSTNode, name: str, child: cst.CSTNode, result: Any) -> Any:
    """What goes in field ``name`` of ``parent`` when its one child came back as ``result``."""
    if isinstance(result, _FLATTEN):
        raise TypeError(f"We got a FlattenSentinel while visiting a {type(child).__name__}. "
                        "This node's parent does not allow for it to be replaced with a "
                        "sequence.")
    if isinstance(result, _REMOVE):
        annotation = str(parent.__dataclass_fields__[name].type)
        if "MaybeSentinel" in annotation:
            return cst.MaybeSentinel.DEFAULT
        if "Optional" in annotation or "None" in annotation:
            return None
        raise TypeError(f"We got a RemovalSentinel while visiting a {type(child).__name__}. "
                        "This node's parent does not allow it to be removed.")
    return result
