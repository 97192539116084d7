"""A read-only walk of a LibCST tree for a ``CSTVisitor``: the hooks ``node.visit(visitor)``
would call, in the same order, on the same nodes, without rebuilding the tree.

LibCST's ``visit`` serves transformers and visitors alike, so it rebuilds every node it visits
(a new node, validated, per node) and calls the attribute hooks for every field, even for a
visitor that only reads. The analyses a conversion runs over a whole module (micro-steps,
loaders, throughput counters, CPU-only devices, fresh models) paid that cost once each, several
times the cost of the one rewriting pass (``benchmarks/results/convert.md``). :func:`walk` reads
the children LibCST would visit (each node type's fields, in the order LibCST's own
``_visit_and_replace_children`` visits them, learnt through the public attribute hooks the first
time a type is met) and calls only the hooks the visitor defines. It also skips the subtrees
where no node type the visitor hooks can be: whitespace and punctuation always (unless hooked),
and every expression when the visitor only hooks statements.

What it deliberately does not do: visitors with attribute hooks (``visit_Call_func``,
``on_visit_attribute``) are handed to LibCST's own ``visit``; a visitor that overrides
``on_visit``/``on_leave`` sees every node (nothing is skipped for it).
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

#: whitespace, comments and punctuation: their subtrees hold nothing else (the rewrite's own
#: traversal skips them too, :mod:`distify.convert.base`)
PUNCTUATION = (
    cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine,
    cst.Newline, cst.Comment, cst.LeftParen, cst.RightParen, cst.LeftSquareBracket,
    cst.RightSquareBracket, cst.LeftCurlyBrace, cst.RightCurlyBrace, cst.Comma, cst.Dot,
    cst.AssignEqual, cst.Colon, cst.Semicolon, cst.BaseBinaryOp, cst.BaseUnaryOp, cst.BaseCompOp,
    cst.BaseAugOp, cst.BaseBooleanOp)
#: nodes that are statements, or hold statements, and nothing an expression can hold
_STATEMENT_LEVEL = (cst.Module, cst.BaseStatement, cst.BaseSmallStatement, cst.BaseSuite,
                    cst.Else, cst.Finally, cst.ExceptHandler, cst.ExceptStarHandler,
                    cst.MatchCase)
#: the nodes below which a statement can be (an expression never holds one)
_HOLDS_STATEMENTS = (cst.Module, cst.BaseCompoundStatement, cst.BaseSuite,
                     cst.SimpleStatementLine, cst.Else, cst.Finally, cst.ExceptHandler,
                     cst.ExceptStarHandler, cst.MatchCase)

_SKIP, _NO_CHILDREN, _CHILDREN = 0, 1, 2
#: one token and its parentheses (the most common nodes of a module, after punctuation)
_ATOMS = frozenset({cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString,
                    cst.Ellipsis})

#: node type → the fields LibCST visits, in its order; and the fields it left unvisited because
#: they held None
_ORDER: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


class _FieldOrder(cst.CSTVisitor):
    """Records the fields LibCST visits on one node, in order, without going deeper."""

    def __init__(self, root: cst.CSTNode) -> None:
        super().__init__()
        self.root = root
        self.fields: list[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node is self.root

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if node is self.root:
            self.fields.append(attribute)


def _learn_order(node: cst.CSTNode) -> tuple[str, ...]:
    recorder = _FieldOrder(node)
    node.visit(recorder)
    visited = tuple(dict.fromkeys(recorder.fields))
    known = _ORDER.get(type(node))
    if known is None or len(visited) > len(known[0]):
        # a field left unvisited while it held None may hold a node elsewhere (``format_spec``);
        # one holding a string (``Name.value``) never does
        others = tuple(name for name in node.__dataclass_fields__
                       if name not in visited and getattr(node, name) is None)
        _ORDER[type(node)] = (visited, others)
    return visited


def _order(node: cst.CSTNode) -> tuple[str, ...]:
    """The fields of ``node`` LibCST visits, in its order. A few node types visit a field only
    when it is set (``format_spec``): met first without it, the type is learnt again."""
    known = _ORDER.get(type(node))
    if known is None:
        return _learn_order(node)
    for name in known[1]:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode) or isinstance(value, (tuple, list)) and value \
                and isinstance(value[0], cst.CSTNode):
            return _learn_order(node)
    return known[0]


#: the fields of a node LibCST visits, in its order, which is also the order it generates their
#: code in (:mod:`distify.analysis.positions` counts lines by it)
child_fields = _order


def varies(kind: type) -> bool:
    """Does LibCST visit a different list of fields for some nodes of type ``kind`` (a field it
    skips while it holds None: ``format_spec``)? Known once :func:`child_fields` met one."""
    return bool(_ORDER[kind][1])


def own_hook(cls: type, name: str) -> Callable | None:
    """``cls``'s hook ``name``, or None where it has none or it is LibCST's default (a
    visitor's or a transformer's, which does nothing): for the read-only walk, the rewriting
    walk and the converter's checks of its own hooks alike."""
    method = getattr(cls, name, None)
    if method is None or method is getattr(cst.CSTVisitor, name, None) \
            or method is getattr(cst.CSTTransformer, name, None):
        return None
    return method


