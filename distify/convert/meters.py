"""Evaluation decided elsewhere in the file, per-batch helpers, meters shown during a loop, and
what a sum of losses really adds (see :class:`~distify.analysis.evaluation.EvalFlow`).

- A function every call of which runs under ``torch.no_grad()`` or after ``model.eval()`` in
  its caller (``with torch.no_grad(): val_loss = evaluate(model, val_loader)``) evaluates: its
  loops over a loader have their sums reduced like those of a loop under its own ``no_grad``
  (the loader is in its exact evaluation mode there: no sample repeated).
- A function called once per batch with that batch's values (the ImageNet example's
  ``accuracy(output, target, topk=(1, 5))``) returns one process's values for one batch, which
  its caller uses as they are (``top1.update(acc1[0], images.size(0))``): nothing in it is
  gathered or reduced; the caller's meters or sums are, after the caller's loop.
- Meters shown during a loop over a loader (``progress.display(i + 1)``, a ``print`` of
  ``top1``) show this process's values: said on the line.
- A sum of a mean-reducing criterion's values (``nn.CrossEntropyLoss()``,
  ``F.cross_entropy(...)`` by default, also ``criterion(out, y).sum().item()``) is a sum of
  per-batch means: its report line says when that equals the single-process value, and a
  summing criterion (``reduction="sum"``) is known to add per-sample values.

What it deliberately does not do: follow a criterion through containers or attributes
(``self.criterion``), or decide evaluation for a method called through another object
(``trainer.evaluate()``); those keep the general rules of :mod:`.loops`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from distify.analysis.evaluation import loss_reduction
from distify.analysis.literals import literal_value
from distify.analysis.names import dotted_name
from distify.analysis.walk import walk
from distify.convert.base import TransformerBase
from distify.convert.context import _Loop
from distify.convert.driver import handles
from distify.convert.syntax import _names_in


@dataclass(slots=True)
class MeterState:
    """What :class:`MeterMixin` keeps while it walks one module (``self._meters``)."""

    #: names bound to an object built from meters (``progress = ProgressMeter(n, [top1])``)
    views: dict[str, list[str]] = field(default_factory=dict)
    #: the loops already given the note (held, not their ids: ids recycle)
    noted: list[_Loop] = field(default_factory=list)


class MeterMixin(TransformerBase):
    _meters: MeterState

    @handles("visit_Module")
    def _meters_on_module(self, node: cst.Module) -> None:
        self._meters = MeterState()

    @handles("visit_FunctionDef")
    def _meters_on_function_def(self, node: cst.FunctionDef) -> None:
        flow = self.facts.evaluation
        if node.name.value in flow.evaluating:
            self._scope.saw_eval = True  # its callers evaluate: see the module docstring
        for outer in self.ctx.path[:-1]:  # meters of an enclosing function, updated in here
            self._scope.meters.update(flow.meters.get(outer, set()) - self._scope.params)

    @handles("visit_Assign")
    def _meters_on_assign(self, node: cst.Assign) -> None:
        value = node.value
        if type(value) is not cst.Call or not self._scope.meters:
            return
        shown = sorted(_names_in(value) & self._scope.meters)
        if shown:
            for target in node.targets:
                if type(target.target) is cst.Name:
                    self._meters.views[target.target.value] = shown

    def _per_batch_scope(self) -> bool:
        """Is this code in a function called once per batch, whose result is used per
        process (see the module docstring)?"""
        helpers = self.facts.evaluation.per_batch
        return any(name in helpers for name in self.ctx.path)

    def _note_meter_display(self, original: cst.Call, result: cst.BaseExpression) -> None:
        """A meter shown inside a loop over a loader: its value there is this process's."""
        loops = [loop for loop in self.ctx.loops if loop.loaderish]
        if "reduce-metrics" in self.skip or not loops or not loops[-1].meters \
                or any(loop is loops[-1] for loop in self._meters.noted):
            return  # (no meters updated in this loop: none are added up after it)
        func = original.func
        shown: list[str] = []
        if type(func) is cst.Attribute and type(func.value) is cst.Name:
            shown = self._meters.views.get(func.value.value, [])
        if not shown and dotted_name(func) == "print":
            shown = sorted(_names_in(original) & self._scope.meters)
        if not shown:
            return
        self._meters.noted.append(loops[-1])
        listed = ", ".join(f"`{name}`" for name in shown)
        self._edit(result, "reduce", f"{listed} shown during the loop: per-batch values are "
                   "this process's own (only the main process prints them); the meters cover "
                   "every process once added up after the loop")

    def _batch_mean_cause(self, value: cst.BaseExpression) -> str | None:
        """Why ``value`` adds one mean per batch (``criterion(out, y).sum().item()`` with a
        mean-reducing ``criterion``), or None when it does not, or may not."""
        finder = _LossCalls()
        walk(value, finder)
        if finder.counts:
            return None  # a mean times its count is a per-sample sum
        flow = self.facts.evaluation
        for call in finder.calls:
            name = dotted_name(call.func)
            if type(call.func) is cst.Name and flow.criteria.get(call.func.value) == "mean":
                return f"`{name}` reduces by its mean"
            if loss_reduction(self._qual(call.func), _keywords(call)) == "mean":
                return f"`{name}(...)` reduces by its mean by default"
        losses = sorted(finder.names & flow.batch_losses)
        if losses:
            return f"`{losses[0]}` is a criterion's mean over its batch"
        return None

    def _adds_loss_sum(self, value: cst.BaseExpression) -> bool:
        """Does ``value`` add a summing criterion's value (``reduction="sum"``)?"""
        finder = _LossCalls()
        walk(value, finder)
        flow = self.facts.evaluation
        return any(type(call.func) is cst.Name and flow.criteria.get(call.func.value)
                   == "sum" for call in finder.calls) or bool(finder.names & flow.sum_losses)


class _LossCalls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []
        self.names: set[str] = set()
        self.counts = False

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)
        func = node.func
        if (type(func) is cst.Attribute and func.attr.value in ("size", "numel")) or (
                type(func) is cst.Name and func.value == "len"):
            self.counts = True

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if type(node.value) is cst.Attribute and node.value.attr.value == "shape":
            self.counts = True

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)


def _keywords(call: cst.Call) -> dict[str, object]:
    return {arg.keyword.value: (literal_value(arg.value)
                                if type(arg.value) is cst.SimpleString else arg.value)
            for arg in call.args if arg.keyword is not None}
