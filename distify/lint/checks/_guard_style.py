"""The main-process guard ``--fix`` wraps a statement in, in the file's own vocabulary.

Shared by DST101-DST104. A fix never adds a dependency: a plain ``torch.distributed`` script
must still run where distify is not installed. So the file's *style* is decided once, from its
imports and the objects it builds, and every fix in the file is spelled in it:

- a file that imports the distify runtime: ``distify.is_main_process()`` (with its alias);
- Accelerate: ``accelerator.is_main_process``; Lightning Fabric: ``fabric.is_global_zero``
  (the name of the file's own ``Accelerator`` / ``Fabric`` in scope at the fix);
- Lightning: ``rank_zero_only.rank == 0`` where the file imports ``rank_zero_only``, else
  ``self.trainer.is_global_zero`` in a ``LightningModule`` and ``trainer.is_global_zero``
  beside a ``Trainer``;
- ``torch.distributed``: ``dist.get_rank() == 0`` with the file's spelling of the module
  (``dist``, ``torch.distributed``); where the script also runs without a process group (it
  asks ``dist.is_initialized()``, or starts the group under ``if ddp:``),
  ``not ddp or dist.get_rank() == 0`` / ``not dist.is_initialized() or dist.get_rank() == 0``.

Before that spelling, what the file already writes is preferred, when it belongs to the style
and its names mean the same at the fix: a guard used earlier in the same function, then the
commonest guard elsewhere, then a guard variable (``master_process``) or a global rank variable
(``rank``) in scope.

What it deliberately does not do: add an import, use a name bound in another function, use a
local rank (``local_rank == 0``) it has not seen the file use, or call ``get_rank()`` before
the ``init_process_group`` of the same function. Such a finding keeps no fix: it is reported
without the fixable mark.
"""

from __future__ import annotations

import ast
import builtins
import functools
import weakref
from collections import Counter
from dataclasses import dataclass, field

from distify.analysis.guards import MAIN
from distify.analysis.names import ast_dotted_name
from distify.lint.engine import FileContext, Site
from distify.lint.model import Fix

RUNTIME, ACCELERATE, FABRIC, LIGHTNING, TORCH = (
    "runtime", "accelerate", "fabric", "lightning", "torch")
#: guards built on a rank or a flag of the file's own (``rank == 0``, ``master_process``)
RANK = "rank"
#: the guard families each style reuses
_ACCEPTS = {RUNTIME: {RUNTIME}, ACCELERATE: {ACCELERATE}, FABRIC: {FABRIC},
            LIGHTNING: {LIGHTNING, FABRIC, RANK}, TORCH: {RANK}, "": {RANK}}
#: Lightning's objects that know the global rank. The ``wrappers`` pack in
#: rules/distributed.yaml names Accelerate's object and its ``guard`` attribute, not these.
_LIGHTNING_OBJECTS = {
    "lightning.Fabric": FABRIC, "lightning.fabric.Fabric": FABRIC,
    "lightning_fabric.Fabric": FABRIC, "lightning.Trainer": LIGHTNING,
    "lightning.pytorch.Trainer": LIGHTNING, "pytorch_lightning.Trainer": LIGHTNING,
}
_CONVENTIONAL = {"fabric": FABRIC, "trainer": LIGHTNING}
#: frameworks whose processes do not share a ``torch.distributed`` group (no ``get_rank()``)
_OWN_GROUPS = ("horovod",)
_INIT = "torch.distributed.init_process_group"
_IS_INITIALIZED = "torch.distributed.is_initialized"
_BUILTINS = frozenset(dir(builtins))
_NESTED = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def guard_fix(ctx: FileContext, site: Site) -> Fix | None:
    """A fix wrapping ``site``'s statement in the file's guard, or None when none is safe.

    Args:
        ctx: the file being checked (after the walk).
        site: where the side effect is.
    """
    if not ctx._wrappable(site):  # the engine's safety rules: one statement, no collective
        return None
    vocabulary = _VOCABULARIES.get(ctx)
    if vocabulary is None:
        vocabulary = _VOCABULARIES[ctx] = _Vocabulary(ctx)
    stmt = site.stmt
    guard = vocabulary.guard(site.function, stmt)
    if guard is None:
        return None
    return Fix("guard", stmt.lineno, ctx.char_col(stmt.lineno, stmt.col_offset), guard=guard)


@dataclass
class _Scope:
    """The names a function (or the module, or a class body) binds."""

    params: tuple[str, ...] = ()
    bound: dict[str, int] = field(default_factory=dict)  # name → first line it is bound on
    declared: set[str] = field(default_factory=set)  # `global` / `nonlocal`
    parent: ast.AST | None = None
    cls: ast.ClassDef | None = None  # the class a method belongs to

    def bind(self, name: str, line: int) -> None:
        self.bound.setdefault(name, line)


