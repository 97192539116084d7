"""The children of a stdlib ``ast`` node, fast, for the whole-file walks of an analysis.

``ast.iter_child_nodes`` goes through two generators per node and yields the context and
operator singletons too (``Load()`` of every name, ``Add()`` of every ``+``): a quarter of a
typical file's nodes, which no analysis here looks at. :func:`child_nodes` returns the same
children, in the same order, without those.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator

#: the fields that hold only a context or operator singleton (``ctx``, ``op``) or a list of
#: them (``ops`` of a comparison)
_LEAF_FIELDS = frozenset({"ctx", "op", "ops"})
#: node type → the fields that may hold child nodes, in ``_fields`` order
_FIELDS: dict[type, tuple[str, ...]] = {}
_AST = ast.AST


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """``list(ast.iter_child_nodes(node))`` without the context and operator nodes."""
    kind = type(node)
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = _FIELDS[kind] = tuple(name for name in kind._fields
                                       if name not in _LEAF_FIELDS)
    found: list[ast.AST] = []
    for name in fields:
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
    index = 0
    while index < len(found):
        found.extend(child_nodes(found[index]))
        index += 1
    return found


def iter_walk(node: ast.AST) -> Iterator[ast.AST]:
    """:func:`walk`, one node at a time (for a search that may stop early)."""
    pending = deque([node])
    while pending:
        node = pending.popleft()
        pending.extend(child_nodes(node))
        yield node
