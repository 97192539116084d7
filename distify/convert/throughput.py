"""Throughput counters in a training loop whose processes train on batches of their own.

``num_tokens += X.numel()`` (nanoGPT, logged as the run's token count) or
``tok_per_step = args.batch_size * args.seq_length`` (feeding a logged tokens/s) counts what one
process trains on. On N processes that each train on their own batches, the job trains on N
times as many, and a log that reads the counter as the run's throughput is off by N. People
multiply by the world size by hand; whether the log means "the job" or "this GPU" is theirs to
say, so the line is reported, not rewritten (the counter stays exact per process).

A counter is a name with a prefix or suffix that makes it one (``num_tokens``, ``n_samples``,
``tokens_seen``, ``tok_per_step``, ``images_per_sec``, ``throughput``): a bare ``images`` or
``tokens`` is the batch itself. It is reported when it is set (``=``, ``+=``) inside a loop that
runs a backward on batches that differ between processes: the loop (or an ``enumerate``/
``tqdm``/``iter`` of it) iterates a DataLoader the file builds (prepared: sharded), calls
``next()`` on an iterator of one, or feeds its backward with per-process draws or a split
stream (:mod:`.randomness`, :mod:`.bptt`). Not reported: a counter computed from another
counter (``tokens_per_sec = tokens_processed / dt``: its source is the one that counts), and
counters of micro-steps, which :mod:`.accumulation` multiplies by the world size itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import libcst as cst

from distify.analysis.loaders import unwrapped
from distify.analysis.names import dotted_name
from distify.analysis.stops import calls_in
from distify.analysis.walk import walk
from distify.convert.syntax import _code, _names_in

_NOUN = r"(tok|toks|tokens?|samples?|examples?|images?|imgs|seqs?|sequences|words|chars)"
#: a throughput counter's name: a noun with a counting prefix or suffix, or "throughput"
COUNTER = re.compile(rf"^((num|n|total|nb)_{_NOUN}(_\w+)?|{_NOUN}_(per_\w+|seen|processed|"
                     rf"done|so_far|count|total|trained)|\w*throughput\w*)$", re.I)


def names_a_counter(names: Iterable[str]) -> bool:
    """Is one of ``names`` (the names the file binds: ``FileFacts.bound``)
    a counter's? Without one, :func:`counter_lines` finds nothing and need not walk."""
    return any(COUNTER.match(name) for name in names)


def counter_lines(module: cst.Module, loaders: set[str], iterators: set[str],
                  fed_backwards: set[int], micro_counts: set[str]) -> dict[int, str]:
    """``id`` of each line (``SimpleStatementLine``) that sets a throughput counter in a
    training loop over per-process batches → the counter's name.

    Args:
        loaders, iterators: names bound to a DataLoader the file builds / ``iter()`` of one.
        fed_backwards: ids of backward calls fed by per-process draws or a split stream.
        micro_counts: the micro-step counts (their counters belong to :mod:`.accumulation`).
    """
    finder = _Finder(loaders, iterators, fed_backwards, micro_counts)
    walk(module, finder)
    return finder.found


class _Finder(cst.CSTVisitor):
    def __init__(self, loaders: set[str], iterators: set[str], fed: set[int],
                 micro_counts: set[str]) -> None:
        self.loaders, self.iterators, self.fed = loaders, iterators, fed
        self.micro_counts = micro_counts
        self.depth = 0  # training loops over per-process batches we are in
        self.loops: list[bool] = []
        self.found: dict[int, str] = {}

    def _enter(self, node: cst.For | cst.While) -> None:
        yes = _trains(node) and (self._over_a_loader(node) or self._fed(node))
        self.loops.append(yes)
        self.depth += yes

    def _leave(self) -> None:
        self.depth -= self.loops.pop()

    def visit_For(self, node: cst.For) -> None:
        self._enter(node)

    def leave_For(self, original_node: cst.For) -> None:
        self._leave()

    def visit_While(self, node: cst.While) -> None:
        self._enter(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._leave()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return self.depth == 0  # a def inside the loop runs when called, not per batch

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if not self.depth:
            return
        for small in node.body:
            name, value = _counter_set(small)
            if name is None or not COUNTER.match(name):
                continue
            used = _names_in(value) if value is not None else set()
            if any(COUNTER.match(other) for other in used) or used & self.micro_counts \
                    or any(count in _code(value) for count in self.micro_counts if "." in count):
                continue
            self.found[id(node)] = name

    def _over_a_loader(self, node: cst.For | cst.While) -> bool:
        if type(node) is cst.For:
            source = unwrapped(node.iter, dotted_name)  # no imports here: names as written
            if _code(source) in self.loaders or _code(source) in self.iterators:
                return True
        nexts = [call.args[0].value for call in calls_in(node.body, definitions=False)
                 if dotted_name(call.func) == "next" and call.args]
        return any(_code(it) in self.iterators or (
            type(it) is cst.Call and dotted_name(it.func) == "iter" and it.args
            and _code(it.args[0].value) in self.loaders) for it in nexts)

    def _fed(self, node: cst.For | cst.While) -> bool:
        return bool(_backwards(node) & self.fed)


def _counter_set(small: cst.BaseSmallStatement) -> tuple[str | None, Any]:
    if type(small) is cst.Assign and len(small.targets) == 1 \
            and type(small.targets[0].target) is cst.Name:
        return small.targets[0].target.value, small.value
    if type(small) is cst.AugAssign and type(small.target) is cst.Name \
            and type(small.operator) is cst.AddAssign:
        return small.target.value, small.value
    return None, None


def _trains(node: cst.For | cst.While) -> bool:
    return bool(_backwards(node))


def _backwards(node: cst.For | cst.While) -> set[int]:
    """Ids of the ``X.backward(...)`` calls in the loop's body (not in a nested def)."""
    return {id(call) for call in calls_in(node.body, definitions=False)
            if type(call.func) is cst.Attribute and call.func.attr.value == "backward"}
