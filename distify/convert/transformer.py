"""The codemod: one LibCST pass that rewrites a single-GPU training script for distify's runtime.

What it rewrites (each rewrite is recorded as a :class:`Edit` for the report):

- DataLoader, optimizer and LR-scheduler constructions → wrapped in ``rt.prepare(...)``, wherever
  they are built (a function, module level, ``self.x = ...``, a ``return``);
- the model(s) an optimizer trains (found from ``X.parameters()`` in the optimizer's arguments)
  → ``model, optimizer = rt.prepare(model, optimizer)`` right after the optimizer is built;
- single-device selection (``torch.device("cuda" ...)``, ``"cuda:0"``, ``.cuda()``,
  ``torch.accelerator.current_accelerator()``) → ``rt.device()``; device pinning removed;
- ``X.backward(...)`` → ``rt.backward(X, ...)``; ``print`` → ``rt.print``; ``torch.save`` /
  ``torch.load`` → ``rt.save`` / ``rt.load``;
- sums accumulated in an evaluation loop over a DataLoader (``correct += ...`` in a loop under
  ``torch.no_grad()`` or after ``model.eval()``) → ``x = rt.reduce(x)`` after the loop.

What it deliberately does not do: it never guesses. A training loop fed without a DataLoader,
a data-dependent ``break`` in a training loop, a custom sampler, predictions collected into
lists, are left as written and reported as :class:`Edit` notes with their node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Union

import libcst as cst

from distify.analysis.facts import FileFacts
from distify.analysis.names import dotted_name
from distify.rules import RuleSet

_LOOP_WRAPPERS = {"enumerate", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm",
                  "iter", "zip"}
_NO_GRAD = {"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad",
            "torch.autograd.grad_mode.no_grad"}
_PARAM_METHODS = {"parameters", "named_parameters"}
_DEVICE_WORDS = ("cuda", "mps", "xpu")


@dataclass(frozen=True)
class Edit:
    """One change or one note, attached to a node of the *output* tree (its line comes later)."""

    node: cst.CSTNode
    kind: str
    message: str
    needs_human: bool = False


@dataclass
class _Scope:
    params: set[str] = field(default_factory=set)
    loaders: set[str] = field(default_factory=set)
    zero_inits: set[str] = field(default_factory=set)
    lists: set[str] = field(default_factory=set)
    prepared_models: set[str] = field(default_factory=set)
    saw_eval: bool = False
    no_grad: bool = False


@dataclass
class _Loop:
    loaderish: bool
    accumulators: list[str] = field(default_factory=list)
    appended: list[str] = field(default_factory=list)
    assigned: set[str] = field(default_factory=set)
    has_backward: bool = False
    breaks: list[tuple[cst.CSTNode, str]] = field(default_factory=list)
    #: ``if (i + 1) % accum == 0: optimizer.step()`` tests (gradient accumulation)
    step_tests: list[cst.BaseExpression] = field(default_factory=list)
    targets: set[str] = field(default_factory=set)


_Stmt = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]


class DistifyTransformer(cst.CSTTransformer):
    """Rewrites one module. ``rt`` is the local name the runtime is imported as."""

    def __init__(self, facts: FileFacts, rules: RuleSet, rt: str) -> None:
        super().__init__()
        self.facts = facts
        self.rules = rules
        self.rt = rt
        self.edits: list[Edit] = []
        self.batch_sizes: list[str] = []
        self._scopes: list[_Scope] = [_Scope()]
        self._loops: list[_Loop] = []
        self._no_grad_depth = 0
        self._classes: list[bool] = []  # True for a model class body
        self._pending_after: list[list[cst.BaseStatement]] = []
        self._pending_models: list[list[str]] = []
        self._unsharded_loop_reported = False
        self._removed: list[str] = []
        self._emptied: set[int] = set()
        self._downloads: list[bool] = []
        self._download_stmts: set[int] = set()
        self._main_only_depth = 0
        self._expr_depth = 0
        self._expr_call: cst.BaseExpression | None = None
        self._leaving: cst.Call | None = None
        #: the script manages its own mixed precision (a GradScaler)
        self.own_mixed_precision = False

    # ---------------------------------------------------------------- helpers
    def _qual(self, node: cst.BaseExpression) -> str | None:
        return self.facts.imports.qualname(node)

    def _rt_attr(self, name: str) -> cst.Attribute:
        return cst.Attribute(value=cst.Name(self.rt), attr=cst.Name(name))

    def _rt_call(self, name: str, *args: cst.BaseExpression) -> cst.Call:
        return cst.Call(func=self._rt_attr(name), args=[cst.Arg(value=a) for a in args])

    def _edit(self, node: cst.CSTNode, kind: str, message: str, human: bool = False) -> None:
        self.edits.append(Edit(node, kind, message, human))

    @property
    def _scope(self) -> _Scope:
        return self._scopes[-1]

    def _in_eval(self) -> bool:
        return self._no_grad_depth > 0 or self._scope.saw_eval or self._scope.no_grad

    def _is_loader_name(self, name: str) -> bool:
        if name in self._scope.params or name in self._scope.loaders:
            return True
        return any(name in scope.loaders for scope in self._scopes[:-1])

    def _loaderish(self, node: cst.BaseExpression) -> bool:
        """Is ``node`` a DataLoader, or ``enumerate``/``tqdm``/``zip`` over one?"""
        if isinstance(node, cst.Call):
            if self._qual(node.func) in _LOOP_WRAPPERS and node.args:
                return any(self._loaderish(arg.value) for arg in node.args if not arg.keyword)
            return self.rules.match("dataloaders", self._qual(node.func)) is not None
        if isinstance(node, cst.Name):
            return self._is_loader_name(node.value) or "loader" in node.value.lower()
        if isinstance(node, cst.Attribute):
            return "loader" in node.attr.value.lower()
        return False

    # ---------------------------------------------------------------- scopes
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(node.name.value in self.facts.model_classes)

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self._classes.pop()
        return updated

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        scope = _Scope()
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            scope.params.add(param.name.value)
        scope.no_grad = any(self._qual(_callee(d.decorator)) in _NO_GRAD
                            for d in node.decorators)
        self._scopes.append(scope)
        self._loops_saved = getattr(self, "_loops_saved", [])
        self._loops_saved.append(self._loops)
        self._loops = []

    def leave_FunctionDef(self, original: cst.FunctionDef,
                          updated: cst.FunctionDef) -> cst.FunctionDef:
        self._scopes.pop()
        self._loops = self._loops_saved.pop()
        return updated


    # ---------------------------------------------------------------- statements
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._pending_after.append([])
        self._pending_models.append([])
        self._downloads.append(False)

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                  updated: cst.SimpleStatementLine):
        after = self._pending_after.pop()
        models = self._pending_models.pop()
        downloads = self._downloads.pop()
        if not updated.body or _is_self_assignment(updated):
            if updated.body:
                self._removed.append("a wrapper DDP replaces")
            return cst.RemovalSentinel.REMOVE
        if self._removed:
            self._attach_removals(updated)
        if downloads:
            self._download_stmts.add(id(updated))
        guarded = self._guard_side_effect(original, updated)
        if guarded is not None:
            return guarded
        if models:
            updated, after = self._prepare_models(updated, models, after)
            if isinstance(updated, cst.FlattenSentinel):
                return updated
        if not after:
            return updated
        return cst.FlattenSentinel([updated, *after])

    # ---------------------------------------------------------------- side effects
    def _side_effect(self, call: cst.BaseExpression) -> str | None:
        """The side-effect kind of ``call`` when it writes on every process, else None."""
        if not isinstance(call, cst.Call):
            return None
        qual = self._qual(call.func)
        if qual is None or self.rules.match("saves", qual):
            return None
        entry = self.rules.match("side_effects", qual)
        if entry is None or _safe_by_keyword(call, entry.get("safe_if") or {}):
            return None
        if entry.get("mode_arg") is not None and not _writes(call, entry.get("mode_arg")):
            return None
        return entry.get("kind")

    def _guard_side_effect(self, original: cst.SimpleStatementLine,
                           updated: cst.SimpleStatementLine) -> cst.If | None:
        if self._main_only_depth or len(original.body) != 1:
            return None
        small = original.body[0]
        if not isinstance(small, cst.Expr) or self._side_effect(small.value) is None:
            return None
        what = dotted_name(small.value.func) or "this call"
        return self._main_only(updated, f"{what}(...) runs on the main process only")

    def _main_only(self, stmt, message: str) -> cst.If:
        """``if rt.is_main_process():`` around ``stmt`` (which keeps its comments above)."""
        guard = cst.If(test=self._rt_call("is_main_process"),
                       body=cst.IndentedBlock([stmt.with_changes(leading_lines=())]),
                       leading_lines=stmt.leading_lines)
        self._edit(guard.test, "guard", message)
        return guard

    def visit_With(self, node: cst.With) -> None:
        if any(self._qual(_callee(item.item)) in _NO_GRAD for item in node.items):
            self._no_grad_depth += 1
        if self._writes_file(node):
            self._main_only_depth += 1

    def leave_With(self, original: cst.With, updated: cst.With):
        if any(self._qual(_callee(item.item)) in _NO_GRAD for item in original.items):
            self._no_grad_depth -= 1
        if self._writes_file(original):
            self._main_only_depth -= 1
            if not self._main_only_depth:
                return self._main_only(updated, "file written by the main process only")
        return updated

    def _writes_file(self, node: cst.With) -> bool:
        return any(self._side_effect(item.item) == "write" for item in node.items)

    def _group_downloads(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """Consecutive statements that download a dataset → ``with rt.main_process_first():``."""
        out: list[cst.BaseStatement] = []
        run: list[cst.BaseStatement] = []
        for stmt in [*body, None]:
            if stmt is not None and id(stmt) in self._download_stmts:
                run.append(stmt)
                continue
            if run:
                first = run[0]
                block = cst.With(items=[cst.WithItem(self._rt_call("main_process_first"))],
                                 body=cst.IndentedBlock([first.with_changes(leading_lines=()),
                                                         *run[1:]]),
                                 leading_lines=first.leading_lines)
                self._edit(block.items[0], "download", "the main process downloads the "
                           "dataset first; the others wait, then read its copy")
                out.append(block)
                run = []
            if stmt is not None:
                out.append(stmt)
        return out

    def _prepare_models(self, stmt: cst.SimpleStatementLine, models: list[str],
                        after: list[cst.BaseStatement]):
        """Prepare ``models`` together with the optimizer built in ``stmt``."""
        target = _single_target(stmt)
        value = _assigned_value(stmt)
        exprs = [cst.parse_expression(m) for m in models]
        if target is not None and isinstance(value, cst.Call) and _is_rt_prepare(value, self.rt):
            # `optimizer = rt.prepare(optim.SGD(...))` → build it plainly, then prepare together.
            inner = _shift_continuations(value.args[0].value, -len(f"{self.rt}.prepare("))
            self.edits = [e for e in self.edits if e.node is not value]
            stmt = stmt.with_changes(body=[stmt.body[0].with_changes(value=inner)])
            names = [*exprs, target]
            line = cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(cst.Tuple([cst.Element(n) for n in names],
                                                    lpar=[], rpar=[]))],
                value=self._rt_call("prepare", *[_clone(n) for n in names]))])
            self._edit(line, "prepare-model",
                       f"{_join(models)} and its optimizer prepared: model moved to the "
                       "device and wrapped in DDP when running on several processes")
            return stmt, [line, *after]
        before = []
        for model, expr in zip(models, exprs):
            line = cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(expr)], value=self._rt_call("prepare", _clone(expr)))])
            self._edit(line, "prepare-model", f"{model} prepared: moved to the device and "
                       "wrapped in DDP when running on several processes")
            before.append(line)
        return cst.FlattenSentinel([*before, stmt, *after]), []

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        names = [t.target.value for t in node.targets if isinstance(t.target, cst.Name)]
        if isinstance(value, cst.Call) and self.rules.match("dataloaders", self._qual(value.func)):
            self._scope.loaders.update(names)
        if _is_zero(value):
            self._scope.zero_inits.update(names)
        if isinstance(value, cst.List) and not value.elements:
            self._scope.lists.update(names)
        for target in node.targets:
            if isinstance(target.target, cst.Tuple) and isinstance(value, cst.Tuple):
                for elem, val in zip(target.target.elements, value.elements):
                    if isinstance(elem.value, cst.Name) and _is_zero(val.value):
                        self._scope.zero_inits.add(elem.value.value)
        if self._loops:
            for name in names:
                self._loops[-1].assigned.add(name)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if not self._loops or not isinstance(node.target, cst.Name):
            return
        name = node.target.value
        for loop in self._loops:
            loop.assigned.add(name)
            if (isinstance(node.operator, cst.AddAssign) and name in self._scope.zero_inits
                    and name not in loop.accumulators):
                loop.accumulators.append(name)

    def leave_Expr(self, original: cst.Expr, updated: cst.Expr):
        self._expr_depth -= 1
        self._expr_call = None
        call = original.value
        if isinstance(call, cst.Call) and self.rules.match("device_pinning",
                                                           self._qual(call.func)):
            self._edit_removed(call)
            return cst.RemovalSentinel.REMOVE
        return updated

    def _edit_removed(self, call: cst.Call) -> None:
        self._removed.append(dotted_name(call.func) or "device pinning")

    def _attach_removals(self, anchor: cst.CSTNode) -> None:
        """Report removed statements at the statement that now follows them."""
        for name in self._removed:
            if name == "a wrapper DDP replaces":
                message = "removed a statement just above that only re-wrapped the model " \
                          "(nn.DataParallel): DDP replaces it"
            else:
                message = f"removed {name}(...) just above: each process uses its own device"
            self._edit(anchor, "device", message)
        self._removed = []

    def leave_IndentedBlock(self, original: cst.IndentedBlock,
                            updated: cst.IndentedBlock) -> cst.IndentedBlock:
        if not updated.body:
            placeholder = cst.SimpleStatementLine([cst.Pass()])
            self._emptied.add(id(placeholder))
            return updated.with_changes(body=[placeholder])
        if self._download_stmts:
            return updated.with_changes(body=self._group_downloads(updated.body))
        return updated

    def leave_If(self, original: cst.If, updated: cst.If):
        """An ``if`` whose whole body was device pinning goes away with it."""
        for loop in self._loops:  # re-anchor a recorded break on the output node
            loop.breaks = [(updated.test if node is original else node, names)
                           for node, names in loop.breaks]
            loop.step_tests = [updated.test if test is original.test else test
                               for test in loop.step_tests]
        body = updated.body.body
        if (updated.orelse is None and len(body) == 1 and id(body[0]) in self._emptied):
            return cst.RemovalSentinel.REMOVE
        return updated

    # ---------------------------------------------------------------- loops
    def visit_For(self, node: cst.For) -> None:
        self._loops.append(_Loop(loaderish=self._loaderish(node.iter),
                                 targets=_names_in(node.target)))

    def leave_For(self, original: cst.For, updated: cst.For):
        loop = self._loops.pop()
        self._report_breaks(loop)
        if loop.has_backward and len(loop.step_tests) == 1:
            updated = self._sync_on_step(updated, loop)
        if not (loop.loaderish and self._in_eval()) or loop.has_backward:
            return updated
        for name in loop.appended:
            self._edit(updated.target, "gather", f"`{name}` collects per-process results: "
                       f"gather them with `{name} = {self.rt}.gather_for_metrics(...)` "
                       "before computing a metric", human=True)
        if not loop.accumulators:
            return updated
        reduces = []
        for name in loop.accumulators:
            line = cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(cst.Name(name))],
                value=self._rt_call("reduce", cst.Name(name)))])
            self._edit(line, "reduce", f"`{name}` summed over all processes, so the metric "
                       "equals the single-process value")
            reduces.append(line)
        for outer in self._loops:  # the reduced value is no longer an accumulator out there
            outer.accumulators = [n for n in outer.accumulators if n not in loop.accumulators]
        return cst.FlattenSentinel([updated, *reduces])

    def visit_While(self, node: cst.While) -> None:
        self._loops.append(_Loop(loaderish=False))

    def leave_While(self, original: cst.While, updated: cst.While) -> cst.While:
        self._report_breaks(self._loops.pop())
        return updated

    def leave_Break(self, original: cst.Break, updated: cst.Break) -> cst.Break:
        return updated

    def _sync_on_step(self, loop_node: cst.For, loop: _Loop) -> cst.For:
        """Gradient accumulation: DDP synchronises only on the micro-step that steps."""
        test = loop.step_tests[0]
        if _names_in(test) & (loop.assigned - loop.targets):
            return loop_node  # the condition is computed inside the loop: leave it to a human
        sync = cst.SimpleStatementLine([cst.Expr(self._rt_call("sync_gradients",
                                                               _strip_parens(test)))])
        self._edit(sync, "accumulation", "gradient accumulation: gradients are synchronised "
                   "across processes only on the micro-step that steps the optimizer")
        body = loop_node.body
        return loop_node.with_changes(body=body.with_changes(body=[sync, *body.body]))

    def visit_If(self, node: cst.If) -> None:
        if self._loops and _has_modulo(node.test) and _calls_method(node.body, "step"):
            self._loops[-1].step_tests.append(node.test)
        if not self._loops or not _breaks_out(node.body):
            return
        used = _names_in(node.test)
        dependent = sorted(used & self._loops[-1].assigned)
        if dependent:
            self._loops[-1].breaks.append((node, ", ".join(dependent)))

    def _report_breaks(self, loop: _Loop) -> None:
        if not loop.has_backward:
            return
        for node, names in loop.breaks:
            self._edit(node, "divergence", f"data-dependent exit from a training loop "
                       f"(depends on {names}): processes may leave at different steps and hang; "
                       f"decide on a reduced value, e.g. `{self.rt}.reduce(x, op='mean')`",
                       human=True)

    # ---------------------------------------------------------------- calls
    @property
    def _statement_call(self) -> bool:
        """Is the call being left the whole of an expression statement (guarded there)?"""
        return self._expr_depth > 0 and self._expr_call is self._leaving

    def visit_Expr(self, node: cst.Expr) -> None:
        self._expr_depth += 1
        self._expr_call = node.value

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "eval" and not node.args:
            self._scope.saw_eval = True
        if (isinstance(func, cst.Attribute) and func.attr.value in ("append", "extend")
                and isinstance(func.value, cst.Name) and self._loops
                and func.value.value in self._scope.lists):
            if func.value.value not in self._loops[-1].appended:
                self._loops[-1].appended.append(func.value.value)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        self._leaving = original
        qual = self._qual(original.func)
        if qual is not None:
            replaced = self._rewrite_named_call(original, updated, qual)
            if replaced is not None:
                return replaced
        if isinstance(original.func, cst.Attribute):
            return self._rewrite_method_call(original, updated)
        return updated

    def _rewrite_named_call(self, original: cst.Call, updated: cst.Call,
                            qual: str) -> cst.BaseExpression | None:
        rules = self.rules
        if qual == "print" and "print" not in self.facts.imports.aliases:
            return self._retarget(updated, "print", "print", "print on the main process only")
        if rules.match("dataloaders", qual):
            return self._prepare_loader(original, updated)
        if any(arg.keyword and arg.keyword.value == "download" and not _is_false(arg.value)
               for arg in original.args) and self._downloads:
            self._downloads[-1] = True
        if rules.match("data_parallel", qual) and updated.args:
            module = updated.args[0].value
            self._edit(module, "data-parallel", f"{qual} removed: each process runs DDP "
                       "instead; `.module` still works, and checkpoints of model.state_dict() "
                       "no longer carry the `module.` prefix")
            return module
        if rules.match("data_parallel_functions", qual) and len(updated.args) >= 2:
            new = cst.Call(func=updated.args[0].value, args=[updated.args[1].with_changes(
                comma=cst.MaybeSentinel.DEFAULT)])
            self._edit(new, "data-parallel", f"{qual}(...) → a plain call: DDP replaces it")
            return new
        if rules.match("grad_scalers", qual):
            self.own_mixed_precision = True
            self._edit(updated, "mixed-precision", "this script manages its own mixed "
                       "precision (a GradScaler): kept as written, it works under DDP; keep "
                       "distify's --mixed-precision at 'no' so the loss is not scaled twice",
                       human=True)
            return None
        if rules.match("progress_bars", qual) and not _has_keyword(updated, "disable"):
            new = updated.with_changes(args=[*_with_trailing_comma(updated.args), cst.Arg(
                keyword=cst.Name("disable"), value=cst.UnaryOperation(
                    cst.Not(), self._rt_call("is_main_process")),
                equal=_EQUAL)])
            self._edit(new, "progress", "progress bar shown on the main process only")
            return new
        if rules.match("logging_setup", qual) and _has_keyword(updated, "level"):
            return self._quiet_other_ranks(updated)
        if rules.match("timestamps", qual) and qual.endswith("strftime"):
            return self._agree(updated)
        kind = self._side_effect(original)
        if kind == "tracker" and not self._main_only_depth and not self._statement_call:
            new = updated.with_changes(func=self._rt_call("on_main_process", updated.func))
            self._edit(new, "guard", f"{qual}(...) runs on the main process only (other "
                       "processes get an object that ignores every call)")
            return new
        if rules.match("optimizers", qual) and not self._in_model_class():
            models = self._trained_models(original)
            if self._pending_models and models:
                self._pending_models[-1].extend(models)
                self._scope.prepared_models.update(models)
            wrapped = self._wrap_prepare(updated)
            self._edit(wrapped, "prepare-optimizer", "optimizer prepared (mixed-precision "
                       "loss scaling when enabled)")
            return wrapped
        if rules.match("schedulers", qual) and not self._in_model_class():
            wrapped = self._wrap_prepare(updated)
            self._edit(wrapped, "prepare-scheduler", "LR scheduler prepared: one step per call, "
                       "none after a skipped optimizer step")
            return wrapped
        for category, what in (("saves", "saved by the main process only, written atomically"),
                               ("loads", "loaded onto this process's device")):
            entry = rules.match(category, qual)
            if entry is not None and entry.get("runtime"):
                name = entry.get("runtime")
                return self._retarget(updated, name, category[:-1],
                                      f"{qual} → {self.rt}.{name}: {what}")
        if rules.match("device_selectors", qual) and _selects_accelerator(original, qual):
            new = self._rt_call("device")
            self._edit(new, "device", "each process uses its own device")
            return new
        return None

    def _quiet_other_ranks(self, call: cst.Call) -> cst.Call:
        args = []
        for arg in call.args:
            if arg.keyword and arg.keyword.value == "level":
                arg = arg.with_changes(value=cst.IfExp(
                    test=self._rt_call("is_main_process"), body=arg.value,
                    orelse=cst.SimpleString('"WARNING"')))
            args.append(arg)
        new = call.with_changes(args=args)
        self._edit(new, "logging", "other processes log warnings and errors only")
        return new

    def _agree(self, call: cst.Call) -> cst.Call:
        new = self._rt_call("broadcast_object", call)
        self._edit(new, "timestamp", "the main process's clock names the run, so every "
                   "process agrees on it")
        return new

    def _retarget(self, call: cst.Call, name: str, kind: str, message: str) -> cst.Call:
        """Call ``rt.<name>`` with the same arguments; keep aligned continuation lines aligned."""
        func = self._rt_attr(name)
        delta = len(_code(func)) - len(_code(call.func))
        new = _shift_continuations(call, delta).with_changes(func=func)
        self._edit(new, kind, message)
        return new

    def _rewrite_method_call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        func = updated.func
        assert isinstance(func, cst.Attribute)
        method = func.attr.value
        receiver_qual = self._qual(original.func.value) or ""
        if receiver_qual.split(".")[0] in ("torch", "tf", "jax"):
            return updated
        if method == "backward":
            if _is_method_call(func.value, "scale"):  # scaler.scale(loss).backward(): its own AMP
                self._mark_backward()
                return updated
            return self._rewrite_backward(updated, func)
        if method == "strftime" and isinstance(func.value, cst.Call) \
                and self.rules.match("timestamps", self._qual(original.func.value.func)):
            return self._agree(updated)
        if method == "cuda":
            new = updated.with_changes(func=func.with_changes(attr=cst.Name("to")),
                                       args=[cst.Arg(self._rt_call("device"))])
            self._edit(new, "device", ".cuda() → .to(device): each process uses its own device")
            return new
        if method == "to" and updated.args and _is_device_string(updated.args[0].value):
            first = updated.args[0].with_changes(value=self._rt_call("device"))
            new = updated.with_changes(args=[first, *updated.args[1:]])
            self._edit(new, "device", "each process uses its own device")
            return new
        return updated

    def _rewrite_backward(self, updated: cst.Call, func: cst.Attribute) -> cst.Call:
        new = cst.Call(func=self._rt_attr("backward"),
                       args=[cst.Arg(func.value), *updated.args])
        self._edit(new, "backward", "backward through the runtime (loss scaling under fp16)")
        self._mark_backward(new)
        return new

    def _mark_backward(self, node: cst.CSTNode | None = None) -> None:
        for loop in self._loops:
            loop.has_backward = True
        if node is not None and self._loops and not any(l.loaderish for l in self._loops):
            self._report_unsharded(node)

    def _report_unsharded(self, node: cst.CSTNode) -> None:
        if self._unsharded_loop_reported:
            return
        self._unsharded_loop_reported = True
        self._edit(node, "data", "this training loop is not fed by a DataLoader: every process "
                   "trains on the same batches. Shard them yourself with "
                   f"{self.rt}.rank() and {self.rt}.world_size()", human=True)

    def _wrap_prepare(self, call: cst.Call) -> cst.Call:
        prefix = f"{self.rt}.prepare("
        return self._rt_call("prepare", _shift_continuations(call, len(prefix)))

    def _prepare_loader(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        wrapped = self._wrap_prepare(updated)
        message = "DataLoader prepared: each process gets its own shard, reshuffled every epoch"
        self._edit(wrapped, "prepare-dataloader", message)
        positional = [a for a in original.args if a.keyword is None and not a.star]
        for arg in original.args:
            keyword = arg.keyword.value if arg.keyword else None
            if keyword == "batch_size" or (len(positional) > 1 and arg is positional[1]):
                self.batch_sizes.append(_code(arg.value))
            elif arg.star == "**":
                self.batch_sizes.append(f"{_code(arg.value)}['batch_size']")
            if keyword in ("sampler", "batch_sampler"):
                self._check_sampler(arg, wrapped)
        return wrapped

    def _check_sampler(self, arg: cst.Arg, anchor: cst.CSTNode) -> None:
        value = arg.value
        qual = self._qual(_callee(value)) if isinstance(value, cst.Call) else None
        if qual is not None and self.rules.match("samplers", qual):
            return
        self._edit(anchor, "sampler", f"custom {arg.keyword.value}: distify shards the indices it "
                   "yields each epoch; make sure it does not shard by rank itself", human=True)

    def _in_model_class(self) -> bool:
        return bool(self._classes) and self._classes[-1]

    def _trained_models(self, call: cst.Call) -> list[str]:
        """The models an optimizer trains: roots of ``X.parameters()`` in its arguments."""
        found: list[str] = []
        for arg in call.args:
            for root in _parameter_roots(arg.value):
                if root not in found and root not in self._scope.prepared_models:
                    found.append(root)
        return found

    def leave_FormattedStringExpression(self, original, updated):
        expr = original.expression
        if isinstance(expr, cst.Call) and self.rules.match("timestamps", self._qual(expr.func)):
            return updated.with_changes(expression=self._agree(updated.expression))
        return updated

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.BaseExpression:
        """``"cuda" if cond else "cpu"`` → ``rt.device()``."""
        branches = (original.body, original.orelse)
        if any(_is_device_string(b) for b in branches) and any(_is_cpu(b) for b in branches):
            new = self._rt_call("device")
            self._edit(new, "device", "each process uses its own device")
            return new
        return updated

    # ---------------------------------------------------------------- module
    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        if self._removed and updated.body:
            self._attach_removals(updated.body[-1])
        if self._download_stmts:
            return updated.with_changes(body=self._group_downloads(updated.body))
        return updated


# -------------------------------------------------------------------- pure helpers
def _callee(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.func if isinstance(node, cst.Call) else node


def _shift_continuations(call: cst.Call, delta: int) -> cst.Call:
    """Move the continuation lines of a call whose arguments are aligned with its opening
    parenthesis by ``delta`` columns, as one would by hand after renaming the callee. Calls in
    the hanging-indent style (a line break right after the parenthesis) are left alone."""
    if delta == 0 or isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace):
        return call

    class _Shift(cst.CSTTransformer):
        def leave_ParenthesizedWhitespace(self, original, updated):
            width = len(updated.last_line.value) + delta
            if width < 0:
                return updated
            return updated.with_changes(last_line=cst.SimpleWhitespace(" " * width))

    return call.with_changes(args=[arg.visit(_Shift()) for arg in call.args])


def _has_modulo(node: cst.CSTNode) -> bool:
    found = False

    class _Find(cst.CSTVisitor):
        def visit_BinaryOperation(self, op: cst.BinaryOperation) -> None:
            nonlocal found
            found = found or isinstance(op.operator, cst.Modulo)

    node.visit(_Find())
    return found


def _calls_method(node: cst.CSTNode, method: str) -> bool:
    found = False

    class _Find(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            nonlocal found
            found = found or (isinstance(call.func, cst.Attribute)
                              and call.func.attr.value == method)

    node.visit(_Find())
    return found


def _strip_parens(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if getattr(node, "lpar", None) else node


_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                        whitespace_after=cst.SimpleWhitespace(""))
_WRITE_MODES = set("wax+")


def _has_keyword(call: cst.Call, name: str) -> bool:
    return any(arg.keyword is not None and arg.keyword.value == name for arg in call.args)


def _with_trailing_comma(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    """The arguments, the last one followed by ``, `` so another can be appended."""
    if not args:
        return []
    last = args[-1]
    if last.comma == cst.MaybeSentinel.DEFAULT:
        last = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return [*args[:-1], last]


def _is_false(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value in ("False", "None")


def _is_method_call(node: cst.BaseExpression, method: str) -> bool:
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == method)


def _is_self_assignment(stmt: cst.SimpleStatementLine) -> bool:
    """``model = model`` (what ``model = nn.DataParallel(model)`` becomes)."""
    if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Assign):
        return False
    assign = stmt.body[0]
    return (len(assign.targets) == 1 and dotted_name(assign.targets[0].target) is not None
            and dotted_name(assign.targets[0].target) == dotted_name(assign.value))


def _safe_by_keyword(call: cst.Call, safe_if: dict) -> bool:
    """``os.makedirs(d, exist_ok=True)`` is safe on every process: a rule's ``safe_if``."""
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value not in safe_if:
            continue
        wanted = safe_if[arg.keyword.value]
        if wanted == "*" or (isinstance(arg.value, cst.Name) and arg.value.value == str(wanted)):
            return True
    return False


