"""Rewrites of side effects: one writer, one printer, one tracker; quiet logs elsewhere.

``print`` → ``rt.print``; ``torch.save``/``torch.load`` → ``rt.save``/``rt.load``; a statement
that writes a file, logs to a tracker or changes the filesystem (the ``side_effects`` rule pack)
→ under ``if rt.is_main_process():``; a tracker object (``SummaryWriter(...)``) → built on the main
process only (``rt.on_main_process(SummaryWriter)(...)``); progress bars shown on the main
process; ``logging.basicConfig(level=...)`` → warnings only elsewhere; dataset downloads → under
``rt.main_process_first()``; timestamps that name runs → the main process's.

Console writes outside ``print`` (``sys.stdout.write``, a ``progress_bar(...)`` helper) → on the
main process only; ``sys.stderr.write`` too when it writes a progress line in a loop (``\\r``, no
newline at its end, or a bare newline), but not a whole line, not outside a loop and not in an
``except`` (an error or a process's own message, which every process keeps).

A local class that subclasses a tracker (``class Writer(SummaryWriter)``) or builds one in its
``__init__`` is a tracker too; an unknown ``*Logger``/``*Writer`` from another module is
reported. Once ``wandb.init`` runs on the main process only, so does every other ``wandb`` call
(elsewhere they raise), assignments to ``wandb.run.name``/``wandb.config.x`` included. A
hand-written download (see :mod:`distify.analysis.downloads`: the fetch, with the writes,
extraction and removals after it) → one unit that the main process runs under
``with rt.main_process_first():`` while the others wait; one whose names later code reads is
reported instead.
"""

from __future__ import annotations

import ast
import posixpath
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst

from distify.analysis.codemods import guarded, merge_guards
from distify.analysis.downloads import DownloadUnit, download_units, may_download
from distify.analysis.effects import (
    HANDLE_KEYWORDS,
    cst_shape,
    is_open_call,
    saves_into_memory,
    side_effect,
    writes_mode,
)
from distify.analysis.evaluation import is_eval_context
from distify.analysis.literals import literal_value
from distify.analysis.names import dotted_name
from distify.analysis.stops import calls_in, local_callee
from distify.analysis.walk import walk
from distify.convert.base import TransformerBase
from distify.convert.driver import handles
from distify.convert.stops import nodes_in
from distify.convert.syntax import (
    _EQUAL,
    _callee,
    _code,
    _has_keyword,
    _is_false,
    _is_rt_call,
    _shift_continuations,
    _with_trailing_comma,
)

#: the rewrite (:mod:`distify.convert.rewrites`) each replacement below belongs to, by kind
_REWRITE_OF = {"save": "save-load", "load": "save-load", "clip": "grad-clipping"}
#: rule category, report kind, why: calls replaced one for one by the runtime's function
_RUNTIME_REPLACEMENTS = (
    ("saves", "save", "saved by the main process only, written atomically"),
    ("loads", "load", "loaded onto this process's device"),
    ("grad_clipping", "clip", "fp16 gradients are unscaled before clipping"),
)


#: the builtin ``open`` under its names
_OPENS = ("open", "io.open")
#: the rule categories :meth:`SideEffectMixin._rewrite_side_effect_call` asks about a callee
#: (its own, and those of ``_side_effect`` and the runtime's replacements)
_CALL_CATEGORIES = ("grad_scalers", "progress_bars", "logging_setup", "timestamps",
                    "side_effects", *(category for category, _, _ in _RUNTIME_REPLACEMENTS))


def _normalised(node: cst.BaseExpression) -> str | None:
    """``node``'s source as ``ast.unparse`` spells it (how the facts record written paths)."""
    try:
        return ast.unparse(ast.parse(_code(node).strip(), mode="eval").body)
    except SyntaxError:
        return None


#: functions that join path pieces (``os.path.join``) and build paths (``Path("runs", "x")``)
_JOINS = frozenset({"os.path.join", "osp.join", "path.join", "posixpath.join", "Path",
                    "pathlib.Path", "PurePath", "pathlib.PurePath", "PosixPath",
                    "pathlib.PosixPath", "PurePosixPath", "pathlib.PurePosixPath"})
#: calls that give their one argument's path back as it is
_AS_IS = frozenset({"str", "os.fspath", "os.path.normpath", "Path.joinpath"})


def path_key(source: str | None) -> str | None:
    """The path that the expression ``source`` (``ast.unparse``'s spelling) names, normalised
    as ``os.path.normpath`` would: ``os.path.join("runs", "h.json")``, ``"./runs/h.json"``,
    ``f"runs/{'h'}.json"`` and ``Path("runs") / "h.json"`` all give ``runs/h.json``. A piece
    that is not a constant (``args.out``) stays in as its own spelling, so ``os.path.join(
    args.out, "h.json")`` and ``f"{args.out}/h.json"`` agree too. None: not a path."""
    if source is None:
        return None
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    text = _spelled(node)
    if text is None:
        return None
    return posixpath.normpath(text) if text else None


def _opaque(node: ast.expr) -> str:
    """A piece of a path that is not a constant, as one path component of its own."""
    return "\0" + ast.unparse(node).replace("/", "\1") + "\0"


