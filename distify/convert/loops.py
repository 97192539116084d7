"""Rewrites and reports about loops: backward, evaluation sums, accumulation, divergence.

- ``X.backward(...)`` → ``rt.backward(X, ...)`` (not ``scaler.scale(loss).backward()``: a script
  with its own GradScaler keeps it);
- sums accumulated (``+=`` into a variable set to 0 before the loop) in an evaluation loop over a
  DataLoader (under ``torch.no_grad()`` or after ``model.eval()``) → ``x = rt.reduce(x)`` after
  the loop, so metrics equal the single-process values;
- ``if (i + 1) % accum == 0: optimizer.step()`` → ``rt.sync_gradients(...)`` at the top of the
  loop, so DDP communicates only on the micro-step that steps;
- reported, not rewritten: a training loop not fed by a DataLoader, predictions collected into
  lists. (Data-dependent exits from training loops are :mod:`.stops`'.)
"""

from __future__ import annotations

from collections import Counter

import libcst as cst

from distify.analysis.codemods import backward_through
from distify.analysis.literals import literal_value
from distify.analysis.loaders import unwrapped
from distify.analysis.names import dotted_name
from distify.analysis.walk import walk
from distify.convert.base import TransformerBase
from distify.convert.context import _Loop
from distify.convert.driver import handles
from distify.convert.syntax import (
    _calls_method,
    _code,
    _has_modulo,
    _is_method_call,
    _is_rt_call,
    _names_in,
    _strip_parens,
)

#: the kind of the notes about a training loop whose loader this file does not build: a project
#: conversion drops them when a module the file imports has its DataLoaders prepared
LOADER_ELSEWHERE = "data-elsewhere"


#: the rewrite (:mod:`distify.convert.rewrites`) of a line added after a loop, by its kind
_METRIC_REWRITES = {"reduce": "reduce-metrics", "gather": "gather-predictions"}


