"""One traversal per file runs every rule, knowing at each node which ranks reach it.

The file is parsed with the stdlib ``ast`` (ten times faster than LibCST, positions included);
LibCST is used only to apply fixes (:mod:`distify.lint.fixer`). The walk keeps a stack of
*frames*, one per enclosing rank condition (``if rank == 0:``, its ``else``, the rest of a block
after ``if not is_main: return``, a ``@rank_zero_only`` function), so that a rule asking
:meth:`FileContext.site` learns whether the node runs on every rank, the main process only, or
only some ranks, and why.

A function's body starts on every rank as far as the walk knows; after the walk, the call sites
of each function defined in the file (matched by name) decide who really enters it, so a
``torch.save`` inside ``save_checkpoint()`` that is only called under ``if rank == 0:`` is
guarded. A function with no call site in the file, or used as a value (``mp.spawn(main_worker)``,
a callback), is entered by every rank. Rules that depend on this record a :class:`Site` while
visiting and ask :meth:`FileContext.reaches` in ``finish``.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from functools import cached_property

from distify.analysis import parallelism
from distify.analysis.facts import parse_ast
from distify.analysis.filemodel import FileModel
from distify.analysis.guards import ALL, MAIN, GuardFacts, Reach, complement, meet
from distify.analysis.project import module_names
from distify.errors import UserError
from distify.lint.matcher import Matcher
from distify.lint.model import PARSE_ERROR, FileResult, Finding, Fix
from distify.lint.rule import REGISTRY, LintRule
from distify.lint.suppression import Suppressions
from distify.nogc import no_collections

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SKIP_FIELDS = frozenset({"ctx", "op", "ops", "type_comment", "is_async"})
_BINDING = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Import, ast.ImportFrom, ast.FunctionDef,
            ast.AsyncFunctionDef, ast.ClassDef, ast.Global, ast.Nonlocal, ast.Delete,
            ast.Return, ast.Break, ast.Continue, ast.Yield, ast.YieldFrom, ast.Await,
            ast.NamedExpr)
RUNTIME_MODULES = ("distify.runtime", "distify_runtime")


@dataclass(frozen=True)
class Cause:
    """Why some code is rank-restricted: ``kind`` is ``if``, ``else``, ``exit`` or
    ``decorator``; ``node`` the ``if`` statement, the exit statement or the decorator."""

    kind: str
    node: ast.AST

    @property
    def line(self) -> int:
        return self.node.lineno


@dataclass(frozen=True)
class State:
    """Which ranks reach a node, and the innermost reason when not all of them."""

    reach: Reach
    cause: Cause | None = None


EVERY = State(ALL)


def compose(outer: State, inner: State) -> State:
    """The state of code under ``inner`` when its enclosing code is under ``outer``."""
    if inner.reach is ALL:
        return outer
    if outer.reach is ALL:
        return inner
    return State(meet(outer.reach, inner.reach), inner.cause)


@dataclass(frozen=True)
class Site:
    """A node's place: its enclosing function (None at module level), local state, statement."""

    function: ast.AST | None
    state: State
    stmt: ast.stmt
    next_line: int | None  # the line the next statement of the same block starts on


@dataclass
class _Owner:
    """A function, module or loop: the extent of an early exit's effect."""

    node: ast.AST
    is_loop: bool
    mark: int
    exits: list[State] = field(default_factory=list)


@dataclass(frozen=True)
class LintOptions:
    """What to check: the rule packs, the rule codes to run, whether non-distributed files too."""

    matcher: Matcher
    codes: tuple[str, ...]
    check_all: bool = False
    #: bytes a file must match to be parsed at all (see :func:`distify.lint.discovery.prefilter`)
    prefilter: re.Pattern[bytes] | None = None


