"""Rewrites and reports about loops: backward, evaluation sums, accumulation, divergence.

- ``X.backward(...)`` → ``rt.backward(X, ...)`` (not ``scaler.scale(loss).backward()``: a script
  with its own GradScaler keeps it);
- sums accumulated (``+=`` into a variable set to 0 before the loop) in an evaluation loop over a
  DataLoader (under ``torch.no_grad()`` or after ``model.eval()``) → ``x = rt.reduce(x)`` after
  the loop, so metrics equal the single-process values;
- ``if (i + 1) % accum == 0: optimizer.step()`` → ``rt.sync_gradients(...)`` at the top of the
  loop, so DDP communicates only on the micro-step that steps;
- reported, not rewritten: a data-dependent ``break`` in a training loop, a training loop not fed
  by a DataLoader, predictions collected into lists.
"""

from __future__ import annotations

import libcst as cst

from distify.convert.base import TransformerBase, _Loop
from distify.convert.syntax import (
    _calls_method,
    _has_modulo,
    _is_method_call,
    _leaves_loop,
    _names_in,
    _strip_parens,
)


class LoopMixin(TransformerBase):
    def _rewrite_backward_call(self, updated: cst.Call, func: cst.Attribute) -> cst.Call:
        if _is_method_call(func.value, "scale"):  # scaler.scale(loss).backward(): its own AMP
            self._mark_backward()
            return updated
        return self._rewrite_backward(updated, func)

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
        if not self._loops or not _leaves_loop(node.body, self._is_exit):
            return
        used = _names_in(node.test)
        dependent = sorted(used & self._loops[-1].assigned)
        if dependent:
            self._loops[-1].breaks.append((node, ", ".join(dependent)))

    def _is_exit(self, call: cst.Call) -> bool:
        return self.rules.match("process_exits", self._qual(call.func)) is not None

    def _report_breaks(self, loop: _Loop) -> None:
        if not loop.has_backward:
            return
        for node, names in loop.breaks:
            self._edit(node, "divergence", f"data-dependent exit from a training loop "
                       f"(depends on {names}): processes may leave at different steps and hang; "
                       f"decide on a reduced value, e.g. `{self.rt}.reduce(x, op='mean')`",
                       human=True)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._count_assignment(node.target)
        if not self._loops or not isinstance(node.target, cst.Name):
            return
        name = node.target.value
        counter = isinstance(node.value, (cst.Integer, cst.Float))  # `iter_num += 1`
        for loop in self._loops:
            if not counter:  # a step counter is equal on every process: not data-dependent
                loop.assigned.add(name)
            if (isinstance(node.operator, cst.AddAssign) and name in self._scope.zero_inits
                    and name not in loop.accumulators):
                loop.accumulators.append(name)

    def _rewrite_backward(self, updated: cst.Call, func: cst.Attribute) -> cst.Call:
        new = cst.Call(func=self._rt_attr("backward"),
                       args=[cst.Arg(func.value), *updated.args])
        self._edit(new, "backward", "backward through the runtime (loss scaling under fp16)")
        self._mark_backward(new)
        return new

    def _mark_backward(self, node: cst.CSTNode | None = None) -> None:
        for loop in self._loops:
            loop.has_backward = True
        if node is not None and self._loops and not any(
                loop.loaderish for loop in self._loops):
            self._report_unsharded(node)

    def _report_unsharded(self, node: cst.CSTNode) -> None:
        if self._unsharded_loop_reported:
            return
        self._unsharded_loop_reported = True
        self._edit(node, "data", "this training loop is not fed by a DataLoader: every process "
                   "trains on the same batches. Shard them yourself with "
                   f"{self.rt}.rank() and {self.rt}.world_size()", human=True)
