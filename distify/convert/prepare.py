"""Rewrites that prepare what training needs: DataLoaders, optimizers, schedulers, models.

DataLoader, optimizer and scheduler constructions are wrapped in ``rt.prepare(...)`` wherever
they are built. The models an optimizer trains (the roots of ``X.parameters()`` in its
arguments) are prepared together with it: ``model, optimizer = rt.prepare(model, optimizer)``.
``nn.DataParallel`` wrappers are dropped, DDP replaces them. Deliberately not done: a module
constructed but never handed to an optimizer (a loss, a frozen teacher) is left alone.
"""

from __future__ import annotations

import libcst as cst

from distify.convert.base import DISTRIBUTED, TransformerBase
from distify.convert.syntax import (
    _assigned_value,
    _callee,
    _clone,
    _code,
    _is_rt_prepare,
    _join,
    _parameter_roots,
    _shift_continuations,
    _single_target,
)

#: the rule categories :meth:`PrepareMixin._rewrite_prepare` acts on
_PREPARED = ("dataloaders", "data_parallel", "data_parallel_functions", "optimizers",
             "schedulers")


class PrepareMixin(TransformerBase):
    def _prepare_may_call(self, qual: str) -> bool:
        """Can :meth:`_rewrite_prepare` act on a call of ``qual``? (It acts only on the
        callees of :data:`_PREPARED`.)"""
        return any(self.rules.match(category, qual) is not None for category in _PREPARED)

    def _rewrite_prepare(self, original: cst.Call, updated: cst.Call,
                         qual: str) -> cst.BaseExpression | None:
        rules = self.rules
        if rules.match("dataloaders", qual):
            if self._skipped("prepare-dataloader", updated):
                return None
            return self._prepare_loader(original, updated)
        if rules.match("data_parallel", qual) and updated.args \
                and not self._skipped("data-parallel", updated):
            # Kept as written: prepared, it drives one device per process and the module it
            # wraps runs under DDP; `.module` and the `module.` checkpoint keys stay.
            self._edit(updated, "data-parallel", f"{qual} kept: once prepared it uses one "
                       "device per process and DDP averages the gradients; `.module` and the "
                       "checkpoint keys are unchanged")
            return updated
        if rules.match("data_parallel_functions", qual):
            if self._skipped("data-parallel", updated):
                return None
            return self._plain_call(updated, qual)
        if self._in_model_class():
            return None
        if rules.match("optimizers", qual):
            if self._skipped("prepare-model", updated):
                return None
            models = self._trained_models(original)
            if self.ctx.pending_models and models:
                self.ctx.pending_models[-1].extend(models)
                self._scope.prepared_models.update(models)
            wrapped = self._wrap_prepare(updated, original)
            self._edit(wrapped, "prepare-optimizer", "optimizer prepared (mixed-precision "
                       "loss scaling when enabled)")
            return wrapped
        if rules.match("schedulers", qual):
            if self._skipped("prepare-scheduler", updated):
                return None
            wrapped = self._wrap_prepare(updated, original)
            self._edit(wrapped, "prepare-scheduler", "LR scheduler prepared: one step per call, "
                       "none after a skipped optimizer step")
            return wrapped
        return None

    def _prepare_models(self, stmt: cst.SimpleStatementLine,
                        models: list[str]) -> list[cst.SimpleStatementLine]:
        """``stmt`` (which builds an optimizer) with ``models`` prepared beside it, in order."""
        target = _single_target(stmt)
        value = _assigned_value(stmt)
        exprs = [cst.parse_expression(m) for m in models]
        if target is not None and type(value) is cst.Call and _is_rt_prepare(value, self.rt):
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
                       f"device and {DISTRIBUTED}")
            return [stmt, line]
        before = []
        for model, expr in zip(models, exprs):
            line = cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(expr)], value=self._rt_call("prepare", _clone(expr)))])
            self._edit(line, "prepare-model", f"{model} prepared: moved to the device and "
                       f"{DISTRIBUTED}")
            before.append(line)
        if len(stmt.body) > 1:  # `m = Net(); opt = SGD(m.parameters())`: m exists only after
            return [stmt, *before]
        return [*before, stmt]

    def _plain_call(self, call: cst.Call, qual: str) -> cst.BaseExpression | None:
        """``data_parallel(module, inputs, ...)`` → ``module(inputs)``: DDP replaces it.
        A tuple of inputs is spread, as data_parallel does; keywords are left to a human."""
        args = call.args
        if len(args) < 2 or any(a.keyword or a.star for a in args[:2]):
            self._edit(call, "data-parallel", f"{qual}(...) with keyword arguments: replace it "
                       "with a plain call of the module (DDP replaces it)", human=True)
            return None
        inputs = args[1].value
        spread = inputs.elements if type(inputs) is cst.Tuple else [cst.Element(inputs)]
        new = cst.Call(func=args[0].value, args=[
            cst.Arg(e.value, comma=cst.MaybeSentinel.DEFAULT if i == len(spread) - 1 else
                    cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            for i, e in enumerate(spread)])
        self._edit(new, "data-parallel", f"{qual}(...) → a plain call: DDP replaces it")
        return new

    def _wrap_prepare(self, call: cst.Call, original: cst.Call) -> cst.Call:
        """``rt.prepare(call)`` (``original``: the call as written). When that would push a
        one-line statement past the file's own line length, the argument goes on the next line,
        indented, as one would by hand."""
        prefix = f"{self.rt}.prepare("
        if self._holds_line_break(call, original):
            return self._rt_call("prepare", _shift_continuations(call, len(prefix)))
        if not self._too_long(len(prefix) + 1):
            return self._rt_call("prepare", call)
        return self._hanging(cst.Call(func=self._rt_attr("prepare"), args=[cst.Arg(call)]))

    def _prepare_loader(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        wrapped = self._wrap_prepare(updated, original)
        message = "DataLoader prepared: each process gets its own shard, reshuffled every epoch"
        self._edit(wrapped, "prepare-dataloader", message)
        positional = [a for a in original.args if a.keyword is None and not a.star]
        inner = wrapped.args[0].value  # the DataLoader call as it is in the output
        for index, arg in enumerate(original.args):
            keyword = arg.keyword.value if arg.keyword else None
            if keyword == "batch_size" or (len(positional) > 1 and arg is positional[1]):
                self.batch_sizes.append(_code(arg.value))
            elif arg.star == "**":
                self.batch_sizes.append(f"{_code(arg.value)}['batch_size']")
            if keyword in ("sampler", "batch_sampler"):
                self._check_sampler(arg, inner.args[index])
        return wrapped

    def _check_sampler(self, arg: cst.Arg, anchor: cst.CSTNode) -> None:
        value = arg.value
        qual = self._qual(_callee(value)) if type(value) is cst.Call else None
        if qual is not None and self.rules.match("samplers", qual):
            return
        if type(value) is cst.Name and any(value.value in s.samplers for s in self.ctx.scopes):
            return  # a stock sampler built a few lines above
        self._edit(anchor, "sampler", f"custom {arg.keyword.value}: distify shards the indices it "
                   "yields each epoch; make sure it does not shard by rank itself", human=True)

    def _trained_models(self, call: cst.Call) -> list[str]:
        """The models an optimizer trains: roots of ``X.parameters()`` in its arguments."""
        found: list[str] = []
        roots = [root for arg in call.args for root in _parameter_roots(arg.value)]
        # and those whose parameters reach it through variables (grouped parameters, ...)
        roots += self._optimizer_models(self._statement_target())
        for root in roots:
            if root not in found and root not in self._scope.prepared_models:
                found.append(root)
        return found
