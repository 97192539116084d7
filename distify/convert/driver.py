"""The converter's dispatch: one walk of the module, each node handed to the rewrite families'
handlers for its type, in an order written down in one table.

LibCST calls ``visit_<Node>`` before a node's children and ``leave_<Node>`` after them. No rewrite
family defines those hooks: each marks its per-node handlers with :func:`handles`
(``_loops_on_for``, ``_stops_after_while``; one handler may handle several hooks: the
download units' bookkeeping runs for every kind of statement), and the driver,
:class:`~distify.convert.transformer.DistifyTransformer`, lists them per hook in its ``HANDLERS``
table, in the order they run. :func:`install` makes the driver's hooks from that table once, when
the class is created:

- a visit hook calls its handlers in order; its answer (``False``: do not visit the children) is
  the last handler's;
- a leave hook threads the node through its handlers: each gets, as ``updated``, what the one
  before it returned (a node, a ``FlattenSentinel`` or a ``RemovalSentinel``), and the last one's
  result replaces the node;
- a hook with one handler is that handler itself, with no call in between.

What it deliberately does not do: it does not order the handlers itself (the table is the
order, and the test suite pins it), and it does not catch a handler that reads another family's
bookkeeping before that family's handler for the same node has run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import libcst as cst

_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def handles(*hooks: str) -> Callable[[_Handler], _Handler]:
    """Mark a rewrite family's method as a handler of the LibCST hooks ``hooks``
    (``"visit_For"``, ``"leave_Assign"``; one in most cases); the driver's table says when it
    runs."""

    def mark(handler: _Handler) -> _Handler:
        handler.handles = hooks  # type: ignore[attr-defined]
        return handler

    return mark


def install(cls: type, table: Mapping[str, tuple[Callable[..., Any], ...]]) -> None:
    """Give ``cls`` the LibCST hooks of ``table`` (hook name → its handlers, in order); a hook
    ``cls`` inherits and the table leaves out is LibCST's own, which does nothing."""
    for name in dir(cls):
        if name.startswith(("visit_", "leave_")) and name not in table \
                and getattr(cls, name) is not getattr(cst.CSTTransformer, name, None):
            setattr(cls, name, getattr(cst.CSTTransformer, name))
    for hook, handlers in table.items():
        kind, _, node = hook.partition("_")
        if kind not in ("visit", "leave") or not isinstance(getattr(cst, node, None), type):
            raise TypeError(f"{cls.__name__}.HANDLERS: {hook!r} is not a LibCST hook")
        for handler in handlers:
            marked = getattr(handler, "handles", ())
            if hook not in marked:
                raise TypeError(f"{cls.__name__}.HANDLERS[{hook!r}] lists {handler.__qualname__}, "
                                f"which handles {', '.join(map(repr, marked)) or 'nothing'}")
        if len(set(handlers)) < len(handlers):
            raise TypeError(f"{cls.__name__}.HANDLERS[{hook!r}] lists a handler twice")
        setattr(cls, hook, _visit_hook(handlers) if kind == "visit" else _leave_hook(handlers))


def _visit_hook(handlers: tuple[Callable[..., Any], ...]) -> Callable[..., Any]:
    if len(handlers) == 1:
        return handlers[0]

    def visit(self: Any, node: cst.CSTNode) -> bool | None:
        answer = None
        for handler in handlers:
            answer = handler(self, node)
        return answer

    return visit


def _leave_hook(handlers: tuple[Callable[..., Any], ...]) -> Callable[..., Any]:
    if len(handlers) == 1:
        return handlers[0]

    def leave(self: Any, original: cst.CSTNode, updated: Any) -> Any:
        for handler in handlers:
            updated = handler(self, original, updated)
        return updated

    return leave