class FileContext:
    """Everything rules know about the file being checked, and where the walk is in it."""

    def __init__(self, path: str, source: bytes, tree: ast.Module, options: LintOptions,
                 model: FileModel | None = None) -> None:
        self.path = path
        self.source = source
        self.tree = tree
        self.options = options
        self.matcher = options.matcher
        #: the file's one analysis, shared with ``convert`` (:mod:`distify.analysis.filemodel`):
        #: the parts below are read from it, each computed when first read
        self.model = model if model is not None else FileModel(tree, source, self.matcher.rules,
                                                               self.matcher)
        self.imports = self.model.imports
        #: already distributed (see :mod:`distify.analysis.parallelism`, shared with convert)
        self.parallel = self.model.parallel
        self.distributed = self.parallel is not None and self.parallel.kind == "distributed"
        self.function: ast.AST | None = None
        self.stmt: ast.stmt = tree
        self.next_line: int | None = None
        self.findings: list[Finding] = []
        self._walker: _Walker | None = None
        self._entries: dict[ast.AST, frozenset[State]] = {}
        self._callees: dict[int, str | None] = {}
        self._text: str | None = None
        self._lines: list[str] | None = None

    # --- the file's model -----------------------------------------------------------------

    @property
    def functions(self) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        """The file's function definitions, in source order."""
        return self.model.functions

    @cached_property
    def function_names(self) -> frozenset[str]:
        return frozenset(func.name for func in self.model.functions)

    @property
    def facts(self) -> GuardFacts:
        """The file's guard vocabulary (rank and guard variables and helpers)."""
        return self.model.guards

    @property
    def module_names(self) -> frozenset[str]:
        """Names bound at module level (by statements outside functions and classes, and by
        imports)."""
        return self.model.module_names

    # --- names ----------------------------------------------------------------------------

    def callee(self, call: ast.Call) -> str | None:
        """The qualified name of what ``call`` calls, with ``()`` for calls and ``<expr>`` for
        anything else in the chain: ``pathlib.Path().write_text``, ``<expr>.savefig``."""
        key = id(call)
        if key not in self._callees:
            self._callees[key] = self.loose_qualname(call.func)
        return self._callees[key]

    def loose_qualname(self, node: ast.AST) -> str | None:
        return self.imports.loose_qualname(node)

    def match(self, category: str, name: str | None):
        return self.matcher.match(category, name)

    def runtime_alias(self) -> str | None:
        """The name the file imports the distify runtime as, if it does."""
        for alias, target in self.imports.aliases.items():
            if target in RUNTIME_MODULES:
                return alias
        return None

    # --- where the walk is ----------------------------------------------------------------

    def site(self) -> Site:
        """The current node's site (function, state, statement)."""
        return Site(self.function, self._walker.state(), self.stmt, self.next_line)

    def reaches(self, site: Site) -> frozenset[State]:
        """After the walk: every state ``site`` can run in, over all calls of its function."""
        entries = self._entries.get(site.function, frozenset({EVERY}))
        return frozenset(compose(entry, site.state) for entry in entries)

    @staticmethod
    def on_every_rank(states: frozenset[State]) -> bool:
        return any(state.reach is ALL for state in states)

    # --- source text ----------------------------------------------------------------------

    @property
    def text(self) -> str:
        if self._text is None:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(self.source).readline)
            self._text = self.source.decode(encoding, errors="replace")
        return self._text

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.text.splitlines()
        return self._lines

    def char_col(self, line: int, byte_col: int) -> int:
        """``ast`` columns count UTF-8 bytes; findings count characters."""
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if text.isascii():
            return byte_col
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))

    def segment(self, node: ast.AST) -> str:
        """The source of ``node`` on one line (re-spelled by ``ast.unparse`` if it spans more)."""
        if node.lineno == node.end_lineno:
            line = self.lines[node.lineno - 1].encode("utf-8")
            return line[node.col_offset:node.end_col_offset].decode("utf-8")
        return ast.unparse(node)

    # --- reporting ------------------------------------------------------------------------

    def report(self, code: str, node: ast.AST, message: str, *, site: Site | None = None,
               fix: Fix | None = None) -> None:
        stmt = site.stmt if site is not None else None
        lines = {node.lineno}
        if isinstance(stmt, ast.stmt) and not hasattr(stmt, "body"):
            lines.update((stmt.lineno, stmt.end_lineno))
        self.findings.append(Finding(
            self.path, node.lineno, self.char_col(node.lineno, node.col_offset) + 1,
            node.end_lineno, self.char_col(node.end_lineno, node.end_col_offset) + 1,
            code, message, fix))
        self._noqa_lines.append(tuple(sorted(lines)))

    # --- fixes ----------------------------------------------------------------------------

    def _wrappable(self, site: Site) -> bool:
        stmt = site.stmt
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            inner = [node for child in stmt.body for node in ast.walk(child)]
            if any(isinstance(node, _BINDING) for node in inner):
                return False
        elif not isinstance(stmt, ast.Expr):
            return False
        first = self.lines[stmt.lineno - 1].encode("utf-8")[:stmt.col_offset]
        if first.strip() or site.next_line == stmt.end_lineno:
            return False  # shares a line with other code (`;`, one-line `if x: save()`)
        for node in ast.walk(stmt):
            if isinstance(node, (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)):
                return False
            if isinstance(node, ast.Call) and self.match("collectives", self.callee(node)):
                return False  # guarding a collective would hang the other ranks
        return True

    # --- the run --------------------------------------------------------------------------

    def run(self, rule_classes: list[type[LintRule]]) -> list[Finding]:
        self._noqa_lines: list[tuple[int, ...]] = []
        rules = [cls(self) for cls in rule_classes]
        self._walker = _Walker(self, rules)
        self._walker.walk(self.tree)
        self._entries = self._walker.resolve_entries()
        for rule in rules:
            rule.finish()
        # the walker and the rules refer back to this context: done with, they go now (freed
        # with the file, not left in a cycle for the garbage collector)
        self._walker = None
        suppressions = Suppressions(self.text, self._noqa_lines) if self.findings else None
        return [finding for finding, lines in zip(self.findings, self._noqa_lines)
                if not suppressions.suppressed(finding.code, lines)]