def _spelled(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        pieces = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                pieces.append(value.value)
            elif isinstance(value, ast.FormattedValue) and value.conversion == -1 \
                    and value.format_spec is None:
                pieces.append(_spelled(value.value) or _opaque(value.value))
            else:
                pieces.append(_opaque(value))
        return "".join(pieces)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Div)):
        left = _spelled(node.left) or _opaque(node.left)
        right = _spelled(node.right) or _opaque(node.right)
        return left + right if isinstance(node.op, ast.Add) else posixpath.join(left, right)
    if isinstance(node, ast.Call) and not node.keywords and node.args \
            and not any(isinstance(arg, ast.Starred) for arg in node.args):
        callee = ast.unparse(node.func)
        pieces = [_spelled(arg) or _opaque(arg) for arg in node.args]
        if callee in _JOINS:
            return posixpath.join(*pieces)
        if callee in _AS_IS and len(pieces) == 1:
            return pieces[0]
        if isinstance(node.func, ast.Attribute) and node.func.attr == "joinpath":
            return posixpath.join(_spelled(node.func.value) or _opaque(node.func.value),
                                  *pieces)
    return _opaque(node)


#: the node types a statement of a block can be (a download unit's statements are)
STATEMENT_KINDS = ("SimpleStatementLine", "If", "For", "While", "With", "Try", "TryStar",
                   "FunctionDef", "ClassDef", "Match")
#: unknown classes whose names say they log (``Logger``, ``SummaryLogger``, ``EventWriter``)
_LOGGERISH = re.compile(r"[A-Z]\w*(Logger|Writer|Visualizer|Tracker)")
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | {"logging", "csv", "io", "codecs"}


@dataclass(slots=True)
class SideEffectState:
    """What :class:`SideEffectMixin` keeps while it walks one module (``self._side_effects``)."""

    #: the module as written (its smoke test and downloading functions are read from it)
    module: cst.Module
    #: the file's classes whose instances log or track (see :func:`_tracker_classes`)
    trackers: set[str]
    #: ids of the calls inside ``except`` blocks
    handler_calls: set[int] = field(default_factory=set)
    #: download units around the node that run on the main process alone
    in_download: int = 0
    #: id of a download unit's first statement as written → the unit
    unit_starts: dict[int, DownloadUnit] = field(default_factory=dict)
    #: id of each statement of a download unit, as written → the unit
    unit_of: dict[int, DownloadUnit] = field(default_factory=dict)
    #: ids of the units inside another one: part of it
    nested_units: set[int] = field(default_factory=set)
    #: ids of the calls of a model file's smoke test (see ``_smoke_test_calls``); None until asked
    smoke_calls: set[int] | None = None
    #: the local functions whose body downloads; None until the first download asks
    downloading_functions: set[str] | None = None