class LoopMixin(TransformerBase):
    def _rewrite_backward_call(self, updated: cst.Call, func: cst.Attribute) -> cst.Call:
        if _is_method_call(func.value, "scale"):  # scaler.scale(loss).backward(): its own AMP
            self._mark_backward()
            return updated
        path = tuple(self.ctx.path)  # the analysis counts a scope's `.backward(` calls too
        if self.ctx.backwards.get(path, 0) in self.facts.training.tensor_only.get(path, ()):
            if "backward" in self.skip:
                return updated
            self._edit(updated, "backward", "differentiates plain tensors, not a model's output "
                       "(an autograd example): left as written; every process computes the same "
                       "gradients, with nothing to average")
            return updated
        return self._rewrite_backward(updated, func)

    @handles("visit_Assign")
    def _loops_on_assign(self, node: cst.Assign) -> None:
        value = _strip_parens(node.value)
        for target in node.targets:
            names = (_names_in(target.target) if type(target.target) is cst.Tuple
                     else {dotted_name(target.target)} - {None})
            for name in names:  # the last assignment seen before the loop wins
                self.ctx.built_from[(tuple(self.ctx.path) if "." not in name else (), name)] = value

    def _built_by(self, source: str) -> str | None:
        """``built by `make_loader(...)`` for a loader this file assigns from an expression
        distify cannot see into (a call of a function or class of its own or imported), or
        None when the file does not assign it (a parameter, a global from elsewhere)."""
        if source in self._scope.params:
            return None
        builders = self.ctx.built_from
        path = tuple(self.ctx.path) if "." not in source else ()
        value = builders.get((path, source))
        if value is None and "." not in source:
            value = builders.get(((), source))  # a module-level loader used in a function
        if value is None:
            return None
        if type(value) is cst.Call:
            callee = dotted_name(value.func) or _short(_code(value.func))
            return f"built by `{callee}(...)`"
        return f"set from `{_short(_code(value))}`"

    @handles("visit_For")
    def _loops_on_for(self, node: cst.For) -> None:
        self.ctx.loops.append(_Loop(loaderish=self._loaderish(node.iter),
                                 targets=_names_in(node.target),
                                 loader=self._loader_behind(_loader_name(node.iter)),
                                 index=_enumerate_index(node)))

    @handles("visit_WithItem")
    def _loops_on_with_item(self, node: cst.WithItem) -> None:
        """``with tqdm(test_loader) as pbar:``: ``pbar`` is a view of the loader."""
        if type(node.asname) is cst.AsName and type(node.asname.name) is cst.Name:
            self._note_loader_view([node.asname.name.value], node.item)

    @handles("leave_For")
    def _loops_after_for(self, original: cst.For, updated: cst.For):
        loop = self.ctx.loops[-1]
        if loop.loaderish and loop.has_backward:
            self._report_loader_from_elsewhere(loop, updated.target)
        self.ctx.loops.pop()
        if loop.has_backward and len(loop.step_tests) == 1:
            updated = self._sync_on_step(updated, loop)
        if not (loop.loaderish or loop.next_from_loader):  # `x, y = next(batches)` feeds one
            return updated
        if self._per_batch_scope() and not loop.has_backward:
            return updated  # one batch's helper: its caller's loop reduces (see .meters)
        evaluating = self._in_eval() and not loop.has_backward
        if not evaluating and not loop.has_backward:
            self._report_unreduced(updated, loop)
            self._report_per_process(updated, loop)  # see .collected
            return updated
        if evaluating:
            for name in loop.appended:
                if name in loop.gathered:
                    continue
                self._edit(updated.target, "gather", f"`{name}` collects per-process results: "
                           f"gather them with `{name} = {self.rt}.gather_for_metrics(...)` "
                           "before computing a metric", human=True)
        names = [n for n in loop.accumulators if n not in loop.resets
                 and n not in loop.own_reduce and (evaluating or self._data_dependent(loop, n))
                 and n in self.facts.read]  # a sum nothing reads needs no all-reduce
        reduces = []
        mark = len(self.edits)
        if loop.meters:
            line = cst.SimpleStatementLine(body=[cst.Expr(self._rt_call(
                "reduce_meters", *(cst.Name(n) for n in loop.meters)))])
            listed = ", ".join(f"`{n}`" for n in loop.meters)
            self._edit(line, "reduce", f"{listed}: the meters' sums and counts added over all "
                       "processes and `avg` recomputed, so " + (
                           "an average of per-sample means updated with their counts "
                           "(`update(value, n)`) is the whole data set's: no sample is "
                           "repeated in evaluation" if evaluating else
                           "the epoch's average covers every process's batches (a training "
                           "shard may repeat a few samples, and the global batch is N× "
                           "larger: close to one process's value, not equal)"))
            reduces.append(line)
            for outer in self.ctx.loops:
                outer.meters = [n for n in outer.meters if n not in loop.meters]
        reduces += self._after_loop_metrics(updated, loop, evaluating)  # see .collected
        reduces = self._unless_lines_skipped(reduces, mark, updated.target)
        if names and self._skipped("reduce-metrics", updated.target):
            names = []
        if not names and not reduces:
            return updated
        for name in names:
            line = cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(cst.Name(name))],
                value=self._rt_call("reduce", cst.Name(name)))])
            self._edit(line, "reduce", self._reduced_message(name, loop, evaluating))
            reduces.append(line)
            if loop.loader is not None:
                self._scope.reduced[name] = loop.loader
        self._scope.counts.update(n for n in loop.accumulators if n not in names)
        if loop.index is not None:
            self._scope.counts.add(loop.index)
        for outer in self.ctx.loops:  # the reduced value is no longer an accumulator out there
            outer.accumulators = [n for n in outer.accumulators if n not in names]
        self._collective_placed()
        return cst.FlattenSentinel([updated, *reduces])

    def _gather_collected(self, original: cst.Call,
                          updated: cst.Call) -> cst.BaseExpression | None:
        """``preds.append(out.argmax(1))`` in an evaluation loop over a loader →
        ``preds.append(rt.gather_for_metrics(out.argmax(1)))``: the list holds every
        process's samples once (repeats of a padded shard dropped), as one process's would."""
        func = original.func
        loops = [loop for loop in self.ctx.loops if loop.loaderish]
        if self._per_batch_scope():  # its caller uses one batch's values per process
            return None
        if not (loops and self._in_eval() and type(func.value) is cst.Name
                and func.value.value in self._scope.lists and len(updated.args) == 1
                and updated.args[0].keyword is None and not updated.args[0].star):
            return None
        loop = loops[-1]
        if loop is not self.ctx.loops[-1] or func.value.value in loop.after:
            return None  # item by item in an inner loop: gathered after the loop (.collected)
        value = updated.args[0].value
        if not _per_sample(original.args[0].value, loop.targets | loop.assigned | loop.unpacked) \
                or _is_rt_call(value, self.rt, "gather_for_metrics"):
            return None
        name = func.value.value
        if self._skipped("gather-predictions", updated):
            return None
        for each in self.ctx.loops:
            each.gathered.add(name)
        new = updated.with_changes(args=[updated.args[0].with_changes(
            value=self._rt_call("gather_for_metrics", value))])
        self._edit(new, "gather", f"`{name}` gathers each batch's results from every process "
                   "(samples repeated to pad a shard dropped), so it holds the whole set once; "
                   "within a batch they come process by process, so pair them with labels "
                   "collected the same way, not with the data set's order")
        return new

    def _unless_lines_skipped(self, lines: list[cst.BaseStatement], mark: int,
                              anchor: cst.CSTNode) -> list[cst.BaseStatement]:
        """The lines to add after a loop, less those of a skipped rewrite (by the kind of the
        report line each one got since ``mark``; that line is dropped too)."""
        if not self.skip:
            return lines
        kinds = {id(edit.node): edit.kind for edit in self.edits[mark:]}
        kept = []
        for line in lines:
            name = _METRIC_REWRITES.get(kinds.get(id(line), ""))
            if name is None or name not in self.skip:
                kept.append(line)
                continue
            self.edits = [edit for edit in self.edits if edit.node is not line]
            self._skipped(name, anchor)
        return kept

    @staticmethod
    def _data_dependent(loop: _Loop, name: str) -> bool:
        """In training, only sums of what the batch gives (``loss.item()``, ``x.size(0)``) differ
        between processes; ``steps += 1`` counts optimizer steps, the same on every process."""
        local = (loop.assigned | loop.targets | loop.unpacked) - {name}  # `x, y = next(it)`
        return any(_names_in(value) & local for value in loop.added.get(name, ()))

    def _reduced_message(self, name: str, loop: _Loop, evaluating: bool) -> str:
        """What the reduce guarantees, and no more (see :func:`_adds_per_sample`)."""
        if not evaluating:
            return (f"`{name}` summed over all processes after the loop, so the epoch's value "
                    "covers every process's batches, not one shard (a training metric follows "
                    "the N× larger global batch: close to one process's, not equal)")
        added = loop.added.get(name, ())
        means = [cause for cause in map(self._batch_mean_cause, added) if cause]
        if means:  # see .meters
            return (f"`{name}` summed over all processes: it adds one mean per batch "
                    f"({means[0]}), so it equals the single-process value when every batch is "
                    "full on every process (the data set's size a multiple of processes × "
                    "batch size); otherwise each process's smaller last batch weighs like a "
                    "full one")
        if all(_adds_per_sample(value) or self._adds_loss_sum(value) for value in added):
            return (f"`{name}` summed over all processes: it adds per-sample values, and no "
                    "sample is repeated in evaluation, so the metric equals the single-process "
                    "value")
        return (f"`{name}` summed over all processes: it adds per-batch values (a mean per "
                "batch?), so it equals the single-process value when every batch is full; a "
                "smaller last batch weighs like a full one, as it does in the original")

    def _report_unreduced(self, node: cst.For, loop: _Loop) -> None:
        """A loop over a loader that neither trains nor is known to evaluate: its sums stay
        per process (its loader pads like a training one while the model trains)."""
        names = [n for n in loop.accumulators if n not in loop.resets]
        if not names:
            return
        self._edit(node.target, "reduce", f"{', '.join(f'`{n}`' for n in names)} summed over "
                   "this process's shard only: this loop neither trains nor runs under "
                   "`torch.no_grad()` / after `model.eval()`; add one of those, or reduce it "
                   f"yourself (`{names[0]} = {self.rt}.reduce({names[0]})` after the loop)",
                   human=True)

    @handles("leave_BinaryOperation")
    def _loops_after_binary_operation(self, original: cst.BinaryOperation,
                                      updated: cst.BinaryOperation) -> cst.BaseExpression:
        if type(original.operator) is cst.Divide and self._scope.reduced:
            divisor = self._total_count(original.left, updated.right)
            if divisor is not None:
                return updated.with_changes(right=divisor)
        return updated

    @handles("leave_AugAssign")
    def _loops_after_aug_assign(self, original: cst.AugAssign,
                                updated: cst.AugAssign) -> cst.AugAssign:
        if type(original.operator) is cst.DivideAssign and self._scope.reduced:
            divisor = self._total_count(original.target, updated.value)
            if divisor is not None:
                return updated.with_changes(value=divisor)
        return updated

    def _total_count(self, dividend: cst.BaseExpression,
                     divisor: cst.BaseExpression) -> cst.BaseExpression | None:
        """A sum reduced over all processes divided by one process's count (``len(loader)``,
        ``steps``, ``batch_idx + 1``) → divided by all processes' count (``rt.reduce(...)``):
        the mean stays a mean instead of growing N times."""
        sums = sorted(_names_in(dividend) & set(self._scope.reduced))
        if not sums:
            return None
        core = _strip_parens(divisor)
        loaders = {self._scope.reduced[name] for name in sums}
        counts_batches = (
            type(core) is cst.Call and dotted_name(core.func) == "len"
            and "len" not in self.facts.bound and len(core.args) == 1
            and dotted_name(core.args[0].value) in loaders)
        counts = _names_in(core) & self._scope.counts
        if not counts_batches and not (counts and _is_count_expression(core)):
            return None
        what = _code(core)
        new = self._rt_call("reduce", core)
        self._edit(new, "reduce", f"`{what}` counts this process's batches → all processes' "
                   f"(`{self.rt}.reduce({what})`), as {', '.join(f'`{n}`' for n in sums)} "
                   "is summed over all of them")
        return new

    @handles("visit_While")
    def _loops_on_while(self, node: cst.While) -> None:
        self.ctx.loops.append(_Loop(loaderish=False))

    @handles("leave_While")
    def _loops_after_while(self, original: cst.While, updated: cst.While) -> cst.While:
        self.ctx.loops.pop()
        return updated

    def _sync_on_step(self, loop_node: cst.For, loop: _Loop) -> cst.For:
        """Gradient accumulation: DDP synchronises only on the micro-step that steps."""
        test = loop.step_tests[0]
        if _names_in(test) & (loop.assigned - loop.targets):
            return loop_node  # the condition is computed inside the loop: leave it to a human
        every_batch = Counter(_stepped(loop_node.body)) - Counter(loop.step_receivers)
        if any(not _is_scheduler(name) for name in every_batch):
            # Another optimizer steps on every batch (a critic beside a generator stepped every
            # n-th, `if i % n_critic == 0: optimizer_G.step()`): not accumulation, and a skipped
            # sync would leave the critic's gradients unaveraged. Averaging on every backward
            # is always correct; only accumulation may skip it.
            return loop_node
        if self._skipped("accumulation", test):
            return loop_node
        sync = cst.SimpleStatementLine([cst.Expr(self._rt_call("sync_gradients",
                                                               _strip_parens(test)))])
        self._edit(sync, "accumulation", "gradient accumulation: gradients are synchronised "
                   "across processes only on the micro-step that steps the optimizer")
        body = loop_node.body
        return loop_node.with_changes(body=body.with_changes(body=[sync, *body.body]))

    @handles("visit_If")
    def _loops_on_if(self, node: cst.If) -> None:
        if self.ctx.loops and _has_modulo(node.test) and _calls_method(node.body, "step"):
            self.ctx.loops[-1].step_tests.append(node.test)
            self.ctx.loops[-1].step_receivers.extend(_stepped(node.body))

    def _is_exit(self, call: cst.Call) -> bool:
        return self.rules.match("process_exits", self._qual(call.func)) is not None

    @handles("visit_AugAssign")
    def _loops_on_aug_assign(self, node: cst.AugAssign) -> None:
        self._count_assignment(node.target)
        if not self.ctx.loops or type(node.target) is not cst.Name:
            return
        name = node.target.value
        counter = type(node.value) in (cst.Integer, cst.Float)  # `iter_num += 1`
        for loop in self.ctx.loops:
            if not counter:  # a step counter is equal on every process: not data-dependent
                loop.assigned.add(name)
            if type(node.operator) is cst.AddAssign and name in self._scope.zero_inits:
                if name not in loop.accumulators:
                    loop.accumulators.append(name)
                loop.added.setdefault(name, []).append(node.value)

    def _rewrite_backward(self, updated: cst.Call, func: cst.Attribute) -> cst.Call:
        if self._skipped("backward", updated):
            self._mark_backward(updated)
            return updated
        new = backward_through(updated, cst.Name(self.rt))
        self._edit(new, "backward", "backward through the runtime (loss scaling under fp16)")
        self._mark_backward(new)
        return new

    def _mark_backward(self, node: cst.CSTNode | None = None) -> None:
        for loop in self.ctx.loops:
            loop.has_backward = True
        if node is not None and self.ctx.loops and not any(
                loop.loaderish or loop.next_from_loader for loop in self.ctx.loops):
            self._report_unsharded(node)

    def _report_unsharded(self, node: cst.CSTNode) -> None:
        if self.ctx.unsharded_loop_reported or self._fed_by_draws() or self._fed_by_stream():
            return
        if self._reported_full_batch(node):  # see .full_batch
            return
        self.ctx.unsharded_loop_reported = True
        source = self.ctx.loops[-1].loader  # the innermost loop's `for ... in train_dl`
        if source is not None and (source in self._scope.params or (
                "." not in source and source not in self.facts.bound)):
            self._edit(node, LOADER_ELSEWHERE, f"this training loop iterates `{source}`, which "
                       "this file does not build as a DataLoader (a parameter, or built in "
                       "another module): if it is one, prepare it where it is built (convert that "
                       "file too, or the whole folder); if not, every process trains on the same "
                       f"batches: shard them yourself with {self.rt}.rank() and "
                       f"{self.rt}.world_size()", human=True)
            return
        self._edit(node, "data", "this training loop is not fed by a DataLoader: every process "
                   "trains on the same batches. Shard them yourself with "
                   f"{self.rt}.rank() and {self.rt}.world_size()", human=True)

    def _report_loader_from_elsewhere(self, loop: _Loop, anchor: cst.CSTNode) -> None:
        """A training loop over ``train_loader`` in a file that builds no DataLoader: it is
        prepared only if the file that builds it is converted too."""
        source = loop.loader
        if self.ctx.unsharded_loop_reported or self.facts.builds_loaders or source is None:
            return
        self.ctx.unsharded_loop_reported = True
        built = self._built_by(source)
        where = (f"is {built}, which distify cannot see into" if built is not None
                 else "is not built in this file")
        self._edit(anchor, LOADER_ELSEWHERE, f"`{source}` {where}: if it is a "
                   "DataLoader, it is sharded only where it is prepared, so convert the file "
                   "that builds it too (or the whole folder), or prepare it here "
                   f"(`{source} = {self.rt}.prepare({source})`) if nothing else does; "
                   "unprepared, every process trains on the same batches (the job warns at its "
                   "first step when their batches are identical)", human=True)


