"""The codemod: one LibCST pass that rewrites a single-GPU training script for distify's runtime.

What it rewrites (each rewrite is recorded as a :class:`Edit` for the report):

- DataLoader, optimizer and LR-scheduler constructions → wrapped in ``rt.prepare(...)``, wherever
  they are built (a function, module level, ``self.x = ...``, a ``return``);
- the model(s) an optimizer trains (found by data flow: ``X.parameters()`` in its arguments or
  in the grouped parameters built above, the receiver of ``model.configure_optimizers()``, a
  model handed to a helper) → ``model, optimizer = rt.prepare(model, optimizer)`` right after
  the optimizer is built; a model only the loss reaches → prepared where it is built;
- single-device selection (``torch.device("cuda" ...)``, ``"cuda:0"``, ``.cuda()``,
  ``torch.accelerator.current_accelerator()``) → ``rt.device()``; device pinning removed;
- ``X.backward(...)`` → ``rt.backward(X, ...)``; ``print`` → ``rt.print``; ``torch.save`` /
  ``torch.load`` → ``rt.save`` / ``rt.load``;
- sums accumulated in an evaluation loop over a DataLoader (``correct += ...`` in a loop under
  ``torch.no_grad()`` or after ``model.eval()``) → ``x = rt.reduce(x)`` after the loop;
- the configured batch size as a shape's leading dimension in a loop over a DataLoader
  (``images.reshape(batch_size, -1)``, ``torch.ones(batch_size, 1)``) → ``images.size(0)``;
- and the idioms real scripts use: gradient accumulation, DataParallel, file writes, trackers,
  progress bars, logging, dataset downloads, run timestamps, gradient clipping, and random
  splits of the data set (drawn from the main process's generator on every process).

Each family of rewrites lives in its own module: :mod:`.models`, :mod:`.prepare`, :mod:`.devices`,
:mod:`.loops`, :mod:`.side_effects`, :mod:`.randomness`, :mod:`.batch_shapes`, :mod:`.bptt`,
:mod:`.stops`, :mod:`.meters`, :mod:`.accumulation`, :mod:`.collected`, :mod:`.environments` and
:mod:`.full_batch` (their docstrings list their rewrites). Their per-node handlers are plain
methods marked with :func:`~.driver.handles` (``_loops_on_for``, ``_stops_after_while``); none
defines a LibCST ``visit_``/``leave_`` hook or calls another family's through ``super()``. This
module is the driver: it walks the tree once, and its ``HANDLERS`` table says, per node type, which
handlers run and in what order (:mod:`.driver` makes the hooks from it; ``tests/test_driver.py``
pins it). Its own handlers merge the statement-level effects: the lines a rewrite adds after a
statement, the models prepared there, a guard around a side effect, a download grouped with the
others. The bookkeeping the handlers share (the statement being left, scopes, loops, what was
added) is one :class:`~.context.ConvertContext`, ``self.ctx``, made anew per module; :mod:`.base`
holds the helpers every family uses, :mod:`.syntax` the node helpers. Each rewrite is registered by
name in :mod:`.rewrites` (its documentation, report kinds and examples); the places where it
changes the code ask :meth:`~.base.TransformerBase._skipped` first, so that ``--skip`` can turn it
off.

What it deliberately does not do: it never guesses. A training loop fed without a DataLoader,
a data-dependent ``break`` in a training loop that no collective can decide where every process
reaches it, a custom sampler, predictions collected into
lists, are left as written and reported as :class:`Edit` notes with their node.
"""

from __future__ import annotations

import libcst as cst

from distify.analysis.evaluation import switches_to_eval
from distify.analysis.names import dotted_name
from distify.convert.accumulation import AccumulationMixin
from distify.convert.base import Edit, TransformerBase
from distify.convert.batch_shapes import BatchShapeMixin
from distify.convert.bptt import StreamShardMixin
from distify.convert.collected import CollectedMixin
from distify.convert.devices import DeviceMixin
from distify.convert.driver import handles
from distify.convert.environments import EnvironmentMixin
from distify.convert.full_batch import FullBatchMixin
from distify.convert.loops import LoopMixin
from distify.convert.meters import MeterMixin
from distify.convert.models import ModelMixin
from distify.convert.prepare import PrepareMixin
from distify.convert.randomness import RandomnessMixin
from distify.convert.side_effects import SideEffectMixin
from distify.convert.stops import StopMixin