class _Walker:
    """The single traversal: keeps the rank frames and dispatches nodes to every rule."""

    def __init__(self, ctx: FileContext, rules: list[LintRule]) -> None:
        self.ctx = ctx
        self.visitors: dict[type, list] = {}
        self.leavers: dict[type, list] = {}
        for rule in rules:
            for name in dir(type(rule)):
                prefix, _, node_type = name.partition("_")
                if prefix in ("visit", "leave") and hasattr(ast, node_type):
                    table = self.visitors if prefix == "visit" else self.leavers
                    table.setdefault(getattr(ast, node_type), []).append(getattr(rule, name))
        # plain functions of the class, called with the walker: its own bound methods kept
        # here would make a cycle, and the file's tree and facts would wait for the collector
        self.special = _SPECIAL
        # Leaf node types no rule visits are not walked into at all (literals are a third of
        # the nodes of a typical script).
        self.leaves = frozenset({ast.Constant} - set(self.visitors) - set(self.leavers))
        self.frames: list[State] = []
        self.composed: list[State] = [EVERY]
        self.owners: list[_Owner] = []
        self.exit_state: State | None = None
        self.callee_ids: set[int] = set()
        self.call_sites: dict[str, list[Site]] = {}
        self.value_refs: set[str] = set()
        self.guards: list[tuple[ast.AST | None, ast.expr]] = []

    # --- state ----------------------------------------------------------------------------

    def state(self) -> State:
        top = self.composed[-1]
        return compose(top, self.exit_state) if self.exit_state is not None else top

    def push(self, frame: State) -> None:
        self.frames.append(frame)
        self.composed.append(compose(self.composed[-1], frame))

    def pop(self) -> None:
        self.frames.pop()
        self.composed.pop()

    def _refresh_exits(self) -> None:
        state = None
        for owner in self.owners:
            for frame in owner.exits:
                state = compose(state or EVERY, frame)
        self.exit_state = state

    # --- traversal ------------------------------------------------------------------------

    def walk(self, tree: ast.Module) -> None:
        self.visit(tree)

    def visit(self, node: ast.AST) -> None:
        handlers = self.visitors.get(type(node))
        special = self.special.get(type(node))
        if special is not None:
            special(self, node, handlers)
        else:
            if handlers:
                for handler in handlers:
                    handler(node)
            self.children(node)
        leavers = self.leavers.get(type(node))
        if leavers:
            for handler in leavers:
                handler(node)

    def children(self, node: ast.AST) -> None:
        for name in node._fields:
            if name in _SKIP_FIELDS:
                continue
            value = getattr(node, name, None)
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self.body(value)
                else:
                    for item in value:
                        if isinstance(item, ast.AST) and type(item) not in self.leaves:
                            self.visit(item)
            elif isinstance(value, ast.AST) and type(value) not in self.leaves:
                self.visit(value)

    def body(self, stmts: list[ast.stmt]) -> None:
        ctx = self.ctx
        saved = ctx.stmt, ctx.next_line
        last = len(stmts) - 1
        for index, stmt in enumerate(stmts):
            ctx.stmt = stmt
            ctx.next_line = stmts[index + 1].lineno if index < last else None
            self.visit(stmt)
        ctx.stmt, ctx.next_line = saved

    @staticmethod
    def _dispatch(node: ast.AST, handlers) -> None:
        if handlers:
            for handler in handlers:
                handler(node)

    # --- special nodes --------------------------------------------------------------------

    def _module(self, node: ast.Module, handlers) -> None:
        self._dispatch(node, handlers)
        self.owners.append(_Owner(node, False, 0))
        self.body(node.body)

    def _function(self, node: ast.AST, handlers) -> None:
        self._dispatch(node, handlers)
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        ctx = self.ctx
        saved = (self.frames, self.composed, self.owners, self.exit_state, ctx.function)
        self.frames, self.composed, self.owners, self.exit_state = [], [EVERY], [], None
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            if ctx.match("guard_decorators", ctx.loose_qualname(target)):
                self.composed = [State(MAIN, Cause("decorator", decorator))]
        ctx.function = node
        self.owners.append(_Owner(node, False, 0))
        self.body(node.body)
        self.frames, self.composed, self.owners, self.exit_state, ctx.function = saved

    def _if(self, node: ast.If, handlers) -> None:
        self._dispatch(node, handlers)
        self.visit(node.test)
        test = self.ctx.facts.test(node.test)
        if test is None:
            self.body(node.body)
            if node.orelse:
                self.body(node.orelse)
            return
        guard = self.ctx.facts.main_operand(node.test)
        if guard is not None:
            self.guards.append((self.ctx.function, guard))
        self.push(State(test.true, Cause("if", node)))
        self.body(node.body)
        self.pop()
        if node.orelse:
            self.push(State(test.false, Cause("else", node)))
            self.body(node.orelse)
            self.pop()

    def _if_exp(self, node: ast.IfExp, handlers) -> None:
        self._dispatch(node, handlers)
        self.visit(node.test)
        test = self.ctx.facts.test(node.test)
        for branch, reach in ((node.body, test and test.true), (node.orelse, test and test.false)):
            if reach:
                self.push(State(reach, Cause("if", node)))
            self.visit(branch)
            if reach:
                self.pop()

    def _bool_op(self, node: ast.BoolOp, handlers) -> None:
        self._dispatch(node, handlers)
        pushed = 0
        for value in node.values:
            self.visit(value)
            test = self.ctx.facts.test(value)
            if test is not None:
                reach = test.true if isinstance(node.op, ast.And) else test.false
                self.push(State(reach, Cause("if", node)))
                pushed += 1
        for _ in range(pushed):
            self.pop()

    def _loop(self, node: ast.AST, handlers) -> None:
        self._dispatch(node, handlers)
        for name in ("target", "iter", "test"):
            child = getattr(node, name, None)
            if child is not None:
                self.visit(child)
        self.owners.append(_Owner(node, True, len(self.frames)))
        self.body(node.body)
        self.owners.pop()
        self._refresh_exits()
        if node.orelse:
            self.body(node.orelse)

    def _exit(self, node: ast.stmt, handlers) -> None:
        self._dispatch(node, handlers)
        self.children(node)
        self.leave_scope(node, loop=isinstance(node, (ast.Break, ast.Continue)))

    def leave_scope(self, node: ast.AST, *, loop: bool) -> None:
        """``node`` leaves its loop or function: if only some ranks get here, the code after it
        in that loop or function is reached by the others only."""
        index = len(self.owners) - 1
        while index >= 0 and loop and not self.owners[index].is_loop:
            index -= 1
        if index < 0:
            return
        if not loop:
            index = 0
        owner = self.owners[index]
        relative = EVERY
        for frame in self.frames[owner.mark:]:
            relative = compose(relative, frame)
        for inner in self.owners[index:]:
            for frame in inner.exits:
                relative = compose(relative, frame)
        if relative.reach is ALL:
            return
        owner.exits.append(State(complement(relative.reach), Cause("exit", node)))
        self._refresh_exits()

    def _call(self, node: ast.Call, handlers) -> None:
        ctx = self.ctx
        func = node.func
        name = None
        if isinstance(func, ast.Name):
            name = func.id
        elif isinstance(func, ast.Attribute):
            root = func.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in ctx.imports.aliases):
                name = func.attr
        if name is not None:
            self.callee_ids.add(id(func))
            if name in ctx.function_names:
                self.call_sites.setdefault(name, []).append(ctx.site())
        self._dispatch(node, handlers)
        self.children(node)
        if (isinstance(ctx.stmt, ast.Expr) and ctx.stmt.value is node
                and ctx.match("process_exits", ctx.callee(node))):
            self.leave_scope(node, loop=False)

    def _name(self, node: ast.Name, handlers) -> None:
        if node.id in self.ctx.function_names and id(node) not in self.callee_ids:
            self.value_refs.add(node.id)
        self._dispatch(node, handlers)

    def _attribute(self, node: ast.Attribute, handlers) -> None:
        if node.attr in self.ctx.function_names and id(node) not in self.callee_ids:
            self.value_refs.add(node.attr)
        self._dispatch(node, handlers)
        self.visit(node.value)

    # --- who enters each function ---------------------------------------------------------

    def resolve_entries(self) -> dict[ast.AST, frozenset[State]]:
        """The states each function of the file can be entered in (a small fixpoint)."""
        outside: dict[ast.AST, list[Site]] = {}
        entries: dict[ast.AST, set[State]] = {}
        for func in self.ctx.functions:
            sites = [site for site in self.call_sites.get(func.name, ())
                     if site.function is not func]
            outside[func] = sites
            open_entry = not sites or func.name in self.value_refs
            entries[func] = {EVERY} if open_entry else set()
        for _ in range(20):
            changed = False
            for func, sites in outside.items():
                new = set(entries[func])
                for site in sites:
                    callers = entries.get(site.function, {EVERY}) if site.function else {EVERY}
                    new.update(compose(entry, site.state) for entry in callers)
                if new != entries[func]:
                    entries[func], changed = new, True
            if not changed:
                break
        return {func: frozenset(states or {EVERY}) for func, states in entries.items()}


