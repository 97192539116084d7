"""The children of a stdlib ``ast`` node, fast, for the whole-file walks of an analysis.

``ast.iter_child_nodes`` goes through two generators per node and yields the context and
operator singletons too (``Load()`` of every name, ``Add()`` of every ``+``): a quarter of a
typical file's nodes, which no analysis here looks at. :func:`child_nodes` returns the same
children, in the same order, without those.

It reads only the fields that can hold a node. Each node class documents its fields in the
grammar's own terms (``Name(identifier id, expr_context ctx)``, ``Dict(expr* keys, expr*
values)``): a field of a builtin type (``identifier``, ``string``, ``constant``, ``int``) or of a
context or operator type never holds one, so the per-node ``isinstance`` tests of a field that
holds a string (every ``id``, ``attr``, ``arg``) go. A class whose signature does not read that
way is walked field by field, testing each value.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Iterator

#: the fields that hold only a context or operator singleton (``ctx``, ``op``) or a list of
#: them (``ops`` of a comparison)
_LEAF_FIELDS = frozenset({"ctx", "op", "ops"})
#: grammar types whose values are never a child node here: builtins, contexts and operators
_NOT_NODES = frozenset({"identifier", "string", "constant", "int", "object", "bytes",
                        "expr_context", "operator", "boolop", "cmpop", "unaryop"})
#: ``Name(identifier id, expr_context ctx)``: the class's name, then its fields' signatures
_SIGNATURE = re.compile(r"(\w+)\((.*)\)")
_FIELD = re.compile(r"(\w+)([*?]?) (\w+)")
#: node type → (field, holds a list) for each field that may hold child nodes, in ``_fields``
#: order; None for a type walked field by field (:func:`_generic`)
_PLANS: dict[type, tuple[tuple[str, bool], ...] | None] = {}
_AST = ast.AST


def _plan(kind: type) -> tuple[tuple[str, bool], ...] | None:
    """The fields of ``kind`` that may hold nodes, read from its grammar signature; None when
    the signature is missing or does not name every field."""
    fields = kind._fields
    match = _SIGNATURE.fullmatch((kind.__doc__ or "").strip())
    if match is None or match.group(1) != kind.__name__:
        return None
    signature = {name: (grammar_type, many) for grammar_type, many, name
                 in _FIELD.findall(match.group(2))}
    if set(signature) != set(fields):
        return None
    return tuple((name, signature[name][1] == "*") for name in fields
                 if name not in _LEAF_FIELDS and signature[name][0] not in _NOT_NODES)


def plan_of(kind: type) -> tuple[tuple[str, bool], ...] | None:
    """(field, holds a list) for each field of node class ``kind`` that may hold child nodes,
    for a walk that reads them inline (a list may hold None: skip it); None when the class has
    no readable signature (use :func:`child_nodes`)."""
    try:
        return _PLANS[kind]
    except KeyError:
        plan = _PLANS[kind] = _plan(kind)
        return plan


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """``list(ast.iter_child_nodes(node))`` without the context and operator nodes."""
    kind = type(node)
    try:
        plan = _PLANS[kind]
    except KeyError:
        plan = _PLANS[kind] = _plan(kind)
    if plan is None:
        return _generic(node)
    found: list[ast.AST] = []
    for name, many in plan:
        value = getattr(node, name, None)
        if value is None:
            continue
        if many:  # a list of nodes, with None in some places (``{**d}``'s key, ``kw_defaults``)
            for item in value:
                if item is not None:
                    found.append(item)
        else:
            found.append(value)
    return found


def _generic(node: ast.AST) -> list[ast.AST]:
    """:func:`child_nodes` testing every field's value (a class without a plan)."""
    found: list[ast.AST] = []
    for name in node._fields:
        if name in _LEAF_FIELDS:
            continue
        value = getattr(node, name, None)
        if type(value) is list:
            for item in value:
                if isinstance(item, _AST):
                    found.append(item)
        elif isinstance(value, _AST):
            found.append(value)
    return found


def walk(node: ast.AST) -> list[ast.AST]:
    """``list(ast.walk(node))`` (breadth first, the same order) without the context and
    operator nodes."""
    found = [node]
    plans = _PLANS
    append = found.append
    for current in found:  # the list grows as it is read: breadth first
        kind = type(current)
        try:
            plan = plans[kind]
        except KeyError:
            plan = plans[kind] = _plan(kind)
        if plan is None:
            found.extend(_generic(current))
            continue
        for name, many in plan:  # child_nodes, inline: a call per node is most of a walk
            value = getattr(current, name, None)
            if value is None:
                continue
            if many:
                for item in value:
                    if item is not None:
                        append(item)
            else:
                append(value)
    return found


def iter_walk(node: ast.AST) -> Iterator[ast.AST]:
    """:func:`walk`, one node at a time (for a search that may stop early)."""
    pending = deque([node])
    while pending:
        node = pending.popleft()
        pending.extend(child_nodes(node))
        yield node


def iter_preorder(node: ast.AST) -> Iterator[ast.AST]:
    """Every node, depth first in source order (a node before its children, the children in
    field order), without the context and operator nodes: the order of the training
    analysis' walk (:class:`~distify.analysis.training.Collector`)."""
    pending = [node]
    while pending:
        node = pending.pop()
        yield node
        children = child_nodes(node)
        children.reverse()
        pending.extend(children)
