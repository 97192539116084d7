"""Hand-written downloads: the statements that fetch a file and then write, extract or remove it.

A script that downloads by hand (``urlopen`` + ``open(..., "wb")`` + ``tarfile`` extract +
``os.remove``, or ``requests.get`` to a file) must do so as one unit on the main process while the
others wait: converted piece by piece, the others read an archive not yet written, or one already
deleted. A *unit* is a run of consecutive statements of one block that starts with a statement
that fetches (the ``downloads`` rule pack, ``kind: fetch``) and goes on over the statements after
it that fetch, unpack (``kind: unpack``), write or change files (the ``side_effects`` pack) or
print.

What it deliberately does not do: follow a download into a function it calls, or join statements
that only compute names (``path = ...``) into a unit; a unit whose names later code reads is
returned with them, so that the caller reports it instead of running it on one process only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import libcst as cst

from distify.analysis.effects import cst_shape, side_effect
from distify.analysis.names import ImportMap, read_names
from distify.analysis.stops import calls_in
from distify.analysis.walk import walk

_SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


@dataclass(frozen=True)
class DownloadUnit:
    """Consecutive statements of one block that download, as written."""

    statements: tuple[cst.BaseStatement, ...]
    #: names the unit binds that statements after it read (then it cannot run on one process)
    read_after: tuple[str, ...] = ()
    #: the unit returns, yields or breaks out of its block
    leaves: bool = False


def may_download(rules: Any, imports: ImportMap) -> bool:
    """Cheap test before :func:`download_units`: does the file import what a fetch needs?"""
    imported = {*imports.modules, *imports.aliases.values()} - _BROAD_ROOTS
    return any(rules.match("downloads", pattern).get("kind") == "fetch"
               and any(pattern == name or pattern.startswith(f"{name}.") for name in imported)
               for pattern in rules.names("downloads"))


#: top-level packages imported by every script: `import torch` alone says nothing of a download
_BROAD_ROOTS = frozenset({"torch", "torchvision"})


def download_units(module: cst.Module, rules: Any, imports: ImportMap) -> list[DownloadUnit]:
    """The download units of every block of ``module`` (nested blocks included)."""
    finder = _Finder(rules, imports)
    walk(module, finder)
    # A statement whose own block holds the download and that runs more than a download
    # (`if __name__ == "__main__":` around the whole script, a loop that trains) is no part of
    # a unit: the unit is inside it. Taken whole, the main process alone would run everything
    # else in it, training included. (`if not os.path.exists(path):` around a fetch is.)
    kinds = {key: kind for key, kind in finder.kinds.items() if key not in finder.holders}
    units = []
    for body in finder.blocks:
        units.extend(_units_of(body, kinds))
    return units


def _units_of(body: Sequence[cst.BaseStatement], kinds: dict[int, str]) -> list[DownloadUnit]:
    units = []
    index = 0
    while index < len(body):
        if kinds.get(id(body[index])) != "fetch":
            index += 1
            continue
        end = index + 1
        while end < len(body) and id(body[end]) in kinds:
            end += 1
        statements = tuple(body[index:end])
        bound = _bound_names(statements)
        later = set().union(*(read_names(stmt) for stmt in body[end:])) if end < len(body) \
            else set()
        units.append(DownloadUnit(statements, tuple(sorted(bound & later)),
                                  any(_leaves(stmt) for stmt in statements)))
        index = end
    return units


class _Finder(cst.CSTVisitor):
    """Marks every statement that fetches (``fetch``) or writes, unpacks or prints (``tail``),
    and records the blocks that hold a fetching statement."""

    def __init__(self, rules: Any, imports: ImportMap) -> None:
        super().__init__()
        self.rules, self.imports = rules, imports
        self.kinds: dict[int, str] = {}
        self.blocks: list[Sequence[cst.BaseStatement]] = []
        #: ids of the statements around a block that holds a fetching statement
        self.holders: set[int] = set()
        self._open: list[list[cst.CSTNode]] = [[]]  # statements being visited, per scope

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, _SCOPES):
            self._open.append([])
        elif isinstance(node, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
            self._open[-1].append(node)
        elif type(node) is cst.Call:
            self._see(node)
        return True

    def on_leave(self, original: cst.CSTNode) -> None:
        if isinstance(original, _SCOPES):
            self._open.pop()
        elif isinstance(original, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
            self._open[-1].pop()
        if type(original) in (cst.Module, cst.IndentedBlock) and any(
                self.kinds.get(id(stmt)) == "fetch" for stmt in original.body):
            self.blocks.append(original.body)
            if type(original) is cst.IndentedBlock:  # the statements around it hold it
                self.holders.update(id(stmt) for stmt in self._open[-1] if _runs_more(stmt))

    def _see(self, call: cst.Call) -> None:
        kind = self._kind(call)
        if kind is None:
            return
        for stmt in self._open[-1]:
            if kind == "fetch" or id(stmt) not in self.kinds:
                self.kinds[id(stmt)] = kind

    def _kind(self, call: cst.Call) -> str | None:
        callee = self.imports.cst_loose_qualname(call.func)
        if callee is None:
            return None
        entry = self.rules.match("downloads", callee)
        if entry is not None:
            return {"fetch": "fetch", "unpack": "tail"}.get(entry.get("kind"))
        if callee in ("print", "sys.stdout.write", "sys.stderr.write"):
            return "tail"
        if self.rules.match("side_effects", callee) is not None and \
                side_effect(self.rules, callee, cst_shape(call, self.imports)) is not None:
            return "tail"
        return None


def _runs_more(stmt: cst.CSTNode) -> bool:
    """Is ``stmt`` the script's ``if __name__ == "__main__":``, or does it train (a
    ``.backward(...)`` or ``.step(...)`` call in it)?"""
    if type(stmt) is cst.If and "__main__" in cst.Module([]).code_for_node(stmt.test):
        return True
    return any(type(call.func) is cst.Attribute and call.func.attr.value in ("backward", "step")
               for call in calls_in(stmt))


def _bound_names(statements: Sequence[cst.CSTNode]) -> set[str]:
    """The plain names the statements bind (assignments, ``as`` names, loop targets, defs)."""
    found: set[str] = set()

    class Binds(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            found.update(_names(node.target))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            found.update(_names(node.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            found.update(_names(node.target))

        def visit_AsName(self, node: cst.AsName) -> None:
            found.update(_names(node.name))

        def visit_For(self, node: cst.For) -> None:
            found.update(_names(node.target))

        def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
            found.update(_names(node.target))

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            found.add(node.name.value)
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            found.add(node.name.value)
            return False

    for stmt in statements:
        walk(stmt, Binds())
    return found


def _names(target: cst.CSTNode) -> set[str]:
    if type(target) is cst.Name:
        return {target.value}
    if type(target) in (cst.Tuple, cst.List):
        return set().union(*(_names(e.value) for e in target.elements))
    if type(target) is cst.StarredElement:
        return _names(target.value)
    return set()


def _leaves(stmt: cst.CSTNode) -> bool:
    """Does ``stmt`` return, yield, or break or continue a loop around it?"""
    stack: list[tuple[cst.CSTNode, bool]] = [(stmt, False)]
    while stack:
        node, in_loop = stack.pop()
        if type(node) in (cst.Return, cst.Yield) or \
                (type(node) in (cst.Break, cst.Continue) and not in_loop):
            return True
        if not isinstance(node, _SCOPES):
            inner = in_loop or type(node) in (cst.For, cst.While)
            stack.extend((child, inner) for child in node.children)
    return False