#: the node types the walker itself handles (its frames), each with its method
_SPECIAL = {
    ast.Module: _Walker._module, ast.FunctionDef: _Walker._function,
    ast.AsyncFunctionDef: _Walker._function, ast.If: _Walker._if, ast.IfExp: _Walker._if_exp,
    ast.BoolOp: _Walker._bool_op, ast.For: _Walker._loop, ast.AsyncFor: _Walker._loop,
    ast.While: _Walker._loop, ast.Return: _Walker._exit, ast.Break: _Walker._exit,
    ast.Continue: _Walker._exit, ast.Call: _Walker._call, ast.Name: _Walker._name,
    ast.Attribute: _Walker._attribute,
}


def lint_source(source: bytes, path: str, options: LintOptions) -> FileResult:
    """Check one file's source.

    Args:
        source: the file's bytes (any PEP 263 encoding).
        path: how findings name the file.
        options: the rule packs, rules and scope.

    Returns:
        Its findings (unsorted), a parse error as a ``DST000`` finding, or why it was skipped.
    """
    with no_collections():  # see distify.nogc (a tenth of a check's time)
        return _lint(source, path, options)


def _lint(source: bytes, path: str, options: LintOptions) -> FileResult:
    try:
        tree = parse_ast(source, path)
    except UserError as err:  # the same one-line message and position `convert` gives
        return FileResult(path, (_parse_error(path, err),))
    if not options.check_all and not any(hint in source for hint in parallelism.HINTS):
        return FileResult(path, skipped="not distributed")
    ctx = FileContext(path, source, tree, options)
    if not ctx.distributed and not options.check_all:
        why = "multi-process, not distributed" if ctx.parallel else "not distributed"
        return FileResult(path, skipped=why)
    findings = ctx.run([REGISTRY[code] for code in options.codes])
    imports = module_names(ctx.imports.modules, ctx.imports.aliases.values())
    return FileResult(path, tuple(findings), imports=imports)


def _parse_error(path: str, err: UserError) -> Finding:
    line, col = err.line or 1, err.col or 1
    return Finding(path, line, col, line, col, PARSE_ERROR, err.message)
