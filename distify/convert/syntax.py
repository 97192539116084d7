"""Small, pure helpers over LibCST nodes used by the conversion rewrites."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from distify.analysis.literals import literal_value
from distify.analysis.names import dotted_name, read_names
from distify.analysis.walk import child_fields, is_node_type, walk

_PARAM_METHODS = {"parameters", "named_parameters"}
_DEVICE_WORDS = ("cuda", "mps", "xpu")


def _callee(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.func if type(node) is cst.Call else node


class _ShiftLines:
    """Moves the continuation lines below a call's arguments ``delta`` columns.

    A plain recursion over the fields LibCST visits (a ``CSTTransformer`` paid LibCST's
    per-node and per-field dispatch: 0.1 s of a 5,000-line conversion). Only the nodes above a
    moved line are new; every other node stays the same object, so a change recorded inside the
    arguments (``distify.reduce(len(loader))`` in a ``print``) keeps its place in the report
    (the report finds its changes by node identity; rebuilding every node once dropped them)."""

    def __init__(self, delta: int, aligned_from: int | None, indent: int) -> None:
        self.delta = delta
        self.aligned_from = aligned_from
        self.indent = indent

    def shift(self, node: cst.CSTNode) -> cst.CSTNode:
        kind = type(node)
        if kind is cst.ParenthesizedWhitespace:
            return self._moved(node)
        if kind in _ONE_LINE:
            return node
        if kind in _ATOMS and not node.lpar:
            return node
        # A bracket inside the call whose contents start on the next line (`save({` then the
        # dict's items one indent deeper) is laid out from its line's indentation, which the
        # rename does not move: its lines, and its closing bracket, stay where they are. Its
        # contents move only when they line up with the call's parenthesis or beyond
        # (`print('...'.format(` then the arguments under the string).
        opening = _hanging_opening(node)
        if opening is not None and (self.aligned_from is None or self._column(opening)
                                    < self.aligned_from):
            return node
        changes = {}
        for name in child_fields(node):
            value = getattr(node, name)
            if isinstance(value, (tuple, list)):
                new = tuple(self.shift(child) for child in value)
                if any(a is not b for a, b in zip(new, value)):
                    changes[name] = new
            elif is_node_type(type(value)):
                new = self.shift(value)
                if new is not value:
                    changes[name] = new
        return node.with_changes(**changes) if changes else node

    def _column(self, whitespace: cst.ParenthesizedWhitespace) -> int:
        return len(whitespace.last_line.value) + (self.indent if whitespace.indent else 0)

    def _moved(self, whitespace: cst.ParenthesizedWhitespace) -> cst.ParenthesizedWhitespace:
        width = len(whitespace.last_line.value) + self.delta
        if width < 0 or self._column(whitespace) < (self.aligned_from or 0):
            return whitespace
        return whitespace.with_changes(last_line=cst.SimpleWhitespace(" " * width))


#: nodes no line break of a call's arguments can be below (a comment's and a string's text are
#: not theirs to move)
_ONE_LINE = frozenset({cst.SimpleWhitespace, cst.TrailingWhitespace, cst.Newline, cst.Comment,
                       cst.EmptyLine})
#: one token (its ``value``) and its parentheses: a line break only inside the parentheses
_ATOMS = frozenset({cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString})


def _hanging_opening(node: cst.CSTNode) -> cst.ParenthesizedWhitespace | None:
    """The line break right after the bracket ``node`` opens (hanging indent), if any."""
    broken = cst.ParenthesizedWhitespace
    whitespace = getattr(node, "whitespace_before_args", None)
    if type(whitespace) is broken:
        return whitespace
    for name in ("lbrace", "lbracket"):
        whitespace = getattr(getattr(node, name, None), "whitespace_after", None)
        if type(whitespace) is broken:
            return whitespace
    for par in getattr(node, "lpar", ()):
        if type(par.whitespace_after) is broken:
            return par.whitespace_after
    return None


#: the nodes whose one token (``value``) may hold a line break: a backslash continuation, a
#: triple-quoted string
_MAY_BREAK = frozenset({cst.SimpleWhitespace, cst.SimpleString, cst.FormattedStringText,
                        *([cst.TemplatedStringText] if hasattr(cst, "TemplatedStringText")
                          else [])})
#: one token, no line break in it: nothing to read below them when they have no parentheses
_NO_BREAK = frozenset({cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.Comment})


def _spans_lines(node: cst.CSTNode) -> bool:
    """Does ``node``'s code hold a line break? (``"\n" in _code(node)``, without generating
    the code: a walk that stops at the first break.)"""
    kind = type(node)
    if kind is cst.Newline:
        return node.value is None or "\n" in node.value  # None: the default, "\n"
    if kind in _MAY_BREAK:
        if "\n" in node.value:
            return True
        if kind is cst.SimpleWhitespace:
            return False
    elif kind in _NO_BREAK and not getattr(node, "lpar", None):
        return False
    for name in child_fields(node):
        value = getattr(node, name)
        if type(value) is tuple or type(value) is list:
            if any(_spans_lines(child) for child in value):
                return True
        elif is_node_type(type(value)) and _spans_lines(value):
            return True
    return False


def _shift_continuations(call: cst.Call, delta: int, opening: int | None = None,
                         indent: int = 0) -> cst.Call:
    """Move the continuation lines of a call whose arguments are aligned with its opening
    parenthesis by ``delta`` columns, as one would by hand after renaming the callee. Calls in
    the hanging-indent style (a line break right after the parenthesis) are left alone.

    ``opening``: the column just after the call's parenthesis, where known (a call that starts
    its line; ``indent``: that line's indentation). Lines indented less than that are hanging
    indents of an inner bracket (``print('...'.format(`` then ``epoch, loss)`` one indent
    deeper): they stay."""
    if delta == 0 or type(call.whitespace_before_args) is cst.ParenthesizedWhitespace:
        return call
    if not _spans_lines(call):  # no line to move
        return call
    shift = _ShiftLines(delta, opening, indent)
    return call.with_changes(args=[shift.shift(arg) for arg in call.args])


class _Finder(cst.CSTVisitor):
    """Does a subtree contain a ``%`` operation / a call of method ``method``?"""

    def __init__(self, method: str | None = None) -> None:
        super().__init__()
        self.method = method
        self.found = False

    def visit_BinaryOperation(self, op: cst.BinaryOperation) -> None:
        if self.method is None and type(op.operator) is cst.Modulo:
            self.found = True

    def visit_Call(self, call: cst.Call) -> None:
        if self.method is not None and type(call.func) is cst.Attribute \
                and call.func.attr.value == self.method:
            self.found = True


def _has_modulo(node: cst.CSTNode) -> bool:
    finder = _Finder()
    walk(node, finder)
    return finder.found


def _calls_method(node: cst.CSTNode, method: str) -> bool:
    finder = _Finder(method)
    walk(node, finder)
    return finder.found


def _strip_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                        whitespace_after=cst.SimpleWhitespace(""))


def _has_keyword(call: cst.Call, name: str) -> bool:
    return any(arg.keyword is not None and arg.keyword.value == name for arg in call.args)


def _with_trailing_comma(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    """The arguments, the last one followed by ``, `` so another can be appended."""
    if not args:
        return []
    last = args[-1]
    space = cst.SimpleWhitespace(" ")
    if last.comma == cst.MaybeSentinel.DEFAULT:
        last = last.with_changes(comma=cst.Comma(whitespace_after=space))
    elif type(last.comma.whitespace_after) is cst.SimpleWhitespace \
            and not last.comma.whitespace_after.value:
        last = last.with_changes(comma=last.comma.with_changes(whitespace_after=space))
    return [*args[:-1], last]


def _is_false(node: cst.BaseExpression) -> bool:
    return type(node) is cst.Name and node.value in ("False", "None")


def _is_method_call(node: cst.BaseExpression, method: str) -> bool:
    return (type(node) is cst.Call and type(node.func) is cst.Attribute
            and node.func.attr.value == method)


def _code(node: cst.CSTNode) -> str:
    kind = type(node)
    if kind in _ATOMS:
        if not node.lpar:
            return node.value
    elif kind is cst.Attribute:
        dotted = _plain_dotted(node)
        if dotted is not None:
            return dotted
    return cst.Module([]).code_for_node(node)


def _plain_dotted(node: cst.Attribute) -> str | None:
    """``a.b.c`` written without parentheses or spaces: its code, without generating it (most
    of the converter's ``_code`` calls); None for anything else."""
    parts = []
    value: cst.BaseExpression = node
    while type(value) is cst.Attribute:
        dot = value.dot
        if value.lpar or type(dot.whitespace_before) is not cst.SimpleWhitespace \
                or dot.whitespace_before.value or type(dot.whitespace_after) \
                is not cst.SimpleWhitespace or dot.whitespace_after.value:
            return None
        parts.append(value.attr.value)
        value = value.value
    if type(value) is not cst.Name or value.lpar:
        return None
    parts.append(value.value)
    return ".".join(reversed(parts))


def _clone(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.deep_clone()


def _join(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _is_zero(node: cst.BaseExpression) -> bool:
    if type(node) is cst.Integer:
        return literal_value(node) == 0
    if type(node) is cst.Float:
        return literal_value(node) == 0.0
    return False


def _names_in(node: cst.CSTNode) -> set[str]:
    """The plain names a subtree reads (``a.b`` contributes ``a``)."""
    return read_names(node)


def _leaves_loop(body: cst.BaseSuite, is_exit) -> bool:
    """Does ``body`` leave the loop: ``break``, ``return``, or a call ``is_exit`` accepts
    (``sys.exit(...)``)?"""
    statements = body.body if type(body) is cst.IndentedBlock else [body]
    for stmt in statements:
        small = stmt.body if type(stmt) in (cst.SimpleStatementLine,
                                               cst.SimpleStatementSuite) else []
        for s in small:
            if type(s) in (cst.Break, cst.Return):
                return True
            if type(s) is cst.Expr and type(s.value) is cst.Call and is_exit(s.value):
                return True
    return False


class _ParameterRoots(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.roots: list[str] = []

    def visit_Call(self, call: cst.Call) -> None:
        func = call.func
        if not (type(func) is cst.Attribute and func.attr.value in _PARAM_METHODS):
            return
        dotted = dotted_name(func.value)
        if not dotted:
            return
        parts = dotted.split(".")
        root = ".".join(parts[:2]) if parts[0] == "self" and len(parts) > 1 else parts[0]
        if root not in self.roots and root != "self":
            self.roots.append(root)


def _parameter_roots(node: cst.CSTNode) -> list[str]:
    """``model.fc.parameters()`` → ``model``; ``self.net.parameters()`` → ``self.net``."""
    finder = _ParameterRoots()
    walk(node, finder)
    return finder.roots


def _single_target(stmt: cst.SimpleStatementLine) -> cst.BaseExpression | None:
    if len(stmt.body) != 1 or type(stmt.body[0]) is not cst.Assign:
        return None
    targets = stmt.body[0].targets
    if len(targets) != 1 or type(targets[0].target) not in (cst.Name, cst.Attribute):
        return None
    return targets[0].target


def _assigned_value(stmt: cst.SimpleStatementLine) -> cst.BaseExpression | None:
    small = stmt.body[0] if stmt.body else None
    return small.value if type(small) is cst.Assign else None


def _is_rt_prepare(call: cst.Call, rt: str) -> bool:
    return dotted_name(call.func) == f"{rt}.prepare" and len(call.args) == 1


def _is_rt_call(node: cst.BaseExpression, rt: str, name: str) -> bool:
    return type(node) is cst.Call and dotted_name(node.func) == f"{rt}.{name}"


def _is_device_string(node: cst.BaseExpression) -> bool:
    if type(node) is cst.SimpleString:
        text = literal_value(node)
        return isinstance(text, str) and text.split(":")[0] in _DEVICE_WORDS
    return False


def _is_cpu(node: cst.BaseExpression) -> bool:
    if type(node) is cst.SimpleString:
        return literal_value(node) == "cpu"
    return (type(node) is cst.Call and len(node.args) == 1
            and type(node.args[0].value) is cst.SimpleString
            and literal_value(node.args[0].value) == "cpu")


def _literal_args(call: cst.Call) -> bool:
    """Are all the call's arguments literals (``torch.device("cuda", 0)``)?"""
    return all(type(arg.value) in (cst.SimpleString, cst.Integer) for arg in call.args)


class _DeviceStrings(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        self.found = self.found or _is_device_string(node)


def _selects_accelerator(call: cst.Call, qual: str) -> bool:
    """``torch.device("cuda" ...)`` picks an accelerator; ``torch.device("cpu")`` does not."""
    if not qual.endswith(".device"):
        return True
    finder = _DeviceStrings()
    for arg in call.args:
        walk(arg, finder)
    return finder.found