#: the ``if`` conditions around a statement in its function: ``(test, branch taken)`` pairs
_Conditions = tuple[tuple[ast.expr, bool], ...]


@dataclass(frozen=True)
class _Assign:
    function: ast.AST | None
    line: int
    name: str  # dotted target: `rank`, `self.gpu_id`
    value: ast.expr
    conditions: _Conditions


class _Vocabulary:
    """One file's guard vocabulary and style, learnt in one pass over its statements."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.scopes: dict[ast.AST | None, _Scope] = {None: _Scope()}
        self.guards: list[tuple[ast.AST | None, ast.expr]] = []
        self.assigns: list[_Assign] = []
        self.conditions: dict[int, _Conditions] = {}  # id(statement) → its conditions
        self.inits: list[tuple[ast.AST | None, int, _Conditions]] = []
        self.asks_initialized = False
        self.lightning_classes: set[ast.ClassDef] = set()
        self._scan(ctx.tree.body, None, ())
        self.objects = {a.name: family for a in self.assigns
                        if (family := self._object_family(a.value)) is not None}
        self.values = {a.name: a.value for a in self.assigns}
        #: assignments of objects that know the main process: (family, assignment)
        self.object_assigns = [(kind, a) for a in self.assigns
                               if (kind := self.objects.get(a.name) or _conventional(a.name))]
        #: the conditions the process group is started under (``if ddp:``), if any
        self.group_conditions = {pair for _, _, conditions in self.inits for pair in conditions
                                 if pair[1] and not _is_main_module_test(pair[0])}
        self.optional_group = self.asks_initialized or bool(self.group_conditions)
        self.style = self._style()
        accepted = _ACCEPTS[self.style]
        #: the file's guards of the style, with whether each needs a process group
        self.own_guards = [(owner, test, self._needs_group(test)) for owner, test in self.guards
                           if self._family(test) in accepted]
        self.variables = self._variables(accepted)

    # --- the pass -------------------------------------------------------------------------

    def _scan(self, body: list[ast.stmt], owner: ast.AST | None,
              conditions: _Conditions) -> None:
        scope = self.scopes[owner]
        for stmt in body:
            self.conditions[id(stmt)] = conditions
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                scope.bind(stmt.name, stmt.lineno)
                self._scan_definition(stmt, owner)
                continue
            if isinstance(stmt, (ast.Global, ast.Nonlocal)):
                scope.declared.update(stmt.names)
            elif isinstance(stmt, ast.If):
                operand = self.ctx.facts.main_operand(stmt.test)
                if operand is not None:
                    self.guards.append((owner, operand))
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                name = ast_dotted_name(targets[0]) if len(targets) == 1 else None
                if name:
                    self.assigns.append(_Assign(owner, stmt.lineno, name, stmt.value,
                                                conditions))
            self._statement(stmt, owner, conditions)

    def _scan_definition(self, node: ast.AST, owner: ast.AST | None) -> None:
        if isinstance(node, ast.ClassDef):
            self.scopes[node] = _Scope(parent=owner)
            if any((self.ctx.loose_qualname(base) or "").endswith("LightningModule")
                   for base in node.bases):
                self.lightning_classes.add(node)
            self._scan(node.body, node, ())
            return
        args = node.args
        params = [*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg]
        cls = owner if isinstance(owner, ast.ClassDef) else None
        self.scopes[node] = _Scope(tuple(a.arg for a in params if a is not None),
                                   parent=owner, cls=cls)
        self._scan(node.body, node, ())

    def _statement(self, stmt: ast.stmt, owner: ast.AST | None,
                   conditions: _Conditions) -> None:
        scope = self.scopes[owner]
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                scope.bind(alias.asname or alias.name.split(".")[0], stmt.lineno)
            return
        for name, value in ast.iter_fields(stmt):
            if name in ("body", "orelse", "finalbody"):
                inner = conditions
                if isinstance(stmt, ast.If):
                    inner = (*conditions, (stmt.test, name == "body"))
                self._scan(value, owner, inner)
            elif name == "handlers":
                for handler in value:
                    if handler.name:
                        scope.bind(handler.name, handler.lineno)
                    self._expressions(handler.type, owner, conditions)
                    self._scan(handler.body, owner, conditions)
            elif name == "cases":
                for case in value:
                    for node in ast.walk(case.pattern):
                        for bound in (getattr(node, "name", None), getattr(node, "rest", None)):
                            if bound:
                                scope.bind(bound, stmt.lineno)
                    self._expressions(case.guard, owner, conditions)
                    self._scan(case.body, owner, conditions)
            else:
                self._expressions(value, owner, conditions)

    def _expressions(self, value, owner: ast.AST | None, conditions: _Conditions) -> None:
        pending = list(value) if isinstance(value, list) else [value]
        while pending:
            node = pending.pop()
            if not isinstance(node, ast.AST) or isinstance(node, _NESTED):
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.scopes[owner].bind(node.id, node.lineno)
            elif isinstance(node, ast.Call):
                callee = self.ctx.callee(node)
                if callee == _INIT:
                    self.inits.append((owner, node.lineno, conditions))
                elif callee == _IS_INITIALIZED:
                    self.asks_initialized = True
            pending.extend(ast.iter_child_nodes(node))

    # --- the style ------------------------------------------------------------------------

    def _object_family(self, value: ast.expr) -> str | None:
        """The family of an object built by ``value`` (``Accelerator()``, ``L.Fabric()``)."""
        if isinstance(value, ast.IfExp):
            body, orelse = self._object_family(value.body), self._object_family(value.orelse)
            return body if body == orelse else None
        if not isinstance(value, ast.Call):
            return None
        callee = self.ctx.callee(value)
        entry = self.ctx.match("wrappers", callee)
        if entry is not None and entry.get("guard") and not entry.get("module"):
            return str(entry.get("name", "")).split(".")[0] or None
        return _LIGHTNING_OBJECTS.get(callee or "")

    def _style(self) -> str:
        if self._runtime():
            return RUNTIME
        if self.objects:
            return next(iter(self.objects.values()))
        imports = self.ctx.imports
        names = imports.modules | set(imports.aliases.values())
        roots = {name.split(".")[0] for name in names}
        if roots & set(_OWN_GROUPS):
            return ""
        if "accelerate" in roots:
            return ACCELERATE
        if "lightning_fabric" in roots or any(n.startswith("lightning.fabric") for n in names):
            return FABRIC
        if roots & {"lightning", "pytorch_lightning"}:
            return LIGHTNING
        torch_markers = [n for n in names if n.startswith("torch.")
                         and not n.startswith("torch.multiprocessing")
                         and self.ctx.match("distributed_markers", n)]
        return TORCH if self.inits or torch_markers else ""

    def _runtime(self) -> str | None:
        alias = self.ctx.runtime_alias()
        imports = self.ctx.imports
        if alias is None and "distify.runtime" in imports.modules \
                and imports.aliases.get("distify") == "distify":
            alias = "distify.runtime"
        return alias

    def _family(self, expr: ast.expr, depth: int = 0) -> str:
        """Which family a guard belongs to, from the names it is built on."""
        for chain in _chains(expr):
            qualname = self.ctx.imports.resolve(chain) or ""
            if qualname.startswith(("distify.runtime", "distify_runtime")):
                return RUNTIME
            for n in range(chain.count(".") + 1):
                prefix = chain.rsplit(".", n)[0]
                family = self.objects.get(prefix)
                if family or _conventional(prefix) == self.style:
                    return family or self.style
            if qualname.startswith(("lightning", "pytorch_lightning")):
                return LIGHTNING
            if qualname.startswith("accelerate"):
                return ACCELERATE
            if chain in self.values and depth < 3:
                family = self._family(self.values[chain], depth + 1)
                if family != RANK:
                    return family
        return RANK

    # --- choosing the guard ---------------------------------------------------------------

    def guard(self, function: ast.AST | None, stmt: ast.stmt) -> str | None:
        """The guard for ``stmt`` in ``function``, or None."""
        line = stmt.lineno
        without_group = self.optional_group and not (
            set(self.conditions.get(id(stmt), ())) & self.group_conditions)
        own = self._reused_here(function, line, without_group)
        if own is not None:
            return own
        if self.style == TORCH and self._before_group(function, line):
            return None  # no rank is known yet
        for guard in (self._reused(function, line, without_group),
                      self._variable(function, line, without_group),
                      self._own_spelling(function, line, without_group)):
            if guard is not None and self._is_main(guard):
                return guard
        return None

    def _reused_here(self, function: ast.AST | None, line: int,
                     without_group: bool) -> str | None:
        """The style's guard used last before ``line`` in the same function."""
        mine = [test for owner, test, needs_group in self.own_guards
                if owner is function and test.lineno < line
                and not (without_group and needs_group)]
        return self.ctx.segment(mine[-1]) if mine else None

    def _reused(self, function: ast.AST | None, line: int, without_group: bool) -> str | None:
        """The commonest guard of the style elsewhere whose names mean the same here."""
        usable = Counter(self.ctx.segment(test) for owner, test, needs_group in self.own_guards
                         if not (without_group and needs_group)
                         and self._same_names(test, owner, function, line))
        return usable.most_common(1)[0][0] if usable else None

    def _variables(self, accepted: set[str]) -> list[tuple[int, _Assign, str, bool]]:
        """The guard variables (``master_process``, priority 0) and global rank variables
        (``rank``, priority 1) of the style: ``(priority, assignment, guard, needs a group)``."""
        facts = self.ctx.facts
        found = []
        for assign in self.assigns:
            node = _expression(assign.name)
            if self._family(node) not in accepted:
                continue
            test = facts.test(node)
            if facts.is_rank(node):
                if _global_rank(assign.name, assign.value):
                    found.append((1, assign, f"{assign.name} == 0", self._needs_group(node)))
            elif test is not None and test.true is MAIN:
                found.append((0, assign, assign.name, self._needs_group(node)))
        return found

    def _variable(self, function: ast.AST | None, line: int, without_group: bool) -> str | None:
        """A guard variable (``master_process``) or global rank variable in scope."""
        found = [(priority, assign.line, guard)
                 for priority, assign, guard, needs_group in self.variables
                 if not (without_group and needs_group) and self._reaches(assign, function, line)]
        if RANK in _ACCEPTS[self.style] and function is not None and not without_group:
            facts = self.ctx.facts
            for name in self.scopes[function].params:
                if facts.is_rank(ast.Name(id=name)) and _global_rank(name, None):
                    found.append((1, 0, f"{name} == 0"))
        return min(found, key=lambda item: (item[0], -item[1]))[2] if found else None

    def _own_spelling(self, function: ast.AST | None, line: int,
                      without_group: bool) -> str | None:
        style = self.style
        if style == RUNTIME:
            alias = self._runtime()
            if self._in_scope(alias.split(".")[0], function, line):
                return f"{alias}.is_main_process()"
            return None
        if style in (ACCELERATE, FABRIC):
            return self._object_guard({style}, function, line)
        if style == LIGHTNING:
            return self._lightning_guard(function, line)
        if style == TORCH:
            return self._torch_guard(function, line, without_group)
        return None

    def _object_guard(self, families: set[str], function: ast.AST | None,
                      line: int) -> str | None:
        """``accelerator.is_main_process`` for an object of ``families`` in scope."""
        attribute = "is_main_process" if ACCELERATE in families else "is_global_zero"
        scope = self.scopes.get(function)
        for name in scope.params if scope is not None else ():
            if _conventional(name) in families:
                return f"{name}.{attribute}"
        for kind, assign in self.object_assigns:
            if kind in families and self._reaches(assign, function, line):
                return f"{assign.name}.{attribute}"
        return None

    def _lightning_guard(self, function: ast.AST | None, line: int) -> str | None:
        for alias, target in self.ctx.imports.aliases.items():
            if target.endswith(".rank_zero_only") and self._in_scope(alias, function, line):
                return f"{alias}.rank == 0"
        scope = self.scopes.get(function)
        if scope is not None and scope.cls in self.lightning_classes and scope.params:
            return f"{scope.params[0]}.trainer.is_global_zero"
        return self._object_guard({LIGHTNING, FABRIC}, function, line)  # `import lightning`

    def _torch_guard(self, function: ast.AST | None, line: int,
                     without_group: bool) -> str | None:
        """``dist.get_rank() == 0``; where there may be no process group, the file's flag
        first (``not ddp or ...``), else ``not dist.is_initialized() or ...``."""
        module = self._torch_distributed()
        if module is None or not self._in_scope(module.split(".")[0], function, line):
            return None
        guard = f"{module}.get_rank() == 0"
        if not without_group:
            return guard
        for owner, _, conditions in self.inits:
            for test, _ in reversed(conditions):
                flag = ast_dotted_name(test)
                if flag and self._same_names(test, owner, function, line):
                    return f"not {flag} or {guard}"
        return f"not {module}.is_initialized() or {guard}"

    def _torch_distributed(self) -> str | None:
        """How the file spells ``torch.distributed``: ``dist``, ``torch.distributed``."""
        aliases = self.ctx.imports.aliases
        for alias, target in aliases.items():
            if target == "torch.distributed":
                return alias
        for alias, target in aliases.items():
            if target == "torch":
                return f"{alias}.distributed"
        return None

    def _before_group(self, function: ast.AST | None, line: int) -> bool:
        starts = [start for owner, start, _ in self.inits if owner is function]
        return bool(starts) and min(starts) > line

    def _needs_group(self, expr: ast.expr) -> bool:
        """Whether ``expr`` fails (or means nothing) in a run without a process group: it
        calls ``torch.distributed`` outside ``not ddp or ...``, or reads a variable that is
        only assigned when the group is started."""
        if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or) \
                and self.ctx.facts.test(expr.values[0]) is None:
            return False
        for node in ast.walk(expr):
            if isinstance(node, ast.Call) and (self.ctx.callee(node) or "").startswith(
                    "torch.distributed."):
                return True
        return any(chain in self.group_only for chain in _chains(expr))

    @functools.cached_property
    def group_only(self) -> set[str]:
        """Variables assigned only where the process group is started (``ddp_rank``)."""
        names: dict[str, bool] = {}
        for assign in self.assigns:
            inside = bool(set(assign.conditions) & self.group_conditions)
            names[assign.name] = names.get(assign.name, True) and inside
        return {name for name, inside in names.items() if inside}

    def _is_main(self, guard: str) -> bool:
        """The guard must be one the linter recognises, so the fix clears the finding."""
        test = self.ctx.facts.test(ast.parse(guard, mode="eval").body)
        return test is not None and test.true is MAIN

    # --- scopes ---------------------------------------------------------------------------

    def _binding(self, name: str, function: ast.AST | None, line: int):
        """Where ``name`` comes from at ``line`` of ``function``: ``("param", cls)`` (the
        class for a method's first parameter), ``("local", owner)``, ``("module", None)``,
        ``("builtin", None)``, or None when it is not bound there yet."""
        current = function
        while current is not None:
            scope = self.scopes[current]
            if name not in scope.declared:
                if name in scope.params:
                    return "param", scope.cls if name == scope.params[0] else None
                first = scope.bound.get(name)
                if first is not None:
                    return ("local", current) if current is not function or first < line \
                        else None
            current = scope.parent
            while isinstance(current, ast.ClassDef):  # a class body is not an enclosing scope
                current = self.scopes[current].parent
        first = self.scopes[None].bound.get(name)
        if first is not None and (function is not None or first < line):
            return "module", None
        return ("builtin", None) if name in _BUILTINS else None

    def _in_scope(self, name: str, function: ast.AST | None, line: int) -> bool:
        return self._binding(name, function, line) is not None

    def _same_names(self, expr: ast.expr, origin: ast.AST | None, function: ast.AST | None,
                    line: int) -> bool:
        """Whether every name in ``expr``, written in ``origin``, means the same at ``line``
        of ``function``: the same module-level name, or a parameter both functions have (the
        same class's ``self``). A local of another function is not in scope."""
        for node in ast.walk(expr):
            if isinstance(node, ast.Name):
                here = self._binding(node.id, function, line)
                there = self._binding(node.id, origin, expr.lineno + 1)
                if here is None or here != there or (here[0] == "local"
                                                     and origin is not function):
                    return False
        return True

    def _reaches(self, assign: _Assign, function: ast.AST | None, line: int) -> bool:
        """Whether ``assign``'s variable is what its name means at ``line`` of ``function``
        (``self.x`` from a method of the same class)."""
        root = assign.name.split(".")[0]
        here = self._binding(root, function, line)
        if here is None:
            return False
        kind, where = here
        if kind == "local":
            return assign.function is where and (where is not function or assign.line < line)
        if kind == "param":
            return root != assign.name and where is not None \
                and self.scopes[assign.function].cls is where
        return kind == "module" and assign.function is None and (
            function is not None or assign.line < line)


def _conventional(name: str) -> str | None:
    last = name.rpartition(".")[2]
    return ACCELERATE if last == "accelerator" else _CONVENTIONAL.get(last)


def _chains(expr: ast.expr):
    """The dotted names in ``expr``, longest first: ``self.trainer.is_global_zero``."""
    pending = [expr]
    while pending:
        node = pending.pop()
        dotted = ast_dotted_name(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        if dotted:
            yield dotted
            continue
        pending.extend(ast.iter_child_nodes(node))


def _expression(dotted: str) -> ast.expr:
    return ast.parse(dotted, mode="eval").body


def _global_rank(name: str, value: ast.expr | None) -> bool:
    """A rank variable a fix may compare with 0: not a local rank (0 on every node), and not
    read with a negative default (``-1`` in a single-process run, where nothing would run)."""
    if "local" in name.lower():
        return False
    if value is None:
        return True
    for node in ast.walk(value):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "LOCAL" in node.value.upper():
            return False
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return False
    return True


def _is_main_module_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``: the script's entry point, not an optional group."""
    return isinstance(test, ast.Compare) and ast_dotted_name(test.left) == "__name__"
