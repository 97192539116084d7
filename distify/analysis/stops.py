"""Exits from training loops that processes may take at different steps (issue 12 item 7).

A converted script's processes train on different batches, so a test on what they compute
(``if loss.item() < 1.0: break``, ``if running_reward > goal: break``, ``while loss > eps:``,
``if not math.isfinite(loss): sys.exit(1)``) can come out differently on each: one process
leaves the loop, the others wait for it in DDP's next gradient all-reduce, and the job hangs.
Such a test must be decided on a value every process agrees on, which takes a collective in the
test, and a collective is safe only where every process reaches it the same number of times
(guarantee 5). This pass looks at one loop nest, as the rewrite has left it (so the reduces it
added after evaluation loops are there to see), and says, for each exit from a loop that trains
whose test reads a per-process value, whether the test can be decided alike there and how.

**Per-process values.** Flow-sensitive, within the nest: a name holds a per-process value after
it is assigned from one, from a call that is not known to be pure (a model, ``get_batch()``,
``env.step(a)``, ``time.time()``), from a batch of a DataLoader the loop iterates, or inside a
branch or loop that processes may take differently; it holds one value on every process again
after an assignment from constants, counters, uniform names or a collective
(``x = rt.reduce(x)``, ``rt.reduce_meters(m)``). Values carried around a loop are joined with
what entered it. Names the nest never assigns are taken to be equal on every process (settings,
``args.dry_run``, the data set, a step counter set before the loop); that is the assumption that
makes a single-GPU script's set-up code the same everywhere.

**Where a collective is safe.** A test at position P is reached alike when, from the nest's
start to P, every enclosing ``if`` tests a value equal on every process (or a test this pass
makes so), no ``continue`` that only some processes take came before P in its loop, P is not in
an exception handler, and every enclosing loop runs the same number of iterations on every
process. A loop does when its source does and every exit from it is decided alike (by induction
over its iterations: all processes start iteration k, reach each exit test together, take the
same decision). A loop's source is alike when it iterates ``range(...)``/``count()`` or
a literal, a DataLoader in a loop that trains (prepared training shards are padded to equal
length; iterable datasets stop together), ``while True`` or a ``while`` test decided alike; or
whatever it iterates, when it calls ``backward`` on every step, since DDP's gradient all-reduce
then already needs the same number of steps everywhere. Not alike: an evaluation loop over a
DataLoader (its shards differ by up to one batch), a loop over a per-process value or over a
name that is no DataLoader (a list of batches may be one process's own). The demotions (an exit
that cannot be decided alike makes its loop uneven, which makes every exit inside it unsafe) are
iterated to a fixed point. Inside a ``try`` block with handlers, positions count as reached by
only some processes (one that raises leaves early).

**Skips and exits in called functions.** A ``continue`` on a per-process test in a loop that
trains is a decision like an exit when what it skips in the rest of the step needs every
process (issue 26): a backward (its gradient all-reduce), a collective, an optimizer's (scaler's,
scheduler's) ``step``. A process that skips alone leaves the others waiting in the all-reduce,
or steps its replica apart. It leaves no loop, so it makes none uneven; what follows it is
reached alike once it is decided alike. A ``continue`` that skips nothing of the kind (after
the step's work) stays a branch, as before. A call of a local function that may end the process
(``sanity_check(x)``, whose ``if torch.isnan(batch).any(): sys.exit(0)`` is an exit from the
nest's loops) is walked into, at the call's place, each parameter per process when its
argument is (``check(args, loss)``: ``args.dry_run`` there is still a setting): its exits are
the nest's (:attr:`Stop.calls` names the calls that reach them; a test reached through several
calls is alike only if it is through each). A call of a local function that always ends the
process (``die(msg)``) is an exit like ``sys.exit``.

**How a test is decided.** The global batch's value is what one process training on all the
processes' batches would see. One ordering comparison of a per-process value with one equal
everywhere compares that value: for a largest (smallest) value of a batch (``batch.abs().max()``,
``x.max().item()``, ``torch.amax(x)``) the largest (smallest) of the processes' (``op="max"``,
``"min"``: ``max > limit`` then holds as soon as it would on any process's batch); for a loss,
a reward, a metric, a time (``loss.item() < 1.0``, ``running_reward > goal``) the mean over the
processes, the global batch's value when the batches are equal in size. The mean is right for a
goal that ends the loop (``break``, ``return``, a ``while`` test, a gate to an evaluation); it is
never used for a per-batch guard, a test that ends the process (``sys.exit``) or skips the step
(``continue``): single-process, that acts on the first batch for which it holds, so it is
decided whole. Any test not one such comparison (``and``/``or``, a call such as
``math.isfinite(loss)``, ``==``, two per-process values), and every guard, is decided whole:
taken by every process as soon as any process's test says so (``any_process``;
``all_processes`` for a ``while`` test or a test whose ``else`` leaves), so none trains on alone.

What it does not do: follow values into other functions (a function's result is per process
unless its callee is known to be pure; only exits are followed into functions the nest calls),
reason about exceptions other than as per-process (a ``continue`` in an exception handler is
not decided, only what it makes unreachable alike is reported), or look at exits from loops
that do not train (evaluation loops may end unevenly; nothing there waits for a gradient
all-reduce).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from distify.analysis.loaders import LOOP_WRAPPERS, is_loop_wrapper
from distify.analysis.names import dotted_name, read_names
from distify.analysis.walk import walk

Action = Literal["reduce", "any", "all", "note"]

#: runtime calls whose result is the same on every process, whatever their arguments
_AGREED = frozenset({"reduce", "any_process", "all_processes", "broadcast_object", "gather",
                     "gather_for_metrics", "world_size"})
#: runtime calls every process must reach the same number of times (collectives and barriers)
COLLECTIVES = frozenset({"reduce", "gather", "gather_for_metrics", "reduce_meters",
                         "broadcast_object", "wait_for_everyone", "main_process_first",
                         "local_main_process_first", "any_process", "all_processes",
                         "save_state", "load_state"})
#: progress bars and iterator wrappers (:mod:`.loaders`'s, and a sequence's ``reversed``, a
#: ``trange``): only their positional arguments make the result
_WRAPPERS = LOOP_WRAPPERS | {"reversed", "tqdm.trange", "tqdm.auto.trange"}
#: builtins and library functions whose result depends on their arguments only
_PURE_FUNCTIONS = frozenset({
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "int", "isinstance",
    "len", "list", "max", "min", "pow", "range", "reversed", "round", "set", "sorted", "str",
    "sum", "tuple", "zip", "iter", "itertools.count", *_WRAPPERS,
    "numpy.mean", "numpy.sum", "numpy.abs", "numpy.isnan", "numpy.isfinite", "numpy.isinf",
    "numpy.array", "numpy.asarray", "numpy.sqrt", "numpy.exp", "numpy.log",
    "torch.isnan", "torch.isfinite", "torch.isinf", "torch.tensor", "torch.as_tensor",
    "torch.mean", "torch.sum", "torch.abs", "torch.stack", "torch.cat",
})
_PURE_MODULES = ("math.",)
#: methods whose result depends on their receiver and arguments only
_PURE_METHODS = frozenset({
    "item", "mean", "sum", "float", "double", "int", "long", "half", "tolist", "cpu",
    "detach", "numpy", "size", "numel", "dim", "max", "min", "abs", "std", "var", "norm",
    "clone", "to", "get", "keys", "values", "items", "copy", "all", "any", "isfinite",
    "isnan", "isinf", "exp", "log", "sqrt", "pow", "round", "format", "lower", "upper",
    "strip", "startswith", "endswith", "argmax", "argmin", "eq", "ne", "lt", "le", "gt", "ge",
    "squeeze", "unsqueeze", "view", "reshape", "flatten",
})
_BUILTINS = frozenset(dir(builtins))
_ORDERING = (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)


@dataclass(frozen=True)
class NestContext:
    """What the rewrite knows about the code around the nest."""

    #: the runtime's local name (``distify``)
    rt: str
    #: the qualified name of a callee (imports resolved), or None
    qual: Callable[[cst.BaseExpression], str | None]
    #: is this the iterable of a loop over a DataLoader (``loader``, ``enumerate(loader)``)?
    is_loader: Callable[[cst.BaseExpression], bool]
    #: does this call end the process (``sys.exit``, the ``process_exits`` rules)?
    is_exit: Callable[[cst.Call], bool]
    #: is this name bound by an import (``time`` in ``time.time()``: a module, not a value)?
    is_imported: Callable[[str], bool] = lambda name: False
    #: local functions that run a backward pass (``finish_episode()``, ``self.train_step()``)
    training_functions: frozenset[str] = frozenset()
    #: does this local function return the same value on every process, given the same
    #: arguments (an ``evaluate()`` whose sums the rewrite reduced; see :func:`returns_agree`)?
    agrees: Callable[[str], bool] = lambda name: False
    #: the whole nest runs on the main process only (inside a block the rewrite guards)
    main_only: bool = False
    #: does this call reach a collective (``rt.reduce(...)``, or a local function whose body,
    #: as rewritten, does: an ``evaluate()`` whose sums the rewrite reduced)?
    collective: Callable[[cst.Call], bool] = lambda call: False
    #: the indented blocks around the nest's loop (to place the tests' lines)
    depth: int = 0
    #: a local function (``sanity_check`` for ``sanity_check(x)``) that may end the process
    #: (it calls ``sys.exit``, directly or through another), to follow into; else None
    exiting: Callable[[str], cst.FunctionDef | None] = lambda name: None
    #: does this call always end the process (a local ``die(msg)`` that calls ``sys.exit``)?
    ends: Callable[[cst.Call], bool] = lambda call: False


@dataclass(frozen=True)
class Stop:
    """A test that processes may decide differently where that hangs the job, and what to do.

    Four kinds: an ``exit`` from a training loop whose test reads a per-process value; a
    ``gate``, an ``if`` on a per-process value whose branch reaches a collective
    (``if loss.item() < 0.5: acc = evaluate()``, where ``evaluate`` reduces its sums); a
    ``work`` decision, an ``if`` on a per-process value in a loop that trains whose branch
    changes the optimizer's work (see :func:`optimizer_work`); a ``site``, a collective that
    only some processes reach for another reason (after a ``continue`` only some take, in an
    exception handler), always a note.
    """

    #: the ``if`` whose branch leaves or reaches a collective, the ``while`` whose test ends
    #: the loop, or (a site) the statement that calls the collective
    node: cst.CSTNode
    #: the test, or (a site) the call
    test: cst.BaseExpression
    #: the per-process names the test reads (for the report)
    names: tuple[str, ...]
    action: Action
    #: for ``reduce``: the comparison's per-process operand, to average over the processes
    operand: cst.BaseExpression | None = None
    #: for ``note``: why no collective can decide it there
    why: str = ""
    #: the test itself reads a per-process value (else only its place differs between processes)
    varies: bool = True
    #: the indented blocks around the ``if``/``while``
    depth: int = 0
    kind: Literal["exit", "gate", "site", "work"] = "exit"
    #: for a gate: the first call in its branches that reaches a collective; for a ``work``
    #: decision: the first call or statement in its branches that changes the optimizer's work
    collective: cst.CSTNode | None = None
    #: for ``reduce``: how the processes' values make the global batch's value: ``"mean"``
    #: (a loss, a reward, a metric), ``"max"``/``"min"`` (a batch's largest/smallest value)
    op: Literal["mean", "max", "min"] = "mean"
    #: how the test leaves: ``break``, ``return``, ``exit`` (the process ends), ``continue``
    #: (the rest of the step is skipped), ``while``, or ``gate``
    how: str = "break"
    #: for a test inside a local function the nest calls (``sanity_check(x)``, whose ``if``
    #: calls ``sys.exit``): the calls that reach it, the nest's and those in the functions
    #: between (``train_step(x)`` → ``sanity_check(batch)``); empty for the nest's own tests
    calls: tuple[cst.Call, ...] = ()
    #: ... and that function's name
    function: str | None = None


def find_stops(loop: cst.For | cst.While, ctx: NestContext) -> list[Stop]:
    """The data-dependent exits from loops that train in the nest rooted at ``loop`` (the
    outermost loop of its function), in source order, each with its :data:`Action`."""
    demoted: dict[int, str] = {}
    uneven: dict[int, str] = {}
    while True:
        walk = _Walk(ctx, demoted, uneven)
        walk.nest(loop)
        new_demoted, new_uneven = _settle(walk, demoted, uneven)
        if new_demoted.keys() == demoted.keys() and new_uneven.keys() == uneven.keys():
            break
        demoted, uneven = new_demoted, new_uneven
    stops = []
    for exit_ in walk.exits.values():
        if not exit_.candidate:
            continue
        why = demoted.get(id(exit_.node))
        op = exit_.extreme or "mean"
        if why is not None:
            action: Action = "note"
        elif exit_.operand is not None and (exit_.extreme is not None
                                            or exit_.how not in ("exit", "continue", "work")):
            action = "reduce"
        else:
            action = "all" if exit_.keeps_going_when_true else "any"
        stops.append(Stop(exit_.node, exit_.test, exit_.names, action, exit_.operand,
                          why or "", exit_.varies, exit_.depth, exit_.kind,
                          exit_.collective, op, exit_.how, tuple(exit_.calls),
                          exit_.function))
    for site in walk.sites.values():
        if not any(dep in demoted for dep in site.deps):  # else its test's note says it
            stops.append(Stop(site.node, site.call, (), "note", why=site.why, varies=False,
                              depth=site.depth, kind="site"))
    stops.sort(key=lambda stop: walk.order[id(stop.node)])
    return stops


def returns_agree(function: cst.FunctionDef, ctx: NestContext) -> bool:
    """Does ``function`` return a value equal on every process whenever it is called with such
    arguments? Its parameters are taken to be equal; every ``return`` must give a value equal on
    every process (``return test_loss, correct / total`` after ``correct = rt.reduce(correct)``)
    from a place every process reaches alike. A function that returns nothing does not agree
    (it is not a metric)."""
    walk = _Walk(ctx, {}, {})
    walk.returns = []
    walk.suite(function.body, _Path())
    return bool(walk.returns) and not any(walk.returns)


class FileFunctions:
    """What the walk asks about the file's own functions, found by name (``evaluate`` for
    ``evaluate(...)`` and ``self.evaluate(...)``) in ``functions`` (``None`` for a name defined
    twice, or not known yet: ``convert`` fills it as it leaves each function, as rewritten).

    Args:
        rt: the runtime's local name (``distify``).
        functions: name → definition; read when asked, so it may grow meanwhile.
    """

    def __init__(self, rt: str, functions: Mapping[str, cst.FunctionDef | None]) -> None:
        self.rt = rt
        self.functions = functions
        self._agreeing: dict[str, bool] = {}
        self._collective: dict[str, bool] = {}
        self._exiting: dict[str, bool] = {}
        self._ending: dict[str, bool] = {}

    def collective(self, call: cst.Call) -> bool:
        """Does ``call`` reach a collective: a runtime collective (``rt.reduce(...)``), or a
        local function whose body calls one, directly or through another (an ``evaluate()``
        whose sums are reduced)?"""
        name = dotted_name(call.func)
        if name is not None and name.startswith(f"{self.rt}.") \
                and name[len(self.rt) + 1:] in COLLECTIVES:
            return True
        local = _local_callee(call.func)
        function = self.functions.get(local) if local is not None else None
        if function is None:
            return False
        if local not in self._collective:
            self._collective[local] = False  # while deciding: a recursive call adds nothing
            self._collective[local] = any(self.collective(inner)
                                          for inner in _calls(function.body, definitions=False))
        return self._collective[local]

    def exiting(self, name: str, is_exit: Callable[[cst.Call], bool]) -> cst.FunctionDef | None:
        """The local function ``name`` if it may end the process: it calls ``sys.exit`` (a
        call ``is_exit`` accepts), directly or through another local function."""
        function = self.functions.get(name)
        if function is None:
            return None
        if name not in self._exiting:
            self._exiting[name] = False  # while deciding: a recursive call adds nothing
            # an exit is a statement of its own (``sys.exit(1)``, ``die(msg)``): the
            # statements are enough, and cheaper than every expression (asked of every
            # function a loop calls)
            self._exiting[name] = any(
                is_exit(call) or ((inner := _local_callee(call.func)) is not None
                                  and self.exiting(inner, is_exit) is not None)
                for call in statement_calls(function.body))
        return function if self._exiting[name] else None

    def ends(self, call: cst.Call, is_exit: Callable[[cst.Call], bool]) -> bool:
        """Does ``call`` always end the process: ``sys.exit(...)``, or a local function one of
        whose own statements (not under a branch) does (``def die(msg): print(msg);
        sys.exit(1)``)?"""
        if is_exit(call):
            return True
        name = _local_callee(call.func)
        function = self.functions.get(name) if name is not None else None
        if function is None:
            return False
        if name not in self._ending:
            self._ending[name] = False
            self._ending[name] = any(
                type(small) is cst.Expr and type(small.value) is cst.Call
                and self.ends(small.value, is_exit)
                for stmt in _top_statements(function.body) for small in stmt.body)
        return self._ending[name]

    def agrees(self, name: str, ctx: NestContext) -> bool:
        """Does the local function ``name`` return a value equal on every process (see
        :func:`returns_agree`)?"""
        if name not in self._agreeing:  # decided once, with the functions known then
            self._agreeing[name] = False  # while deciding: a recursive call does not agree
            function = self.functions.get(name)
            self._agreeing[name] = function is not None and returns_agree(function, ctx)
        return self._agreeing[name]


def calls_in(node: cst.CSTNode, definitions: bool = True) -> list[cst.Call]:
    """Every call in ``node`` (not in lambdas; in nested definitions unless ``definitions`` is
    false: a ``def`` runs when called, not where it stands)."""
    return _calls(node, definitions)


def local_callee(func: cst.BaseExpression) -> str | None:
    """``evaluate`` for ``evaluate(...)`` and ``self.evaluate(...)``, else None."""
    return _local_callee(func)


# --------------------------------------------------------------------------- the walk's records


@dataclass
class _LoopInfo:
    node: cst.For | cst.While
    trains: bool
    #: why its iterations may differ between processes by what it iterates, or None
    source: str | None


@dataclass
class _Exit:
    node: cst.CSTNode  # the If or While (or the bare break/return/exit statement)
    test: cst.BaseExpression | None
    names: tuple[str, ...]
    varies: bool
    #: varies, and it leaves a loop that trains: rewritten, or reported
    candidate: bool
    #: the loops it leaves, and the loops around it (for a ``while`` test, its own too)
    leaves: list[_LoopInfo]
    inside: list[_LoopInfo]
    #: why its position is not reached alike on every process, or None
    bad: str | None
    #: candidate exits whose test must be decided alike for it to be reached alike
    deps: frozenset[int]
    #: the test holding keeps the loop going (a ``while`` test, an exit in the ``else``)
    keeps_going_when_true: bool = False
    #: the per-process side of a single ordering comparison
    operand: cst.BaseExpression | None = None
    depth: int = 0
    kind: Literal["exit", "gate", "work"] = "exit"
    collective: cst.CSTNode | None = None
    how: str = "break"
    #: the operand is a largest/smallest value (``batch.abs().max()``): ``"max"``/``"min"``
    extreme: Literal["max", "min"] | None = None
    #: the nest's calls through which a test in a local function is reached
    calls: list[cst.Call] = field(default_factory=list)
    function: str | None = None


@dataclass
class _Site:
    """A collective reached by only some processes (see :class:`Stop`)."""

    node: cst.CSTNode
    call: cst.Call
    why: str
    deps: frozenset[int]
    depth: int


@dataclass(frozen=True)
class _Path:
    """How the statements being walked are reached."""

    #: why they are not reached alike on every process, or None
    bad: str | None = None
    #: candidate exits whose test must be decided alike for them to be reached alike
    deps: frozenset[int] = frozenset()
    #: bad because only some processes get there (a branch, a continue, a handler), not
    #: because a loop around runs unevenly
    some: bool = False
    #: bad only because a process that raises would leave early (a ``try`` block): a
    #: collective there is not reported
    soft: bool = False

    def worse(self, why: str, some: bool = True, soft: bool = False) -> _Path:
        if self.bad is None or (some and not self.some):  # the more specific reason wins
            return _Path(why, self.deps, some, soft)
        return self

    def needs(self, exit_id: int) -> _Path:
        return _Path(self.bad, self.deps | {exit_id}, self.some, self.soft)


def _settle(walk: _Walk, demoted: dict[int, str],
            uneven: dict[int, str]) -> tuple[dict[int, str], dict[int, str]]:
    """One round of demotions: exits not reached alike, loops not run alike."""
    demoted, uneven = dict(demoted), dict(uneven)
    for loop in walk.loops.values():
        if loop.source is not None:
            uneven.setdefault(id(loop.node), loop.source)
    for exit_ in walk.exits.values():
        why = _position_problem(exit_, demoted, uneven)
        if why is not None and exit_.candidate:
            demoted.setdefault(id(exit_.node), why)
        if why is not None or (exit_.varies and (not exit_.candidate
                                                 or id(exit_.node) in demoted)):
            for loop in exit_.leaves:
                uneven.setdefault(id(loop.node), f"`{_head(loop.node)}` can also be left by "
                                  f"`{_head(exit_.node)}`, which processes may not take alike")
    return demoted, uneven


def _position_problem(exit_: _Exit, demoted: dict[int, str],
                      uneven: dict[int, str]) -> str | None:
    if exit_.bad is not None:
        return exit_.bad
    for dep in exit_.deps:
        if dep in demoted:
            return "it is reached only in a branch whose test cannot be decided alike"
    for loop in exit_.inside:
        if id(loop.node) in uneven:
            return f"it is inside `{_head(loop.node)}`, which may run a different number of " \
                   f"times on each process ({uneven[id(loop.node)]})"
    return None


# --------------------------------------------------------------------------- the walk


class _Walk:
    """One source-ordered walk of the nest, given the demotions decided so far."""

    def __init__(self, ctx: NestContext, demoted: dict[int, str],
                 uneven: dict[int, str]) -> None:
        self.ctx = ctx
        self.demoted = demoted
        self.uneven = uneven
        self.varying: set[str] = set()
        self.stack: list[_LoopInfo] = []
        self.loops: dict[int, _LoopInfo] = {}
        self.exits: dict[int, _Exit] = {}
        self.sites: dict[int, _Site] = {}  # by statement: a loop's body is walked again
        #: source order of the statements walked (to list the findings in it)
        self.order: dict[int, int] = {}
        self.claimed: set[int] = set()  # the break/return/exit of an exit-``if``
        self.continued: list[str | None] = []  # per loop: a continue only some processes take
        #: walking a function body (:func:`returns_agree`): for each return, does it vary?
        self.returns: list[bool] | None = None
        self.depth = ctx.depth
        self._trains: dict[int, tuple[bool, bool]] = {}
        #: following a call of the nest into a local function that may end the process: the
        #: nest's call, the functions being walked, and how many loops of the stack are the
        #: nest's
        self._via: list[tuple[cst.Call, str]] = []
        self._base = 0

    def nest(self, loop: cst.For | cst.While) -> None:
        path = _Path("the loop runs on the main process only") if self.ctx.main_only \
            else _Path()
        self.statement(loop, path)

    # ------------------------------------------------------------------ values

    def varies(self, node: cst.CSTNode | None) -> bool:
        """Can ``node``'s value differ between processes here?"""
        if node is None:
            return False
        if type(node) is cst.Name:
            return node.value in self.varying
        if type(node) is cst.Call:
            return self._call_varies(node)
        if type(node) is cst.Lambda:
            return False
        if type(node) in (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp):
            return self._comprehension_varies(node)
        if type(node) is cst.Attribute:
            chain = dotted_name(node)
            if chain is not None:  # `self.iter_num`: its own value, or all of `self`'s
                return any(part in self.varying for part in _prefixes(chain))
            return self.varies(node.value)
        return any(self.varies(child) for child in node.children)

    def _call_varies(self, call: cst.Call) -> bool:
        func = call.func
        name = dotted_name(func)
        if name is not None and name.startswith(f"{self.ctx.rt}.") \
                and name[len(self.ctx.rt) + 1:] in _AGREED:
            return False
        args = [arg.value for arg in call.args]
        if type(func) is cst.Attribute and func.attr.value in _PURE_METHODS \
                and not self._is_module(func.value):
            return self.varies(func.value) or any(self.varies(a) for a in args)
        qual = self.ctx.qual(func) or name
        if qual in _PURE_FUNCTIONS or (qual or "").startswith(_PURE_MODULES):
            if qual in _WRAPPERS:
                args = [arg.value for arg in call.args if arg.keyword is None]
            return any(self.varies(a) for a in args)
        local = _local_callee(func)
        if local is not None and not self.ctx.is_imported(local) and self.ctx.agrees(local):
            return any(self.varies(a) for a in args)
        return True

    def _is_module(self, node: cst.BaseExpression) -> bool:
        """``time`` in ``time.time()``: a module's function, not a method of a value."""
        root = _root_name(node)
        return root is not None and self.ctx.is_imported(root)

    def _comprehension_varies(self, node: cst.BaseExpression) -> bool:
        targets: set[str] = set()
        level = node.for_in
        while level is not None:
            if self.varies(level.iter) or any(self.varies(i.test) for i in level.ifs):
                return True
            targets |= bound_names(level.target)
            level = level.inner_for_in
        saved = set(self.varying)
        self.varying -= targets
        try:
            parts = [node.key, node.value] if type(node) is cst.DictComp else [node.elt]
            return any(self.varies(part) for part in parts)
        finally:
            self.varying = saved

    def varying_names(self, node: cst.CSTNode) -> tuple[str, ...]:
        names = {n for n in read_names(node) if n in self.varying}
        names |= {chain for chain in _chains(node) if chain in self.varying}
        return tuple(sorted(names))

    def assign(self, target: cst.BaseExpression, varies: bool) -> None:
        """``target = value``: names and attribute chains strongly (``self.loss = loss``
        leaves ``self.iter_num`` as it was), ``a[k] =`` weakly (``a`` may keep per-process
        parts)."""
        chain = dotted_name(target) if type(target) in (cst.Name, cst.Attribute) else None
        if chain is not None:
            if varies:
                self.varying.add(chain)
            else:
                self.varying -= {n for n in self.varying
                                 if n == chain or n.startswith(f"{chain}.")}
        elif type(target) in (cst.Tuple, cst.List):
            for element in target.elements:
                value = element.value
                self.assign(value.value if type(value) is cst.StarredElement else value,
                            varies)
        elif type(target) in (cst.Subscript, cst.Attribute):  # `a[k] =`, `f().b =`
            root = _root_name(target)
            if root is not None and (varies or (type(target) is cst.Subscript and any(
                    self.varies(element) for element in target.slice))):
                self.varying.add(root)

    # ------------------------------------------------------------------ statements

    def block(self, statements: Iterable[cst.CSTNode], path: _Path) -> None:
        for stmt in statements:
            if self.continued and self.continued[-1] is not None:
                path = path.worse(self.continued[-1])
            self.statement(stmt, path)

    def suite(self, suite: cst.BaseSuite | None, path: _Path) -> None:
        if suite is None:
            return
        if type(suite) is cst.IndentedBlock:
            self.depth += 1
            self.block(suite.body, path)
            self.depth -= 1
        else:
            self.block([suite], path)

    def statement(self, stmt: cst.CSTNode, path: _Path) -> None:
        if type(stmt) in (cst.SimpleStatementLine, cst.SimpleStatementSuite):
            for small in stmt.body:
                self.small(small, path)
        elif type(stmt) is cst.If:
            self.if_(stmt, path)
        elif type(stmt) is cst.For:
            self.for_(stmt, path)
        elif type(stmt) is cst.While:
            self.while_(stmt, path)
        elif type(stmt) is cst.With:
            for item in stmt.items:
                if item.asname is not None:
                    self.assign(item.asname.name, self.varies(item.item) or self._implicit(path))
            self.suite(stmt.body, path)
        elif type(stmt) in (cst.Try, cst.TryStar):
            self.try_(stmt, path)
        elif type(stmt) is cst.Match:
            branch = path.worse(f"it is inside `match {_code(stmt.subject)}:`, on a value that "
                                "differs between processes") if self.varies(stmt.subject) else path
            self.branches([case.body for case in stmt.cases], branch)
        # a def or class inside the loop runs later, when it is called: not here

    def small(self, small: cst.BaseSmallStatement, path: _Path) -> None:
        implicit = self._implicit(path)
        if path.bad is not None and path.some and not path.soft and not self._via:
            call = next((c for c in _calls(small) if self.ctx.collective(c)), None)
            if call is not None:
                self.order.setdefault(id(small), len(self.order))
                self.sites[id(small)] = _Site(small, call, path.bad, path.deps, self.depth)
        self.mutate(small, implicit)
        if type(small) is cst.Assign:
            varies = self.varies(small.value) or implicit
            for target in small.targets:
                self.assign(target.target, varies)
        elif type(small) is cst.AnnAssign and small.value is not None:
            self.assign(small.target, self.varies(small.value) or implicit)
        elif type(small) is cst.AugAssign:
            self.assign(small.target, self.varies(small.target) or self.varies(small.value)
                        or implicit)
        elif type(small) is cst.Continue:
            if self.continued and implicit:
                self.continued[-1] = self.continued[-1] or (
                    "it comes after a `continue` that only some processes may take")
        elif type(small) in (cst.Break, cst.Return):
            self.bare_exit(small, path, "break" if type(small) is cst.Break else "return")
            if type(small) is cst.Return and self.returns is not None:
                self.returns.append(small.value is None or self.varies(small.value) or implicit)
        if type(small) is cst.Expr and type(small.value) is cst.Call \
                and self._ends(small.value):
            self.bare_exit(small, path, "exit")
        elif self.stack:
            self._follow(small, path)

    def _follow(self, small: cst.BaseSmallStatement, path: _Path) -> None:
        """Walk into the local functions ``small`` calls that may end the process
        (``sanity_check(x)``, whose ``if torch.isnan(batch).any(): sys.exit(0)`` is an exit
        from the nest's loops), each parameter per process when its argument is."""
        for call in _calls(small, definitions=False):
            name = _local_callee(call.func)
            if name is None or self.ctx.is_imported(name) \
                    or name in {function for _, function in self._via}:
                continue
            function = self.ctx.exiting(name)
            if function is None:
                continue
            varying = _varying_parameters(function, call, self.varies)
            saved = (set(self.varying), self.returns, self.depth, self._base)
            params = _parameters(function)  # they shadow the caller's names
            self.varying = {n for n in self.varying if n.split(".")[0] not in params} | varying
            self.returns, self.depth, self._base = None, 0, len(self.stack)
            self._via.append((call, name))
            try:
                self.suite(function.body, path)
            finally:
                self._via.pop()
                self.varying, self.returns, self.depth, self._base = saved

    def mutate(self, small: cst.BaseSmallStatement, implicit: bool) -> None:
        """A call may change what it is called on: ``losses.append(loss.item())``,
        ``early_stopping(val_loss, model)``, ``env.step(action)`` leave a per-process object
        when given a per-process value; ``rt.reduce_meters(m)`` leaves ``m`` agreed."""
        for call in _calls(small):
            func = call.func
            if dotted_name(func) == f"{self.ctx.rt}.reduce_meters":
                for arg in call.args:
                    if type(arg.value) is cst.Name:
                        self.varying.discard(arg.value.value)
                continue
            if type(func) is cst.Name and (func.value in _BUILTINS or not (
                    type(small) is cst.Expr and small.value is call)):
                continue  # `out = model(x)` is called for its result: the model is unchanged
            receiver = func.value if type(func) is cst.Attribute else func
            root = _root_name(receiver)
            if root is None or root == self.ctx.rt or self.ctx.is_imported(root):
                continue
            if implicit or any(self.varies(arg.value) for arg in call.args):
                # `self.losses.append(loss)` changes `self.losses`, not `self.iter_num`
                self.varying.add(dotted_name(receiver) or root)

    def _implicit(self, path: _Path) -> bool:
        """Is a value assigned here per process because only some processes get here, or get
        here a different number of times?"""
        return path.bad is not None or any(dep in self.demoted for dep in path.deps)

    def bare_exit(self, stmt: cst.CSTNode, path: _Path, how: str) -> None:
        if id(stmt) in self.claimed or not self.stack:
            return
        leaves = self._left({how})
        if not leaves:  # a return of a function the nest calls
            return
        self._record(_Exit(stmt, None, (), False, False, leaves, list(self.stack), path.bad,
                           path.deps))

    def branches(self, suites: list[cst.BaseSuite | None], path: _Path) -> None:
        entry = set(self.varying)
        joined = set(entry)
        for suite in suites:
            self.varying = set(entry)
            self.suite(suite, path)
            joined |= self.varying
        self.varying = joined

    def if_(self, node: cst.If, path: _Path) -> None:
        varies = self.varies(node.test)
        else_suite = node.orelse.body if type(node.orelse) is cst.Else else None
        leaving = _leaving(node.body, self._ends)
        keeps_going = False
        if not leaving and else_suite is not None:
            leaving, keeps_going = _leaving(else_suite, self._ends), True
        hows = {how for _, how in leaving}
        if hows == {"continue"}:
            # a test that skips the rest of the step: decided alike only where what it skips
            # needs every process (a backward's gradient all-reduce, a collective, the
            # optimizer's step); else a branch like any other, as before
            skips = self._skipped_work(node) if (varies or path.some) and self.stack else None
            if skips is None:
                leaving = []
        else:
            leaving = [(stmt, how) for stmt, how in leaving if how != "continue"]
            hows.discard("continue")
        leaves = self._left(hows) if leaving and self.stack and hows != {"continue"} else []
        branch = path
        if leaving and (leaves or hows == {"continue"}):
            self.claimed.update(id(stmt) for stmt, _ in leaving)
            how = "continue" if hows == {"continue"} else "exit" if "exit" in hows \
                else "return" if "return" in hows else "break"
            # a test on a per-process value, or one only some processes reach
            candidate = (varies or path.some) and (
                how == "continue" or any(self._loop_trains(loop.node) for loop in leaves))
            exit_ = _Exit(node, node.test, self.varying_names(node.test), varies, candidate,
                          leaves, list(self.stack), path.bad, path.deps, keeps_going,
                          self._operand(node.test) if candidate else None, self.depth,
                          how=how)
            self._record(exit_)
            if candidate and id(node) not in self.demoted:
                branch = path.needs(id(node))
            elif varies:
                branch = path.worse(_branch_why(node.test))
        elif varies and (collective := self._collective_in(node)) is not None:
            # a gate: only the processes whose test holds would reach the collective
            exit_ = _Exit(node, node.test, self.varying_names(node.test), True, True, [],
                          list(self.stack), path.bad, path.deps, False,
                          self._operand(node.test), self.depth, "gate", collective, "gate")
            self._record(exit_)
            branch = path.needs(id(node))
            if id(node) in self.demoted:  # its note covers what it leads to
                branch = path.worse(_branch_why(node.test)).needs(id(node))
        elif varies and not self._via and any(self._loop_trains(loop.node)
                                              for loop in self.stack) \
                and (work := optimizer_work(node)) is not None:
            # a decision on the optimizer's work (its step, the gradients, the weights, the
            # learning rate) taken by some processes only: the replicas drift apart
            exit_ = _Exit(node, node.test, self.varying_names(node.test), True, True, [],
                          list(self.stack), path.bad, path.deps, _steps_when_true(node),
                          self._operand(node.test), self.depth, "work", work, "work")
            self._record(exit_)
            branch = path.needs(id(node))
            if id(node) in self.demoted:
                branch = path.worse(_branch_why(node.test)).needs(id(node))
        elif varies:
            branch = path.worse(_branch_why(node.test))
        orelse = node.orelse
        self.branches([node.body, orelse if type(orelse) is cst.If else else_suite],
                      branch)

    def _ends(self, call: cst.Call) -> bool:
        return self.ctx.is_exit(call) or self.ctx.ends(call)

    def _left(self, hows: set[str]) -> list[_LoopInfo]:
        """The loops left by ``break`` (the innermost), an exit (all: the process ends), or
        ``return`` (all of the nest's; in a function the nest calls, that function's own)."""
        if hows == {"break"}:
            return self.stack[-1:]
        if "exit" in hows:
            return list(self.stack)
        return list(self.stack[self._base:])

    def _skipped_work(self, node: cst.If) -> str | None:
        """What a ``continue`` in ``node`` skips in the rest of the innermost loop's step that
        every process must do alike (``loss.backward()``, a collective, ``optimizer.step()``),
        or None. Only in a loop that trains."""
        loop = self.stack[-1].node
        if not self._loop_trains(loop):
            return None
        finder = _After(node, self.ctx)
        walk(loop.body, finder)
        return None if finder.found is None else _code(finder.found)

    def _collective_in(self, node: cst.If) -> cst.Call | None:
        """The first call in a branch of ``node`` (``elif``/``else`` included) that reaches a
        collective, or None."""
        branches = [node.body] if node.orelse is None else [node.body, node.orelse]
        return next((call for branch in branches for call in _calls(branch)
                     if self.ctx.collective(call)), None)

    def _record(self, exit_: _Exit) -> None:
        if exit_.operand is not None:
            exit_.extreme = _extreme(exit_.operand, self.ctx.qual)
        old = self.exits.get(id(exit_.node))
        if self._via:  # the chain of calls from the nest: `train_step(x)`, `check(batch)`
            exit_.calls, exit_.function = [call for call, _ in self._via], self._via[-1][1]
            if old is not None:  # reached from several calls: alike only if from each
                exit_ = _merged(old, exit_)
        self.exits[id(exit_.node)] = exit_
        self.order.setdefault(id(exit_.node), len(self.order))

    def _operand(self, test: cst.BaseExpression) -> cst.BaseExpression | None:
        """The per-process side of one ordering comparison (``not`` around it allowed)."""
        core = test
        while type(core) is cst.UnaryOperation and type(core.operator) is cst.Not:
            core = core.expression
        if not (type(core) is cst.Comparison and len(core.comparisons) == 1
                and isinstance(core.comparisons[0].operator, _ORDERING)):
            return None
        left, right = core.left, core.comparisons[0].comparator
        if self.varies(left) != self.varies(right):
            return left if self.varies(left) else right
        return None

    def try_(self, node: cst.Try | cst.TryStar, path: _Path) -> None:
        entry = set(self.varying)
        # a process that raises leaves the block early: what follows the raise is not run there
        body_path = path.worse("it is in a `try` block, which a process that raises leaves "
                               "early", soft=True) if node.handlers else path
        self.suite(node.body, body_path)
        after_body = set(self.varying)
        handler_path = path.worse("it is in an exception handler, which only the processes "
                                  "that raised run")
        joined = entry | after_body
        for handler in node.handlers:
            self.varying = entry | after_body
            if handler.name is not None:
                self.assign(handler.name.name, True)
            self.suite(handler.body, handler_path)
            joined |= self.varying
        self.varying = joined
        if node.orelse is not None:
            self.suite(node.orelse.body, path)
        if node.finalbody is not None:
            self.suite(node.finalbody.body, path)

    def for_(self, node: cst.For, path: _Path) -> None:
        trains, every_step = self._loop_trains_every_step(node)
        iterable = node.iter
        # a DataLoader, or a name that may hold one: its batches are per process, and its
        # number of batches too unless it pads them (in training)
        loader = self.ctx.is_loader(iterable)
        data = loader or _names_data(iterable)
        source = None
        if self.varies(iterable):
            source = f"it iterates `{_code(iterable)}`, which differs between processes"
        elif data and not trains:
            source = "a loop over data that does not train: an evaluation DataLoader's shards " \
                     "differ in length between processes"
        elif data and not loader:  # a DataLoader pads its training shards; a list does not
            source = f"it iterates `{_code(iterable)}`, which may hold a different number of " \
                     "items on each process"
        if source is not None and every_step:
            source = None  # DDP's all-reduce in its every-step backward needs equal steps
        info = self._enter(node, trains, source)
        index = _enumerate_index(node) if data else None

        def head() -> None:
            # within one step, a step count is the same on every process that runs it
            self.assign(node.target, data or self.varies(iterable) or self._implicit(path))
            if index is not None:
                self.assign(index, self._implicit(path))

        self._loop(node, info, path, head)
        if id(node) in self.uneven or info.source is not None:
            self.assign(node.target, True)  # where each process's last step left it
        self.suite(node.orelse.body if node.orelse else None, path)

    def while_(self, node: cst.While, path: _Path) -> None:
        trains, _ = self._loop_trains_every_step(node)
        info = self._enter(node, trains, None)
        entry_path = path

        def head() -> None:
            varies = self.varies(node.test)
            candidate = (varies or entry_path.some) and trains
            exit_ = _Exit(node, node.test, self.varying_names(node.test), varies, candidate,
                          [info], list(self.stack), entry_path.bad, entry_path.deps, True,
                          self._operand(node.test) if candidate else None, self.depth)
            self._record(exit_)

        self._loop(node, info, path, head)
        self.suite(node.orelse.body if node.orelse else None, path)

    def _enter(self, node: cst.For | cst.While, trains: bool, source: str | None) -> _LoopInfo:
        info = _LoopInfo(node, trains, source)
        self.loops[id(node)] = info
        return info

    def _loop(self, node: cst.For | cst.While, info: _LoopInfo, path: _Path,
              head: Callable[[], None]) -> None:
        """Walk the body until the per-process names carried around the loop settle."""
        uneven = self.uneven.get(id(node)) or info.source
        body_path = path.worse(f"it is inside `{_head(node)}`, which may run a different number "
                               f"of times on each process ({uneven})", some=False) \
            if uneven else path
        entry = set(self.varying)
        carried = set(entry)
        while True:
            self.varying = set(carried)
            self.stack.append(info)
            self.continued.append(None)
            head()
            self.block(node.body.body if type(node.body) is cst.IndentedBlock
                       else [node.body], body_path)
            self.continued.pop()
            self.stack.pop()
            if self.varying <= carried:
                break
            carried |= self.varying
        self.varying = carried

    def _loop_trains(self, node: cst.For | cst.While) -> bool:
        return self._loop_trains_every_step(node)[0]

    def _loop_trains_every_step(self, node: cst.For | cst.While) -> tuple[bool, bool]:
        """Does the loop run a backward pass (itself or through a function of the file), and
        on every step (a statement of its body calls ``backward``, and no ``continue`` anywhere
        could skip it)?"""
        key = id(node)
        if key not in self._trains:
            finder = _TrainingCalls(self.ctx)
            walk(node.body, finder)
            every_step = finder.found and not finder.continues and any(
                _has_backward(stmt, self.ctx) for stmt in _top_statements(node.body))
            self._trains[key] = (finder.found, every_step)
        return self._trains[key]


