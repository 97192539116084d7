"""Data-dependent exits from training loops, decided alike on every process (issue 12 item 7).

Each process trains on its own batches, so ``if loss.item() < 1.0: break`` may be true on one
process and not on another: that one leaves, and the others wait for it in DDP's next
all-reduce. Where :mod:`distify.analysis.stops` proves that every process reaches the test the
same number of times, the test is decided on all of them at once:

- one ordering comparison of a per-process value that ends the loop → that value averaged
  over the processes: ``if loss.item() < 1.0:`` → ``if rt.reduce(loss.item(), op="mean") <
  1.0:``, ``while loss > eps:`` → ``while rt.reduce(loss, op="mean") > eps:``;
- one comparison of a batch's largest (smallest) value → the largest (smallest) of the
  processes': ``if batch.abs().max() > limit:`` → ``if rt.reduce(batch.abs().max(),
  op="max") > limit:`` (the global batch's maximum);
- any other test, and every test that ends the process or skips the step (``sys.exit``,
  ``continue``, never on the mean) → decided whole, as soon as any process would:
  ``if not math.isfinite(loss_value):`` → ``if rt.any_process(not math.isfinite(loss_value)):``
  (``while rt.all_processes(...):`` for a ``while`` test);
- a test in a local function the training loop calls (``sanity_check(batch)``, whose ``if``
  calls ``sys.exit``) → decided the same way in that function, once the whole file is seen
  (:meth:`StopMixin._stops_after_module`), where every call of the function in the file is one the
  analysis placed in a training loop; else reported at the test (and a ``print`` right before
  the ``sys.exit`` then stays a plain ``print``, so a process that leaves alone says why). A
  function defined below the loop is followed in its def as written, and its test is moved to
  the rewritten def when that is left.

In a single process ``reduce`` returns its input and the helpers are ``bool(test)``: the script
computes what the original computes. A test whose values already agree on every process (a step
counter, ``args.dry_run``, a reduced validation loss, a patience counter fed by one) is left as
it is, without a note. Where a collective would not be reached alike (under a branch on a
per-process value, after a ``continue`` only some processes take, in an evaluation loop, in a
block that runs on the main process only, in a loop that can also be left unevenly) the test is
left as written and reported with why.

A ``continue`` on a per-process test is decided the same way when the rest of the step it skips
needs every process (a backward, a collective, an optimizer's ``step``); one after the step's
work is left alone. What it does not do: rewrite exits of loops that do not train.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import libcst as cst

from distify.analysis.names import dotted_name
from distify.analysis.stops import (
    FileFunctions,
    NestContext,
    Stop,
    calls_in,
    find_stops,
    local_callee,
    optimizer_work,
    statement_calls,
)
from distify.analysis.walk import walk
from distify.convert.base import TransformerBase
from distify.convert.driver import handles
from distify.convert.syntax import _EQUAL, _code, _leaves_loop, _strip_parens

_SPACE = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


@dataclass(slots=True)
class StopState:
    """What :class:`StopMixin` keeps while it walks one module (``self._stops``)."""

    #: local defs, as rewritten (None for a name defined twice)
    functions: dict[str, cst.FunctionDef | None]
    #: the calls of those defs, followed (:class:`~distify.analysis.stops.FileFunctions`)
    file_functions: FileFunctions
    #: every def of the file as written (None for a name defined twice): a function that may
    #: end the process is followed even when it is defined below the loop that calls it
    #: (``main()`` above ``sanity_check``); its tests move to the rewritten def when it is left
    originals: dict[str, cst.FunctionDef | None]
    #: the calls of the defs as rewritten, or as written where not rewritten yet
    exits: FileFunctions
    #: the names of the functions that train (call a backward)
    training_functions: frozenset[str]
    #: ids of the loop nests with an exit to decide
    nests_with_exits: set[int] = field(default_factory=set)
    #: nests with a collective in a branch (an ``if``, a handler, a ``match`` case) inside
    #: them: their ``if`` tests are analysed even without exits
    gated_nests: set[int] = field(default_factory=set)
    #: branches around the node being visited
    branch_depth: int = 0
    #: ... around the current nest's outermost loop
    nest_branch_base: int = 0
    #: tests in local functions that the nests call (``sanity_check(x)``'s ``if ...:
    #: sys.exit(0)``), decided in ``_stops_after_module`` once every call is known: the test's
    #: node → (its decision, the calls of training loops that reach it)
    function_stops: dict[int, tuple[Stop, list[cst.Call]]] = field(default_factory=dict)
    #: ... found in a def not left yet, as written
    written: set[int] = field(default_factory=set)
    #: how many times the file calls each name (``f(...)``, ``self.f(...)``): counted in
    #: ``_stops_after_module``, only for a file with such tests
    calls_of: dict[str, int] = field(default_factory=dict)


class StopMixin(TransformerBase):
    _stops: StopState

    @handles("visit_Module")
    def _stops_on_module(self, node: cst.Module) -> None:
        functions: dict[str, cst.FunctionDef | None] = {}
        originals: dict[str, cst.FunctionDef | None] = {}
        for definition in _definitions(node):
            name = definition.name.value
            originals[name] = None if name in originals else definition
        self._stops = StopState(
            functions=functions, file_functions=FileFunctions(self.rt, functions),
            originals=originals, exits=FileFunctions(self.rt, _Either(functions, originals)),
            training_functions=frozenset(
                path[-1] for path in self.facts.training.backward_scopes if path))

    @handles("leave_FunctionDef")
    def _stops_after_function_def(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        """Record the def as rewritten (before the scope bookkeeping leaves it)."""
        name = updated.name.value
        # two functions of one name (methods of two classes): neither is known to agree
        self._stops.functions[name] = None if name in self._stops.functions else updated
        return updated

    @handles("leave_FunctionDef")
    def _stops_move_function_tests(self, original: cst.FunctionDef, updated: cst.FunctionDef):
        """Move the tests found in the def as written to the rewritten def (after the scope
        bookkeeping left it)."""
        if type(updated) is cst.FunctionDef and \
                self._stops.originals.get(updated.name.value) is original:
            self._move_tests(updated.name.value, updated)
        return updated

    def _move_tests(self, name: str, rewritten: cst.FunctionDef) -> None:
        """The tests found in ``name`` as written (it is defined below a loop that calls it),
        moved to the same tests in its rewritten def (found by their code); one not found
        there once is reported instead."""
        for key, (stop, calls) in list(self._stops.function_stops.items()):
            if stop.function != name or key not in self._stops.written:
                continue
            self._stops.written.discard(key)
            code = _code(stop.test)
            tests = [n for n in nodes_in(rewritten, cst.If) if _code(n.test) == code]
            operand = None
            if len(tests) == 1 and stop.operand is not None:
                wanted = _code(stop.operand)
                operand = next((n for n in nodes_in(tests[0].test, type(stop.operand))
                                if _code(n) == wanted), None)
            del self._stops.function_stops[key]
            if len(tests) != 1 or (stop.operand is not None and operand is None):
                stop = replace(stop, action="note", why=f"`{name}` was rewritten around it")
                self._stops.function_stops[key] = (stop, calls)
                continue
            moved = replace(stop, node=tests[0], test=tests[0].test, operand=operand)
            self._stops.function_stops[id(tests[0])] = (moved, calls)

    def _agrees(self, name: str) -> bool:
        """Does the local function ``name`` (defined above, as rewritten) return a value equal
        on every process?"""
        return self._stops.file_functions.agrees(name, self._nest_context())

    def _collective(self, call: cst.Call) -> bool:
        """Does ``call`` reach a collective: a runtime collective, or a local function (defined
        above, as rewritten) whose body calls one (an ``evaluate()`` whose sums were reduced)?"""
        return self._stops.file_functions.collective(call)

    def _collective_placed(self, call: cst.CSTNode | None = None) -> None:
        if not self.ctx.loops or self._stops.branch_depth <= self._stops.nest_branch_base:
            return
        if call is None or (type(call) is cst.Call and (
                self._collective(call) or any(type(arg.value) is cst.Call
                                              and self._collective(arg.value)
                                              for arg in call.args))):
            self._stops.gated_nests.add(id(self.ctx.loops[0]))

    def _branch_left(self) -> None:
        self._stops.branch_depth -= 1

    @handles("visit_ExceptHandler")
    def _stops_on_except_handler(self, node: cst.ExceptHandler) -> None:
        self._stops.branch_depth += 1

    @handles("leave_ExceptHandler")
    def _stops_after_except_handler(self, original: cst.ExceptHandler, updated: cst.ExceptHandler):
        self._stops.branch_depth -= 1
        return updated

    @handles("visit_MatchCase")
    def _stops_on_match_case(self, node: cst.MatchCase) -> None:
        self._stops.branch_depth += 1

    @handles("leave_MatchCase")
    def _stops_after_match_case(self, original: cst.MatchCase, updated: cst.MatchCase):
        self._stops.branch_depth -= 1
        return updated

    @handles("visit_For")
    def _stops_on_for(self, node: cst.For) -> None:
        if len(self.ctx.loops) == 1:
            self._stops.nest_branch_base = self._stops.branch_depth
            self._calls_exiting(node)

    def _calls_exiting(self, loop: cst.For | cst.While) -> None:
        """A nest that calls a local function that may end the process is analysed (a call
        that is a statement of its own or an assignment's value, ``sanity_check(x)``,
        ``x = clean(x)``: found without a walk of every expression, as this runs on every
        loop; a nest analysed for another reason follows every call)."""
        for call in statement_calls(loop.body):
            name = local_callee(call.func)
            if name is not None and self._stops.exits.exiting(name, self._is_exit):
                self._stops.nests_with_exits.add(id(self.ctx.loops[0]))
                return

    @handles("visit_If")
    def _stops_on_if(self, node: cst.If) -> None:
        self._stops.branch_depth += 1
        if self.ctx.loops and (any(
                _leaves_loop(body, self._ends) or _continues(body)
                for body in (node.body, node.orelse.body if type(node.orelse) is cst.Else
                             else None) if body is not None) or optimizer_work(node) is not None):
            self._stops.nests_with_exits.add(id(self.ctx.loops[0]))

    @handles("visit_While")
    def _stops_on_while(self, node: cst.While) -> None:
        if len(self.ctx.loops) == 1:
            self._stops.nest_branch_base = self._stops.branch_depth
            self._calls_exiting(node)
        if not (type(node.test) is cst.Name and node.test.value == "True"):
            self._stops.nests_with_exits.add(id(self.ctx.loops[0]))

    @handles("leave_For")
    def _stops_after_for(self, original: cst.For, updated: cst.For):
        return self._decide_stops(updated)

    @handles("leave_While")
    def _stops_after_while(self, original: cst.While, updated: cst.While):
        return self._decide_stops(updated)

    def _decide_stops(self, loop: cst.For | cst.While) -> cst.For | cst.While:
        """At the outermost loop of a function: rewrite or report the exits of the nest."""
        if len(self.ctx.loops) != 1 or (id(self.ctx.loops[0]) not in self._stops.nests_with_exits
                                     and id(self.ctx.loops[0]) not in self._stops.gated_nests):
            return loop
        self._stops.nests_with_exits.discard(id(self.ctx.loops[0]))
        replacements: dict[int, Callable[[cst.CSTNode], cst.CSTNode]] = {}
        for stop in find_stops(loop, self._nest_context()):
            if stop.calls:  # in a function the nest calls: decided with all its calls known
                if stop.function not in self._stops.functions:  # found in its def as written
                    self._stops.written.add(id(stop.node))
                known = self._stops.function_stops.get(id(stop.node))
                if known is not None:
                    calls = known[1] + [c for c in stop.calls if all(c is not k
                                                                     for k in known[1])]
                    stop = known[0] if stop.action != "note" else stop
                else:
                    calls = list(stop.calls)
                self._stops.function_stops[id(stop.node)] = (stop, calls)
                continue
            if stop.action == "note":
                self._edit(stop.test, "divergence", self._unsafe_message(stop), human=True)
                self._keep_reason(stop, replacements)
                continue
            if self._skipped("stops", stop.test):
                continue
            old, replace = self._decided(stop)
            replacements[id(old)] = replace
        return loop.visit(_Replace(loop, replacements, self._moved)) if replacements else loop

    def _keep_reason(self, stop: Stop,
                     replacements: dict[int, Callable[[cst.CSTNode], cst.CSTNode]]) -> None:
        """An exit only some processes may take (reported, not decided): the ``print`` right
        before its ``sys.exit`` stays a plain ``print``, so the process that leaves alone says
        why (``distify.print`` would show the main process's output only)."""
        if stop.how != "exit" or type(stop.node) is not cst.If \
                or type(stop.node.body) is not cst.IndentedBlock:
            return
        statements = stop.node.body.body
        for before, stmt in zip(statements, statements[1:]):
            if not (type(before) is cst.SimpleStatementLine
                    and type(stmt) is cst.SimpleStatementLine and len(before.body) == 1
                    and type(stmt.body[0]) is cst.Expr
                    and type(stmt.body[0].value) is cst.Call
                    and self._ends(stmt.body[0].value)):
                continue
            expr = before.body[0]
            call = expr.value if type(expr) is cst.Expr else None
            if type(call) is not cst.Call or dotted_name(call.func) != f"{self.rt}.print" \
                    or any("\n" in _code(arg) for arg in call.args):
                return
            plain = call.with_changes(func=cst.Name("print"),
                                      whitespace_before_args=cst.SimpleWhitespace(""))
            replacements[id(call)] = lambda updated, plain=plain: plain
            self.edits[:] = [edit for edit in self.edits if edit.node is not call]
            return

    @handles("leave_Module")
    def _stops_after_module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        """Decide the tests in local functions that training loops call (``sanity_check(x)``,
        whose ``if torch.isnan(batch).any(): sys.exit(0)`` ends one process): alike when
        every call of the function in the file is one the analysis placed (so every process
        reaches the collective in its test together), else reported at the test."""
        replacements: dict[int, Callable[[cst.CSTNode], cst.CSTNode]] = {}
        decided: dict[int, tuple[Stop, list]] = {}
        if self._stops.function_stops:
            for call in calls_in(original):
                name = local_callee(call.func)
                if name is not None:
                    self._stops.calls_of[name] = self._stops.calls_of.get(name, 0) + 1
        for stop, calls in self._stops.function_stops.values():
            name = stop.function or ""
            if stop.action == "note":
                self._edit(stop.test, "divergence", self._unsafe_message(stop), human=True)
                self._keep_reason(stop, replacements)
                continue
            placed: dict[str, int] = {}  # each function on the way, by its placed calls
            for call in calls:
                callee = local_callee(call.func) or ""
                placed[callee] = placed.get(callee, 0) + 1
            elsewhere, name = max((self._stops.calls_of.get(callee, 0) - count, callee)
                                  for callee, count in placed.items())
            if elsewhere > 0:
                self._edit(stop.test, "divergence", self._unsafe_message(replace(
                    stop, action="note", why=f"`{name}` is also called where not every "
                    f"process may reach it ({elsewhere} other call(s) in the file)")),
                    human=True)
                self._keep_reason(stop, replacements)
                continue
            if id(stop.node) in self._stops.written:  # its def was never left: not in the output
                self._edit(stop.test, "divergence", self._unsafe_message(replace(
                    stop, action="note", why=f"`{name}` could not be followed")), human=True)
                continue
            if self._skipped("stops", stop.test):
                continue
            edits = len(self.edits)
            old, change = self._decided(stop)
            replacements[id(old)] = change
            decided[id(old)] = (stop, self.edits[edits:])
        if replacements:
            applied: set[int] = set()
            updated = updated.visit(_Replace(updated, replacements, self._moved, applied))
            for key, (stop, edits) in decided.items():
                if key not in applied:  # the test is not in the output as found: say so
                    self.edits[:] = [e for e in self.edits if all(e is not x for x in edits)]
                    self._edit(stop.test, "divergence", self._unsafe_message(replace(
                        stop, action="note", why=f"`{stop.function}` was rewritten around "
                        "it")), human=True)
        return updated

    def _moved(self, old: cst.CSTNode, new: cst.CSTNode) -> None:
        """The rewrite rebuilt ``old`` as ``new``: the report's lines on it follow."""
        self.edits[:] = [replace(edit, node=new) if edit.node is old else edit
                         for edit in self.edits]

    def _nest_context(self) -> NestContext:
        return NestContext(rt=self.rt, qual=self._qual, is_loader=self._loaderish,
                           is_exit=self._is_exit,
                           is_imported=self.facts.imports.aliases.__contains__,
                           training_functions=self._stops.training_functions, agrees=self._agrees,
                           main_only=self.ctx.main_only_depth > 0, depth=self.ctx.depth,
                           collective=self._collective,
                           exiting=lambda name: self._stops.exits.exiting(name, self._is_exit),
                           ends=self._ends)

    def _ends(self, call: cst.Call) -> bool:
        """Does ``call`` end the process (``sys.exit(1)``, a local ``die(msg)`` that does)?"""
        return self._stops.exits.ends(call, self._is_exit)

    def _decided(self, stop: Stop) -> tuple[cst.CSTNode, Callable[[cst.CSTNode], cst.CSTNode]]:
        """The node to replace and how, with the report's line."""
        test = _one_line(stop.test)
        gate = stop.kind == "gate"
        where = f" in `{stop.function}`, which the training loop calls," if stop.function \
            else ""
        if stop.action == "reduce":
            operand = stop.operand
            new = cst.Call(func=self._rt_attr("reduce"), args=[
                cst.Arg(operand, comma=_SPACE),
                cst.Arg(cst.SimpleString(f'"{stop.op}"'), keyword=cst.Name("op"),
                        equal=_EQUAL)])
            if self._test_too_long(stop, stop.test.deep_replace(operand, new)):
                new = self._hanging_test(new)
            value = _one_line(operand)
            if stop.op == "mean":
                on = (f"on the mean of `{value}` over all processes (the global batch's value "
                      "when the batches are equal in size, what one process training on all "
                      "of them would compare)")
            else:
                on = (f"on the {'largest' if stop.op == 'max' else 'smallest'} `{value}` of "
                      f"all processes (the global batch's {stop.op}imum: the test holds as soon "
                      f"as it would on any process's batch)" if _holds_on_any(stop) else
                      f"on the {'largest' if stop.op == 'max' else 'smallest'} `{value}` of "
                      f"all processes (the global batch's {stop.op}imum)")
            self._edit(new, "stop", f"`{test}`{where} is decided {on}: "
                       f"{self._outcome(stop, 'at the same step')} (in a single process, the "
                       "original value)")
            return operand, lambda updated: new
        helper = "any_process" if stop.action == "any" else "all_processes"
        new = self._rt_call(helper, _strip_parens(stop.test))
        if self._test_too_long(stop, new):
            new = self._hanging_test(new)
        if stop.action == "any" or gate:
            what = self._outcome(stop, "when any of them would")
        elif stop.kind == "work":
            what = ("every process takes the `if` branch only when the test holds on every "
                    f"process, else none does {self._to_work(stop)}, so the replicas stay equal")
        elif stop.how == "continue":
            what = ("every process goes on with the step only when the test holds on every "
                    "process, else all skip it")
        elif stop.how == "while":
            what = "the loop goes on while the test holds on every process, so all leave together"
        else:
            what = "every process goes on only while the test holds on every process, so all " \
                "leave together"
        self._edit(new, "stop", f"`{test}`{where} is decided alike on every process "
                   f"(`{self.rt}.{helper}`): {what} (in a single process, the test itself)")
        space = "whitespace_before_test" if type(stop.node) is cst.If \
            else "whitespace_after_while"  # `if(a and b):` needs one once its parens go
        return stop.node, lambda updated: updated.with_changes(
            test=new, **{space: cst.SimpleWhitespace(" ")})

    def _outcome(self, stop: Stop, when: str) -> str:
        """What deciding ``stop`` alike does, for the report."""
        if stop.kind == "gate":
            return f"every process takes the branch {self._to_collective(stop)} {when}"
        if stop.kind == "work":
            return (f"every process takes the `if` branch {when} {self._to_work(stop)}, so "
                    "the replicas stay equal")
        if stop.how == "continue":
            return (f"every process skips the rest of the step {when} (a process skipping "
                    "alone would leave the others waiting in the next gradient all-reduce)")
        if stop.how == "exit":
            return f"every process ends {when}, not one alone while the others wait for it"
        if when == "when any of them would":
            return "all processes leave the loop at the first step at which any of them would"
        return f"every process leaves the loop {when}"

    def _to_collective(self, stop: Stop) -> str:
        """How a gate's branch reaches its collective, for the report."""
        call = _one_line(stop.collective) if stop.collective is not None else "a collective"
        if len(call) > 60:
            call = call[:57] + "..."
        return f"(to `{call}`, which every process must join)"

    def _to_work(self, stop: Stop) -> str:
        """What a ``work`` decision's branch does to the optimizer's work, for the report."""
        what = _one_line(stop.collective) if stop.collective is not None else "a step"
        if len(what) > 60:
            what = what[:57] + "..."
        return f"(a branch changes the optimizer's work: `{what}`)"

    def _test_too_long(self, stop: Stop, test: cst.BaseExpression) -> bool:
        """Would ``if <test>:`` run past the file's line length (a one-line test only)?"""
        code = _code(test)
        if "\n" in _code(stop.test) or "\n" in code:
            return False
        keyword = "if " if type(stop.node) is cst.If else "while "
        width = len(self.ctx.indent_unit) * stop.depth + len(keyword) + len(code) + 1
        return width > max(self.facts.longest_line, 79)

    def _hanging_test(self, call: cst.Call) -> cst.Call:
        """The call's arguments on the next line, two indents deeper than the ``if`` (so they
        stand apart from its body)."""
        return call.with_changes(whitespace_before_args=cst.ParenthesizedWhitespace(
            indent=True, last_line=cst.SimpleWhitespace(self.ctx.indent_unit * 2)))

    def _unsafe_message(self, stop: Stop) -> str:
        test = _one_line(stop.test)
        if stop.kind == "site":
            return (f"`{test}` needs every process (a collective), but only some may reach it "
                    f"here: {stop.why}, so the others would not join it and the job would "
                    "hang. Move it where every process gets, or decide what leads here on a "
                    f"value every process agrees on (e.g. `{self.rt}.reduce(x, op=\"mean\")`)")
        if stop.kind == "gate":
            reads = (f"reads {', '.join(f'`{n}`' for n in stop.names)}, which differ"
                     if stop.names else "calls something whose result differs")
            return (f"`if {test}:` {reads} between processes, and its branch leads "
                    f"{self._to_collective(stop)[1:-1]}: the job may hang. Not "
                    f"rewritten: a collective in the test would not be reached alike "
                    f"({stop.why}). Decide it on a value every process agrees on, where all "
                    f"of them reach it (e.g. `{self.rt}.reduce(x, op=\"mean\")`)")
        if stop.kind == "work":
            reads = (f"reads {', '.join(f'`{n}`' for n in stop.names)}, which differ"
                     if stop.names else "calls something whose result differs")
            return (f"`if {test}:` {reads} between processes {self._to_work(stop)}: "
                    "processes that decide differently train their replicas apart. Not "
                    "rewritten: a collective in the test would not be reached alike "
                    f"({stop.why}). Decide it on a value every process agrees on, where all "
                    f"of them reach it (e.g. `{self.rt}.any_process(...)`)")
        if not stop.varies:
            return (f"exit from a training loop that only some processes may reach (`{test}`): "
                    f"{stop.why}, so they may leave at different steps and hang. Decide the "
                    "test that leads here on a value every process agrees on (e.g. "
                    f"`{self.rt}.reduce(x, op=\"mean\")`)")
        reads = (f"reads {', '.join(f'`{n}`' for n in stop.names)}, which differ"
                 if stop.names else "calls something whose result differs")
        fix = f"`{self.rt}.any_process(...)`" if stop.how in ("exit", "continue") \
            else f"`{self.rt}.reduce(x, op=\"mean\")`"
        if stop.how == "continue":
            return (f"data-dependent skip in a training loop: `{test}` {reads} between "
                    "processes, and its `continue` skips work every process must do together "
                    "(a process that skips alone leaves the others waiting in the gradient "
                    "all-reduce: the job hangs). Not rewritten: a collective here would not be "
                    f"reached alike ({stop.why}). Decide it on a value every process agrees "
                    f"on, where all of them reach it (e.g. {fix})")
        where = f" in `{stop.function}`, which the training loop calls," if stop.function \
            else ""
        return (f"data-dependent exit from a training loop: `{test}`{where} {reads} between "
                "processes, so they may leave at different steps and hang. Not rewritten: a "
                f"collective here would not be reached alike ({stop.why}). Decide it on a "
                f"value every process agrees on, where all of them reach it (e.g. {fix})")


def _one_line(node: cst.CSTNode) -> str:
    return " ".join(_code(node).split())


class _Replace(cst.CSTTransformer):
    """Replace the nodes (found by identity) with what their functions make of them.

    Only the replaced nodes and their ancestors are rebuilt: every other node keeps its
    identity, so the report's lines attached to them stay found; ``moved(old, new)`` is told of
    each rebuilt node, to move the lines attached to it."""

    def __init__(self, root: cst.CSTNode,
                 replacements: dict[int, Callable[[cst.CSTNode], cst.CSTNode]],
                 moved: Callable[[cst.CSTNode, cst.CSTNode], None],
                 applied: set[int] | None = None) -> None:
        super().__init__()
        self.replacements = replacements
        self.moved = moved
        self.applied = applied if applied is not None else set()
        self.on_path: set[int] = set()
        stack: list[cst.CSTNode] = []
        on_path = self.on_path

        class Ancestors(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                stack.append(node)
                if id(node) in replacements:
                    on_path.update(id(n) for n in stack)
                return True

            def on_leave(self, original: cst.CSTNode) -> None:
                stack.pop()

        walk(root, Ancestors())

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) in self.on_path

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):
        replace = self.replacements.get(id(original))
        if replace is not None:
            self.applied.add(id(original))
        result = updated if replace is None else replace(updated)
        if result is not original:
            self.moved(original, result)
        return result