#: methods and functions whose result is one number per batch, not per sample
_SCALAR_METHODS = frozenset({"item"})
_SCALAR_FUNCTIONS = frozenset({"float", "int", "round", "len"})


def _per_sample(value: cst.BaseExpression, batch_names: set[str]) -> bool:
    """Is ``value`` per-sample results of the batch (``out.argmax(1)``, ``labels.tolist()``),
    not one number per batch (``loss.item()``, ``float(acc)``, a ``loss`` tensor)?"""
    finder = _Calls()
    walk(value, finder)
    if finder.methods & _SCALAR_METHODS or finder.functions & _SCALAR_FUNCTIONS \
            or type(value) in (cst.Integer, cst.Float):
        return False
    names = _names_in(value)
    if any("loss" in name.lower() for name in names):
        return False
    return bool(names & batch_names)


class _Calls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.methods: set[str] = set()
        self.functions: set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Attribute:
            self.methods.add(func.attr.value)
        elif type(func) is cst.Name:
            self.functions.add(func.value)


def _enumerate_index(node: cst.For) -> str | None:
    """``i`` in ``for i, (x, y) in enumerate(loader)``."""
    target, it = node.target, node.iter
    if type(it) is cst.Call and dotted_name(it.func) == "enumerate" \
            and type(target) is cst.Tuple and target.elements \
            and type(target.elements[0].value) is cst.Name:
        return target.elements[0].value.value
    return None


