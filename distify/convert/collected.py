"""Metrics kept in containers in a loop over a DataLoader: per-class tallies and collected
predictions.

- a tally filled by index (``class_correct[label] += c[i].item()``, ``confusion[t, p] += 1``,
  ``counts += np.bincount(y, minlength=10)``) in a container made of zeros before the loop (a
  list ``[0.] * 10`` / ``list(0. for i in range(10))``, ``np.zeros``, ``torch.zeros``, a dict
  ``{c: 0 for c in classes}``, ``defaultdict(int)``, ``Counter()``) → ``x = rt.reduce(x)``
  right after the loop: summed elementwise over all processes, same type, before anything
  reads it (so a division by a class's total divides by the whole set's);
- predictions accumulated into an array (``all_preds = np.append(all_preds, p)``,
  ``np.concatenate([all_preds, p])``, ``torch.cat((all_preds, p))``) → the batch's part
  gathered as it is added (``rt.gather_for_metrics(p)``), like a list's ``append``;
- lists filled one item at a time in an inner loop (``for i in range(len(out)):
  hypotheses.append(decode(out[i]))``, references for BLEU): the processes' inner loops run
  different numbers of times, so nothing is gathered inside; every list the loop fills is
  gathered after it instead (``x = rt.gather_list(x)``, rank by rank), which keeps
  hypotheses and references paired.

What it deliberately does not do: a tally made elsewhere (a parameter, another function's, an
attribute), one changed otherwise in the loop (``x[i] = ...``, ``x[i] -= ...``) or one that
goes on accumulating in an enclosing loop is reported with its line, not reduced; so is an
array of predictions in a loop whose lists are gathered after it. Item-by-item lists are
gathered only in evaluation (where no process repeats a sample).
"""

from __future__ import annotations

import libcst as cst

from distify.analysis.loaders import names_a_loader
from distify.analysis.names import dotted_name
from distify.analysis.walk import walk
from distify.convert.base import TransformerBase
from distify.convert.context import _Loop
from distify.convert.driver import handles
from distify.convert.loops import _per_sample
from distify.convert.syntax import _code, _is_rt_call, _is_zero, _strip_parens

#: calls that make a container of zeros to count into
_ZERO_MAKERS = frozenset({"numpy.zeros", "numpy.zeros_like", "torch.zeros", "torch.zeros_like"})
#: calls that make an empty dict counting from zero
_COUNTERS = frozenset({"collections.Counter", "collections.defaultdict"})
#: calls that grow an array of predictions by the batch's: ``x = f([x, batch])``
_GROWERS = frozenset({"numpy.append", "numpy.concatenate", "numpy.hstack", "numpy.vstack",
                      "torch.cat", "torch.concatenate", "torch.hstack", "torch.vstack"})