def _writes(call: cst.Call, mode_arg: int) -> bool:
    """Does an ``open``-like call open for writing (mode at ``mode_arg`` or ``mode=``)?"""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    mode = next((a.value for a in call.args if a.keyword and a.keyword.value == "mode"), None)
    if mode is None and len(positional) > mode_arg:
        mode = positional[mode_arg].value
    if isinstance(mode, cst.SimpleString):
        return bool(set(str(mode.evaluated_value)) & _WRITE_MODES)
    return False


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _clone(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.deep_clone()


def _join(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _is_zero(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Integer):
        return node.evaluated_value == 0
    if isinstance(node, cst.Float):
        return node.evaluated_value == 0.0
    return False


def _names_in(node: cst.CSTNode) -> set[str]:
    names: set[str] = set()

    class _Collect(cst.CSTVisitor):
        def visit_Name(self, name: cst.Name) -> None:
            names.add(name.value)

        def visit_Attribute(self, attr: cst.Attribute) -> bool:
            attr.value.visit(self)
            return False

    node.visit(_Collect())
    return names


def _breaks_out(body: cst.BaseSuite) -> bool:
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for stmt in statements:
        small = stmt.body if isinstance(stmt, (cst.SimpleStatementLine,
                                               cst.SimpleStatementSuite)) else []
        if any(isinstance(s, cst.Break) for s in small):
            return True
    return False


def _parameter_roots(node: cst.CSTNode) -> list[str]:
    """``model.fc.parameters()`` → ``model``; ``self.net.parameters()`` → ``self.net``."""
    roots: list[str] = []

    class _Find(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value in _PARAM_METHODS:
                dotted = dotted_name(func.value)
                if dotted:
                    parts = dotted.split(".")
                    root = ".".join(parts[:2]) if parts[0] == "self" and len(parts) > 1 \
                        else parts[0]
                    if root not in roots and root != "self":
                        roots.append(root)

    node.visit(_Find())
    return roots


def _single_target(stmt: cst.SimpleStatementLine) -> cst.BaseExpression | None:
    if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Assign):
        return None
    targets = stmt.body[0].targets
    if len(targets) != 1 or not isinstance(targets[0].target, (cst.Name, cst.Attribute)):
        return None
    return targets[0].target


def _assigned_value(stmt: cst.SimpleStatementLine) -> cst.BaseExpression | None:
    small = stmt.body[0] if stmt.body else None
    return small.value if isinstance(small, cst.Assign) else None


def _is_rt_prepare(call: cst.Call, rt: str) -> bool:
    return dotted_name(call.func) == f"{rt}.prepare" and len(call.args) == 1


def _is_device_string(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.SimpleString):
        text = node.evaluated_value
        return isinstance(text, str) and text.split(":")[0] in _DEVICE_WORDS
    return False


def _is_cpu(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value == "cpu"
    return (isinstance(node, cst.Call) and len(node.args) == 1
            and isinstance(node.args[0].value, cst.SimpleString)
            and node.args[0].value.evaluated_value == "cpu")


def _selects_accelerator(call: cst.Call, qual: str) -> bool:
    """``torch.device("cuda" ...)`` picks an accelerator; ``torch.device("cpu")`` does not."""
    if not qual.endswith(".device"):
        return True
    found = False

    class _Strings(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            nonlocal found
            found = found or _is_device_string(node)

    for arg in call.args:
        arg.visit(_Strings())
    return found