# --------------------------------------------------------------------------- helpers


class _TrainingCalls(cst.CSTVisitor):
    """Backward passes (``loss.backward()``, ``rt.backward(loss)``, calls of local functions
    that run one) and ``continue`` statements, outside nested definitions."""

    def __init__(self, ctx: NestContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.found = False
        self.continues = False
        self._loops = 0

    def visit_Call(self, node: cst.Call) -> None:
        self.found = self.found or _is_training_call(node, self.ctx)

    def visit_Continue(self, node: cst.Continue) -> None:
        if not self._loops:  # a continue of a nested loop skips nothing here
            self.continues = True

    def visit_For(self, node: cst.For) -> None:
        self._loops += 1

    def leave_For(self, node: cst.For) -> None:
        self._loops -= 1

    def visit_While(self, node: cst.While) -> None:
        self._loops += 1

    def leave_While(self, node: cst.While) -> None:
        self._loops -= 1

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def _is_training_call(call: cst.Call, ctx: NestContext) -> bool:
    func = call.func
    if type(func) is cst.Attribute and func.attr.value == "backward":
        return True
    if dotted_name(func) == f"{ctx.rt}.backward":
        return True
    if type(func) is cst.Name:
        return func.value in ctx.training_functions
    return (type(func) is cst.Attribute and type(func.value) is cst.Name
            and func.value.value in ("self", "cls")
            and func.attr.value in ctx.training_functions)


def _has_backward(stmt: cst.CSTNode, ctx: NestContext) -> bool:
    """Does ``stmt`` itself run a backward pass (not a function that may run one, or not)?"""
    finder = _TrainingCalls(NestContext(ctx.rt, ctx.qual, ctx.is_loader, ctx.is_exit))
    walk(stmt, finder)
    return finder.found


def _top_statements(body: cst.BaseSuite) -> Iterator[cst.CSTNode]:
    """The statements run on every pass through ``body``: its own, and those of its ``with``
    blocks."""
    statements = body.body if type(body) is cst.IndentedBlock else [body]
    for stmt in statements:
        if type(stmt) is cst.With:
            yield from _top_statements(stmt.body)
        elif type(stmt) in (cst.SimpleStatementLine, cst.SimpleStatementSuite):
            yield stmt


def _leaving(body: cst.BaseSuite, is_exit: Callable[[cst.Call], bool]) \
        -> list[tuple[cst.CSTNode, str]]:
    """The statements of ``body`` itself that leave the loop: ``break``, ``return``, or a call
    ``is_exit`` accepts (``sys.exit(1)``), each with how it leaves; and ``continue``, which
    leaves the step."""
    statements = body.body if type(body) is cst.IndentedBlock else [body]
    found = []
    for stmt in statements:
        if type(stmt) not in (cst.SimpleStatementLine, cst.SimpleStatementSuite):
            continue
        for small in stmt.body:
            if type(small) is cst.Break:
                found.append((small, "break"))
            elif type(small) is cst.Continue:
                found.append((small, "continue"))
            elif type(small) is cst.Return:
                found.append((small, "return"))
            elif type(small) is cst.Expr and type(small.value) is cst.Call \
                    and is_exit(small.value):
                found.append((small, "exit"))
    return found


def _names_data(iterable: cst.BaseExpression) -> bool:
    """Is the loop over a name (``data``, ``self.loader``, ``enumerate(batches)``), which may
    hold a DataLoader, rather than over a literal or a ``range``/``count``?"""
    while type(iterable) is cst.Call and iterable.args and (
            is_loop_wrapper(callee := dotted_name(iterable.func)) or callee == "reversed"):
        iterable = iterable.args[0].value
    return type(iterable) in (cst.Name, cst.Attribute, cst.Subscript)


def _local_callee(func: cst.BaseExpression) -> str | None:
    """``evaluate`` for ``evaluate(...)`` and ``self.evaluate(...)``."""
    if type(func) is cst.Name:
        return func.value
    if type(func) is cst.Attribute and type(func.value) is cst.Name \
            and func.value.value in ("self", "cls"):
        return func.attr.value
    return None


def _enumerate_index(node: cst.For) -> cst.BaseExpression | None:
    """``i`` in ``for i, (x, y) in enumerate(loader)``: a step count, not the batch."""
    it, target = node.iter, node.target
    if type(it) is cst.Call and dotted_name(it.func) == "enumerate" \
            and type(target) in (cst.Tuple, cst.List) and len(target.elements) == 2:
        return target.elements[0].value
    return None


class _Calls(cst.CSTVisitor):
    def __init__(self, definitions: bool) -> None:
        super().__init__()
        self.calls: list[cst.Call] = []
        self.definitions = definitions

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return self.definitions


def _calls(node: cst.CSTNode, definitions: bool = True) -> list[cst.Call]:
    """The calls in ``node`` (not in lambdas; in nested ``def``s only with ``definitions``)."""
    finder = _Calls(definitions)
    walk(node, finder)
    return finder.calls


def bound_names(target: cst.BaseExpression) -> set[str]:
    """The names an assignment target binds (``x``, ``x, (y, *z)``), not ``a.b``/``a[k]``."""
    if type(target) is cst.Name:
        return {target.value}
    if type(target) in (cst.Tuple, cst.List):
        return set().union(*(bound_names(e.value) for e in target.elements))
    if type(target) is cst.StarredElement:
        return bound_names(target.value)
    return set()


def _root_name(node: cst.BaseExpression) -> str | None:
    while type(node) in (cst.Attribute, cst.Subscript):
        node = node.value
    return node.value if type(node) is cst.Name else None


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _head(node: cst.CSTNode) -> str:
    """A statement's first line, as the report names it (``for x, y in val_loader:``)."""
    if type(node) is cst.For:
        return f"for {_code(node.target)} in {_code(node.iter)}:"
    if type(node) is cst.While:
        return f"while {_code(node.test)}:"
    if type(node) is cst.If:
        return f"if {_code(node.test)}:"
    return _code(node).strip().splitlines()[0]


def _branch_why(test: cst.BaseExpression) -> str:
    return f"it is reached only in a branch of `if {_code(test)}:`, a test on a value that " \
           "differs between processes"


def _merged(old: _Exit, new: _Exit) -> _Exit:
    """One test in a function the nest calls, reached through ``old``'s calls and ``new``'s."""
    def union(a: list, b: list) -> list:
        return a + [x for x in b if all(x is not y for y in a)]

    candidate = old.candidate or new.candidate
    return _Exit(new.node, new.test, tuple(sorted(set(old.names) | set(new.names))),
                 old.varies or new.varies, candidate, union(old.leaves, new.leaves),
                 union(old.inside, new.inside), old.bad or new.bad, old.deps | new.deps,
                 new.keeps_going_when_true, new.operand or old.operand if candidate else None,
                 new.depth, new.kind, new.collective, new.how, new.extreme or old.extreme,
                 union(old.calls, new.calls), new.function)


def _prefixes(chain: str) -> Iterator[str]:
    """``a.b.c`` → ``a``, ``a.b``, ``a.b.c``."""
    parts = chain.split(".")
    for end in range(1, len(parts) + 1):
        yield ".".join(parts[:end])


def _chains(node: cst.CSTNode) -> set[str]:
    """The attribute chains a subtree reads (``self.iter_num >= c.max`` → both)."""
    found: set[str] = set()
    stack = [node]
    while stack:
        node = stack.pop()
        chain = dotted_name(node) if type(node) is cst.Attribute else None
        if chain is not None:
            found.update(_prefixes(chain))
        else:
            stack.extend(node.children)
    return found


def _varying_parameters(function: cst.FunctionDef, call: cst.Call,
                        varies: Callable[[cst.BaseExpression], bool]) -> set[str]:
    """The parameters of ``function`` that hold a per-process value when ``call`` calls it:
    each is its own argument's (``check(args, loss)``: ``loss`` is, ``args`` is not); a
    default is the same everywhere. Every parameter is when the call unpacks (``f(*xs)``)."""
    if any(arg.star for arg in call.args):
        return _parameters(function) if any(varies(a.value) for a in call.args) else set()
    params = function.params
    positional = [p.name.value for p in (*params.posonly_params, *params.params)]
    if type(call.func) is cst.Attribute and positional[:1] in (["self"], ["cls"]):
        positional = positional[1:]  # `self.check(x)`: x is the first after self
    names = {p.name.value for p in (*params.posonly_params, *params.params,
                                    *params.kwonly_params)}
    found: set[str] = set()
    for index, arg in enumerate(a for a in call.args if a.keyword is None):
        if varies(arg.value):
            if index < len(positional):
                found.add(positional[index])
            elif type(params.star_arg) is cst.Param:
                found.add(params.star_arg.name.value)
    for arg in call.args:
        if arg.keyword is not None and varies(arg.value):
            name = arg.keyword.value
            if name in names:
                found.add(name)
            elif type(params.star_kwarg) is cst.Param:
                found.add(params.star_kwarg.name.value)
    return found - {"self", "cls"}


def _parameters(function: cst.FunctionDef) -> set[str]:
    params = function.params
    names = {p.name.value for p in (*params.posonly_params, *params.params,
                                    *params.kwonly_params)}
    for star in (params.star_arg, params.star_kwarg):
        if type(star) is cst.Param:
            names.add(star.name.value)
    return names - {"self", "cls"}


#: wrappers that keep a value (``x.max().item()``, ``float(x.max())``)
_KEEPING = frozenset({"item", "float", "double", "cpu", "detach", "clone", "to", "tolist"})
_EXTREMES = {"max": "max", "amax": "max", "min": "min", "amin": "min"}


def _extreme(operand: cst.BaseExpression,
             qual: Callable[[cst.BaseExpression], str | None]) -> Literal["max", "min"] | None:
    """``"max"`` for a largest value (``batch.abs().max()``, ``x.max().item()``,
    ``torch.amax(x)``, ``max(values)``), ``"min"`` for a smallest one, else None: over the
    processes, the global batch's is the largest (smallest) of theirs."""
    node = operand
    while type(node) is cst.Call:
        func = node.func
        if type(func) is cst.Attribute and func.attr.value in _KEEPING:
            node = func.value
            continue
        if type(func) is cst.Name and func.value in ("float", "int") and len(node.args) == 1:
            node = node.args[0].value
            continue
        break
    if type(node) is not cst.Call:
        return None
    func = node.func
    if type(func) is cst.Attribute and func.attr.value in _EXTREMES \
            and not any(arg.keyword is None or arg.keyword.value == "dim" for arg in node.args):
        return _EXTREMES[func.attr.value]  # whole-tensor `x.max()`, not `x.max(dim)`
    name = qual(func) or dotted_name(func) or ""
    module, _, last = name.rpartition(".")
    if last in _EXTREMES and module in ("", "torch", "numpy", "math") and node.args:
        return _EXTREMES[last]
    return None


class _After(cst.CSTVisitor):
    """The first call after ``node`` (in source order, outside nested definitions) that needs
    every process alike: a backward pass, a collective, an optimizer's (scaler's, scheduler's)
    ``step``."""

    def __init__(self, node: cst.CSTNode, ctx: NestContext) -> None:
        super().__init__()
        self.node = node
        self.ctx = ctx
        self.after = False
        self.found: cst.Call | None = None

    def on_leave(self, original: cst.CSTNode) -> None:
        if original is self.node:
            self.after = True
        super().on_leave(original)

    def visit_Call(self, node: cst.Call) -> None:
        if self.after and self.found is None and (
                _is_training_call(node, self.ctx) or self.ctx.collective(node)
                or _is_step(node)):
            self.found = node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


#: methods that change the optimizer's work whatever they are called on
_WORK_METHODS = frozenset({"zero_grad", "load_state_dict", "reset_parameters"})
#: what an in-place change of the weights, gradients or optimizer settings is made on
_WORK_PARTS = (".weight", ".bias", ".data", ".grad", "param_groups", ".parameters()")


def optimizer_work(node: cst.If) -> cst.CSTNode | None:
    """The first call or assignment in a branch of ``node`` (``elif``/``else`` included)
    that changes what the optimizer does to the replica: its ``step`` (an optimizer's,
    scaler's, scheduler's), ``zero_grad``, ``load_state_dict``, ``reset_parameters``,
    ``nn.init`` calls, an in-place method (``mul_``, ``clamp_``, ``copy_``) or an assignment
    on weights, gradients or ``param_groups`` (``.weight``, ``.data``, ``.grad``, a name
    bound by ``for p in model.parameters()`` or ``for g in optimizer.param_groups``); else
    None. Taken on some processes only, any of these trains the replicas apart (issue 20
    item 2); a metric's in-place ``add_`` is none of these."""
    finder = _Work()
    walk(node.body, finder)
    if node.orelse is not None and finder.found is None:
        walk(node.orelse, finder)
    return finder.found


def _steps_when_true(node: cst.If) -> bool:
    """Does the ``if`` branch step an optimizer and the ``else`` branch not (``if
    torch.isfinite(loss): optimizer.step()``)? Then the step is taken when the test holds on
    every process: what one process would do with the global batch."""
    body = [c for c in _calls(node.body) if _is_step(c)]
    other = [c for c in _calls(node.orelse) if _is_step(c)] if node.orelse is not None else []
    return bool(body) and not other


class _Work(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: cst.CSTNode | None = None
        self.bound: set[str] = set()  # names bound to parameters or param groups

    def visit_For(self, node: cst.For) -> None:
        if any(part in _code(node.iter) for part in ("parameters(", "param_groups")):
            self.bound |= bound_names(node.target)

    def visit_Call(self, node: cst.Call) -> bool:
        func = node.func
        if self.found is None and type(func) is cst.Attribute:
            name = func.attr.value
            if _is_step(node) or name in _WORK_METHODS or ".init." in _code(func) or (
                    name.endswith("_") and not name.startswith("_")
                    and self._changes_weights(func.value)):
                self.found = node
        return self.found is None

    def visit_Assign(self, node: cst.Assign) -> None:
        if any(type(t.target) is not cst.Name and self._changes_weights(t.target)
               for t in node.targets):  # `p = p * 2` binds a new tensor; `p.data = ...` not
            self._found(node)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if self._changes_weights(node.target):
            self._found(node)

    def _found(self, node: cst.CSTNode) -> None:
        if self.found is None:
            self.found = node

    def _changes_weights(self, node: cst.BaseExpression) -> bool:
        if type(node) not in (cst.Attribute, cst.Subscript, cst.Name):
            return False
        return _root_name(node) in self.bound or (
            type(node) is not cst.Name and any(p in _code(node) for p in _WORK_PARTS))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def _is_step(call: cst.Call) -> bool:
    """``optimizer.step()``, ``scaler.step(opt)``, ``self.optim.step()``,
    ``scheduler.step()``: skipped on some processes only, the replicas drift apart."""
    func = call.func
    if not (type(func) is cst.Attribute and func.attr.value == "step"):
        return False
    owner = func.value
    name = owner.attr.value if type(owner) is cst.Attribute else \
        owner.value if type(owner) is cst.Name else ""
    return any(part in name.lower() for part in ("opt", "scaler", "sched"))


def statement_calls(suite: cst.BaseSuite) -> list[cst.Call]:
    """The calls that make a statement of ``suite`` (nested blocks included, not nested
    ``def``/``class``): ``f(x)``, ``y = f(x)``, ``return f(x)``."""
    found: list[cst.Call] = []
    statements = suite.body if type(suite) is cst.IndentedBlock else [suite]
    for stmt in statements:
        if type(stmt) in (cst.SimpleStatementLine, cst.SimpleStatementSuite):
            for small in stmt.body:
                value = getattr(small, "value", None)
                if type(value) is cst.Call:
                    found.append(value)
        elif type(stmt) in (cst.FunctionDef, cst.ClassDef):
            continue
        else:
            for block in (getattr(stmt, "body", None), getattr(stmt, "orelse", None),
                          getattr(stmt, "finalbody", None)):
                if type(block) is cst.If:
                    found += statement_calls(cst.IndentedBlock(body=[block]))
                elif type(block) in (cst.Else, cst.Finally):
                    found += statement_calls(block.body)
                elif isinstance(block, cst.BaseSuite):
                    found += statement_calls(block)
            for handler in getattr(stmt, "handlers", ()):
                found += statement_calls(handler.body)
            for case in getattr(stmt, "cases", ()):
                found += statement_calls(case.body)
    return found
