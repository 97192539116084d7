"""The bookkeeping of one conversion: what the rewrite families record about the nodes being
walked, in one object the driver makes per module (``self.ctx`` in every handler).

Every field more than one family reads or writes is here. What only one family reads (its
whole-file analyses and its own stacks) is in that family's one state object, a dataclass of its
module made anew in its ``visit_Module`` handler (``self._stops``, a :class:`~.stops.StopState`),
set and read in that module only; the transformer holds no family's loose fields
(``tests/test_driver.py`` checks all three). One attribute per family rather than a table of
states in the context: one attribute lookup, as before, and each typed where its family declares
it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from distify.analysis.bptt_flow import StreamFlow
    from distify.analysis.downloads import DownloadUnit
    from distify.analysis.draws_flow import DrawFlow
    from distify.convert.models import _IfFrame


@dataclass
class _Scope:
    """What a module or function body has bound so far (the names the rewrites ask about)."""

    params: set[str] = field(default_factory=set)
    loaders: set[str] = field(default_factory=set)
    zero_inits: set[str] = field(default_factory=set)
    lists: set[str] = field(default_factory=set)
    #: in-memory files built here (``buffer = io.BytesIO()``): saving into one is no side effect
    buffers: set[str] = field(default_factory=set)
    #: running-average meters built here (``losses = AverageMeter()``)
    meters: set[str] = field(default_factory=set)
    prepared_models: set[str] = field(default_factory=set)
    samplers: set[str] = field(default_factory=set)
    saw_eval: bool = False
    no_grad: bool = False
    #: accumulators reduced after a loop over a loader → that loader's dotted name: later
    #: ``len(loader)`` divisors of them count every process's batches
    reduced: dict[str, str] = field(default_factory=dict)
    #: per-process counts of such a loop (``steps += 1`` in it, its ``enumerate`` index),
    #: which a reduced sum must not be divided by as they are
    counts: set[str] = field(default_factory=set)
    #: dicts built here that hold an optimizer's state (a training-state checkpoint)
    training_states: set[str] = field(default_factory=set)
    #: iterators over a DataLoader built here (``batches = iter(train_loader)``)
    loader_iters: set[str] = field(default_factory=set)
    #: names bound to a view of a loader (``bar = tqdm(train_loader)``) → the loader's name
    loader_views: dict[str, str] = field(default_factory=dict)


@dataclass
class _Loop:
    """A ``for`` or ``while`` loop being visited: what its body does, as found so far."""

    loaderish: bool
    accumulators: list[str] = field(default_factory=list)
    #: what each accumulator adds (``correct += <value>``), for the report
    added: dict[str, list[cst.BaseExpression]] = field(default_factory=dict)
    #: names set to zero again inside the loop (``running_loss = 0.0`` after a log line)
    resets: set[str] = field(default_factory=set)
    #: the loader the loop iterates (its dotted name), when it is a plain name or attribute
    loader: str | None = None
    #: the ``i`` of ``for i, batch in enumerate(loader)``
    index: str | None = None
    appended: list[str] = field(default_factory=list)
    #: meters updated in the loop (``losses.update(loss.item(), n)``)
    meters: list[str] = field(default_factory=list)
    #: lists whose per-sample entries are gathered as they are appended
    gathered: set[str] = field(default_factory=set)
    assigned: set[str] = field(default_factory=set)
    has_backward: bool = False
    #: the loop draws batches with ``next(...)`` from an iterator over a DataLoader
    next_from_loader: bool = False
    #: ``if (i + 1) % accum == 0: optimizer.step()`` tests (gradient accumulation)
    step_tests: list[cst.BaseExpression] = field(default_factory=list)
    #: what the ``if`` of a step test steps (``optimizer`` of ``optimizer.step()``)
    step_receivers: list[str] = field(default_factory=list)
    targets: set[str] = field(default_factory=set)
    #: sums the accumulation rewrite averages itself where they are read (``loss_accum``)
    own_reduce: set[str] = field(default_factory=set)
    #: containers added to by index (``counts[label] += 1``) → what the first addition adds
    tallied: dict[str, cst.BaseExpression] = field(default_factory=dict)
    #: containers changed otherwise in the loop (``counts[i] = 0``) → that statement
    tally_odd: dict[str, cst.CSTNode] = field(default_factory=dict)
    #: lists filled item by item in an inner loop: this loop's lists are gathered after it
    after: list[str] = field(default_factory=list)
    #: names unpacked from a tuple in the loop (``inputs, labels = batch``)
    unpacked: set[str] = field(default_factory=set)


class NodeSet:
    """Nodes marked by identity. It holds on to them, so that a node the rewrite dropped cannot
    free its ``id`` for an unrelated node to be mistaken for it."""

    def __init__(self) -> None:
        self._nodes: dict[int, cst.CSTNode] = {}

    def add(self, node: cst.CSTNode) -> None:
        self._nodes[id(node)] = node

    def __contains__(self, node: object) -> bool:
        return self._nodes.get(id(node)) is node

    def __bool__(self) -> bool:
        return bool(self._nodes)


@dataclass
class ConvertContext:
    """The mutable state of one conversion, per module."""

    #: expression → its qualified name (``nn.Linear`` → ``torch.nn.Linear``) or None: asked by
    #: several families of the same nodes (keyed by the node itself, which it keeps alive)
    quals: dict[cst.CSTNode, str | None] = field(default_factory=dict)
    #: qualified name of a callee → may a rewrite of calls by name act on a call of it (see
    #: ``DistifyTransformer._may_rewrite_call``)
    call_names: dict[str, bool] = field(default_factory=dict)

    # ---------------------------------------------------------------- the statement being left
    #: the simple statements (lines, or one-line suites) being visited, innermost last
    statements: list[cst.SimpleStatementLine] = field(default_factory=list)
    #: id of a statement line → the length of its first line as written (line-length checks)
    first_lines: dict[int, int] = field(default_factory=dict)
    #: per statement being visited: the models to prepare right after it
    pending_models: list[list[str]] = field(default_factory=list)
    #: per statement being visited: (name, assignment index) of the objects it builds
    built: list[list[tuple[str, int]]] = field(default_factory=list)
    #: per statement being visited: does it download a data set (grouped after it is left)
    downloads: list[bool] = field(default_factory=list)
    #: lines to add after the statement being left
    after: list[cst.SimpleStatementLine] = field(default_factory=list)
    #: (rewrite, id of the statement) where a skip was reported → that statement (kept alive,
    #: so that its id is not reused)
    skip_sites: dict[tuple[str, int], cst.CSTNode] = field(default_factory=dict)

    # ---------------------------------------------------------------- where the walk is
    #: id of each of the module's own statements → (its index, whether it is a def or class:
    #: its body runs later)
    top_level: dict[int, tuple[int, bool]] = field(default_factory=dict)
    #: the top-level statement being visited, as in ``top_level``
    current_top: tuple[int, bool] = (sys.maxsize, True)
    #: the module's indentation unit
    indent_unit: str = "    "
    #: indented blocks around the node being visited
    depth: int = 0
    #: enclosing classes and functions, as the analysis names them
    path: list[str] = field(default_factory=list)
    #: the scopes around the node (the module's first), innermost last
    scopes: list[_Scope] = field(default_factory=lambda: [_Scope()])
    #: per enclosing class: is it a model class body?
    classes: list[bool] = field(default_factory=list)
    #: the loops being visited in the current function, innermost last
    loops: list[_Loop] = field(default_factory=list)
    #: the ``loops`` of the functions around the current one, saved while it is visited
    loops_saved: list[list[_Loop]] = field(default_factory=list)
    #: ``torch.no_grad()`` blocks and the like around the node
    no_grad_depth: int = 0
    #: blocks run on the main process only around the node (a guard, a download unit)
    main_only_depth: int = 0
    #: expression statements around the node, and the call that is the whole of the innermost
    expr_depth: int = 0
    expr_call: cst.BaseExpression | None = None
    #: the call being left (as written)
    leaving: cst.Call | None = None

    # ---------------------------------------------------------------- what the rewrite made
    #: device pinning removed from the statements being left, said at the next line kept
    removed: list[str] = field(default_factory=list)
    #: ids of the ``rt.device_index()`` calls made (:mod:`.devices`)
    index_calls: set[int] = field(default_factory=set)
    #: the ``pass`` put where the rewrite emptied a block
    emptied: NodeSet = field(default_factory=lambda: NodeSet())
    #: the statements that download a data set (grouped under one ``main_process_first``)
    download_stmts: NodeSet = field(default_factory=lambda: NodeSet())
    #: the ``if rt.is_main_process():`` guards the rewrite added (adjacent ones are merged)
    guards: NodeSet = field(default_factory=lambda: NodeSet())
    #: names of files opened with ``rt.open`` (``with open(p, "w") as f``): dumps into them run
    #: on every process, and write once
    runtime_handles: set[str] = field(default_factory=set)
    #: a loop fed without a DataLoader was reported (said once a file)
    unsharded_loop_reported: bool = False

    # ---------------------------------------------------------------- models (:mod:`.models`)
    #: (scope path, name) → how many times it has been assigned so far
    assignments: dict[tuple[tuple[str, ...], str], int] = field(default_factory=dict)
    #: (scope path, name) → the ``if`` serial when it was first assigned
    first_assigned: dict[tuple[tuple[str, ...], str], int] = field(default_factory=dict)
    #: backward calls seen so far, per scope path
    backwards: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: the ``if`` chains being rewritten (models prepared per branch), innermost last
    if_frames: list[_IfFrame] = field(default_factory=list)
    #: ``if`` chains begun so far
    if_serial: int = 0
    #: ids of the ``If`` nodes that are an ``elif``
    elifs: set[int] = field(default_factory=set)
    #: ids of the ``Else`` nodes of ``if`` chains
    if_elses: set[int] = field(default_factory=set)

    # ---------------------------------------------------------------- loops and tallies
    #: what each name was last assigned, per enclosing function (attributes: file-wide)
    built_from: dict[tuple[tuple[str, ...], str], cst.BaseExpression] = field(
        default_factory=dict)
    #: per scope (by identity): tally name → the loops around the line that made it
    #: (:mod:`.collected`)
    tallies: dict[int, tuple[object, dict[str, tuple[int, ...]]]] = field(default_factory=dict)

    # ---------------------------------------------------------------- read by several families
    #: the batches drawn per process (:mod:`.randomness`; None where the file draws none)
    draw_flow: DrawFlow | None = None
    #: the streams split per process (:mod:`.bptt`; None where the file batchifies none)
    stream_flow: StreamFlow | None = None
    #: id of each statement a download unit left in the output → (it, its unit): grouped under
    #: one ``main_process_first`` by the driver (:mod:`.side_effects`)
    unit_outputs: dict[int, tuple[cst.CSTNode, DownloadUnit]] = field(default_factory=dict)