class _Plan:
    """What to do at each node type for the visitors of one class."""

    def __init__(self, cls: type, hooked: list[type]) -> None:
        self.cls = cls
        #: it overrides on_visit/on_leave: every node goes to them
        self.generic = (own_hook(cls, "on_visit") is not None
                        or own_hook(cls, "on_leave") is not None)
        self.statements_only = all(is_a(kind, _STATEMENT_LEVEL) for kind in hooked)
        self.punctuation = any(is_a(kind, PUNCTUATION) for kind in hooked)
        #: node type → (visit hook, leave hook, _SKIP / _NO_CHILDREN / _CHILDREN)
        self.steps: dict[type, tuple[Callable | None, Callable | None, int]] = {}

    def step(self, kind: type) -> tuple[Callable | None, Callable | None, int]:
        visit = own_hook(self.cls, f"visit_{kind.__name__}")
        leave = own_hook(self.cls, f"leave_{kind.__name__}")
        if is_a(kind, PUNCTUATION) and not self.punctuation:
            what = _SKIP
        elif kind in _ATOMS and not self.punctuation and visit is None and leave is None:
            what = _SKIP  # a name, number or string holds its parentheses only
        elif self.statements_only and not is_a(kind, _HOLDS_STATEMENTS):
            what = _NO_CHILDREN if visit is not None or leave is not None else _SKIP
        else:
            what = _CHILDREN
        step = self.steps[kind] = (visit, leave, what)
        return step


#: visitor class → its plan, or None: its attribute hooks need LibCST's own visit
_PLANS: dict[type, _Plan | None] = {}


def _plan(cls: type) -> _Plan | None:
    if cls in _PLANS:
        return _PLANS[cls]
    hooked: list[type] = []
    attribute_hooks = any(own_hook(cls, name) is not None
                          for name in ("on_visit_attribute", "on_leave_attribute"))
    for name in _defined(cls):
        if not name.startswith(("visit_", "leave_")) or own_hook(cls, name) is None:
            continue
        kind = getattr(cst, name.split("_", 1)[1], None)
        if isinstance(kind, type) and is_a(kind, (cst.CSTNode,)):
            hooked.append(kind)
        else:  # visit_Call_func: an attribute hook
            attribute_hooks = True
    plan = _PLANS[cls] = None if attribute_hooks else _Plan(cls, hooked)
    return plan


def _defined(cls: type) -> set[str]:
    """The attributes ``cls`` and its bases define above LibCST's visitor classes (whose
    ``dir`` lists a do-nothing hook for every node type: the analyses make a visitor class per
    call, and reading that list each time cost more than their walks)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass not in _VISITOR_BASES:
            names.update(vars(klass))
    return names


#: LibCST's visitor and transformer classes and their bases (their hooks do nothing)
_VISITOR_BASES = frozenset({*cst.CSTVisitor.__mro__, *cst.CSTTransformer.__mro__})


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """Call ``visitor``'s hooks on ``node`` and its descendants, as ``node.visit(visitor)``
    does, without rebuilding the tree (see the module's docstring)."""
    plan = _plan(type(visitor))
    if plan is None:
        node.visit(visitor)
    elif plan.generic:
        _walk_generic(node, visitor)
    else:
        _walk(node, visitor, plan)


def _walk(node: cst.CSTNode, visitor: cst.CSTVisitor, plan: _Plan) -> None:
    steps = plan.steps
    step = steps.get(type(node))
    if step is None:
        step = plan.step(type(node))
    visit, leave, what = step
    if what == _SKIP:
        return
    if (visit is None or visit(visitor, node) is not False) and what == _CHILDREN:
        # the children a step skips are skipped here, without a call (most of a module's
        # nodes: whitespace, punctuation, names)
        for name in _order(node):
            value = getattr(node, name)
            kind = type(value)
            if kind is tuple or kind is list:
                for child in value:
                    known = steps.get(type(child))
                    if known is None or known[2] != _SKIP:
                        _walk(child, visitor, plan)
                continue
            known = steps.get(kind)  # a node type met before (no ABC isinstance test)
            if known is not None:
                if known[2] != _SKIP:
                    _walk(value, visitor, plan)
            elif is_node_type(kind):
                _walk(value, visitor, plan)
            elif isinstance(value, (tuple, list)):
                for child in value:
                    _walk(child, visitor, plan)
    if leave is not None:
        leave(visitor, node)


#: type → is it a LibCST node (``isinstance`` on LibCST's abstract base class is slow)
_NODE_TYPES: dict[type, bool] = {}


def is_a(kind: type, bases: tuple[type, ...]) -> bool:
    """``issubclass(kind, bases)``, read from ``kind``'s MRO. LibCST's node bases are ABCs, and
    an ABC answers its first "no" for a type only after asking each of its own subclasses:
    the checks the walks make of each node type met cost a cold process about 10 ms that
    way. LibCST registers no virtual subclasses, so the MRO says the same."""
    mro = kind.__mro__
    return any(base in mro for base in bases)


def is_node_type(kind: type) -> bool:
    """``issubclass(kind, libcst.CSTNode)``, remembered."""
    found = _NODE_TYPES.get(kind)
    if found is None:
        found = _NODE_TYPES[kind] = is_a(kind, (cst.CSTNode,))
    return found


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node.children`` (the child nodes, in LibCST's order) without the visitor LibCST runs
    per node to collect them."""
    found: list[cst.CSTNode] = []
    for name in _order(node):
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found.extend(value)
    return found


def _walk_generic(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    if visitor.on_visit(node):
        for child in children(node):
            _walk_generic(child, visitor)
    visitor.on_leave(node)
