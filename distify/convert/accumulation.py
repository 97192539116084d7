"""Gradient accumulation written as nested micro-steps, the way GPT trainers write it.

nanoGPT-style scripts step the optimizer once per outer iteration, after an inner loop of
micro-steps that each divide the loss by the count and call backward::

    for micro_step in range(grad_accum_steps):
        x, y = next(train_iter)
        loss = model(x, y) / grad_accum_steps
        loss_accum += loss.detach()
        loss.backward()
    optimizer.step()

Such a loop (``range(count)`` whose body calls backward, divides by ``count`` and steps no
optimizer, directly inside a loop that does) is rewritten so that:

- gradients are averaged across processes on the last micro-step only:
  ``rt.sync_gradients(micro_step == grad_accum_steps - 1)`` opens the micro-step's body;
- a count derived from a declared total batch (``total_batch_size // (B * T)``, or a number
  whose comment speaks of a total, larger, effective or global batch, nanoGPT's
  ``gradient_accumulation_steps = 5 * 8  # used to simulate larger batch sizes``) is shared
  out over the processes right after it is set
  (``grad_accum_steps = rt.split_accumulation(grad_accum_steps)``, which stops with an error
  when the world size does not divide it): an optimizer step still covers the declared total,
  as people do by hand (``grad_accum_steps //= ddp_world_size``). Any other count is the
  user's choice and is kept on every process; the report line says that an optimizer step
  then covers N× the single-process batch. Only micro-steps whose batches differ between
  processes (``next()`` of an iterator over a DataLoader the file builds, batches drawn per
  process, a split stream) get the count shared out and the counters below: where every
  process trains on the same batches, a share would shrink the step's distinct data to 1/N,
  so the count is kept and the line says why;
- a per-step sum of the micro-steps' losses (``loss_accum = 0.0`` in the outer loop,
  ``loss_accum += loss.detach()`` in the micro-steps) becomes the mean over the processes,
  ``loss_accum = rt.reduce(loss_accum, op="mean")``, where it is read: at the top of the one
  ``if`` that reads it (``if step % log_interval == 0:``) when its test is the same on every
  process, otherwise right after the micro-steps. The loops' generic sum is not added;
- a throughput counter, an assignment to a name about tokens or samples whose value is a
  product with the count (``tokens_processed = B * T * grad_accum_steps``), is multiplied by
  ``rt.world_size()``: it counts every process's tokens (the same number at world size 1);
  any other product with the count after the micro-steps (``estimate_mfu(batch_size * n, dt)``,
  a tokens/sec inside a print) is left as written and its line says it counts one process's.

What it deliberately does not do: follow micro-steps in a function the outer loop calls, or
split a count set more than once (it is kept, and said to be); average a loss logged from the
last micro-step alone (``lossf = loss.item() * grad_accum_steps``): its line says it is this
process's last micro-batch, as the single process logs one micro-batch. Two optimizers stepped
on different schedules are no micro-steps (each steps in its own loop).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from distify.analysis.literals import literal_value
from distify.analysis.names import dotted_name
from distify.analysis.walk import walk
from distify.convert.base import TransformerBase
from distify.convert.driver import handles
from distify.convert.syntax import _code, _names_in, _strip_parens
from distify.convert.throughput import counter_lines, names_a_counter

#: a comment on the count's line that says it stands for a batch size of the whole step
_DECLARED_TOTAL = re.compile(r"total|simulat|effective|global batch|larger batch", re.I)
#: names of throughput counters (``tokens_processed``, ``tokens_per_iter``, ``samples_seen``)
_THROUGHPUT = re.compile(r"token|sample|example|seq|image", re.I)


@dataclass
class _MicroSteps:
    """One micro-step loop found before the rewrite, with what goes with it."""

    count: str  # the code of ``range``'s argument: ``grad_accum_steps``, ``args.accum``
    target: str  # ``micro_step``
    losses: set[str] = field(default_factory=set)  # ``loss`` of ``loss.backward()``
    #: ids of its backward calls, and what it calls ``next()`` on (``train_iter``)
    backwards: set[int] = field(default_factory=set)
    nexts: list[cst.BaseExpression] = field(default_factory=list)
    #: each process trains on its own batches (a prepared loader's iterator, per-process draws)
    sharded: bool = False
    #: sums of the loss that nothing reads (no collective for them)
    unread: set[str] = field(default_factory=set)
    #: per-step sums of the loss (``loss_accum``) → the ``if`` to reduce them at (or None:
    #: right after the micro-steps)
    sums: dict[str, cst.If | None] = field(default_factory=dict)
    #: names read after the micro-steps as one micro-batch's loss (``lossf = loss.item() * n``)
    last_loss: list[cst.SimpleStatementLine] = field(default_factory=list)


@dataclass
class _Count:
    """Where a micro-step count is set, and whether it is shared out over the processes."""

    line: cst.SimpleStatementLine
    split: bool


@dataclass(slots=True)
class AccumulationState:
    """What :class:`AccumulationMixin` keeps while it walks one module (``self._accumulation``)."""

    #: id of each micro-step loop as written → what it accumulates
    micro_steps: dict[int, _MicroSteps] = field(default_factory=dict)
    #: micro-step loops being rewritten around the node
    micro_depth: int = 0
    #: id of the node where sums of micro-steps are read → the sums to average there
    reduce_at: dict[int, list[str]] = field(default_factory=dict)
    #: each micro-step count set once in the file → its line and what it stands for
    counts: dict[str, _Count] = field(default_factory=dict)
    #: id of the line that sets a count → (the count's name, it)
    count_of_line: dict[int, tuple[str, _Count]] = field(default_factory=dict)
    #: ids of the lines after a micro-step loop that use its last loss
    last_loss_lines: set[int] = field(default_factory=set)
    #: (line, about the loss?) already noted: a product with the count, said once a line
    noted_lines: set[tuple[int, bool]] = field(default_factory=set)
    #: the notes for the line being left
    line_notes: list[str] = field(default_factory=list)
    #: the names of the micro-steps' losses
    losses: set[str] = field(default_factory=set)
    #: id of a line setting a throughput counter over per-process batches → the counter's
    #: name (:mod:`.throughput`)
    counter_lines: dict[int, str] = field(default_factory=dict)
    #: ids of the micro-step loops left as written (``--skip accumulation``): plain loops
    skipped_micro: set[int] = field(default_factory=set)


class AccumulationMixin(TransformerBase):
    _accumulation: AccumulationState

    @handles("visit_Module")
    def _accumulation_on_module(self, node: cst.Module) -> None:
        state = self._accumulation = AccumulationState()
        finder = _MicroStepFinder()
        walk(node, finder)
        state.micro_steps = {id(loop): found for loop, found in finder.loops}
        for found in state.micro_steps.values():
            for name, where in found.sums.items():
                if where is not None:
                    state.reduce_at.setdefault(id(where), []).append(name)
        for found in state.micro_steps.values():
            found.sharded = self._shards_batches(found)
        state.counts = _count_lines(node, {f.count for f in state.micro_steps.values()})
        for name, count in state.counts.items():  # shared out only where the data is
            count.split = count.split and all(f.sharded for f in state.micro_steps.values()
                                              if f.count == name)
        state.count_of_line = {id(c.line): (name, c) for name, c in state.counts.items()}
        state.last_loss_lines = {id(line) for found in state.micro_steps.values()
                                 for line in found.last_loss}
        state.losses = {name for found in state.micro_steps.values() for name in found.losses}
        if names_a_counter(self.facts.bound):  # else no line sets one: skip the two walks
            fed: set[int] = set()
            for flow in (self.ctx.draw_flow, self.ctx.stream_flow):
                if flow is not None:
                    fed |= flow.fed_backwards
            state.counter_lines = counter_lines(
                node, self.facts.loader_targets, self.facts.loader_iterators, fed,
                {f.count for f in state.micro_steps.values()})
        if "accumulation" in self.skip:  # the micro-step loops are plain loops from here on
            self._accumulation = AccumulationState(skipped_micro=set(state.micro_steps))

    @handles("leave_Module")
    def _accumulation_after_module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        """The report's batch-size line: with the count shared out, the per-process batch is
        a micro-batch's, and an optimizer step keeps the script's total."""
        split = [name for name, count in self._accumulation.counts.items() if count.split]
        if split and self.batch_sizes:
            self.batch_sizes = [f"{size} (per micro-step; an optimizer step keeps the "
                                f"declared total, as `{split[0]}` is shared out)"
                                for size in self.batch_sizes]
        return updated

    def _shards_batches(self, found: _MicroSteps) -> bool:
        """Does each process train on its own batches in these micro-steps: drawn per process
        by a batch function (:mod:`.randomness`), sliced from a split stream (:mod:`.bptt`),
        or ``next()`` of an iterator over a DataLoader this file builds (prepared, sharded)?"""
        for flow in (self.ctx.draw_flow, self.ctx.stream_flow):
            if flow is not None and found.backwards & flow.fed_backwards:
                return True
        if not found.nexts:
            return False
        facts = self.facts
        return any(_code(source) in facts.loader_iterators or (
            type(source) is cst.Call and dotted_name(source.func) == "iter"
            and source.args and _code(source.args[0].value) in facts.loader_targets)
            for source in found.nexts)

    # ---------------------------------------------------------------- the micro-step loop
    @handles("visit_For")
    def _accumulation_on_for(self, node: cst.For) -> None:
        found = self._accumulation.micro_steps.get(id(node))
        if found is not None:
            self._accumulation.micro_depth += 1
            if self.ctx.loops:  # averaged where read, or read nowhere: no sum after the loop
                self.ctx.loops[-1].own_reduce.update(found.sums, found.unread)

    @handles("leave_For")
    def _accumulation_after_for(self, original: cst.For, updated: cst.For):
        found = self._accumulation.micro_steps.get(id(original))
        if found is None:
            if id(original) in self._accumulation.skipped_micro:
                nodes = updated.nodes if isinstance(updated, cst.FlattenSentinel) else [updated]
                self._skipped("accumulation", nodes[0].target)
            return updated
        self._accumulation.micro_depth -= 1
        # the loop, maybe followed by lines another rewrite adds after it
        nodes = list(updated.nodes) if isinstance(updated, cst.FlattenSentinel) else [updated]
        if not nodes or type(nodes[0]) is not cst.For:
            return updated
        loop = self._sync_last_micro_step(nodes[0], found)
        after = [self._mean_line(name, found) for name, where in found.sums.items()
                 if where is None]
        if after:
            self._collective_placed()
        if len(nodes) == 1 and not after:
            return loop
        return cst.FlattenSentinel([loop, *after, *nodes[1:]])

    def _sync_last_micro_step(self, loop: cst.For, found: _MicroSteps) -> cst.For:
        sync = cst.SimpleStatementLine([cst.Expr(cst.parse_expression(
            f"{self.rt}.sync_gradients({found.target} == {found.count} - 1)"))])
        count = self._accumulation.counts.get(found.count)
        if count is not None and count.split:
            batch = (f"`{found.count}` is shared out over the processes where it is set, so an "
                     "optimizer step covers the single-process batch")
        elif not found.sharded:
            batch = (f"`{found.count}` is kept: these micro-steps' batches are not known to "
                     "differ between processes (see the note on the data), and while every "
                     "process trains on the same ones a step is the single-process step; once "
                     "each draws its own, an optimizer step covers N× the batch, or share a "
                     f"count meant as a total out with `{found.count} = "
                     f"{self.rt}.split_accumulation({found.count})`")
        else:
            batch = (f"`{found.count}` is the script's own count, kept on every process: on N "
                     f"processes an optimizer step covers N × `{found.count}` micro-batches, N× "
                     f"the single-process batch (divide it by `{self.rt}.world_size()` to keep "
                     "that batch)")
        self._edit(sync, "accumulation", "gradient accumulation over micro-steps: gradients are "
                   "averaged across processes on the last micro-step only (no communication on "
                   f"the others); {batch}")
        body = loop.body
        return loop.with_changes(body=body.with_changes(body=[sync, *body.body]))

    def _mean_line(self, name: str, found: _MicroSteps) -> cst.SimpleStatementLine:
        line = cst.SimpleStatementLine([cst.Assign(
            targets=[cst.AssignTarget(cst.Name(name))],
            value=cst.parse_expression(f'{self.rt}.reduce({name}, op="mean")'))])
        self._edit(line, "reduce", f"`{name}` averaged over the processes before it is read: "
                   "each process sums its own micro-steps' losses (each divided by "
                   f"`{found.count}`), so the mean is the step's loss over every process's "
                   "micro-batches, not this process's share")
        return line

    def _reduce_where_read(self, original: cst.If, updated: cst.If) -> cst.If:
        """Called by the driver's ``leave_If`` handler: the sums read only in this ``if`` are
        averaged at its top."""
        names = self._accumulation.reduce_at.get(id(original))
        if not names or type(updated.body) is not cst.IndentedBlock:
            return updated
        found = next(f for f in self._accumulation.micro_steps.values() if names[0] in f.sums)
        lines = [self._mean_line(name, found) for name in names]
        self._collective_placed()
        body = updated.body
        return updated.with_changes(body=body.with_changes(body=[*lines, *body.body]))

    # ---------------------------------------------------------------- the count and counters
    @handles("leave_Assign")
    def _accumulation_after_assign(self, original: cst.Assign, updated: cst.Assign):
        if type(updated) is not cst.Assign or not self.ctx.statements:
            return updated
        line = self.ctx.statements[-1]
        known = self._accumulation.count_of_line.get(id(line))
        if known is not None and known[1].split:
            self._split_count(known[0], updated)
        if id(line) in self._accumulation.last_loss_lines:
            self._note_last_loss(updated)
        return self._count_all_processes(updated)

    def _note_last_loss(self, assign: cst.Assign) -> None:
        names = ", ".join(f"`{_code(t.target)}`" for t in assign.targets)
        self._edit(assign, "accumulation", f"{names}: the last micro-batch's loss of this "
                   "process (on the console, the main process's), as the single process logs "
                   "one micro-batch's; accumulate `loss.detach()` over the micro-steps and "
                   f"`{self.rt}.reduce(..., op=\"mean\")` it to log the step's loss")

    def _split_count(self, count: str, assign: cst.Assign) -> None:
        share = cst.SimpleStatementLine([cst.Assign(
            targets=[cst.AssignTarget(cst.parse_expression(count))],
            value=cst.parse_expression(f"{self.rt}.split_accumulation({count})"))])
        comment = self._accumulation.counts[count].line.trailing_whitespace.comment
        why = (f"is derived from a declared total batch (`{_short(_code(assign.value))}`)"
               if _has_floor_division(assign.value) else
               f"stands for a total batch (its comment: `{_short(comment.value.lstrip('# '))}`)")
        self._edit(share, "accumulation", f"`{count}` {why}: each of N processes runs 1/N of "
                   "its micro-steps, so an optimizer step still covers that total; the job stops "
                   "with an error when N does not divide it")
        self.ctx.after.append(share)

    @handles("leave_BinaryOperation")
    def _accumulation_after_binary_operation(self, original: cst.BinaryOperation,
                                             updated: cst.BinaryOperation) -> cst.BaseExpression:
        """A product with the count left as it is (``estimate_mfu(batch_size * n, dt)``, a
        tokens/sec in a print) counts one process's share: said on its line, once."""
        state = self._accumulation
        line = self.ctx.statements[-1] if self.ctx.statements else None
        counts = {f.count for f in state.micro_steps.values() if f.sharded}
        if (line is None or state.micro_depth or id(line) in state.last_loss_lines
                or id(line) in state.count_of_line or not set(_factors(original)) & counts
                or _is_counter_line(line)):
            return updated
        loss = bool(_names_in(original) & state.losses)
        if (id(line), loss) in state.noted_lines:
            return updated
        state.noted_lines.add((id(line), loss))
        what = _short(_code(original))
        if loss:
            message = (f"`{what}`: the last micro-batch's loss of this process (on the console, "
                       "the main process's), as the single process logs one micro-batch's")
        else:
            message = (f"`{what}` counts this process's share of an optimizer step (all "
                       f"processes: × `{self.rt}.world_size()`)")
        state.line_notes.append(message)
        return updated

    def _note_on_line(self, original: cst.SimpleStatementLine,
                      updated: cst.SimpleStatementLine) -> None:
        """Called by the driver's ``leave_SimpleStatementLine`` handler: the notes about parts of
        this line go on the line itself (a rewrite of the line may rebuild its parts)."""
        for message in self._accumulation.line_notes:
            self._edit(updated, "accumulation", message)
        self._accumulation.line_notes = []
        counter = self._accumulation.counter_lines.get(id(original))
        if counter is not None:
            self._edit(updated, "throughput", f"`{counter}` counts this process's share only "
                       "(each process trains on batches of its own): the whole job's is × "
                       f"`{self.rt}.world_size()`")

    def _count_all_processes(self, assign: cst.Assign) -> cst.Assign:
        """``tokens_processed = B * T * grad_accum_steps`` → ``... * rt.world_size()``."""
        if not _is_counter(assign) or not self._accumulation.micro_steps:
            return assign
        name = assign.targets[0].target.value
        counts = {f.count for f in self._accumulation.micro_steps.values() if f.sharded}
        if not (set(_factors(assign.value)) & counts) or self._accumulation.micro_depth:
            return assign
        value = cst.BinaryOperation(left=assign.value, operator=cst.Multiply(),
                                    right=self._rt_call("world_size"))
        new = assign.with_changes(value=value)
        self._edit(new, "accumulation", f"`{name}` counts every process's share of the step "
                   f"(× `{self.rt}.world_size()`; the same number at world size 1)")
        return new