def _is_count_expression(node: cst.BaseExpression) -> bool:
    """``steps``, ``i + 1``, ``(batch_idx + 1)``: a count name, maybe plus a constant."""
    node = _strip_parens(node)
    if type(node) is cst.Name:
        return True
    return (type(node) is cst.BinaryOperation and type(node.operator) is cst.Add
            and type(_strip_parens(node.left)) is cst.Name
            and type(_strip_parens(node.right)) is cst.Integer)


def _loader_name(node: cst.BaseExpression) -> str | None:
    """``train_loader`` for ``train_loader``, ``enumerate(train_loader)``, ``tqdm(self.loader)``."""
    return dotted_name(unwrapped(node, dotted_name))


#: per-sample sums and counts: ``reduction="sum"``, ``.sum()``, ``x.size(0)``, ``len(y)``
_PER_SAMPLE_CALLS = ("sum", "size", "numel", "count_nonzero")


def _adds_per_sample(value: cst.BaseExpression) -> bool:
    """Does ``value`` add a per-sample sum or a sample count, so that summing it over
    disjoint shards gives exactly the whole set's (not a per-batch mean)?"""
    if type(value) in (cst.Integer, cst.Float):
        return False  # `+= 1` counts batches, not samples
    finder = _PerSample()
    walk(value, finder)
    return finder.found