class SideEffectMixin(TransformerBase):
    _side_effects: SideEffectState

    @handles("visit_Module")
    def _side_effects_on_module(self, node: cst.Module) -> None:
        state = self._side_effects = SideEffectState(module=node,
                                                     trackers=_tracker_classes(node, self))
        if may_download(self.rules, self.facts.imports):
            for unit in download_units(node, self.rules, self.facts.imports):
                state.unit_starts[id(unit.statements[0])] = unit
                for stmt in unit.statements:
                    state.unit_of[id(stmt)] = unit

    # A download unit is a run of statements of any kind: these two handlers run for every
    # statement, first on the way in and last on the way out (the driver's table).
    @handles(*(f"visit_{kind}" for kind in STATEMENT_KINDS))
    def _side_effects_on_statement(self, node: cst.BaseStatement) -> None:
        state = self._side_effects
        unit = state.unit_of.get(id(node))
        if unit is None:
            return
        if state.in_download and state.unit_starts.get(id(node)) is unit:
            state.nested_units.add(id(unit))
        if _runs_alone(unit) and id(unit) not in state.nested_units \
                and "downloads" not in self.skip:
            self.ctx.main_only_depth += 1
            state.in_download += 1

    @handles(*(f"leave_{kind}" for kind in STATEMENT_KINDS))
    def _side_effects_after_statement(self, original: cst.BaseStatement, result):
        state = self._side_effects
        unit = state.unit_of.get(id(original))
        if unit is None or id(unit) in state.nested_units:
            return result
        nodes = result.nodes if isinstance(result, cst.FlattenSentinel) else \
            [] if isinstance(result, cst.RemovalSentinel) else [result]
        if "downloads" in self.skip:
            if state.unit_starts.get(id(original)) is unit and nodes:
                self._skipped("downloads", nodes[0])
        elif _runs_alone(unit):
            self.ctx.main_only_depth -= 1
            state.in_download -= 1
            for new in nodes:
                self.ctx.unit_outputs[id(new)] = (new, unit)
        elif state.unit_starts.get(id(original)) is unit and nodes:
            self._report_download(nodes[0], unit)
        return result

    def _report_download(self, node: cst.CSTNode, unit: DownloadUnit) -> None:
        why = (f"later code reads what it binds ({', '.join(f'`{n}`' for n in unit.read_after)})"
               if unit.read_after else "it returns or leaves its loop")
        self._edit(node, "download", "a hand-written download (the fetch with the writes, "
                   "extraction and removals after it) that every process runs at once, and "
                   f"distify cannot run it on the main process only: {why}; other processes may "
                   "read its files before they are written, or after they are removed: put it "
                   f"under `with {self.rt}.main_process_first():` with "
                   f"`if {self.rt}.is_main_process():` around the download itself", human=True)

    @handles("visit_Try")
    def _side_effects_on_try(self, node: cst.Try) -> None:
        for handler in node.handlers:
            self._side_effects.handler_calls.update(_call_ids(handler.body))

    def _side_effects_may_call(self, qual: str) -> bool:
        """Can :meth:`_rewrite_side_effect_call` act on a call of ``qual`` (whatever its
        arguments, apart from a ``download=`` keyword: see :meth:`_side_effects_may_download`)?
        False only where each of its branches returns None and records nothing. (Its
        ``_side_effect`` names the callee loosely, ``ImportMap.cst_loose_qualname``; for a
        Name/Attribute chain, the only callee with a qualified name, that is ``qual`` itself.)"""
        rules = self.rules
        return (qual == "print" or qual in _OPENS or _downloads_itself(rules, qual)
                or qual in self._side_effects.trackers
                or any(rules.match(category, qual) is not None for category in _CALL_CATEGORIES)
                or _LOGGERISH.fullmatch(qual.rsplit(".", 1)[-1]) is not None)

    def _side_effects_may_download(self, call: cst.Call) -> bool:
        """A call that asks to download (``download=True``) in a run of statements grouped as
        a download (its statement is marked, whatever the callee)."""
        return bool(self.ctx.downloads) and any(
            arg.keyword is not None and arg.keyword.value == "download" for arg in call.args)

    def _rewrite_side_effect_call(self, original: cst.Call, updated: cst.Call,
                                  qual: str) -> cst.BaseExpression | None:
        rules = self.rules
        if qual == "print" and "print" not in self.facts.bound \
                and id(original) not in self._smoke_test_calls():  # the builtin, not a local
            if self._skipped("print", updated):
                return None
            return self._retarget(updated, "print", "print", "print on the main process only",
                                  original)
        if qual in _OPENS and self._is_open(original.func) and not self._side_effects.in_download:
            new = self._runtime_open(original, updated)
            if new is not None:
                return new
        if self.ctx.downloads and not self.ctx.main_only_depth and self._downloads_here(
                original, qual) and not self._calls_downloading_function(original) \
                and not self._skipped("downloads", updated):
            self.ctx.downloads[-1] = True
        if rules.match("grad_scalers", qual):
            self.own_mixed_precision = True
            self._edit(updated, "mixed-precision", "this script manages its own mixed "
                       "precision (a GradScaler): kept as written, it works under DDP; keep "
                       "distify's --mixed-precision at 'no' so the loss is not scaled twice",
                       human=True)
            return None
        if rules.match("progress_bars", qual) and not _has_keyword(updated, "disable") \
                and not self._skipped("progress-bars", updated):
            new = updated.with_changes(args=[*_with_trailing_comma(updated.args), cst.Arg(
                keyword=cst.Name("disable"), value=cst.UnaryOperation(
                    cst.Not(), self._rt_call("is_main_process")),
                equal=_EQUAL)])
            self._edit(new, "progress", "progress bar shown on the main process only")
            return new
        if rules.match("logging_setup", qual) and _has_keyword(updated, "level"):
            return None if self._skipped("logging", updated) else self._quiet_other_ranks(updated)
        if rules.match("timestamps", qual) and qual.endswith("strftime"):
            return None if self._skipped("timestamps", updated) else self._agree(updated)
        kind = self._side_effect(original)
        if kind is not None and not self.ctx.main_only_depth and not self._statement_call:
            if kind == "tracker" and not self._skipped("guard-side-effects", updated):
                new = updated.with_changes(func=self._rt_call("on_main_process", updated.func))
                self._edit(new, "guard", f"{qual}(...) runs on the main process only (other "
                           "processes get an object that ignores every call)")
                return new
            if kind != "tracker":
                self._edit(updated, "side-effect", f"{qual}(...) writes on every process: "
                           f"guard it with `if {self.rt}.is_main_process():`", human=True)
        elif kind is None and not self.ctx.main_only_depth:
            self._report_unknown_logger(updated, qual)
        if rules.match("saves", qual) and self._into_memory(original):
            return None  # `torch.save(obj, buffer)`: every process keeps its own bytes
        for category, kind, what in _RUNTIME_REPLACEMENTS:
            entry = rules.match(category, qual)
            if entry is not None and entry.get("runtime"):
                if self._skipped(_REWRITE_OF[kind], updated):
                    return None
                name = entry.get("runtime")
                caveat = None
                if name in ("save", "load"):
                    updated = self._file_argument_to_path(updated, name)
                    caveat = self._through_file_object(updated, name)
                if caveat is None:
                    return self._retarget(updated, name, kind,
                                          f"{qual} → {self.rt}.{name}: {what}"
                                          + self._resume_hint(original, name), original)
                new = self._retarget(updated, name, kind, f"{qual} → {self.rt}.{name}",
                                     original)
                self._edit(new, "checkpoint", caveat, human=True)
                return new
        return None

    def _report_unknown_logger(self, call: cst.Call, qual: str) -> None:
        """``Logger(log_dir)`` imported from a module distify does not know: say it may log on
        every process (a local class is looked into instead, see :func:`_tracker_classes`)."""
        if not _LOGGERISH.fullmatch(qual.rsplit(".", 1)[-1]) \
                or qual.split(".")[0] in _STDLIB or self.rules.match("side_effects", qual):
            return  # the standard library's writers (csv.DictWriter) write into their file
        if (dotted_name(call.func) or "").split(".")[0] not in self.facts.imports.aliases:
            return  # a local class: looked into (see _tracker_classes)
        self._edit(call, "tracker", f"`{qual}(...)` is built on every process and distify "
                   "does not know what it writes: if it logs to files or a tracker, build it on "
                   f"the main process only: `{self.rt}.on_main_process({_code(call.func)})(...)`",
                   human=True)

    def _resume_hint(self, call: cst.Call, name: str) -> str:
        """For a save of the training state: what an exact resume of a distributed job needs
        beyond it. The conversion keeps the script's own checkpoint (at world size 1 it must
        write what the original writes), so it says where ``save_state`` would go instead."""
        if name != "save" or not call.args or \
                not self._holds_optimizer_state(call.args[0].value):
            return ""
        return (f"; it holds the training state: to resume a job killed mid-epoch exactly "
                f"(data order, each process's random state) save with "
                f"`{self.rt}.save_state(folder, epoch=...)` and resume with "
                f"`{self.rt}.load_state(folder)` after prepare")

    def _rewrite_timestamp_method(self, original: cst.Call,
                                  updated: cst.Call) -> cst.BaseExpression | None:
        """``datetime.now().strftime(...)`` → the main process's reading."""
        receiver = original.func.value
        if type(receiver) is cst.Call and \
                self.rules.match("timestamps", self._qual(receiver.func)) \
                and not self._skipped("timestamps", updated):
            return self._agree(updated)
        return None

    def _side_effect(self, call: cst.BaseExpression) -> str | None:
        """The side-effect kind of ``call`` when it writes on every process, else None (the
        decision :mod:`distify.analysis.effects` makes for ``check`` too)."""
        if type(call) is not cst.Call:
            return None
        callee = self.facts.imports.cst_loose_qualname(call.func)
        if callee in self._side_effects.trackers:
            return "tracker"
        if callee is None or self.rules.match("saves", callee) \
                or self.rules.match("side_effects", callee) is None or self._is_open(call.func):
            return None  # the builtin open becomes the runtime's (see _runtime_open)
        shape = cst_shape(call, self.facts.imports)
        entry = side_effect(self.rules, callee, shape)
        if entry is None:
            return None
        if entry.get("errors_stay") and (not self.ctx.loops
                                         or id(call) in self._side_effects.handler_calls
                                         or not _progress_line(call)):
            return None  # an error or a per-process line (not a progress line): every process
            # shows it
        handle_arg = entry.get("handle_arg")
        if handle_arg is not None:  # a dump into a file the runtime opened: once, by design
            handle = shape.argument(handle_arg, HANDLE_KEYWORDS)
            if handle is not None and (handle.dotted in self.ctx.runtime_handles
                                       or handle.call in _OPENS):
                return None
        return entry.get("kind")

    def _through_file_object(self, call: cst.Call, name: str) -> str | None:
        """What a save or load through a file object (not a path) still guarantees, when it is
        less than by path: the report must not claim atomic or waited-for where it is not."""
        value = cst_shape(call, self.facts.imports).argument(1 if name == "save" else 0,
                                                             ("f",))
        if value is None or value.call in (None, f"{self.rt}.open", *_OPENS) \
                or not is_open_call(self.rules, value.call):
            return None  # a path, or a file distify.open opens: atomic and waited for

        return (f"through a file object ({value.call}(...)), which every process opens (and "
                "truncates): only the main process writes it, not atomically, and the others do "
                "not wait for it; save by path" if name == "save" else
                f"through a file object ({value.call}(...)): onto this process's device, "
                "without waiting for a save of it")

    def _into_memory(self, call: cst.Call) -> bool:
        """Does this save write into an ``io.BytesIO`` built in this scope?"""
        return saves_into_memory(cst_shape(call, self.facts.imports), self._scope.buffers)

    def _is_open(self, func: cst.BaseExpression) -> bool:
        """The builtin ``open`` (or ``io.open``), or the runtime's that replaces it."""
        qual = self._qual(func)
        if qual == f"{self.rt}.open":
            return True
        return qual in _OPENS and not (qual == "open" and "open" in self.facts.bound)

    def _runtime_open(self, original: cst.Call, updated: cst.Call) -> cst.Call | None:
        """``open(p, "w")`` → ``rt.open(p, "w")``: the main process writes, atomically, the
        others write into nothing; ``open(p)`` of a path the script writes → ``rt.open(p)``,
        which waits for the main process's write of it."""
        shape = cst_shape(original, self.facts.imports)
        mode = shape.argument(1, ("mode",))
        if mode is not None and not mode.is_constant:
            return None  # a mode decided at run time: left to a human (reported as a write)
        text = mode.constant if mode is not None else "r"
        if not isinstance(text, str) or not original.args or original.args[0].keyword:
            return None
        if writes_mode(text):
            what = ("appended to by the main process only (the others write into nothing)"
                    if "a" in text or "+" in text else
                    "written by the main process only, atomically (the others write into "
                    "nothing); a later read of it waits until it is complete")
        elif self._reads_a_written_path(original.args[0].value):
            what = "read once the main process has finished writing it"
        else:
            self._report_unmatched_read(original, updated)
            return None
        if self._skipped("file-writes", updated):
            return None
        return self._retarget(updated, "open", "write", f"open → {self.rt}.open: {what}")

    def _reads_a_written_path(self, path: cst.BaseExpression) -> bool:
        """Does the script write the path that ``path`` names, however it spells it?"""
        written = self.facts.written_paths
        if not written:
            return False
        spelling = _normalised(path)
        if spelling in written:
            return True
        key = path_key(spelling)
        return key is not None and any(path_key(other) == key for other in written)

    def _report_unmatched_read(self, original: cst.Call, updated: cst.Call) -> None:
        """A read of a file whose name the script also writes under a path that distify cannot
        tell is the same (``"runs/h.json"`` read, ``os.path.join(out, "h.json")`` written):
        other processes may read it before the main process has written it."""
        key = path_key(_normalised(original.args[0].value))
        name = _file_name(key)
        if name is None:
            return
        for other in sorted(self.facts.written_paths):
            written = path_key(other)
            # two constant paths that differ are two files; a piece decided at run time
            # (`args.out`) may make them one
            if _file_name(written) == name and "\0" in key + written:
                self._edit(updated, "read-unmatched", f"this reads `{name}`, which the script "
                           f"writes as `{other}`, but distify cannot tell that the two paths "
                           "are the same file: if they are, spell the path the same way in "
                           f"both (or read it with {self.rt}.open(...)), so that the read waits "
                           "for the main process's write; as written, other processes may read "
                           "it before it is written", human=True)
                return

    def _is_side_effect_stmt(self, small: cst.BaseSmallStatement) -> bool:
        return (type(small) is cst.Expr and self._side_effect(small.value) is not None) \
            or self._sets_wandb_state(small)

    def _sets_wandb_state(self, small: cst.BaseSmallStatement) -> bool:
        """``wandb.run.name = ...``, ``wandb.config.lr = ...``: wandb's state, which exists on
        the process that ran ``wandb.init`` only (the main one, once converted)."""
        if type(small) is cst.Assign:
            targets = [t.target for t in small.targets]
        elif type(small) in (cst.AugAssign, cst.AnnAssign):
            targets = [small.target]
        else:
            return False
        return all(type(t) in (cst.Attribute, cst.Subscript)
                   and (self._qual(_root_of(t)) or "") == "wandb" for t in targets)

    def _guard_side_effect(self, original: cst.SimpleStatementLine,
                           updated: cst.SimpleStatementLine) -> cst.If | None:
        if self.ctx.main_only_depth or len(original.body) != 1:
            return None
        small = original.body[0]
        if not self._is_side_effect_stmt(small) or self._skipped("guard-side-effects", updated):
            return None
        if type(small) is not cst.Expr:  # `wandb.run.name = ...`
            target = small.targets[0].target if type(small) is cst.Assign else small.target
            return self._main_only(updated, f"{_code(target)} = ... runs on the main process "
                                            "only (wandb's state exists there only)")
        what = dotted_name(small.value.func) or "this call"
        return self._main_only(updated, f"{what}(...) runs on the main process only")

    def _main_only(self, stmt, message: str) -> cst.If:
        """``if rt.is_main_process():`` around ``stmt`` (which keeps its comments above)."""
        guard = guarded([stmt], self._rt_call("is_main_process"))
        self._edit(guard.body.body[0], "guard", message)
        self.ctx.guards.add(guard)
        return guard

    def _merge_guards(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """Adjacent statements guarded by the rewrite share one ``if rt.is_main_process():``
        (not across a comment or a blank line, which stay where the script has them)."""
        return merge_guards(body, lambda stmt: stmt in self.ctx.guards or None,
                            across_comments=False, merged=self.ctx.guards.add)

    @handles("visit_With")
    def _side_effects_on_with(self, node: cst.With) -> None:
        for item in node.items:
            if type(item.item) is cst.Call and self._is_open(item.item.func) \
                    and type(item.asname) is cst.AsName \
                    and type(item.asname.name) is cst.Name:
                self.ctx.runtime_handles.add(item.asname.name.value)
        if any(is_eval_context(self.rules, self._qual(_callee(item.item))) for item in node.items):
            self.ctx.no_grad_depth += 1
        if self._writes_file(node):
            self.ctx.main_only_depth += 1

    @handles("leave_With")
    def _side_effects_after_with(self, original: cst.With, updated: cst.With):
        if any(is_eval_context(self.rules, self._qual(_callee(item.item)))
               for item in original.items):
            self.ctx.no_grad_depth -= 1
        by_path = self._checkpoint_by_path(updated)
        if self._writes_file(original):
            self.ctx.main_only_depth -= 1
            if by_path is not None:
                return by_path
            if not self.ctx.main_only_depth and not self._skipped("file-writes", updated):
                return self._main_only(updated, "file written by the main process only")
        return by_path if by_path is not None else updated

    def _checkpoint_by_path(self, node: cst.With) -> cst.SimpleStatementLine | None:
        """``with open(p, "wb") as f: torch.save(obj, f)`` → ``rt.save(obj, p)``, and ``with
        open(p, "rb") as f: x = torch.load(f)`` → ``x = rt.load(p)``: by path, the save is
        atomic and a load on another process waits for it (a file object gives neither: the
        main process truncates the file before writing, and the others read whatever is there).
        Any other use of the file object inside the block is reported instead."""
        if len(node.items) != 1 or type(node.items[0].asname) is not cst.AsName:
            return None
        item = node.items[0]
        handle = item.asname.name
        if not (type(item.item) is cst.Call and self._is_open(item.item.func)
                and type(handle) is cst.Name and item.item.args):
            return None
        uses = _runtime_io_calls(node.body, self.rt, handle.value)
        if not uses or "save-load" in self.skip:
            return None
        body = node.body.body if type(node.body) is cst.IndentedBlock else ()
        line = body[0] if len(body) == 1 else None
        small = line.body[0] if type(line) is cst.SimpleStatementLine and \
            len(line.body) == 1 else None
        call = small.value if type(small) in (cst.Expr, cst.Assign) else None
        if len(uses) != 1 or call is not uses[0] or item.item.args[0].keyword is not None:
            if dotted_name(item.item.func) == f"{self.rt}.open":
                return None  # the runtime's file: atomic, and waited for (see _runtime_open)
            for use in uses:  # the report must not claim what a file object does not give
                self.edits = [e for e in self.edits if e.node is not use]
                self._edit(use, "checkpoint", f"{dotted_name(use.func)}(...) through a file "
                           "object: not atomic, and other processes do not wait for it; save "
                           f"and load by path ({self.rt}.save(obj, path), {self.rt}.load(path))",
                           human=True)
            return None
        path = item.item.args[0].value.deep_clone()
        position = 1 if dotted_name(call.func) == f"{self.rt}.save" else 0
        args = [a.with_changes(value=path) if i == position else a
                for i, a in enumerate(call.args)]
        new_call = call.with_changes(args=args)
        self.edits = [e for e in self.edits if e.node is not call]
        what = "saved by the main process only, atomically" if position else \
            "read once the main process has finished saving it"
        self._edit(new_call, "checkpoint", f"a checkpoint through a file object → by path: {what}")
        new_small = small.with_changes(value=new_call)
        return line.with_changes(body=[new_small], leading_lines=node.leading_lines)

    def _writes_file(self, node: cst.With) -> bool:
        return any(self._side_effect(item.item) == "write" for item in node.items)

    def _group_units(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """A hand-written download's statements → ``with rt.main_process_first():`` around
        ``if rt.is_main_process():`` (the others wait at its end, then go on)."""
        out: list[cst.BaseStatement] = []
        run: list[cst.BaseStatement] = []
        unit = None
        for stmt in [*body, None]:
            entry = self.ctx.unit_outputs.get(id(stmt)) if stmt is not None else None
            mine = entry is not None and entry[0] is stmt
            if mine and (not run or entry[1] is unit):
                run.append(stmt)
                unit = entry[1]
                continue
            if run:
                out.append(self._download_unit_block(run))
                run, unit = [], None
            if mine:
                run, unit = [stmt], entry[1]
            elif stmt is not None:
                out.append(stmt)
        return out

    def _download_unit_block(self, run: list[cst.BaseStatement]) -> cst.With:
        inner = guarded(run, self._rt_call("is_main_process"))
        block = cst.With(items=[cst.WithItem(self._rt_call("main_process_first"))],
                         body=cst.IndentedBlock([inner.with_changes(leading_lines=())]),
                         leading_lines=inner.leading_lines)
        self._edit(block.items[0], "download", "a hand-written download run as one unit: the "
                   "main process fetches, writes, extracts and removes its files; the others "
                   "wait, then read what it left")
        return block

    def _group_downloads(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """Consecutive statements that download a dataset → ``with rt.main_process_first():``."""
        if self.ctx.unit_outputs:
            body = self._group_units(body)
        out: list[cst.BaseStatement] = []
        run: list[cst.BaseStatement] = []
        for stmt in [*body, None]:
            if stmt is not None and stmt in self.ctx.download_stmts:
                run.append(stmt)
                continue
            if run:
                first = run[0]
                block = cst.With(items=[cst.WithItem(self._rt_call("main_process_first"))],
                                 body=cst.IndentedBlock([first.with_changes(leading_lines=()),
                                                         *run[1:]]),
                                 leading_lines=first.leading_lines)
                self._edit(block.items[0], "download", "the main process downloads the "
                           "dataset first; the others wait, then read its copy")
                out.append(block)
                run = []
            if stmt is not None:
                out.append(stmt)
        return out

    def _smoke_test_calls(self) -> set[int]:
        """The calls in a model file's smoke test, left as written: a file that trains nothing
        (no backward, optimizer or DataLoader), its ``if __name__ == "__main__":`` block and
        the functions only that block calls (``test()``, which prints a forward's shape). Run
        as a script it is one process; imported, the block does not run."""
        if self._side_effects.smoke_calls is None:
            self._side_effects.smoke_calls = set()
            training = self.facts.training
            if training.backward_count or any(training.optimizer_models.values()) \
                    or self.facts.builds_loaders:
                return self._side_effects.smoke_calls
            module = self._side_effects.module
            guards = [s for s in module.body if type(s) is cst.If and _is_main_guard(s)]
            called = {c.func.value for g in guards for c in calls_in(g)
                      if type(c.func) is cst.Name}
            rest = [s for s in module.body if s not in guards]
            used = {n.value for s in rest for n in nodes_in(s, cst.Name)
                    if not (type(s) is cst.FunctionDef and n is s.name)}
            tests = [s for s in rest if type(s) is cst.FunctionDef
                     and s.name.value in called - used]
            self._side_effects.smoke_calls = {id(c) for part in (*guards, *tests)
                                              for c in calls_in(part)}
        return self._side_effects.smoke_calls

    def _downloads_here(self, call: cst.Call, qual: str | None) -> bool:
        """A data set built with ``download=...`` (not False), or one that downloads itself."""
        return any(arg.keyword and arg.keyword.value == "download" and not _is_false(arg.value)
                   for arg in call.args) or _downloads_itself(self.rules, qual or "")

    def _calls_downloading_function(self, call: cst.Call) -> bool:
        """``get_dataset(name, download=True)`` of a local function whose own body downloads:
        that body is put under ``main_process_first`` where it downloads, so the call is not
        (the main process would wait in one ``main_process_first`` inside another)."""
        name = local_callee(call.func)
        if name is None:
            return False
        if self._side_effects.downloading_functions is None:
            self._side_effects.downloading_functions = {
                d.name.value for d in nodes_in(self._side_effects.module, cst.FunctionDef)
                if any(self._downloads_here(c, self._qual(c.func)) for c in calls_in(d.body))}
        return name in self._side_effects.downloading_functions

    def _quiet_other_ranks(self, call: cst.Call) -> cst.Call:
        func = call.func  # `logging.basicConfig` → `logging.WARNING`; else the level's name
        warning: cst.BaseExpression = cst.SimpleString('"WARNING"')
        if type(func) is cst.Attribute and type(func.value) is cst.Name:
            warning = cst.Attribute(value=cst.Name(func.value.value), attr=cst.Name("WARNING"))
        args = []
        for arg in call.args:
            if arg.keyword and arg.keyword.value == "level":
                arg = arg.with_changes(value=cst.IfExp(
                    test=self._rt_call("is_main_process"), body=arg.value, orelse=warning))
            args.append(arg)
        new = call.with_changes(args=args)
        self._edit(new, "logging", "other processes log warnings and errors only")
        return new

    def _agree(self, call: cst.Call) -> cst.Call:
        new = self._rt_call("broadcast_object", call)
        self._edit(new, "timestamp", "the main process's clock names the run, so every "
                   "process agrees on it")
        return new

    def _retarget(self, call: cst.Call, name: str, kind: str, message: str,
                  original: cst.Call | None = None) -> cst.Call:
        """Call ``rt.<name>`` with the same arguments; keep aligned continuation lines aligned,
        and move the arguments of a one-line call to the next line when the longer name would
        push the line past the file's own line length."""
        func = self._rt_attr(name)
        delta = len(_code(func)) - len(_code(call.func))
        breaks = self._holds_line_break(call, original)
        if call.args and not breaks and self._too_long(delta):
            new = self._hanging(call.with_changes(func=func))
        elif breaks:
            new = _shift_continuations(call, delta, self._opening_column(original),
                                       self.ctx.depth * len(self.ctx.indent_unit))
            new = new.with_changes(func=func)
        else:  # no continuation line to move
            new = call.with_changes(func=func)
        self._edit(new, kind, message)
        return new

    def _opening_column(self, original: cst.Call | None) -> int | None:
        """The column just after ``original``'s parenthesis, when the call starts its
        statement's line (``print(...)``); else None."""
        statement = self.ctx.statements[-1] if self.ctx.statements else None
        if original is None or statement is None or not statement.body:
            return None
        first = statement.body[0]
        if not (type(first) is cst.Expr and first.value is original):
            return None
        return self.ctx.depth * len(self.ctx.indent_unit) + len(_code(original.func)) + 1

    def _file_argument_to_path(self, call: cst.Call, name: str) -> cst.Call:
        """``rt.save(obj, open(p, "wb"))`` → ``rt.save(obj, p)`` (and ``rt.load(open(p))``):
        opened on every process, the file was truncated by all of them."""
        position = 1 if name == "save" else 0
        positional = [a for a in call.args if a.keyword is None and not a.star]
        if len(positional) <= position:
            return call
        value = positional[position].value
        if not (type(value) is cst.Call and self._is_open(value.func) and value.args
                and value.args[0].keyword is None):
            return call
        index = list(call.args).index(positional[position])
        args = list(call.args)
        args[index] = args[index].with_changes(value=value.args[0].value)
        return call.with_changes(args=args)

    @handles("leave_FormattedStringExpression")
    def _side_effects_after_formatted_string_expression(self, original, updated):
        expr = original.expression
        if (type(expr) is cst.Call and self.rules.match("timestamps", self._qual(expr.func))
                and not _is_rt_call(updated.expression, self.rt, "broadcast_object")):
            return updated.with_changes(expression=self._agree(updated.expression))
        return updated


def _runtime_io_calls(body: cst.BaseSuite, rt: str, handle: str) -> list[cst.Call]:
    """The ``rt.save(..., handle)`` / ``rt.load(handle, ...)`` calls in ``body``."""
    found: list[cst.Call] = []

    class _Finder(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            name = dotted_name(call.func)
            position = {f"{rt}.save": 1, f"{rt}.load": 0}.get(name or "")
            if position is not None and len(call.args) > position:
                value = call.args[position].value
                if type(value) is cst.Name and value.value == handle:
                    found.append(call)

    walk(body, _Finder())
    return found


def _file_name(key: str | None) -> str | None:
    """The last component of a normalised path when it is a constant (``h.json``)."""
    if key is None:
        return None
    name = posixpath.basename(key)
    return name if name and "\0" not in name and name not in (".", "..") else None


def _runs_alone(unit: DownloadUnit) -> bool:
    """Can the unit run on the main process only (nothing after it needs what it binds)?"""
    return not unit.read_after and not unit.leaves


def _is_main_guard(node: cst.If) -> bool:
    """``if __name__ == "__main__":``, either way round."""
    test = node.test
    if type(test) is not cst.Comparison or len(test.comparisons) != 1 \
            or type(test.comparisons[0].operator) is not cst.Equal:
        return False
    sides = {cst.Module([]).code_for_node(side).replace("'", '"')
             for side in (test.left, test.comparisons[0].comparator)}
    return sides == {"__name__", '"__main__"'}


def _downloads_itself(rules, qual: str) -> bool:
    """A data set that downloads its files when they are missing (``Planetoid(root, name)``)."""
    entry = rules.match("downloads", qual)
    return entry is not None and entry.get("kind") == "dataset"


def _root_of(node: cst.BaseExpression) -> cst.BaseExpression:
    """``a`` of ``a.b[c].d``."""
    while type(node) in (cst.Attribute, cst.Subscript):
        node = node.value
    return node


def _call_ids(body: cst.CSTNode) -> set[int]:
    """The ids of every call inside ``body``."""
    found: set[int] = set()
    stack = [body]
    while stack:
        node = stack.pop()
        if type(node) is cst.Call:
            found.add(id(node))
        stack.extend(node.children)
    return found


def _tracker_classes(module: cst.Module, mixin: SideEffectMixin) -> set[str]:
    """Local classes that are trackers: a subclass of one (``class W(SummaryWriter)``), or one
    whose ``__init__`` builds one (a TensorFlow ``FileWriter`` wrapper). Model classes never."""
    found: set[str] = set()
    classes = [s for s in module.body if type(s) is cst.ClassDef]
    builds: dict[int, bool] = {}  # each class's __init__ is read once, not once per round
    for _ in range(3):  # a subclass of a local tracker class is one too
        for cls in classes:
            name = cls.name.value
            if name in found or name in mixin.facts.model_classes:
                continue
            bases = [mixin.facts.imports.cst_loose_qualname(b.value) for b in cls.bases]
            if any(b in found or _is_tracker(mixin, b) for b in bases):
                found.add(name)
                continue
            if id(cls) not in builds:
                builds[id(cls)] = _builds_tracker(cls, mixin)
            if builds[id(cls)]:
                found.add(name)
    return found


def _is_tracker(mixin: SideEffectMixin, qual: str | None) -> bool:
    entry = mixin.rules.match("side_effects", qual)
    return entry is not None and entry.get("kind") == "tracker"


def _builds_tracker(cls: cst.ClassDef, mixin: SideEffectMixin) -> bool:
    init = next((s for s in cls.body.body if type(s) is cst.FunctionDef
                 and s.name.value == "__init__"), None) \
        if type(cls.body) is cst.IndentedBlock else None
    if init is None:
        return False
    finder = _TrackerCalls(mixin)
    walk(init, finder)
    return finder.found


class _TrackerCalls(cst.CSTVisitor):
    """Does a subtree call a tracker's constructor? (One class, so :func:`walk` plans it once.)"""

    def __init__(self, mixin: SideEffectMixin) -> None:
        super().__init__()
        self.mixin = mixin
        self.found = False

    def visit_Call(self, node: cst.Call) -> None:
        self.found = self.found or _is_tracker(
            self.mixin, self.mixin.facts.imports.cst_loose_qualname(node.func))


def _written_text(node: cst.BaseExpression) -> str | None:
    """The text a ``write(...)`` argument writes, as far as its own literal tells: a string,
    the format of ``"..." % args`` or ``"...".format(...)``, an f-string's text parts (each
    expression read as ``{}``); None when it is not spelled in the call."""
    if type(node) is cst.BinaryOperation and type(node.operator) is cst.Modulo:
        return _written_text(node.left)
    if type(node) is cst.Call and type(node.func) is cst.Attribute \
            and node.func.attr.value == "format":
        return _written_text(node.func.value)
    if type(node) is cst.SimpleString:
        value = literal_value(node)
        return value if isinstance(value, str) else None
    if type(node) is cst.ConcatenatedString:
        left, right = _written_text(node.left), _written_text(node.right)
        return None if left is None or right is None else left + right
    if type(node) is cst.FormattedString:
        text = "".join(part.value if type(part) is cst.FormattedStringText else "{}"
                       for part in node.parts)
        return text if "r" in node.prefix.lower() else \
            text.replace("\\r", "\r").replace("\\n", "\n")
    return None


def _progress_line(call: cst.Call) -> bool:
    """``sys.stderr.write("step %d\\r" % i)``: a line rewritten in place, one left open (no
    newline at its end) or a bare newline that ends one is a progress line; a whole line
    (``"...\\n"``) or a text distify cannot read is a process's own message, which every
    process keeps."""
    if not call.args:
        return False
    text = _written_text(call.args[0].value)
    return text is not None and ("\r" in text or not text.endswith("\n") or not text.strip())

