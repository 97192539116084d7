"""Convert one file's source: parse, analyse, rewrite, and say what changed where.

The conversion is static: the user's code is parsed, never imported or run. The output keeps the
input's encoding (coding cookie, BOM), line endings, comments and formatting; lines distify does
not touch come out byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import libcst as cst

from distify.analysis.facts import parse_ast
from distify.analysis.filemodel import FileModel
from distify.analysis.positions import lines_of, start_line
from distify.analysis.project import module_names
from distify.convert.base import Edit
from distify.convert.devices import (
    CPU_MESSAGE,
    forward_factories,
    fresh_models,
    stays_on_cpu,
)
from distify.convert.rewrites import REGISTRY
from distify.convert.starts import StatementStarts
from distify.convert.transformer import DistifyTransformer
from distify.convert.traverse import rewrite
from distify.errors import UserError
from distify.nogc import no_collections
from distify.rules import RuleSet, default_rules

Status = Literal["converted", "unchanged", "already-distributed", "no-torch"]

_TORCH_ROOTS = {"torch", "torchvision", "timm", "transformers"}
#: names tried, in order, for the runtime's import
_RUNTIME_NAMES = ("distify", "distify_rt", "_distify")


@dataclass(frozen=True)
class Item:
    """One line of the report: a change made, or a place that needs a human look."""

    line: int
    kind: str
    message: str
    needs_human: bool = False


@dataclass(frozen=True)
class FileResult:
    """The outcome of converting one file."""

    path: str
    source: bytes
    output: bytes
    status: Status
    changes: tuple[Item, ...] = ()
    notes: tuple[Item, ...] = ()
    batch_sizes: tuple[str, ...] = ()
    reason: str = ""
    runtime_name: str = "distify"
    #: the script has its own GradScaler: distify's mixed precision must stay off
    own_mixed_precision: bool = False
    #: the modules it imports (``model``, ``.utils``), to find a project's local helpers
    imports: tuple[str, ...] = ()
    #: converted as a helper of a project's script (it imports no torch), never launched
    helper: bool = False
    #: the rewrites turned off for it (``--skip``), by name
    skipped: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.output != self.source

    @property
    def ready(self) -> bool:
        """False when a model that trains may not be prepared (a ``model`` note): launched as it
        is, the job would stop with an error, or train each process on its own."""
        return not any(note.kind == "model" for note in self.notes)


def convert_source(source: bytes, path: str = "<string>", rules: RuleSet | None = None,
                   runtime_module: str = "distify.runtime", *,
                   helper: bool = False, skip: frozenset[str] = frozenset()) -> FileResult:
    """Convert one script's source.

    Args:
        source: the file's bytes (any encoding Python accepts: cookie, BOM, UTF-8).
        path: used in messages only.
        rules: the rule packs; the bundled ones by default.
        runtime_module: what the added import imports (``distify_runtime`` for a standalone
            conversion that copies the runtime beside the output).
        helper: a project's module that a converted script imports: converted (its prints and
            file writes) even when it imports no torch.
        skip: rewrites turned off (names of :mod:`distify.convert.rewrites`, checked by the
            caller with :func:`~distify.convert.rewrites.select_skips`).

    Raises:
        UserError: the source is not valid Python (the message carries ``path:line:col``).
    """
    with no_collections():  # see distify.nogc (a fifth of a large file's conversion)
        return _convert(source, path, rules, runtime_module, helper, skip)


def _convert(source: bytes, path: str, rules: RuleSet | None, runtime_module: str,
             helper: bool, skip: frozenset[str]) -> FileResult:
    rules = rules or default_rules()
    tree = parse_ast(source, path)  # cheap, and a syntax error is reported even without torch
    model = FileModel(tree, source, rules)  # the one analysis of the file
    facts = model.facts if helper or b"torch" in source else None
    table = model.imports
    imports = module_names(table.modules, table.aliases.values())
    if facts is None or not helper and not any(m.split(".")[0] in _TORCH_ROOTS
                                               for m in facts.imports.modules):
        return FileResult(path, source, source, "no-torch", reason="does not import torch",
                          imports=imports)
    if facts.parallel is not None and not facts.parallel.imported_only:
        return FileResult(path, source, source, "already-distributed",
                          reason=facts.parallel.reason, imports=imports)
    if facts.training.trains_no_model and not facts.model_classes:
        lines = ", ".join(str(n) for n in facts.training.tensor_only_backwards)
        return FileResult(path, source, source, "unchanged", imports=imports, reason=(
            f"no model or optimizer to distribute: the backward pass (line {lines}) "
            "differentiates plain tensors, as an autograd example does"))
    module = _parse_cst(source, path)
    rt = next((n for n in _RUNTIME_NAMES if n not in facts.names), "_distify_runtime")
    transformer = DistifyTransformer(facts, rules, rt, skip,
                                     starts=StatementStarts(model.statements.all, source, module))
    with _deep_recursion(path):
        result = _rewrite(path, source, module, transformer, runtime_module)
    return dataclasses.replace(result, imports=imports, helper=helper,
                               skipped=tuple(sorted(skip)))


def _rewrite(path: str, source: bytes, module: cst.Module, transformer: DistifyTransformer,
             runtime_module: str) -> FileResult:
    rt = transformer.rt
    updated = rewrite(module, transformer)
    if not any(not e.needs_human for e in transformer.edits):
        notes = _located(updated, transformer.edits, transformer.starts)[2]
        return FileResult(path, source, source, "unchanged", notes=notes,
                          reason="nothing to convert")
    updated = _add_import(updated, first_touched=transformer.first_touched, rt=rt,
                          runtime_module=runtime_module)
    edits = transformer.edits
    if _prepares(transformer):
        if "device" in transformer.skip:  # the script's own device choices stay
            if stays_on_cpu(module) and _runs_as_a_script(module):
                edits = [*edits, _skipped_cpu_line(updated, rt)]
        elif stays_on_cpu(module) and _runs_as_a_script(module):
            updated, line = _stay_on_cpu(updated, rt)
            edits = [*edits, Edit(line, "device", CPU_MESSAGE.format(rt=rt))]
        else:
            classes = transformer.facts.model_classes
            edits = [*edits, *forward_factories(updated, classes, transformer._qual, rt),
                     *fresh_models(updated, classes, rt, source)]
    code, changes, notes = _located(updated, edits, transformer.starts)
    return FileResult(path, source, code.encode(updated.encoding), "converted", changes, notes,
                      tuple(dict.fromkeys(transformer.batch_sizes)), runtime_name=rt,
                      own_mixed_precision=transformer.own_mixed_precision)


#: LibCST visits recursively: long chains (``a + b + ...`` with hundreds of terms) need depth
_DEEP_RECURSION = 20_000


@contextlib.contextmanager
def _deep_recursion(path: str) -> Iterator[None]:
    """LibCST visits and generates code recursively; allow long (valid) chains, and turn the
    rest into a one-line error instead of a traceback."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _DEEP_RECURSION))
    try:
        yield
    except RecursionError:
        raise UserError("an expression is nested too deeply to convert; split it over a few "
                        "statements", path=path, line=1, col=1) from None
    finally:
        sys.setrecursionlimit(limit)