def _continues(body: cst.BaseSuite) -> bool:
    """Does ``body`` itself end with ``continue`` (skip the rest of the step)?"""
    statements = body.body if type(body) is cst.IndentedBlock else [body]
    return any(type(small) is cst.Continue for stmt in statements
               if type(stmt) in (cst.SimpleStatementLine, cst.SimpleStatementSuite)
               for small in stmt.body)


def _holds_on_any(stop: Stop) -> bool:
    """Is the test ``largest > bound`` (``smallest < bound``), true on the global batch exactly
    when it is on some process's batch?"""
    core = stop.test
    negated = False
    while type(core) is cst.UnaryOperation and type(core.operator) is cst.Not:
        core, negated = core.expression, not negated
    if type(core) is not cst.Comparison or len(core.comparisons) != 1:
        return False
    operator = core.comparisons[0].operator
    above = type(operator) in (cst.GreaterThan, cst.GreaterThanEqual)
    if core.left is not stop.operand:
        above = not above
    return not negated and above == (stop.op == "max")


class _Either(Mapping):
    """The defs as rewritten (``first``), else as written (``then``)."""

    def __init__(self, first: dict, then: dict) -> None:
        self.first, self.then = first, then

    def __getitem__(self, name: str):
        return self.first[name] if name in self.first else self.then[name]

    def __iter__(self):
        return iter(self.then)

    def __len__(self) -> int:
        return len(self.then)


