"""Qualified names without LibCST's metadata providers.

Full scope analysis costs several times a parse on a large file. Training scripts bind the names
we care about (``torch``, ``nn``, ``DataLoader``, ``optim``) with imports, almost always at module
level, so an import table built with the standard library's fast ``ast`` parser, plus the
dotted spelling of an expression, resolves ``import torch as t``, ``from torch.utils.data import
DataLoader as DL`` and friends. A name rebound by an assignment keeps its imported meaning; that
imprecision is accepted for speed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `distify check` uses only the ast half: don't make it pay for LibCST
    import libcst as cst


@dataclass
class ImportMap:
    """Local name → qualified name, from every import statement in a module."""

    aliases: dict[str, str] = field(default_factory=dict)
    #: every module imported anywhere (``import a.b`` records ``a.b``; ``from a import b``, ``a``)
    modules: set[str] = field(default_factory=set)

    @classmethod
    def from_ast(cls, tree: ast.AST) -> "ImportMap":
        return cls.from_imports(statements(tree))

    @classmethod
    def from_imports(cls, statements: Iterable[ast.AST]) -> "ImportMap":
        """The table of ``statements`` (in source order; any but imports are passed over)."""
        table = cls()
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    table.modules.add(alias.name)
                    if alias.asname:
                        table.aliases[alias.asname] = alias.name
                    else:
                        root = alias.name.split(".")[0]
                        table.aliases.setdefault(root, root)
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                table.modules.add(base)
                for alias in node.names:
                    if alias.name == "*":
                        continue
                    sep = "" if base.endswith(".") else "."
                    table.aliases[alias.asname or alias.name] = f"{base}{sep}{alias.name}"
        return table

    def resolve(self, dotted: str | None) -> str | None:
        """``nn.Linear`` → ``torch.nn.Linear`` when ``nn`` was imported as ``torch.nn``."""
        if not dotted:
            return None
        root, _, rest = dotted.partition(".")
        target = self.aliases.get(root)
        if target is None:
            return dotted
        return f"{target}.{rest}" if rest else target

    def qualname(self, node: cst.BaseExpression) -> str | None:
        """The qualified name of a LibCST Name/Attribute chain, else None."""
        return self.resolve(dotted_name(node))

    def ast_qualname(self, node: ast.AST) -> str | None:
        """The qualified name of an ``ast`` Name/Attribute chain, else None."""
        # resolve(ast_dotted_name(node)) in one pass: the root is a name without dots, so its
        # import target simply takes its place (asked for every call and attribute of a file)
        kind = type(node)
        if kind is ast.Name:
            target = self.aliases.get(node.id)
            return node.id if target is None else target
        parts: list[str] = []
        while kind is ast.Attribute:
            parts.append(node.attr)
            node = node.value
            kind = type(node)
        if kind is not ast.Name:
            return None
        target = self.aliases.get(node.id)
        parts.append(node.id if target is None else target)
        parts.reverse()
        return ".".join(parts)

    # Callee naming, the same for both trees (``convert`` walks LibCST, ``check`` walks ``ast``):
    # a chain through a call keeps the call as ``()`` and anything else as ``<expr>``, so the
    # rule packs match ``plt.gcf().savefig`` (``matplotlib.pyplot.gcf().savefig``) and
    # ``fig.savefig`` alike (``**.savefig``).

    def loose_qualname(self, node: ast.AST) -> str | None:
        """The loose qualified name of an ``ast`` expression: ``pathlib.Path().write_text``,
        ``<expr>.savefig``; None for a bare non-name."""
        return self._loose(node, _AST_SHAPE)

    def cst_loose_qualname(self, node: cst.BaseExpression) -> str | None:
        """:meth:`loose_qualname` for a LibCST expression (the same spelling)."""
        return self._loose(node, _CST_SHAPE or _cst_shape())

    def _loose(self, node: Any, shape: tuple) -> str | None:
        # the node classes of both trees are final: a type test is an isinstance test
        attribute, attr_of, name, id_of, call = shape
        parts: list[str] = []
        while type(node) is attribute:
            parts.append(attr_of(node))
            node = node.value
        if type(node) is name:
            root = self.resolve(id_of(node))
        elif type(node) is call:
            inner = self._loose(node.func, shape)
            root = f"{inner}()" if inner else "<expr>"
        elif parts:
            root = "<expr>"
        else:
            return None
        return ".".join([root, *reversed(parts)])


#: how :meth:`ImportMap._loose` reads an ``ast`` tree: Attribute, its name, Name, its id, Call
_AST_SHAPE = (ast.Attribute, lambda n: n.attr, ast.Name, lambda n: n.id, ast.Call)
#: ... and a LibCST tree (made on first use: ``check`` of a plain file never imports LibCST)
_CST_SHAPE: tuple | None = None


def _cst_shape() -> tuple:
    global _CST_SHAPE
    import libcst as cst

    _CST_SHAPE = (cst.Attribute, lambda n: n.attr.value, cst.Name, lambda n: n.value, cst.Call)
    return _CST_SHAPE


#: the fields of a statement that hold statements (imports are statements: no expression can hold
#: one, so the walk skips every expression, most of a file's nodes), in the order they come in
#: every node that has them (``try``: body, handlers, else, finally)
_BODIES = ("body", "handlers", "orelse", "finalbody", "cases")


def statements(tree: ast.AST) -> list[ast.AST]:
    """Every statement of ``tree`` (and except handlers, match cases), in source order."""
    found: list[ast.AST] = []
    stack = list(reversed(getattr(tree, "body", [])))
    while stack:
        node = stack.pop()
        found.append(node)
        kind = type(node)
        bodies = _BODIES_OF.get(kind)
        if bodies is None:
            bodies = _BODIES_OF[kind] = tuple(name for name in _BODIES if name in kind._fields)
        if not bodies:
            continue  # most statements have none: nothing to look up
        inner: list[ast.AST] = []
        for name in bodies:
            children = getattr(node, name, None)
            if children:
                inner.extend(children)
        inner.reverse()
        stack.extend(inner)
    return found


#: node type → the fields of :data:`_BODIES` it has
_BODIES_OF: dict[type, tuple[str, ...]] = {}


#: LibCST's Attribute and Name, bound on first use (``check`` of a plain file never imports LibCST)
_CST_CHAIN: tuple[type, type] | None = None


def _cst_chain() -> tuple[type, type]:
    global _CST_CHAIN
    import libcst as cst

    _CST_CHAIN = (cst.Attribute, cst.Name)
    return _CST_CHAIN


def dotted_name(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a chain of LibCST Name/Attribute nodes, else None."""
    # LibCST's node classes are final: a type test is an isinstance test without the cost of
    # their abstract base class's __instancecheck__ (this runs for most nodes a rewrite reads)
    attribute, name = _CST_CHAIN or _cst_chain()
    kind = type(node)
    if kind is name:
        return node.value
    parts: list[str] = []
    while kind is attribute:
        parts.append(node.attr.value)
        node = node.value
        kind = type(node)
    if kind is not name:
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def read_names(node: cst.CSTNode) -> set[str]:
    """The plain names a LibCST subtree reads: ``a.b[c]`` reads ``a`` and ``c``, not ``b``."""
    import libcst as cst

    from distify.analysis.walk import PUNCTUATION, children, is_a

    found: set[str] = set()
    stack = [node]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is cst.Name:
            found.add(node.value)
        elif kind is cst.Attribute:
            stack.append(node.value)
        elif not is_a(kind, PUNCTUATION):
            stack.extend(children(node))
    return found


def ast_dotted_name(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of ``ast`` Name/Attribute nodes, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))