class CollectedMixin(TransformerBase):
    def _scope_tallies(self) -> dict[str, tuple[int, ...]]:
        scope = self._scope
        held = self.ctx.tallies.get(id(scope))
        if held is None or held[0] is not scope:
            held = self.ctx.tallies[id(scope)] = (scope, {})
        return held[1]

    # ------------------------------------------------------------ what the script builds
    @handles("visit_Assign")
    def _collected_on_assign(self, node: cst.Assign) -> None:
        tallies = self._scope_tallies()
        pairs = [(t.target, node.value) for t in node.targets]
        for target in node.targets:  # `matches, totals = [0] * n, [0] * n`
            if type(target.target) is cst.Tuple and type(node.value) is cst.Tuple \
                    and len(target.target.elements) == len(node.value.elements):
                pairs += [(e.value, v.value) for e, v in zip(target.target.elements,
                                                             node.value.elements)]
            elif type(target.target) is cst.Tuple and self.ctx.loops:
                # `inputs, labels = batch`: the batch's own values, per sample
                self.ctx.loops[-1].unpacked.update(
                    e.value.value for e in target.target.elements if type(e.value) is cst.Name)
        for target, value in pairs:
            if type(target) is cst.Name and _is_empty_list(value):  # `refs = list()`
                self._scope.lists.add(target.value)
            if type(target) is cst.Name:  # where each list starts empty, as for tallies
                key = f"list:{target.value}"
                if _is_empty_list(value) or (type(value) is cst.List and not value.elements):
                    tallies[key] = tuple(id(loop) for loop in self.ctx.loops)
                else:
                    tallies.pop(key, None)
            if type(target) is cst.Name:
                if self._zero_container(value):
                    tallies[target.value] = tuple(id(loop) for loop in self.ctx.loops)
                else:
                    tallies.pop(target.value, None)
            self._subscript_changed(target, node)

    @handles("visit_AugAssign")
    def _collected_on_aug_assign(self, node: cst.AugAssign) -> None:
        if not self.ctx.loops:
            return
        name = _subscripted(node.target)
        whole = type(node.target) is cst.Name and node.target.value
        adds = type(node.operator) is cst.AddAssign
        if name is None and not (whole and adds and whole in self._scope_tallies()):
            return
        name = name or whole
        if not adds and name not in self._scope_tallies():
            return  # `images[:, 0] *= 255`: not a tally
        for loop in self.ctx.loops:
            if not adds:
                loop.tally_odd.setdefault(name, node)
            loop.tallied.setdefault(name, node.value)

    def _subscript_changed(self, target: cst.BaseExpression, node: cst.CSTNode) -> None:
        name = _subscripted(target)
        if name is not None:
            for loop in self.ctx.loops:
                loop.tally_odd.setdefault(name, node)

    def _zero_container(self, value: cst.BaseExpression) -> bool:
        """``[0.] * 10``, ``list(0 for _ in range(n))``, ``[[0] * n for _ in range(n)]``,
        ``np.zeros(...)``, ``torch.zeros(...)``, ``{c: 0 for c in classes}``,
        ``dict.fromkeys(classes, 0)``, ``defaultdict(int)``, ``Counter()``."""
        value = _strip_parens(value)
        if type(value) is cst.List:
            return bool(value.elements) and all(
                _is_zero(e.value) or self._zero_container(e.value) for e in value.elements)
        if type(value) is cst.BinaryOperation and type(value.operator) is cst.Multiply:
            return self._zero_container(value.left) or self._zero_container(value.right)
        if type(value) in (cst.ListComp, cst.GeneratorExp):
            return _is_zero(value.elt) or self._zero_container(value.elt)
        if type(value) is cst.DictComp:
            return _is_zero(value.value)
        if type(value) is cst.Dict:
            return bool(value.elements) and all(
                type(e) is cst.DictElement and _is_zero(e.value) for e in value.elements)
        if type(value) is not cst.Call:
            return False
        qual = self._qual(value.func) or dotted_name(value.func)
        args = [a.value for a in value.args]
        if qual == "list" and len(args) == 1:
            return self._zero_container(args[0])
        if qual == "dict.fromkeys":
            return len(args) == 2 and _is_zero(args[1])
        if qual == "collections.Counter":
            return not args
        if qual == "collections.defaultdict":
            return len(args) == 1 and dotted_name(args[0]) in ("int", "float")
        return qual in _ZERO_MAKERS

    # ------------------------------------------------------------ loops
    @handles("visit_For")
    def _collected_on_for(self, node: cst.For) -> None:
        loop = self.ctx.loops[-1]
        if self._surely_a_loader(loop) and self._in_eval():
            inner = _InnerAppends()
            walk(node.body, inner)
            lists = self._scope.lists
            if inner.names & lists:  # every list it fills, to keep them paired
                loop.after = sorted(inner.names | inner.outer)
                loop.gathered.update(loop.after)

    def _surely_a_loader(self, loop: _Loop) -> bool:
        """Is the loop over a DataLoader, not over lists that a parameter's name merely
        suggests could be one (``zip(references, hypotheses)`` in a metric helper)?"""
        source = loop.loader
        return loop.loaderish and (source is None or source not in self._scope.params
                                   or names_a_loader(source))

    @handles("leave_Assign")
    def _collected_after_assign(self, original: cst.Assign, updated: cst.Assign):
        updated = self._gather_grown(original, updated)
        return updated

    def _gather_grown(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        """``all_preds = np.append(all_preds, p)`` in an evaluation loop over a loader, at
        the loop's level → ``np.append(all_preds, rt.gather_for_metrics(p))``."""
        loops = [loop for loop in self.ctx.loops if loop.loaderish]
        value = updated.value
        if not (loops and loops[-1] is self.ctx.loops[-1] and self._in_eval()
                and len(original.targets) == 1 and type(original.targets[0].target) is cst.Name
                and type(value) is cst.Call and value.args
                and self._qual(value.func) in _GROWERS):
            return updated
        loop, name = loops[-1], original.targets[0].target.value
        pieces = _grown_pieces(value, name)
        if pieces is None:
            return updated
        if loop.after:
            loop.tally_odd.setdefault(f"array:{name}", original)
            return updated
        holder, index = pieces
        part = holder[index].value
        if _is_rt_call(part, self.rt, "gather_for_metrics"):
            return updated
        if not _per_sample(_grown_pieces(original.value, name)[0][index].value,
                           loop.targets | loop.assigned | loop.unpacked):
            self._edit(updated, "gather", f"`{name}` collects a per-batch value on each "
                       "process (not per-sample results): it holds this process's batches only; "
                       f"gather it yourself (`{name} = {self.rt}.gather({name})` after the loop, "
                       "rank by rank) before computing a metric", human=True)
            return updated
        if self._skipped("gather-predictions", updated):
            return updated
        gathered = self._rt_call("gather_for_metrics", part)
        new_value = _replace_piece(value, holder, index, gathered)
        for each in self.ctx.loops:
            each.gathered.add(name)
        self._edit(gathered, "gather", f"`{name}` grows by each batch's results gathered from "
                   "every process (samples repeated to pad a shard dropped), so it holds the "
                   "whole set once; within a batch they come process by process, so pair it "
                   "with labels collected the same way, not with the data set's order")
        return updated.with_changes(value=new_value)

    def _after_loop_metrics(self, node: cst.For, loop: _Loop,
                            evaluating: bool) -> list[cst.BaseStatement]:
        """The lines after a loop over a loader that reduce its tallies and gather its
        item-by-item lists (called by :mod:`.loops` as it leaves the loop)."""
        lines: list[cst.BaseStatement] = []
        if not self._surely_a_loader(loop):
            return lines
        outside = tuple(id(each) for each in self.ctx.loops)
        tallies = self._scope_tallies()
        for name, added in loop.tallied.items():
            if name not in tallies and name in loop.assigned | loop.targets | loop.unpacked:
                continue  # the batch's own tensor (`out[mask] += 1`), not a tally
            line = self._reduce_tally(node, name, added, loop, evaluating, tallies.get(name),
                                      outside)
            if line is not None:
                lines.append(line)
        for outer in self.ctx.loops:  # summed here: no longer a tally out there
            for name in loop.tallied:
                outer.tallied.pop(name, None)
        for key, node in loop.tally_odd.items():
            if key.startswith("array:"):
                name = key.split(":", 1)[1]
                self._edit(node, "gather", f"`{name}` collects this process's predictions only: "
                           "this loop's lists are gathered after it, so gather it there too "
                           f"(`{name} = {self.rt}.gather({name})` after the loop) to keep "
                           "them paired", human=True)
        if loop.after and not loop.has_backward:
            inside = (*outside, id(loop))
            after = [n for n in loop.after  # not a list made anew in the loop (`words = []`)
                     if tallies.get(f"list:{n}", ())[:len(inside)] != inside]
            lasting = [n for n in after if tallies.get(f"list:{n}") != outside]
            if lasting:  # gathered again every time round: gather none, to keep them paired
                self._edit(node.target, "gather", f"{', '.join(f'`{n}`' for n in after)} "
                           "collect this process's items only, and "
                           f"{', '.join(f'`{n}`' for n in lasting)} is not emptied right before "
                           "this loop in this function (it is made elsewhere, or goes on filling "
                           "in an enclosing loop): gather them yourself once they are complete "
                           f"(`x = {self.rt}.gather_list(x)`)", human=True)
                return lines
            for name in after:
                line = cst.SimpleStatementLine([cst.Assign(
                    targets=[cst.AssignTarget(cst.Name(name))],
                    value=self._rt_call("gather_list", cst.Name(name)))])
                self._edit(line, "gather", f"`{name}` gathered from every process after the "
                           "loop, rank by rank: it is filled item by item, and the processes' "
                           "inner loops run different numbers of times, so nothing is gathered "
                           "inside; evaluation repeats no sample, so it holds the whole set "
                           f"once, in the same order as {_others(name, after)}")
                lines.append(line)
        return lines

    def _report_per_process(self, node: cst.For, loop: _Loop) -> None:
        """A loop over a loader that neither trains nor is known to evaluate: its tallies and
        the lists it fills stay per process (called by :mod:`.loops`)."""
        names = [*loop.tallied, *(n for n in loop.appended if n not in loop.gathered)]
        if names:
            listed = ", ".join(f"`{n}`" for n in names)
            self._edit(node.target, "reduce", f"{listed} filled from this process's shard only: "
                       "this loop neither trains nor runs under `torch.no_grad()` / after "
                       "`model.eval()`; add one of those, or sum it (`x = "
                       f"{self.rt}.reduce(x)`) or gather it (`x = {self.rt}.gather_list(x)`) "
                       "yourself after the loop", human=True)

    def _reduce_tally(self, node: cst.For, name: str, added: cst.BaseExpression, loop: _Loop,
                      evaluating: bool, made_in: tuple[int, ...] | None,
                      outside: tuple[int, ...]) -> cst.SimpleStatementLine | None:
        anchor = loop.tally_odd.get(name)
        if made_in is None or anchor is not None or made_in != outside:
            if made_in is None:
                why = ("it is not made of zeros in this function before the loop (a parameter, "
                       "another function's or an attribute)")
            elif anchor is not None:
                why = "the loop also changes it otherwise (`" + _code(anchor).strip() + "`)"
            else:
                why = "it goes on accumulating in the enclosing loop"
            self._edit(node.target, "reduce", f"`{name}` is added to by "
                       f"index on this process's shard only and {why}: sum it over the processes "
                       f"yourself (`{name} = {self.rt}.reduce({name})`, elementwise, same type) "
                       "before it is read", human=True)
            return None
        line = cst.SimpleStatementLine([cst.Assign(
            targets=[cst.AssignTarget(cst.Name(name))],
            value=self._rt_call("reduce", cst.Name(name)))])
        self._edit(line, "reduce", _tally_message(name, added, evaluating))
        self._collective_placed()
        return line


def _tally_message(name: str, added: cst.BaseExpression, evaluating: bool) -> str:
    """What the elementwise sum guarantees, and no more."""
    head = (f"`{name}` summed elementwise over all processes after the loop (same type), "
            "before it is read: ")
    if not evaluating:
        return head + ("it covers every process's batches, but a training loader repeats a few "
                       "samples to pad the shards when the data set does not divide evenly, so "
                       "it can exceed the single-process counts by those")
    if _counts_samples(added):
        return head + ("each process counted its own samples and evaluation repeats none, so "
                       "every entry equals the single-process value")
    return head + (f"it adds `{_code(added).strip()}`, which distify cannot tell is a per-sample "
                   "value: every entry covers all processes' batches, and equals the "
                   "single-process value only if each addition is a per-sample count or sum")


def _counts_samples(value: cst.BaseExpression) -> bool:
    """``1``, ``c[i].item()``, ``(p == t).sum().item()``, ``np.bincount(...)``: per-sample."""
    value = _strip_parens(value)
    if type(value) in (cst.Integer, cst.Float, cst.Subscript):
        return True
    code = _code(value)
    return any(part in code for part in ("[i]", ".sum(", "bincount", "confusion_matrix")) or (
        type(value) is cst.Call and type(value.func) is cst.Attribute
        and value.func.attr.value == "item" and type(value.func.value) is cst.Subscript)


def _is_empty_list(value: cst.BaseExpression) -> bool:
    return type(value) is cst.Call and dotted_name(value.func) == "list" and not value.args


def _subscripted(target: cst.BaseExpression) -> str | None:
    """``x`` of ``x[i]``, ``x[t, p]``, ``x[t][p]``."""
    if type(target) is not cst.Subscript:
        return None
    while type(target) is cst.Subscript:
        target = target.value
    return target.value if type(target) is cst.Name else None


def _grown_pieces(call: cst.Call, name: str) -> tuple[list[cst.BaseElement | cst.Arg], int] | None:
    """Where the new part is in ``np.append(name, part)`` / ``np.concatenate([name, part])``:
    the sequence holding it and its index; None for any other shape."""
    args = [a for a in call.args if a.keyword is None]
    first = args[0].value if args else None
    if len(args) == 2 and type(first) is cst.Name and first.value == name:
        return list(call.args), call.args.index(args[1])
    if len(args) == 1 and type(first) in (cst.List, cst.Tuple) and len(first.elements) == 2:
        head = first.elements[0].value
        if type(head) is cst.Name and head.value == name:
            return list(first.elements), 1
    return None


def _replace_piece(call: cst.Call, holder: list, index: int,
                   gathered: cst.BaseExpression) -> cst.Call:
    if type(holder[index]) is cst.Arg:
        args = list(call.args)
        args[index] = args[index].with_changes(value=gathered)
        return call.with_changes(args=args)
    arg = next(a for a in call.args if a.keyword is None)
    seq = arg.value
    elements = list(seq.elements)
    elements[index] = elements[index].with_changes(value=gathered)
    args = [a.with_changes(value=seq.with_changes(elements=elements)) if a is arg else a
            for a in call.args]
    return call.with_changes(args=args)


def _others(name: str, names: list[str]) -> str:
    rest = [f"`{n}`" for n in names if n != name]
    return "the data set's order on one process" if not rest else \
        ", ".join(rest) + " (so their items stay paired)"


class _InnerAppends(cst.CSTVisitor):
    """The names appended to (``x.append``/``x.extend``) inside a loop within a loop body
    (``inner``), and outside one (``outer``); nested functions are not looked into."""

    def __init__(self) -> None:
        self.depth = 0
        self.names: set[str] = set()
        self.outer: set[str] = set()

    def visit_For(self, node: cst.For) -> None:
        self.depth += 1

    def leave_For(self, node: cst.For) -> None:
        self.depth -= 1

    def visit_While(self, node: cst.While) -> None:
        self.depth += 1

    def leave_While(self, node: cst.While) -> None:
        self.depth -= 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Attribute and func.attr.value in ("append", "extend") \
                and type(func.value) is cst.Name:
            (self.names if self.depth else self.outer).add(func.value.value)