class _Nodes(cst.CSTVisitor):
    def __init__(self, kind: type) -> None:
        super().__init__()
        self.kind = kind
        self.found: list = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.kind):
            self.found.append(node)
        return True


def nodes_in(root: cst.CSTNode, kind: type) -> list:
    """The nodes of type ``kind`` in ``root`` (itself included), in source order."""
    finder = _Nodes(kind)
    walk(root, finder)
    return finder.found


def _definitions(block: cst.Module | cst.BaseSuite) -> list[cst.FunctionDef]:
    """The functions and methods defined at the module's level (also under ``if``/``try``
    there) and in its classes; not those nested in functions. Without a walk of the whole
    tree: it runs on every conversion."""
    found: list[cst.FunctionDef] = []
    statements = block.body if type(block) in (cst.Module, cst.IndentedBlock) else []
    for stmt in statements:
        if type(stmt) is cst.FunctionDef:
            found.append(stmt)
        elif type(stmt) is cst.ClassDef:
            found += _definitions(stmt.body)
        elif type(stmt) is cst.If:
            found += _definitions(stmt.body)
            orelse = stmt.orelse
            while type(orelse) is cst.If:
                found += _definitions(orelse.body)
                orelse = orelse.orelse
            if type(orelse) is cst.Else:
                found += _definitions(orelse.body)
        elif type(stmt) is cst.Try:
            found += _definitions(stmt.body)
    return found