__all__ = ["DistifyTransformer", "Edit"]


class DistifyTransformer(AccumulationMixin, BatchShapeMixin, CollectedMixin, ModelMixin,
                         PrepareMixin, DeviceMixin, StopMixin, FullBatchMixin, LoopMixin,
                         SideEffectMixin, RandomnessMixin, EnvironmentMixin, StreamShardMixin,
                         MeterMixin, TransformerBase):
    """Rewrites one module in one pass: the driver. Each base class owns one family of rewrites
    (its handlers and helpers); ``HANDLERS`` dispatches each node type to them, and this class's
    own handlers merge what they did to a statement, a call, a block and the module."""

    # ---------------------------------------------------------------- statements
    @handles("visit_SimpleStatementLine")
    def _driver_on_simple_statement_line(self, node: cst.SimpleStatementLine) -> None:
        self.ctx.statements.append(node)
        self.ctx.pending_models.append([])
        self.ctx.built.append([])
        self.ctx.downloads.append(False)

    @handles("leave_SimpleStatementLine")
    def _driver_after_simple_statement_line(self, original: cst.SimpleStatementLine,
                                            updated: cst.SimpleStatementLine):
        self.ctx.statements.pop()
        models = self.ctx.pending_models.pop()
        built = self.ctx.built.pop()
        downloads = self.ctx.downloads.pop()
        if not updated.body:
            return cst.RemovalSentinel.REMOVE
        updated = self._update_device_comment(updated)
        self._note_on_line(original, updated)  # see .accumulation
        if self.ctx.removed:
            self._attach_removals(updated)
        if downloads:
            self.ctx.download_stmts.add(updated)
            self._touch()
        if len(original.body) > 1 and any(self._is_side_effect_stmt(s) for s in original.body) \
                and not self._skipped("guard-side-effects", updated):
            return self._split_line(original, updated)
        guarded = self._guard_side_effect(original, updated)
        if guarded is not None:
            return guarded
        if models:
            return cst.FlattenSentinel(self._prepare_models(updated, models))
        models = self._models_to_prepare(original, models)
        joined = self._join_prepare(updated, models) if models else None
        if joined:
            return cst.FlattenSentinel(joined)
        prepared = self._prepare_built(updated, built) or updated
        if self.ctx.after:
            lines, self.ctx.after = [prepared, *self.ctx.after], []
            return cst.FlattenSentinel(lines)
        return prepared

    def _split_line(self, original: cst.SimpleStatementLine,
                    updated: cst.SimpleStatementLine) -> cst.FlattenSentinel:
        """``os.makedirs(d); x = 1`` → one statement a line, the side effect guarded."""
        lines: list[cst.BaseStatement] = []
        for index, (old, new) in enumerate(zip(original.body, updated.body)):
            line = cst.SimpleStatementLine(
                body=[new.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)],
                leading_lines=updated.leading_lines if index == 0 else ())
            if self._is_side_effect_stmt(old) and not self.ctx.main_only_depth:
                line = self._main_only(line, f"{dotted_name(old.value.func)}(...) runs on the "
                                             "main process only")
            lines.append(line)
        return cst.FlattenSentinel(lines)

    # A one-line suite (`if cond: stmt`) is handled as the line it holds; when the rewrite needs
    # more than that line, the suite becomes an indented block.
    @handles("visit_SimpleStatementSuite")
    def _driver_on_simple_statement_suite(self, node: cst.SimpleStatementSuite) -> None:
        self._driver_on_simple_statement_line(node)  # type: ignore[arg-type]

    @handles("leave_SimpleStatementSuite")
    def _driver_after_simple_statement_suite(self, original: cst.SimpleStatementSuite,
                                             updated: cst.SimpleStatementSuite):
        as_line = cst.SimpleStatementLine(body=updated.body)
        result = self._driver_after_simple_statement_line(
            cst.SimpleStatementLine(body=original.body), as_line)
        if result is as_line:
            return updated
        if isinstance(result, cst.FlattenSentinel):
            statements = list(result.nodes)
        elif isinstance(result, cst.RemovalSentinel):
            placeholder = cst.SimpleStatementLine([cst.Pass()])
            self.ctx.emptied.add(placeholder)
            statements = [placeholder]
        else:
            statements = [result]
        return cst.IndentedBlock(body=statements, header=updated.trailing_whitespace)

    @property
    def _statement_call(self) -> bool:
        """Is the call being left the whole of an expression statement (guarded there)?"""
        return self.ctx.expr_depth > 0 and self.ctx.expr_call is self.ctx.leaving

    @handles("visit_Expr")
    def _driver_on_expr(self, node: cst.Expr) -> None:
        self.ctx.expr_depth += 1
        self.ctx.expr_call = node.value

    @handles("leave_Expr")
    def _driver_after_expr(self, original: cst.Expr, updated: cst.Expr):
        self.ctx.expr_depth -= 1
        self.ctx.expr_call = None
        if self._is_pinning(original.value) and not self._skipped("device", updated):
            self._edit_removed(original.value)
            return cst.RemovalSentinel.REMOVE
        return updated

    @handles("leave_IndentedBlock")
    def _driver_after_indented_block(self, original: cst.IndentedBlock,
                                     updated: cst.IndentedBlock) -> cst.IndentedBlock:
        self.ctx.depth -= 1
        if not updated.body:
            placeholder = cst.SimpleStatementLine([cst.Pass()])
            self.ctx.emptied.add(placeholder)
            return updated.with_changes(body=[placeholder])
        body = self._tidy_block(updated.body)
        return updated if body is updated.body else updated.with_changes(body=body)

    def _tidy_block(self, body):
        """Group dataset downloads under one ``main_process_first`` and merge adjacent guards;
        ``body`` itself when that changes nothing (so the block is not copied)."""
        tidied = body
        if self.ctx.download_stmts or self.ctx.unit_outputs:
            tidied = self._group_downloads(tidied)
        if self.ctx.guards:
            tidied = self._merge_guards(tidied)
        if len(tidied) == len(body) and all(a is b for a, b in zip(tidied, body)):
            return body
        return tidied

    @handles("leave_If")
    def _driver_after_if(self, original: cst.If, updated: cst.If):
        """An ``if`` whose whole body was device pinning goes away with it."""
        updated = self._reduce_where_read(original, updated)  # see .accumulation
        self._branch_left()
        for loop in self.ctx.loops:  # re-anchor a recorded step test on the output node
            loop.step_tests = [updated.test if test is original.test else test
                               for test in loop.step_tests]
        updated, after = self._models_after_branches(original, updated)
        body = updated.body.body
        if (updated.orelse is None and len(body) == 1 and body[0] in self.ctx.emptied):
            return cst.FlattenSentinel(after) if after else cst.RemovalSentinel.REMOVE
        return cst.FlattenSentinel([updated, *after]) if after else updated

    # ---------------------------------------------------------------- calls
    @handles("visit_Call")
    def _driver_on_call(self, node: cst.Call) -> None:
        func = node.func
        if self.ctx.loops and self._draws_from_a_loader(node):
            for loop in self.ctx.loops:
                loop.next_from_loader = True
        if type(func) is cst.Attribute and switches_to_eval(
                func.attr.value, [False if _is_literal_false(a.value) else a for a in node.args]):
            self._scope.saw_eval = True
        if (type(func) is cst.Attribute and func.attr.value in ("append", "extend")
                and type(func.value) is cst.Name and self.ctx.loops
                and func.value.value in self._scope.lists
                and func.value.value not in self.ctx.loops[-1].appended):
            self.ctx.loops[-1].appended.append(func.value.value)
        if (type(func) is cst.Attribute and func.attr.value == "update" and self.ctx.loops
                and type(func.value) is cst.Name and func.value.value in self._scope.meters
                and func.value.value not in self.ctx.loops[-1].meters):
            self.ctx.loops[-1].meters.append(func.value.value)

    @handles("leave_Call")
    def _driver_after_call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        updated = self._batch_shape_call(original, updated)
        updated = self._shard_stream_call(original, updated)
        result = self._leave_call(original, updated)
        if type(original.func) is cst.Attribute and original.func.attr.value == "backward":
            self._note_backward(result)
        self._note_meter_display(original, result)  # see .meters
        self._collective_placed(original if result is updated else result)
        return result

    def _leave_call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        self.ctx.leaving = original
        qual = self._qual(original.func)
        if qual is not None and self._may_rewrite_call(original, qual):
            for rewrite in (self._rewrite_side_effect_call, self._rewrite_prepare,
                            self._rewrite_device):
                replaced = rewrite(original, updated, qual)
                if replaced is not None:
                    return replaced
            replaced = self._unless_skipped("random-draws", updated, lambda: (
                self._rewrite_random_draw(original, updated, qual)))
            if replaced is not None:
                return replaced
        if type(original.func) is cst.Attribute:
            return self._rewrite_method_call(original, updated)
        return updated

    def _may_rewrite_call(self, call: cst.Call, qual: str) -> bool:
        """Can a rewrite of calls by their callee's name (side effects, prepare, devices,
        random draws) act on ``call``, a call of ``qual``? Most calls of a script are of names
        none of them knows (``model(x)``, ``torch.cat``, ``len``): each would look the name up
        in a dozen rule categories and return None, recording nothing. What their name decides
        is asked once per name; what the call itself decides (a ``download=`` keyword, a draw
        the draw flow picked out), every time. ``tests/test_call_pretest.py`` runs every
        fixture with the full rewrites behind each False, to see that they change nothing."""
        known = self.ctx.call_names.get(qual)
        if known is None:
            known = self.ctx.call_names[qual] = (
                self._side_effects_may_call(qual) or self._prepare_may_call(qual)
                or self._devices_may_call(qual) or self._randomness_may_call(qual))
        return known or self._side_effects_may_download(call) or self._randomness_marked(call)

    def _rewrite_method_call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        func = updated.func
        assert type(func) is cst.Attribute
        receiver = self._qual(original.func.value) or ""
        if receiver.split(".")[0] in ("torch", "tf", "jax"):
            return updated
        method = func.attr.value
        if method == "backward":
            return self._rewrite_backward_call(updated, func)
        if method == "strftime":
            return self._rewrite_timestamp_method(original, updated) or updated
        if method in ("append", "extend"):
            return self._gather_collected(original, updated) or updated
        if method in ("reset", "seed"):
            return self._unless_skipped("env-seeds", updated, lambda: (
                self._rewrite_env_seed(original, updated))) or updated
        return self._rewrite_device_method(updated, func, method) or updated

    # ---------------------------------------------------------------- module
    @handles("leave_Module")
    def _driver_after_module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        if self.ctx.removed and updated.body:
            self._attach_removals(updated.body[-1])
        body = self._tidy_block(updated.body)
        return updated if body is updated.body else updated.with_changes(body=body)

    # LibCST's per-field hooks: only the models' ``if``-chain bookkeeping uses them (the base's
    # do nothing, and skip LibCST's lookup of ``visit_<Node>_<field>`` methods)
    on_visit_attribute = ModelMixin._models_on_field
    on_leave_attribute = ModelMixin._models_after_field
    FIELD_HOOKS = (cst.If, cst.Else)  # the only nodes those two act on

    # ---------------------------------------------------------------- the dispatch table
    #: LibCST hook → the handlers it runs, in order (see :mod:`.driver`): a visit hook's answer
    #: is its last handler's; a leave hook hands each handler the node the one before returned.
    #: The scope bookkeeping (``base``) comes first on the way in; the rewrites that read what
    #: the others made of a node (``accumulation`` of a loop, the statement's ``driver``) last on
    #: the way out. Download units (:mod:`.side_effects`) are runs of statements of any kind:
    #: their bookkeeping is first in and last out of every statement.
    _on_statement = SideEffectMixin._side_effects_on_statement
    _after_statement = SideEffectMixin._side_effects_after_statement
    HANDLERS = {
        # the module: whole-file analyses first, then what is decided once every node is known
        "visit_Module": (
            TransformerBase._base_on_module, DeviceMixin._devices_on_module,
            MeterMixin._meters_on_module,
            StreamShardMixin._bptt_on_module, RandomnessMixin._randomness_on_module,
            SideEffectMixin._side_effects_on_module, FullBatchMixin._full_batch_on_module,
            StopMixin._stops_on_module, BatchShapeMixin._batch_shapes_on_module,
            AccumulationMixin._accumulation_on_module),
        "leave_Module": (
            StopMixin._stops_after_module, AccumulationMixin._accumulation_after_module,
            _driver_after_module),
        # scopes
        "visit_ClassDef": (_on_statement, TransformerBase._base_on_class_def),
        "leave_ClassDef": (TransformerBase._base_after_class_def, _after_statement),
        "visit_FunctionDef": (
            _on_statement, TransformerBase._base_on_function_def,
            MeterMixin._meters_on_function_def),
        "leave_FunctionDef": (
            StopMixin._stops_after_function_def, TransformerBase._base_after_function_def,
            StopMixin._stops_move_function_tests, _after_statement),
        "visit_Lambda": (BatchShapeMixin._batch_shapes_on_lambda,),
        "leave_Lambda": (BatchShapeMixin._batch_shapes_after_lambda,),
        "visit_IndentedBlock": (TransformerBase._base_on_indented_block,),
        "leave_IndentedBlock": (_driver_after_indented_block,),
        # loops and branches
        "visit_For": (
            _on_statement, LoopMixin._loops_on_for, FullBatchMixin._full_batch_on_for,
            StopMixin._stops_on_for, CollectedMixin._collected_on_for,
            BatchShapeMixin._batch_shapes_on_for, AccumulationMixin._accumulation_on_for),
        "leave_For": (
            BatchShapeMixin._batch_shapes_after_for, StopMixin._stops_after_for,
            FullBatchMixin._full_batch_after_for, LoopMixin._loops_after_for,
            AccumulationMixin._accumulation_after_for, _after_statement),
        "visit_While": (
            _on_statement, LoopMixin._loops_on_while, FullBatchMixin._full_batch_on_while,
            StopMixin._stops_on_while),
        "leave_While": (
            StopMixin._stops_after_while, FullBatchMixin._full_batch_after_while,
            LoopMixin._loops_after_while, _after_statement),
        "visit_If": (_on_statement, LoopMixin._loops_on_if, StopMixin._stops_on_if),
        "leave_If": (_driver_after_if, _after_statement),
        "visit_Try": (_on_statement, SideEffectMixin._side_effects_on_try),
        "leave_Try": (_after_statement,),
        "visit_TryStar": (_on_statement,),
        "leave_TryStar": (_after_statement,),
        "visit_Match": (_on_statement,),
        "leave_Match": (_after_statement,),
        "visit_ExceptHandler": (StopMixin._stops_on_except_handler,),
        "leave_ExceptHandler": (StopMixin._stops_after_except_handler,),
        "visit_MatchCase": (StopMixin._stops_on_match_case,),
        "leave_MatchCase": (StopMixin._stops_after_match_case,),
        "visit_With": (_on_statement, SideEffectMixin._side_effects_on_with),
        "leave_With": (SideEffectMixin._side_effects_after_with, _after_statement),
        "visit_WithItem": (LoopMixin._loops_on_with_item,),
        # statements
        "visit_SimpleStatementLine": (_on_statement, _driver_on_simple_statement_line),
        "leave_SimpleStatementLine": (_driver_after_simple_statement_line, _after_statement),
        "visit_SimpleStatementSuite": (_driver_on_simple_statement_suite,),
        "leave_SimpleStatementSuite": (_driver_after_simple_statement_suite,),
        "visit_Expr": (_driver_on_expr,),
        "leave_Expr": (_driver_after_expr,),
        "visit_Assign": (
            TransformerBase._base_on_assign, MeterMixin._meters_on_assign,
            LoopMixin._loops_on_assign, CollectedMixin._collected_on_assign),
        "leave_Assign": (
            BatchShapeMixin._batch_shapes_after_assign, CollectedMixin._collected_after_assign,
            DeviceMixin._devices_after_assign, AccumulationMixin._accumulation_after_assign),
        "visit_AugAssign": (
            LoopMixin._loops_on_aug_assign, CollectedMixin._collected_on_aug_assign),
        "leave_AugAssign": (LoopMixin._loops_after_aug_assign,),
        "visit_AnnAssign": (ModelMixin._models_on_ann_assign,),
        "leave_AnnAssign": (
            BatchShapeMixin._batch_shapes_after_ann_assign, DeviceMixin._devices_after_ann_assign),
        # expressions
        "visit_Call": (_driver_on_call,),
        "leave_Call": (_driver_after_call,),
        "visit_Attribute": (BatchShapeMixin._batch_shapes_on_attribute,),
        "leave_Arg": (DeviceMixin._devices_after_arg,),
        "leave_DictElement": (DeviceMixin._devices_after_dict_element,),
        "leave_IfExp": (DeviceMixin._devices_after_if_exp,),
        "leave_BinaryOperation": (
            LoopMixin._loops_after_binary_operation,
            AccumulationMixin._accumulation_after_binary_operation),
        "leave_FormattedStringExpression": (
            SideEffectMixin._side_effects_after_formatted_string_expression,),
    }
    del _on_statement, _after_statement


def _is_literal_false(node: cst.BaseExpression) -> bool:
    return type(node) is cst.Name and node.value == "False"
