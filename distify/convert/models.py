"""Rewrites that put every model that trains under DDP, whatever way its optimizer was built.

The facts come from :mod:`distify.analysis.training` (a pre-pass over the whole file); this mixin
places the ``rt.prepare`` calls:

- an optimizer built by a known constructor over parameters gathered a few lines above (grouped
  parameters, ``filter``, ``itertools.chain``, a list comprehension) → its models are prepared
  with it, ``model, optimizer = rt.prepare(model, optimizer)``, as for ``model.parameters()``;
- an optimizer built by a method or a helper (``optimizer = model.configure_optimizers(...)``,
  ``optimizer = set_optimizer(opt, model)``, ``Lion(...)``) → the same line right after it;
- a model no optimizer names (manual SGD on ``p.data``), found from the loss it computes → prepared
  where it is built: ``model = rt.prepare(Net())``, ``self.model = rt.prepare(model.to(gpu))``.

Reported, not rewritten (a note with the line, and no ``Launch:`` line): a backward pass whose
model cannot be found, and a loss computed by a model's method rather than its forward (DDP only
averages the gradients of a forward through the model itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from distify.analysis.names import dotted_name
from distify.analysis.training import BuildSite
from distify.convert.base import DISTRIBUTED, TransformerBase
from distify.convert.driver import handles
from distify.convert.syntax import _code, _is_rt_prepare, _shift_continuations


def _dotted_target(node: cst.BaseExpression) -> str | None:
    """``model`` or ``self.model`` (as the analysis names them), else None."""
    name = dotted_name(node)
    if name is None or name.count(".") > (1 if name.startswith("self.") else 0):
        return None
    return name


@dataclass
class _IfFrame:
    """An ``if`` chain being rewritten: the models prepared before it, and for each branch the
    models prepared at its end and whether it ends the path (``raise``, ``return``, ...)."""

    before: set[str]
    serial: int
    branches: list[tuple[set[str], bool]] = field(default_factory=list)
    has_else: bool = False


def _with_else(chain: cst.If, lines: list[cst.SimpleStatementLine]) -> cst.If:
    """``chain`` with ``else:`` holding ``lines`` at its end (after its last ``elif``)."""
    if type(chain.orelse) is cst.If:
        return chain.with_changes(orelse=_with_else(chain.orelse, lines))
    return chain.with_changes(orelse=cst.Else(body=cst.IndentedBlock(body=lines)))


def _is_none(node: cst.BaseSmallStatement) -> bool:
    value = getattr(node, "value", None)
    return type(value) is cst.Name and value.value == "None"


def _ends(block: cst.BaseSuite) -> bool:
    """Does the block always leave the path (its last statement raises, returns, continues,
    breaks or exits)?"""
    if type(block) is cst.SimpleStatementSuite:
        small = block.body
    else:
        last = block.body[-1] if block.body else None
        small = last.body if type(last) is cst.SimpleStatementLine else ()
    if not small:
        return False
    statement = small[-1]
    if type(statement) in (cst.Raise, cst.Return, cst.Continue, cst.Break):
        return True
    return (type(statement) is cst.Expr and type(statement.value) is cst.Call
            and dotted_name(statement.value.func) in ("sys.exit", "exit", "quit", "os._exit"))


class ModelMixin(TransformerBase):
    # ---------------------------------------------------------------- assignments, in order
    def _count_assignment(self, target: cst.BaseExpression) -> None:
        """Number each assignment to a name per scope, as the analysis does."""
        if type(target) in (cst.Tuple, cst.List):
            for element in target.elements:
                if type(element) is not cst.StarredElement:
                    self._count_assignment(element.value)
            return
        name = _dotted_target(target)
        if name is None:
            return
        key = (tuple(self.ctx.path), name)
        self.ctx.first_assigned.setdefault(key, self.ctx.if_serial)
        index = self.ctx.assignments.get(key, 0)
        self.ctx.assignments[key] = index + 1
        if self.ctx.built:
            self.ctx.built[-1].append((name, index))

    @handles("visit_AnnAssign")
    def _models_on_ann_assign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._count_assignment(node.target)

    # ---------------------------------------------------------------- optimizers
    def _optimizer_models(self, target: str) -> list[str]:
        """The models the analysis found for the optimizer assigned to ``target`` here."""
        return list(self.facts.training.optimizer_models.get(tuple(self.ctx.path), {})
                    .get(target, ()))

    def _statement_target(self) -> str:
        """The dotted target of the statement being rewritten, or ``""`` (a ``return``)."""
        return self._statement_target_of(self.ctx.statements[-1]) if self.ctx.statements else ""

    def _models_to_prepare(self, original: cst.SimpleStatementLine,
                           pending: list[str]) -> list[str]:
        """Models to prepare beside this statement: those of a known optimizer (``pending``),
        or those of an optimizer built by a call the rules do not know."""
        if pending:
            return pending
        target = self._statement_target_of(original)
        if not target or _is_none(original.body[0]):  # `optimizer = None`: none yet
            return []
        models = [m for m in self._optimizer_models(target)
                  if m not in self._scope.prepared_models]
        self._scope.prepared_models.update(models)
        return models

    def _statement_target_of(self, stmt: cst.SimpleStatementLine) -> str:
        """``model``/``self.model`` for ``X = ...`` (one target), else ``""``."""
        body = stmt.body
        if len(body) == 1 and type(body[0]) is cst.Assign and len(body[0].targets) == 1:
            return _dotted_target(body[0].targets[0].target) or ""
        return ""

    # ---------------------------------------------------------------- branches
    # A model is prepared where its optimizer is built. When that is in one branch of an `if`
    # (`if args.opt == "sgd": ... elif ...:`, `if args.use_optimizer:` beside manual SGD, a
    # resume path that builds none), each branch prepares it on its own path, and a path that
    # falls through without preparing it gets `model = rt.prepare(model)` after the `if`
    # (preparing twice returns the model unchanged). Bookkept through LibCST's per-field hooks
    # on an `if` chain's bodies, which nothing else here uses (the driver's `on_visit_attribute`
    # and `on_leave_attribute` are these two).

    def _models_on_field(self, node: cst.CSTNode, attribute: str) -> None:
        if attribute == "body" and type(node) is cst.If and id(node) not in self.ctx.elifs:
            self.ctx.if_serial += 1
            self.ctx.if_frames.append(_IfFrame(set(self._scope.prepared_models),
                                               self.ctx.if_serial))

    def _models_after_field(self, original_node: cst.CSTNode, attribute: str) -> None:
        if attribute != "body":
            return
        kind = type(original_node)
        if kind is cst.If:
            orelse = original_node.orelse
            if type(orelse) is cst.If:
                self.ctx.elifs.add(id(orelse))
            elif type(orelse) is cst.Else:
                self.ctx.if_elses.add(id(orelse))
        elif kind is not cst.Else or id(original_node) not in self.ctx.if_elses:
            return
        frame = self.ctx.if_frames[-1]
        frame.branches.append((set(self._scope.prepared_models), _ends(original_node.body)))
        self._scope.prepared_models.clear()
        self._scope.prepared_models.update(frame.before)
        frame.has_else = kind is cst.Else

    def _models_after_branches(self, original: cst.If, updated: cst.If,
                               ) -> tuple[cst.If, list[cst.SimpleStatementLine]]:
        """At the end of an ``if`` chain: the prepares a path that falls through lacks, as
        lines after the chain; or, where only the chain's missing ``else`` lacks them
        (``if args.use_optimizer: ... prepare(model, optimizer)``), as that ``else``, so that no
        path prepares the model twice."""
        if id(original) in self.ctx.elifs or not self.ctx.if_frames:
            return updated, []
        if "prepare-model" in self.skip:  # nothing was prepared in the branches
            self.ctx.if_frames.pop()
            return updated, []
        frame = self.ctx.if_frames.pop()
        branches = frame.branches if frame.has_else else [*frame.branches, (frame.before, False)]
        falling = [prepared for prepared, ends in branches if not ends]
        everywhere = set().union(*(prepared for prepared, _ in branches))
        self._scope.prepared_models.update(everywhere)
        if not falling:
            return updated, []
        somewhere = set().union(*falling) - set.intersection(*falling)
        lines = self._prepare_lines(updated, frame, somewhere)
        explicit = [prepared for prepared, ends in frame.branches if not ends]
        if lines and not frame.has_else and all(somewhere <= prepared for prepared in explicit):
            return _with_else(updated, lines), []
        return updated, lines

    def _prepare_lines(self, updated: cst.If, frame: _IfFrame,
                       somewhere: set[str]) -> list[cst.SimpleStatementLine]:
        lines = []
        for name in sorted(somewhere):
            if not self._bound_before(name, frame.serial):
                self._edit(updated, "model", f"`{name}` is prepared on some paths of "
                           f"this `if` only, and is not built before it: prepare it with "
                           f"`{name} = {self.rt}.prepare({name})` where every path has it",
                           human=True)
                continue
            line = cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(cst.parse_expression(name))],
                value=self._rt_call("prepare", cst.parse_expression(name)))])
            self._edit(line, "prepare-model", f"`{name}` prepared on every path of the `if`, "
                       "which builds its optimizer on some paths only: moved to the device and "
                       f"{DISTRIBUTED}")
            lines.append(line)
        return lines

    def _bound_before(self, name: str, serial: int) -> bool:
        """Was ``name`` bound before the ``if`` numbered ``serial`` began?"""
        if name.startswith("self.") or name in self._scope.params:
            return True
        for key in ((tuple(self.ctx.path), name), ((), name)):
            if self.ctx.first_assigned.get(key, serial) < serial:
                return True
        return False

    # ---------------------------------------------------------------- models built here
    def _prepare_built(self, updated: cst.SimpleStatementLine,
                       built: list[tuple[str, int]]) -> cst.SimpleStatementLine | None:
        """``model = Net()`` → ``model = rt.prepare(Net())`` when this is where a model that only
        a backward pass reaches is built (its last assignment in the scope)."""
        sites = self.facts.training.build_sites
        path = tuple(self.ctx.path)
        for name, index in built:
            if BuildSite(path, name, index) not in sites or name in self._scope.prepared_models:
                continue
            if self._skipped("prepare-model", updated):
                return None
            self._scope.prepared_models.add(name)
            body = updated.body
            assign = body[0] if len(body) == 1 else None
            if type(assign) is cst.Assign and len(assign.targets) == 1 \
                    and type(assign.value) is not cst.Tuple \
                    and type(assign.targets[0].target) not in (cst.Tuple, cst.List) \
                    and not (type(assign.value) is cst.Call
                             and _is_rt_prepare(assign.value, self.rt)):
                call = self._rt_call("prepare", _shift_continuations(
                    assign.value, len(f"{self.rt}.prepare(")) if type(assign.value) is cst.Call
                    else assign.value)
                new = updated.with_changes(body=[assign.with_changes(value=call)])
                self._edit(call, "prepare-model", f"`{name}` prepared where it is built: moved "
                           f"to the device and {DISTRIBUTED} "
                           "(found from the loss it computes)")
                return new
            line = cst.SimpleStatementLine(body=[cst.Assign(
                targets=[cst.AssignTarget(cst.parse_expression(name))],
                value=self._rt_call("prepare", cst.parse_expression(name)))])
            self._edit(line, "prepare-model", f"`{name}` prepared where it is built (found from "
                       "the loss it computes)")
            self.ctx.after.append(line)
        return None

    # ---------------------------------------------------------------- backward passes
    def _note_backward(self, node: cst.CSTNode) -> None:
        """Report a backward pass whose model the analysis could not find."""
        path = tuple(self.ctx.path)
        ordinal = self.ctx.backwards.get(path, 0)
        self.ctx.backwards[path] = ordinal + 1
        training = self.facts.training
        method = training.method_losses.get(path, {}).get(ordinal)
        if method is not None:
            self._edit(node, "model", f"this loss comes from `{method}`, a method of the model, "
                       "not its forward: DDP averages only the gradients of a call of the model "
                       "itself (`model(...)`), so call the model, or move that code into its "
                       "forward", human=True)
        elif ordinal in training.unresolved.get(path, ()):
            self._edit(node, "model", "cannot tell which model computes this loss, so it may "
                       f"not be prepared: prepare it with `model = {self.rt}.prepare(model)` "
                       "where it is built (at run time distify stops a job whose loss does not "
                       "come from a prepared model)", human=True)

    def _join_prepare(self, stmt: cst.SimpleStatementLine,
                      models: list[str]) -> list[cst.SimpleStatementLine] | None:
        """``optimizer = make(model)`` → that, then ``model, optimizer = rt.prepare(model,
        optimizer)`` (an optimizer the rules do not know, built by a call)."""
        target = self._statement_target_of(stmt)
        value = stmt.body[0].value if target else None
        if not target or (type(value) is cst.Call and _is_rt_prepare(value, self.rt)) \
                or self._skipped("prepare-model", stmt):
            return None
        names = [cst.parse_expression(n) for n in (*models, target)]
        line = cst.SimpleStatementLine(body=[cst.Assign(
            targets=[cst.AssignTarget(cst.Tuple([cst.Element(n) for n in names],
                                                lpar=[], rpar=[]))],
            value=self._rt_call("prepare", *[n.deep_clone() for n in names]))])
        callee = _code(value.func) if type(value) is cst.Call else "a call"
        plural = "s" if len(models) > 1 else ""
        self._edit(line, "prepare-model", f"{', '.join(f'`{m}`' for m in models)} and the "
                   f"optimizer built by {callee}(...) prepared: the model{plural} moved to the "
                   f"device and {DISTRIBUTED}")
        return [stmt, line]
