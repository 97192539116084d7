"""What a loop iterates: the one answer, for ``convert`` and ``check``, to "is this a DataLoader?".

A loop is over a DataLoader when its iterable is one, directly or through a *loop wrapper*: a
call whose iteration yields the items of its positional arguments in their order, adding at most
an index (``enumerate``), a progress bar (``tqdm`` and its variants) or the items of another
iterable beside them (``zip``); ``iter(loader)`` is the loader's own stream. The iterable is a
DataLoader when it is built by a call the ``dataloaders`` rules name, when the site knows the
name to be bound to one (a scope's assignments: the caller's knowledge), or when its name says
so (``train_loader``, ``self.val_loader``, ``dataloaders[phase]``).

Both trees are read: ``convert`` walks LibCST, the file facts and most checks the stdlib
``ast``. LibCST is never imported here (``check`` does not load it for files it reads with
``ast``): a LibCST node is recognised through the module its caller has loaded already.

Callees are matched by qualified name (imports resolved: ``from tqdm.auto import tqdm`` calls
``tqdm.auto.tqdm``). A site that has no import table passes the dotted name as written; the
vocabulary holds the bare spellings (``tqdm``, ``enumerate``) for it, and for a ``tqdm`` bound
by a star import.

What it deliberately does not do: follow a wrapper of the file's own (``def batches(loader):
yield from loader``), or read ``map``/``filter``/``itertools.islice`` as wrappers (they change
the batches or their number, which the rewrites that unwrap a loop rely on).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from distify.analysis.names import ast_dotted_name, dotted_name

#: progress bars that iterate what they are given (``tqdm(loader)``)
PROGRESS_BARS = frozenset({
    "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm",
    "tqdm.rich.tqdm", "tqdm.autonotebook.tqdm", "torch.hub.tqdm"})
#: wrappers that pair the items of several iterables (``for (x, y), z in zip(loader, other)``):
#: their loop target is a tuple of items, not one item
PAIRING = frozenset({"zip"})
#: calls that hand a loop the items of their positional arguments (see the module docstring)
LOOP_WRAPPERS = PROGRESS_BARS | PAIRING | {"enumerate", "iter"}

Qualname = Callable[[Any], "str | None"]


def is_loop_wrapper(callee: str | None, *, pairing: bool = True) -> bool:
    """Is ``callee`` (a qualified or dotted name) a loop wrapper?

    Args:
        callee: the callee's qualified name (or, at a site without imports, its dotted name).
        pairing: whether ``zip`` counts; a site that reads the loop target as one loader's
            item (``for i, (x, y) in enumerate(loader)``) passes False.
    """
    return callee in LOOP_WRAPPERS and (pairing or callee not in PAIRING)


def names_a_loader(dotted: str | None) -> bool:
    """Does the name say it holds a loader (``train_loader``, ``self.dataloaders``)?"""
    return dotted is not None and "loader" in dotted.rsplit(".", 1)[-1].lower()


def unwrapped(node: Any, qualname: Qualname, *, pairing: bool = True) -> Any:
    """``loader`` for ``enumerate(tqdm(loader))``: the iterable behind the loop wrappers
    (through their first positional argument), or ``node`` itself."""
    while True:
        parts = _call(node, stars=False)
        if parts is None or not parts[1] or not is_loop_wrapper(qualname(parts[0]),
                                                                pairing=pairing):
            return node
        node = parts[1][0]


def is_loaderish(node: Any, qualname: Qualname, *, known: Callable[[str], bool] | None = None,
                 builds: Callable[[str | None], bool] | None = None) -> bool:
    """Is ``node`` (either tree) a DataLoader, or a loop wrapper over one (any of its
    positional arguments: ``zip(images, train_loader)``)?

    Args:
        node: the expression (a loop's iterable, an argument).
        qualname: a callee's qualified name (see the module docstring).
        known: whether a dotted name is bound to a DataLoader where the site reads it.
        builds: whether a callee's qualified name builds a DataLoader (the ``dataloaders``
            rules); without it no call is one.
    """
    kinds = _kinds(node)
    if kinds is None:
        return False
    if isinstance(node, kinds.call):
        parts = _call(node)
        callee = qualname(parts[0])
        if is_loop_wrapper(callee) and parts[1]:
            return any(is_loaderish(arg, qualname, known=known, builds=builds)
                       for arg in parts[1])
        return builds is not None and builds(callee)
    if isinstance(node, kinds.subscript):  # `dataloaders[phase]`, `loaders["train"]`
        value = node.value
        return isinstance(value, (kinds.name, kinds.attribute)) \
            and is_loaderish(value, qualname, known=known)
    if isinstance(node, kinds.name):
        name = node.id if kinds.ast else node.value
        return names_a_loader(name) or (known is not None and known(name))
    if isinstance(node, kinds.attribute):
        if names_a_loader(node.attr if kinds.ast else node.attr.value):
            return True
        dotted = ast_dotted_name(node) if kinds.ast else dotted_name(node)
        return known is not None and dotted is not None and known(dotted)
    return False


class _Kinds(NamedTuple):
    """The node types of one tree."""

    ast: bool
    call: type
    subscript: type
    name: type
    attribute: type


_AST = _Kinds(True, ast.Call, ast.Subscript, ast.Name, ast.Attribute)
_CST: list[_Kinds] = []  # LibCST's, once a caller has loaded it


def _kinds(node: Any) -> _Kinds | None:
    if isinstance(node, ast.AST):
        return _AST
    if not _CST:
        cst = sys.modules.get("libcst")
        if cst is None:
            return None
        _CST.append(_Kinds(False, cst.Call, cst.Subscript, cst.Name, cst.Attribute))
    return _CST[0]


def _call(node: Any, *, stars: bool = True) -> tuple[Any, list[Any]] | None:
    """``(callee, positional arguments)`` of a call in either tree, else None. A starred
    argument stands for what it unpacks (``zip(*loaders)``: ``loaders``); with ``stars=False``
    the arguments end before it (what it unpacks is not one of them)."""
    kinds = _kinds(node)
    if kinds is None or not isinstance(node, kinds.call):
        return None
    if kinds.ast:
        args = [(a.value, True) if isinstance(a, ast.Starred) else (a, False) for a in node.args]
    else:
        args = [(a.value, bool(a.star)) for a in node.args
                if a.keyword is None and a.star != "**"]
    if not stars:
        starred = [star for _, star in args]
        args = args[:starred.index(True)] if True in starred else args
    return node.func, [value for value, _ in args]