class _PerSample(cst.CSTVisitor):
    def __init__(self) -> None:
        self.found = False

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (type(func) is cst.Attribute and func.attr.value in _PER_SAMPLE_CALLS) or (
                type(func) is cst.Name and func.value == "len"):
            self.found = True
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "reduction" \
                    and type(arg.value) is cst.SimpleString \
                    and literal_value(arg.value) == "sum":
                self.found = True

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if type(node.value) is cst.Attribute and node.value.attr.value == "shape":
            self.found = True  # x.shape[0]


def _short(code: str, width: int = 40) -> str:
    """``code`` on one line, cut at ``width`` characters."""
    text = " ".join(code.split())
    return text if len(text) <= width else text[:width - 3] + "..."


class _Steps(cst.CSTVisitor):
    def __init__(self) -> None:
        self.receivers: list[str] = []

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Attribute and func.attr.value == "step":
            self.receivers.append(dotted_name(func.value) or _code(func.value))


def _stepped(node: cst.CSTNode) -> list[str]:
    """The receivers of the ``.step()`` calls under ``node``, in order (with repeats)."""
    visitor = _Steps()
    walk(node, visitor)
    return visitor.receivers


def _is_scheduler(name: str) -> bool:
    short = name.rsplit(".", 1)[-1].lower()
    return "sched" in short or short.startswith("lr")
