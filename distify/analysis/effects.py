"""Side-effect classification, shared by ``convert`` (which guards) and ``check`` (which reports).

A call is a side effect when its loose callee name (:meth:`ImportMap.loose_qualname`) matches the
``side_effects`` rule pack and its arguments do not make it harmless:

- ``safe_if``: a keyword that makes the call safe on every rank (``os.makedirs(d,
  exist_ok=True)``, ``model.save_pretrained(d, is_main_process=...)``);
- ``mode_arg``: an ``open``-like call writes only when its mode (at that position or ``mode=``)
  is a constant with ``w``, ``a``, ``x`` or ``+``;
- ``handle_arg``: a dump into a handle (``json.dump(obj, f)``) writes unless the handle is the
  console (``sys.stdout``/``sys.stderr``).

Both trees are first reduced to a :class:`CallShape` (the constants and dotted names of the
arguments), so the decision itself is written once.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from distify.analysis.names import ImportMap, ast_dotted_name, dotted_name

if TYPE_CHECKING:
    import libcst as cst

_WRITE_MODE = re.compile(r"[rwxabtU+]+")
HANDLE_KEYWORDS = ("fp", "file", "stream", "f")
_CONSOLE = frozenset({"sys.stdout", "sys.stderr"})
_NOTHING: Any = object()
#: the distify runtime, under the names a conversion imports it as
RUNTIME_PREFIXES = ("distify.runtime.", "distify_runtime.")


class _Matches(Protocol):
    def match(self, category: str, name: str | None) -> Any: ...


@dataclass(frozen=True)
class Argument:
    """What the classification needs to know about one argument."""

    #: its value when it is a literal (``"w"``, ``True``), else ``_NOTHING``
    constant: Any = _NOTHING
    #: its qualified dotted name when it is a Name/Attribute chain (``sys.stdout``)
    dotted: str | None = None
    #: the loose callee name when it is a call (``open(...)`` → ``open``)
    call: str | None = None

    @property
    def is_constant(self) -> bool:
        return self.constant is not _NOTHING


@dataclass(frozen=True)
class CallShape:
    """A call's arguments, reduced: positionals up to the first ``*args``, and keywords."""

    positional: tuple[Argument, ...] = ()
    keywords: dict[str, Argument] = field(default_factory=dict)

    def argument(self, index: int, names: tuple[str, ...]) -> Argument | None:
        """The argument at position ``index``, or passed as one of the keywords ``names``."""
        if index < len(self.positional):
            return self.positional[index]
        return next((self.keywords[name] for name in names if name in self.keywords), None)


def ast_shape(call: ast.Call, imports: ImportMap) -> CallShape:
    positional = []
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            break
        positional.append(_ast_argument(arg, imports))
    keywords = {kw.arg: _ast_argument(kw.value, imports) for kw in call.keywords if kw.arg}
    return CallShape(tuple(positional), keywords)


def _ast_argument(node: ast.expr, imports: ImportMap) -> Argument:
    if isinstance(node, ast.Constant):
        return Argument(constant=node.value)
    if isinstance(node, ast.Call):
        return Argument(call=imports.loose_qualname(node.func))
    return Argument(dotted=imports.resolve(ast_dotted_name(node)))


def cst_shape(call: cst.Call, imports: ImportMap) -> CallShape:
    positional = []
    keywords = {}
    for arg in call.args:
        if arg.star:
            if arg.star == "*":
                break
            continue
        value = _cst_argument(arg.value, imports)
        if arg.keyword is None:
            if keywords:
                continue
            positional.append(value)
        else:
            keywords[arg.keyword.value] = value
    return CallShape(tuple(positional), keywords)


def _cst_argument(node: cst.BaseExpression, imports: ImportMap) -> Argument:
    import libcst as cst

    from distify.analysis.literals import literal_value

    if type(node) in (cst.SimpleString, cst.ConcatenatedString):
        value = literal_value(node)
        return Argument(constant=value) if isinstance(value, str) else Argument()
    if type(node) in (cst.Integer, cst.Float):
        return Argument(constant=literal_value(node))
    if type(node) is cst.Name and node.value in ("True", "False", "None"):
        return Argument(constant={"True": True, "False": False, "None": None}[node.value])
    if type(node) is cst.Call:
        return Argument(call=imports.cst_loose_qualname(node.func))
    return Argument(dotted=imports.resolve(dotted_name(node)))


def side_effect(rules: _Matches, callee: str | None, shape: CallShape) -> dict | None:
    """The ``side_effects`` entry of a call that writes, logs or changes the filesystem on every
    process it runs on; None when it does not (no match, or its arguments make it harmless)."""
    if callee is None or callee.startswith(RUNTIME_PREFIXES):
        return None  # the runtime's own open/save write once, by construction
    entry = rules.match("side_effects", callee)
    if entry is None or _made_safe(entry, shape):
        return None
    mode_arg = entry.get("mode_arg")
    if mode_arg is not None:
        mode = shape.argument(mode_arg, ("mode",))
        return entry if mode is not None and writes_mode(mode.constant) else None
    handle_arg = entry.get("handle_arg")
    if handle_arg is not None:
        handle = shape.argument(handle_arg, HANDLE_KEYWORDS)
        return entry if handle is not None and handle.dotted not in _CONSOLE else None
    return entry


#: in-memory files: what is saved into one stays in this process, on every process
MEMORY_FILES = frozenset({"io.BytesIO", "io.StringIO"})


def saves_into_memory(shape: CallShape, memory_names: set[str]) -> bool:
    """Does a save (``torch.save(obj, f)``) write into an ``io.BytesIO`` (built in the call, or
    a name ``memory_names`` holds)? Then it is no side effect: every process keeps its bytes."""
    target = shape.argument(1, ("f",))
    if target is None:
        return False
    return target.call in MEMORY_FILES or (target.dotted is not None
                                           and target.dotted in memory_names)


def opens_for_writing(rules: _Matches, callee: str | None, shape: CallShape) -> bool:
    """Is this an ``open``-like call (a ``mode_arg`` entry) that opens for writing?"""
    entry = rules.match("side_effects", callee)
    return entry is not None and entry.get("mode_arg") is not None \
        and side_effect(rules, callee, shape) is not None


def is_open_call(rules: _Matches, callee: str | None) -> bool:
    """Is this an ``open``-like call, whatever its mode?"""
    entry = rules.match("side_effects", callee)
    return entry is not None and entry.get("mode_arg") is not None


def writes_mode(mode: Any) -> bool:
    return (isinstance(mode, str) and _WRITE_MODE.fullmatch(mode) is not None
            and bool(set(mode) & set("wax+")))


def _made_safe(entry: dict, shape: CallShape) -> bool:
    for name, wanted in (entry.get("safe_if") or {}).items():
        value = shape.keywords.get(name)
        if value is not None and (wanted == "*" or (value.is_constant
                                                    and value.constant == wanted)):
            return True
    return False