def _parse_cst(source: bytes, path: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as err:
        raise UserError(f"LibCST cannot parse this file: {err.message}", path=path,
                        line=err.raw_line, col=err.raw_column + 1) from None
    except UnicodeDecodeError as err:  # CPython tolerates bad bytes in comments; LibCST does not
        line = source[:err.start].count(b"\n") + 1
        col = err.start - (source.rfind(b"\n", 0, err.start) + 1) + 1
        raise UserError(f"not valid {err.encoding} text (byte {source[err.start]:#04x}); "
                        "fix the file's encoding or its coding cookie", path=path, line=line,
                        col=col) from None


def _located(module: cst.Module, edits, starts: StatementStarts | None = None,
             ) -> tuple[str, tuple[Item, ...], tuple[Item, ...]]:
    """The module's code (generated once: the top-level statements left as they were copied
    from the source, when ``starts`` knows them) and the changes and notes with their
    lines."""
    anchors = {id(edit): start_line(edit.node) for edit in edits}
    code, lines = lines_of(module, anchors.values(),
                           starts.code(module) if starts is not None else None)
    # an edit whose node is no longer in the output was superseded by an outer rewrite
    items = sorted(
        (Item(lines[id(anchors[id(edit)])], edit.kind, edit.message, edit.needs_human)
         for edit in edits if id(anchors[id(edit)]) in lines),
        key=lambda item: item.line)
    return (code, tuple(i for i in items if not i.needs_human),
            tuple(i for i in items if i.needs_human))


def _add_import(updated: cst.Module, *, first_touched: int, rt: str,
                runtime_module: str) -> cst.Module:
    """Add ``import <runtime_module> as <rt>`` once: after the leading imports, and before the
    first top-level statement the rewrite touched."""
    alias = None if runtime_module.split(".")[-1] == rt and "." not in runtime_module else rt
    stmt = cst.SimpleStatementLine(body=[cst.Import(names=[cst.ImportAlias(
        name=cst.parse_expression(runtime_module),
        asname=cst.AsName(cst.Name(alias)) if alias else None)])])
    body = list(updated.body)
    index = _insertion_index(body, min(first_touched, len(body)))
    line = body[index] if index < len(body) else None
    if type(line) is cst.SimpleStatementLine and _future_count(line):
        # `from __future__ import x; import torch; print(1)`: the import joins that line,
        # right after the future import, so it precedes the rewritten code beside it.
        count = _future_count(line)
        small = [*line.body[:count], stmt.body[0], *line.body[count:]]
        small[count - 1] = small[count - 1].with_changes(semicolon=cst.Semicolon(
            whitespace_after=cst.SimpleWhitespace(" ")))
        if count == len(line.body):
            small[-1] = small[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        body[index] = line.with_changes(body=small)
    else:
        body.insert(index, stmt)
    return updated.with_changes(body=body)


def _prepares(transformer: DistifyTransformer) -> bool:
    return any(edit.kind == "prepare-model" and not edit.needs_human for edit in transformer.edits)


def _skipped_cpu_line(updated: cst.Module, rt: str) -> Edit:
    """The note, on the runtime's import, that ``rt.init(cpu=True)`` was not added."""
    line = next(stmt for stmt in updated.body if _imports_runtime(stmt, rt))
    return Edit(line, "skipped", "rewrite `device` skipped: left as written, so "
                f"{REGISTRY['device'].SKIPPED}; this script never uses an accelerator, and "
                f"`{rt}.init(cpu=True)` here would keep its processes on the CPU", True)


def _runs_as_a_script(module: cst.Module) -> bool:
    """The file does work when run (a ``__main__`` block, a loop or a call at its top level),
    not only definitions: a helper module that a GPU script imports must not put that script's
    process on the CPU, however CPU-only the helper reads (its caller decides the device)."""
    for statement in module.body:
        if type(statement) in (cst.If, cst.For, cst.While, cst.With, cst.Try):
            return True
        if type(statement) is cst.SimpleStatementLine and any(
                type(small) is cst.Expr and type(small.value) is cst.Call
                for small in statement.body):
            return True
    return False


def _stay_on_cpu(updated: cst.Module, rt: str) -> tuple[cst.Module, cst.SimpleStatementLine]:
    """Add ``rt.init(cpu=True)`` on the line after the runtime's import."""
    line = cst.SimpleStatementLine(body=[cst.Expr(cst.parse_expression(f"{rt}.init(cpu=True)"))])
    body = list(updated.body)
    index = next(i for i, stmt in enumerate(body) if _imports_runtime(stmt, rt))
    body.insert(index + 1, line)
    return updated.with_changes(body=body), line


def _imports_runtime(stmt: cst.CSTNode, rt: str) -> bool:
    if type(stmt) is not cst.SimpleStatementLine:
        return False
    for small in stmt.body:
        if type(small) is cst.Import:
            for alias in small.names:
                name = alias.asname.name if alias.asname else alias.name
                if type(name) is cst.Name and name.value == rt or \
                        cst.Module([]).code_for_node(alias.name) == rt:
                    return True
    return False


def _future_count(line: cst.SimpleStatementLine) -> int:
    """How many small statements at the start of ``line`` are ``from __future__`` imports."""
    count = 0
    for small in line.body:
        if not (type(small) is cst.ImportFrom and dotted_module(small) == "__future__"):
            break
        count += 1
    return count


def _is_import(stmt: cst.CSTNode) -> bool:
    return type(stmt) is cst.SimpleStatementLine and all(
        type(s) in (cst.Import, cst.ImportFrom) for s in stmt.body)


def _is_docstring_or_future(stmt: cst.CSTNode) -> bool:
    """A docstring, or a line holding a ``from __future__`` import (which must stay first)."""
    if type(stmt) is not cst.SimpleStatementLine or not stmt.body:
        return False
    small = stmt.body[0]
    if len(stmt.body) == 1 and type(small) is cst.Expr \
            and type(small.value) in (cst.SimpleString, cst.ConcatenatedString):
        return True
    return any(type(s) is cst.ImportFrom and dotted_module(s) == "__future__"
               for s in stmt.body)


def dotted_module(node: cst.ImportFrom) -> str:
    return cst.Module([]).code_for_node(node.module) if node.module else ""


def _insertion_index(body: list, first_touched: int) -> int:
    """After the leading imports, docstring and future imports, and not after
    ``first_touched`` (the first top-level statement that uses the runtime on import)."""
    index = 0
    for i, stmt in enumerate(body[:first_touched + 1]):
        if i == first_touched:  # a rewritten line: only a future import on it moves us on
            break
        if _is_import(stmt) or (i == index and _is_docstring_or_future(stmt)):
            index = i + 1
        elif type(stmt) in (cst.FunctionDef, cst.ClassDef):
            break
    return index