def _is_counter(assign: cst.Assign) -> bool:
    """``tokens_processed = ...``: one name about tokens or samples."""
    return (len(assign.targets) == 1 and type(assign.targets[0].target) is cst.Name
            and bool(_THROUGHPUT.search(assign.targets[0].target.value)))


def _is_counter_line(line: cst.SimpleStatementLine) -> bool:
    return any(type(small) is cst.Assign and _is_counter(small) for small in line.body)


def _short(code: str, width: int = 40) -> str:
    text = " ".join(code.split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _factors(node: cst.BaseExpression) -> list[str]:
    """The factors of a product, as code: ``B * T * n`` → ``["B", "T", "n"]``; [] for anything
    that is not a product at its top (``a * b + c``: multiplying it would change its sense)."""
    node = _strip_parens(node)
    if not (type(node) is cst.BinaryOperation and type(node.operator) is cst.Multiply):
        return []
    found: list[str] = []
    for side in (node.left, node.right):
        side = _strip_parens(side)
        inner = _factors(side)
        found.extend(inner or [_code(side)])
    return found


# ---------------------------------------------------------------- the analysis before the rewrite
class _MicroStepFinder(cst.CSTVisitor):
    """Finds micro-step loops, each directly in the body of a loop that steps an optimizer."""

    def __init__(self) -> None:
        self.loops: list[tuple[cst.For, _MicroSteps]] = []
        self._module: cst.Module | None = None

    def visit_Module(self, node: cst.Module) -> None:
        self._module = node

    def visit_For(self, node: cst.For) -> None:
        self._look(node)

    def visit_While(self, node: cst.While) -> None:
        self._look(node)

    def _look(self, outer: cst.For | cst.While) -> None:
        if type(outer.body) is not cst.IndentedBlock:
            return
        body = list(outer.body.body)
        for index, stmt in enumerate(body):
            found = _micro_steps(stmt, outer)
            if found is None:
                continue
            found.sums, found.unread = _loss_sums(stmt, body[:index], body[index + 1:], outer,
                                                  self._module)
            found.last_loss = _last_loss_lines(stmt, body[index + 1:], found.count)
            self.loops.append((stmt, found))


def _micro_steps(stmt: cst.BaseStatement, outer: cst.For | cst.While) -> _MicroSteps | None:
    """``for micro_step in range(count):`` whose body calls backward, divides by ``count`` and
    steps nothing, in a loop body that steps an optimizer after it."""
    if not (type(stmt) is cst.For and type(stmt.target) is cst.Name
            and type(stmt.iter) is cst.Call and dotted_name(stmt.iter.func) == "range"
            and len(stmt.iter.args) == 1 and stmt.orelse is None):
        return None
    count = stmt.iter.args[0].value
    if dotted_name(count) is None:
        return None
    calls = _MethodCalls()
    walk(stmt.body, calls)
    if "backward" not in calls.methods or "step" in calls.methods:
        return None
    code = _code(count)
    if not _divides_by(stmt.body, code):
        return None
    outer_calls = _MethodCalls()
    walk(outer.body, outer_calls)
    if "step" not in outer_calls.methods:
        return None
    return _MicroSteps(count=code, target=stmt.target.value,
                       losses=_backward_receivers(stmt.body) - {code},
                       backwards=calls.backwards, nexts=calls.nexts)


class _MethodCalls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.methods: set[str] = set()
        self.backwards: set[int] = set()
        self.nexts: list[cst.BaseExpression] = []

    def visit_Call(self, node: cst.Call) -> None:
        if type(node.func) is cst.Attribute:
            self.methods.add(node.func.attr.value)
            if node.func.attr.value == "backward":
                self.backwards.add(id(node))
        elif dotted_name(node.func) == "next" and node.args:
            self.nexts.append(node.args[0].value)


def _divides_by(body: cst.CSTNode, count: str) -> bool:
    """Does ``body`` divide something by ``count`` (``loss / count``, ``loss /= count``)?"""
    finder = _Divisions()
    walk(body, finder)
    return count in finder.divisors


class _Divisions(cst.CSTVisitor):
    def __init__(self) -> None:
        self.divisors: set[str] = set()

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        if type(node.operator) is cst.Divide:
            self.divisors.add(_code(_strip_parens(node.right)))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if type(node.operator) is cst.DivideAssign:
            self.divisors.add(_code(_strip_parens(node.value)))


def _loss_sums(loop: cst.For, before: list, after: list, outer: cst.For | cst.While,
               module: cst.Module | None) -> tuple[dict[str, cst.If | None], set[str]]:
    """``loss_accum`` of ``loss_accum = 0.0`` before the micro-steps and ``loss_accum +=
    loss.detach()`` in them → the ``if`` after them where it is read, or None; and the sums
    read nowhere."""
    zeroed = {name for stmt in before for name in _zeroed(stmt)}
    sums: dict[str, cst.If | None] = {}
    unread: set[str] = set()
    adds = _AddsTo()
    walk(loop.body, adds)
    losses = _backward_receivers(loop.body)
    for name, values in adds.added.items():
        if name not in zeroed or not any(_names_in(v) & losses for v in values):
            continue
        if module is not None and _count_name(module, name) == _own_uses(loop, name):
            unread.add(name)  # no collective for it
            continue
        sums[name] = _read_in_one_if(name, loop, after, outer, module)
    return sums, unread


def _zeroed(stmt: cst.BaseStatement) -> list[str]:
    if type(stmt) is not cst.SimpleStatementLine:
        return []
    names = []
    for small in stmt.body:
        if type(small) is cst.Assign and type(small.value) in (cst.Integer, cst.Float) \
                and literal_value(small.value) == 0:
            names.extend(t.target.value for t in small.targets
                         if type(t.target) is cst.Name)
    return names


class _AddsTo(cst.CSTVisitor):
    def __init__(self) -> None:
        self.added: dict[str, list[cst.BaseExpression]] = {}

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if type(node.operator) is cst.AddAssign and type(node.target) is cst.Name:
            self.added.setdefault(node.target.value, []).append(node.value)


def _backward_receivers(body: cst.CSTNode) -> set[str]:
    """``loss`` of ``loss.backward()`` (and of ``scaler.scale(loss).backward()``)."""
    found: set[str] = set()

    class _Visitor(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if type(node.func) is cst.Attribute and node.func.attr.value == "backward":
                found.update(_names_in(node.func.value))

    walk(body, _Visitor())
    return found


def _read_in_one_if(name: str, loop: cst.For, after: list, outer: cst.For | cst.While,
                    module: cst.Module | None) -> cst.If | None:
    """The one ``if`` directly after the micro-steps whose body holds every read of ``name``
    outside them, when its test is the same on every process; None otherwise."""
    total = _count_name(module, name) if module is not None else 0
    own = _own_uses(loop, name)
    reading = [stmt for stmt in after if _count_name(stmt, name)]
    if len(reading) != 1 or type(reading[0]) is not cst.If:
        return None
    test_if = reading[0]
    if _count_name(test_if.body, name) != total - own or _count_name(test_if.test, name):
        return None
    changing = _assigned_in(outer.body)
    if _names_in(test_if.test) & changing:
        return None  # a test computed in the step may differ between processes
    return test_if


def _own_uses(loop: cst.For, name: str) -> int:
    """Its ``+=`` in the micro-steps, and its zeroing above them."""
    return _count_name(loop.body, name) + 1


def _count_name(node: cst.CSTNode, name: str) -> int:
    class _Counter(cst.CSTVisitor):
        count = 0

        def visit_Name(self, inner: cst.Name) -> None:
            if inner.value == name:
                _Counter.count += 1

    counter = _Counter()
    walk(node, counter)
    return _Counter.count


def _assigned_in(body: cst.CSTNode) -> set[str]:
    """Names the loop body assigns, except counters stepped by a number (``iter_num += 1``)."""
    found: set[str] = set()

    class _Visitor(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            found.update(_names_in(node.target))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if type(node.value) not in (cst.Integer, cst.Float):
                found.update(_names_in(node.target))

        def visit_For(self, node: cst.For) -> None:
            found.update(_names_in(node.target))

    walk(body, _Visitor())
    return found


def _last_loss_lines(loop: cst.For, after: list, count: str) -> list[cst.SimpleStatementLine]:
    """Lines after the micro-steps that scale the last micro-step's loss back up
    (``lossf = loss.item() * gradient_accumulation_steps``): one micro-batch's loss."""
    losses = _backward_receivers(loop.body)
    lines: list[cst.SimpleStatementLine] = []

    class _Visitor(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            for small in node.body:
                if type(small) is cst.Assign and count in _factors(small.value) \
                        and _names_in(small.value) & losses:
                    lines.append(node)
                    return

    for stmt in after:
        walk(stmt, _Visitor())
    return lines


def _count_lines(module: cst.Module, counts: set[str]) -> dict[str, _Count]:
    """Each count name set exactly once in the file (a plain name), with whether it stands for
    a declared total batch: a floor division (``total_batch_size // (B * T)``), or a number
    whose comment says so."""
    if not counts:  # no micro-step loop: nothing to look for (most files)
        return {}
    lines: dict[str, list[cst.SimpleStatementLine]] = {}
    changed: set[str] = set()

    class _Visitor(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            for small in node.body:
                if type(small) is cst.Assign:
                    for target in small.targets:
                        for name in _names_in(target.target) & counts:
                            lines.setdefault(name, []).append(node)
                elif type(small) in (cst.AugAssign, cst.AnnAssign):
                    changed.update(_names_in(small.target) & counts)

    walk(module, _Visitor())
    found: dict[str, _Count] = {}
    for name, where in lines.items():
        if len(where) != 1 or name in changed or len(where[0].body) != 1:
            continue
        assign = where[0].body[0]
        if not (type(assign) is cst.Assign and len(assign.targets) == 1
                and type(assign.targets[0].target) is cst.Name):
            continue
        comment = where[0].trailing_whitespace.comment
        split = _has_floor_division(assign.value) or (
            _is_number(assign.value) and comment is not None
            and bool(_DECLARED_TOTAL.search(comment.value)))
        found[name] = _Count(line=where[0], split=split)
    return found


def _has_floor_division(node: cst.BaseExpression) -> bool:
    node = _strip_parens(node)
    return type(node) is cst.BinaryOperation and type(node.operator) is cst.FloorDivide


def _is_number(node: cst.BaseExpression) -> bool:
    """``40``, ``5 * 8``: an integer written as literals."""
    node = _strip_parens(node)
    if type(node) is cst.Integer:
        return True
    return (type(node) is cst.BinaryOperation and type(node.operator) is cst.Multiply
            and _is_number(node.left) and _is_number(node.right))
