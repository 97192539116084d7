"""Where the parsed module's statement lines start in the source, read from the ``ast`` tree.

A rewrite that lengthens a line asks how long the line is as written (``_too_long``: does the
longer name still fit the file's own line length?), and whether a call it renames or wraps holds a
line break (its continuation lines then move with it). Generating the statement's code to measure
its first line was the largest single cost left in the rewriting pass: hundreds of statements
on a large script, each written out in full; after it, walking each renamed call's nodes for a
line break (``print``, ``DataLoader``, ``torch.save``) that a one-line statement cannot hold.
The file model's statement list
(:class:`~distify.analysis.filemodel.Statements`, from the ``ast`` tree) knows where every
statement starts; the two trees hold the same statements in the same order, so the k-th
statement of one is the k-th of the other. That correspondence is checked statement by
statement (their kinds must agree all the way) before it is used; a file where it does not hold,
or whose lines do not end the way both parsers count them, is measured the old way.

The same starts give each top-level statement's lines in the source, from its leading comment
lines to the next statement's: the output's text of a statement the conversion left as it was
(most of a large script's functions) is copied from there instead of generated, as LibCST would
write it back byte for byte (:meth:`StatementStarts.code`). The copy is used only when it holds
as many line breaks as the walk for the report lines counts in the output's tokens
(:func:`distify.analysis.positions.lines_of`); the output is generated otherwise.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

import libcst as cst

#: LibCST statement type → the ``ast`` statement types it can be
_KINDS: dict[type, tuple[type, ...]] = {
    cst.Expr: (ast.Expr,), cst.Assign: (ast.Assign,), cst.AugAssign: (ast.AugAssign,),
    cst.AnnAssign: (ast.AnnAssign,), cst.Return: (ast.Return,), cst.Raise: (ast.Raise,),
    cst.Assert: (ast.Assert,), cst.Del: (ast.Delete,), cst.Pass: (ast.Pass,),
    cst.Break: (ast.Break,), cst.Continue: (ast.Continue,), cst.Global: (ast.Global,),
    cst.Nonlocal: (ast.Nonlocal,), cst.Import: (ast.Import,), cst.ImportFrom: (ast.ImportFrom,),
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef), cst.ClassDef: (ast.ClassDef,),
    cst.For: (ast.For, ast.AsyncFor), cst.While: (ast.While,), cst.If: (ast.If,),
    cst.With: (ast.With, ast.AsyncWith), cst.Try: (ast.Try,), cst.Match: (ast.Match,),
}
for _name in ("TryStar", "TypeAlias"):  # newer Pythons' statements
    if hasattr(cst, _name) and hasattr(ast, _name):
        _KINDS[getattr(cst, _name)] = (getattr(ast, _name),)


class StatementStarts:
    """The first line of each of a module's own statement lines, as written (built on first
    use)."""

    def __init__(self, statements: Sequence[ast.AST], source: bytes,
                 module: cst.Module) -> None:
        #: the ``ast`` statements in source order, a statement before those it holds (except
        #: handlers and match cases may be among them: they are left out)
        self._statements = statements
        self._source = source
        self._module = module
        #: id of a statement line → (1-based line, UTF-8 byte column) of its first statement,
        #: and the line where its last statement ends; None until built, empty when the trees
        #: could not be matched
        self._starts: dict[int, tuple[int, int, int]] | None = None
        self._lines: list[str] = []
        #: id of a top-level statement but the last → its lines in the source, from its
        #: leading comment lines to the next statement's (1-based, the end excluded)
        self._spans: dict[int, tuple[int, int]] = {}

    def first_line(self, statement: cst.SimpleStatementLine) -> int | None:
        """The length of ``statement``'s first line from its first token (its code's first
        line, leading comments left out); None when not known here (not a statement of the
        parsed module, or a file measured the old way)."""
        start = self._known().get(id(statement))
        if start is None:
            return None
        line = self._lines[start[0] - 1]
        if line.endswith("\r") and self._module.default_newline == "\r\n":
            # LibCST keeps the file's usual line end as "the default" (written as "\n" when the
            # statement's code is generated on its own); another line end is its own text
            line = line[:-1]
        if line.isascii():
            return len(line) - start[1]
        return len(line.encode("utf-8")[start[1]:].decode("utf-8"))

    def one_line(self, statement: cst.BaseSuite | cst.SimpleStatementLine) -> bool | None:
        """Is ``statement`` written on one line, from its first token to its last (no line break
        inside it, so none in any node it holds as written)? None when not known here."""
        start = self._known().get(id(statement))
        return None if start is None else start[0] == start[2]

    def code(self, module: cst.Module) -> str | None:
        """``module.code`` of the converted ``module``, each top-level statement the
        conversion left as it was (the parsed module's own node) copied from the source rather
        than generated: the same text (LibCST writes a file back byte for byte) at a fraction
        of the cost, as most of a large script's functions are left alone. None when not known
        here (the last statement, whose end is the file's, and the comment lines after it are
        generated; a file without a final line end is left to LibCST)."""
        self._known()  # (builds the spans too)
        if not self._spans or not module.has_trailing_newline:
            return None
        lines, spans = self._lines, self._spans
        parts = [module.code_for_node(line) for line in module.header]
        for stmt in module.body:
            span = spans.get(id(stmt))
            if span is None:
                parts.append(module.code_for_node(stmt))
            else:
                parts.append("\n".join(lines[span[0] - 1:span[1] - 1]))
                parts.append("\n")
        parts.extend(module.code_for_node(line) for line in module.footer)
        return "".join(parts)

    def _known(self) -> dict[int, tuple[int, int, int]]:
        """The statement lines' starts, built on first use."""
        if self._starts is None:
            self._starts = self._build()
        return self._starts

    def _top_level(self, theirs: list[ast.stmt], ours: list[cst.CSTNode],
                   lines: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        """Each top-level statement's lines but the last one's (see :meth:`code`): from the
        line of its first token (a decorator's, for a decorated def) back over its leading
        comment lines, to where the next statement's begin. Empty when the file's header and
        the statements' starts do not add up."""
        body = self._module.body
        tops = {id(stmt) for stmt in body}
        index = {id(node): k for k, node in enumerate(ours) if id(node) in tops}
        starts = []
        for stmt in body:
            if type(stmt) is cst.SimpleStatementLine:
                first = theirs[lines[id(stmt)][0]].lineno
            else:
                node = theirs[index[id(stmt)]]
                first = min([node.lineno,
                             *(d.lineno for d in getattr(node, "decorator_list", ()))])
            starts.append(first - len(stmt.leading_lines))
        if not starts or starts[0] != len(self._module.header) + 1 \
                or any(a >= b for a, b in zip(starts, starts[1:])):
            return {}
        return {id(stmt): (start, end) for stmt, start, end in zip(body, starts, starts[1:])}

    def _build(self) -> dict[int, tuple[int, int, int]]:
        try:
            text = self._source.decode(self._module.encoding)
        except (LookupError, UnicodeDecodeError):
            return {}
        text = text.removeprefix("\ufeff")
        if "\r" in text.replace("\r\n", ""):  # a lone carriage return ends a line for ast
            return {}
        self._lines = text.split("\n")
        theirs = [stmt for stmt in self._statements if isinstance(stmt, ast.stmt)]
        lines: dict[int, tuple[int, int]] = {}
        ours = _cst_statements(self._module.body, [], lines)
        if len(ours) != len(theirs) or any(
                not isinstance(other, _KINDS.get(type(mine), ())) for mine, other in
                zip(ours, theirs)):
            return {}
        self._spans = self._top_level(theirs, ours, lines)
        # the last statement of a line ends last: `a = f(\n); b = 1` ends where `b = 1` does
        return {key: (theirs[first].lineno, theirs[first].col_offset, theirs[last].end_lineno)
                for key, (first, last) in lines.items()}


def _cst_statements(body, out: list[cst.CSTNode],
                    lines: dict[int, tuple[int, int]]) -> list[cst.CSTNode]:
    """The LibCST statements in ``body``, in the order of the file model's (each small
    statement of a line on its own); ``lines`` gets the indexes of each line's first and last
    ones."""
    for stmt in body:
        if type(stmt) is cst.SimpleStatementLine:
            lines[id(stmt)] = (len(out), len(out) + len(stmt.body) - 1)
            out.extend(stmt.body)
            continue
        out.append(stmt)
        if type(stmt) is cst.If:
            _cst_suite(stmt.body, out, lines)
            orelse = stmt.orelse
            while type(orelse) is cst.If:  # elif: an `if` in the `else` for ast
                out.append(orelse)
                _cst_suite(orelse.body, out, lines)
                orelse = orelse.orelse
            if orelse is not None:
                _cst_suite(orelse.body, out, lines)
        elif isinstance(stmt, (cst.Try, *_CST_TRY_STAR)):
            _cst_suite(stmt.body, out, lines)
            for handler in stmt.handlers:
                _cst_suite(handler.body, out, lines)
            for part in (stmt.orelse, stmt.finalbody):
                if part is not None:
                    _cst_suite(part.body, out, lines)
        elif type(stmt) is cst.Match:
            for case in stmt.cases:
                _cst_suite(case.body, out, lines)
        elif type(stmt) in (cst.For, cst.While):
            _cst_suite(stmt.body, out, lines)
            if stmt.orelse is not None:
                _cst_suite(stmt.orelse.body, out, lines)
        elif type(stmt) in (cst.FunctionDef, cst.ClassDef, cst.With):
            _cst_suite(stmt.body, out, lines)
        else:  # a statement this module does not know: no correspondence to rely on
            out.append(None)
    return out


_CST_TRY_STAR = (cst.TryStar,) if hasattr(cst, "TryStar") else ()


def _cst_suite(suite: cst.BaseSuite, out: list[cst.CSTNode],
               lines: dict[int, tuple[int, int]]) -> None:
    if type(suite) is cst.IndentedBlock:
        _cst_statements(suite.body, out, lines)
    else:  # `if x: a; b`: the small statements of a one-line suite
        out.extend(suite.body)
