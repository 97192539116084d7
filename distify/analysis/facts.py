"""Whole-file facts gathered with the standard library's fast ``ast`` parser, before any rewrite.

These are the facts a rewrite needs about the *whole* file before it touches the first line:
which names are imported from where, whether the file is already distributed, which local
classes are models, and which names are taken (so the runtime's import collides with nothing).
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distify.analysis import parallelism
from distify.analysis.astwalk import walk
from distify.analysis.bptt import RESHAPES, reshape_dim_names
from distify.analysis.draws import may_draw_batches
from distify.analysis.effects import writes_mode
from distify.analysis.evaluation import EvalFlow, FlowFinder
from distify.analysis.loaders import is_loaderish
from distify.analysis.names import ImportMap
from distify.analysis.parallelism import Parallelism
from distify.analysis.training import Training, analyse, collect
from distify.errors import UserError
from distify.rules import RuleSet

if TYPE_CHECKING:
    from distify.analysis.filemodel import FileModel

#: every draw :func:`may_draw_batches` looks for contains one of these
_DRAW_WORDS = (b"rand", b"normal", b"multinomial", b"choice", b"shuffle", b"sample", b"gauss",
               b"uniform", b"permutation")


@dataclass
class FileFacts:
    imports: ImportMap
    #: whether (and why) the file is already distributed or multi-process, or None
    parallel: Parallelism | None = None
    #: local classes whose bases resolve to a model base (nn.Module, PreTrainedModel, ...)
    model_classes: set[str] = field(default_factory=set)
    #: every identifier the file binds or reads
    names: set[str] = field(default_factory=set)
    #: identifiers the file binds itself (assignments, defs, parameters, imports)
    bound: set[str] = field(default_factory=set)
    #: identifiers the file reads (``total`` of ``total += n`` is only bound)
    read: set[str] = field(default_factory=set)
    #: the file builds DataLoaders (so a function parameter iterated in a loop may be one)
    builds_loaders: bool = False
    #: function name → the parameters some call of it in this file fills with a loader (a
    #: DataLoader built in the call, a name bound to one, a name about loaders); a function
    #: not in it has no call here that binds its parameters (called from elsewhere)
    loader_params: dict[str, set[str]] = field(default_factory=dict)
    #: targets (as ``ast.unparse`` writes them: ``train_loader``, ``self.loader``) assigned a
    #: DataLoader the file builds (a call the ``dataloaders`` rules name) ...
    loader_targets: set[str] = field(default_factory=set)
    #: ... and those assigned ``iter()`` of one of them (``it = iter(train_loader)``), in
    #: source order: an ``iter()`` before the loader's assignment is no iterator of it
    loader_iterators: set[str] = field(default_factory=set)
    #: the longest line, in characters: the file's own line-length habit
    longest_line: int = 0
    #: the file seeds a random generator somewhere (``torch.manual_seed``, ``set_seed``, ...)
    seeds: bool = False
    #: the paths it opens for writing with the builtin ``open`` (as ``ast.unparse`` spells them)
    written_paths: set[str] = field(default_factory=set)
    #: a loop may draw its own batches or noise (see :func:`~.draws_flow.may_draw_batches`)
    may_draw_batches: bool = False
    #: a function may lay a token stream out in columns (see :mod:`~.bptt`)
    may_batchify: bool = False
    #: what its optimizers and backward passes train (see :mod:`distify.analysis.training`)
    training: Training = field(default_factory=Training)
    #: criteria, per-batch helpers and evaluation called from elsewhere (see :class:`EvalFlow`)
    evaluation: EvalFlow = field(default_factory=EvalFlow)


def parse_ast(source: bytes, path: str) -> ast.Module:
    """Parse with ``ast``; a syntax error becomes a one-line :class:`UserError` with position."""
    try:
        with warnings.catch_warnings():  # the script's own warnings (invalid escapes, ...)
            warnings.simplefilter("ignore")  # are its author's business, not the report's
            return ast.parse(source, filename=path)
    except SyntaxError as err:
        if err.lineno is None and b"\0" in source:  # no position from the parser: find it
            line = source[:source.index(b"\0")].count(b"\n") + 1
            raise UserError("cannot read as Python source: it contains null bytes "
                            "(a binary file?)", path=path, line=line, col=1) from None
        raise UserError(f"syntax error: {err.msg}", path=path, line=max(err.lineno or 1, 1),
                        col=_character_column(err)) from None
    except RecursionError:
        raise UserError("an expression is nested too deeply for Python's parser; split it over "
                        "a few statements", path=path, line=1, col=1) from None
    except (ValueError, UnicodeDecodeError) as err:  # null bytes, undecodable text
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"cannot read as Python source: {reason}", path=path, line=1,
                        col=1) from None


def _character_column(err: SyntaxError) -> int:
    """The 1-based column in characters: parsing bytes, CPython counts UTF-8 bytes."""
    offset = err.offset if err.offset and err.offset > 0 else 1
    if err.text is None:
        return offset
    prefix = err.text.encode("utf-8")[:offset - 1]
    return len(prefix.decode("utf-8", errors="ignore")) + 1


def gather_facts(tree: ast.Module, source: bytes, rules: RuleSet) -> FileFacts:
    """The :class:`FileFacts` of ``tree``: the conversion's view of a new
    :class:`~distify.analysis.filemodel.FileModel` (build the model yourself to read its other
    parts too)."""
    from distify.analysis.filemodel import FileModel

    return FileModel(tree, source, rules).facts


def convert_facts(model: FileModel) -> FileFacts:
    """Collect :class:`FileFacts` in one walk of ``model.tree`` (shared with the training
    analysis when the file may train, and with the parallelism search when no one asked for
    it before); the statements and the import table are the model's."""
    tree, source, rules = model.tree, model.source, model.rules
    facts = FileFacts(imports=model.imports)
    statements = model.statements
    markers = (parallelism.Finder(facts.imports, model.matcher)
               if not model.knows("parallel") and any(hint in source
                                                      for hint in parallelism.HINTS) else None)
    seed_names = ({name.rsplit(".", 1)[-1] for name in rules.names("seeds")}
                  if b"seed" in source else set())
    trains = model.may_train
    reshapes = b".view(" in source or b".reshape(" in source
    params: set[str] = set()  # every function's parameters
    dims: set[str] = set()  # names that are a dimension of a `.view(a, b)`/`.reshape(a, b)`
    flow = FlowFinder(facts.imports, rules) if trains else None  # evaluation across the file

    names, bound, read = facts.names, facts.bound, facts.read
    calls: list[ast.Call] = []

    def name(node: ast.Name) -> None:
        names.add(node.id)
        if type(node.ctx) is not ast.Load:
            bound.add(node.id)
        else:
            read.add(node.id)

    def defined(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        names.add(node.name)
        bound.add(node.name)

    def arg(node: ast.arg) -> None:
        names.add(node.arg)
        bound.add(node.arg)
        params.add(node.arg)

    def named(node: ast.ExceptHandler | ast.MatchAs | ast.MatchStar) -> None:
        if node.name:
            names.add(node.name)

    def rest(node: ast.MatchMapping) -> None:
        if node.rest:
            names.add(node.rest)

    def declared(node: ast.Global | ast.Nonlocal) -> None:
        names.update(node.names)

    def call(node: ast.Call) -> None:
        calls.append(node)
        if isinstance(node.func, ast.Name) and node.func.id == "open" and node.args:
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(mode, ast.Constant) and writes_mode(mode.value):
                facts.written_paths.add(ast.unparse(node.args[0]))
        elif reshapes and isinstance(node.func, ast.Attribute) and node.func.attr in RESHAPES:
            dims.update(reshape_dim_names(node.args))
        elif seed_names and not facts.seeds and _last_name(node.func) in seed_names:
            facts.seeds = rules.match("seeds",
                                      facts.imports.ast_qualname(node.func)) is not None

    # node type → what it tells (a dict lookup per node, not a chain of isinstance tests)
    handlers: dict[type, Callable[[Any], None]] = {
        ast.Name: name, ast.FunctionDef: defined, ast.AsyncFunctionDef: defined,
        ast.ClassDef: defined, ast.arg: arg, ast.ExceptHandler: named, ast.MatchAs: named,
        ast.MatchStar: named, ast.MatchMapping: rest, ast.Global: declared,
        ast.Nonlocal: declared, ast.Call: call}
    handler_of = handlers.get

    def each(node: ast.AST) -> None:
        handler = handler_of(type(node))
        if handler is not None:
            handler(node)

    seen = parallelism.SEEN  # the markers read a few node types: not the rest

    def each_and_markers(node: ast.AST) -> None:  # each's body again: a call per node costs
        kind = type(node)
        handler = handler_of(kind)
        if handler is not None:
            handler(node)
        if kind in seen and not markers.done:
            markers.see(node)

    visit = each if markers is None else each_and_markers

    # the walk's order is the one :attr:`FileModel.parallel` searches in
    collected = collect(tree, facts.imports, rules, visit) if trains else None
    if collected is None:
        for node in walk(tree):  # breadth first, as the markers' first line always was
            visit(node)
    if markers is not None:
        model.give("parallel", markers.result())
    facts.parallel = model.parallel
    facts.names.update(facts.imports.aliases)
    facts.bound.update(facts.imports.aliases)
    facts.model_classes = model_classes(statements.classes, facts.imports, rules)
    facts.longest_line = max((len(line) for line in
                              source.decode("utf-8", errors="replace").splitlines()), default=0)
    if collected is not None:
        facts.training = analyse(collected, facts.model_classes)
        facts.may_draw_batches = any(word in source for word in _DRAW_WORDS) \
            and may_draw_batches(tree, facts.imports)
        facts.may_batchify = not params.isdisjoint(dims)
        seen_by_flow = FlowFinder.SEEN  # statements all: the flow reads nothing else
        for node in statements.all:
            if type(node) in seen_by_flow:
                flow.see(node)
        facts.evaluation = flow.result(tree)
    facts.builds_loaders = any(name.rsplit(".", 1)[-1].encode() in source
                               for name in rules.names("dataloaders"))
    _loader_targets(facts, statements.assignments, rules)
    if facts.builds_loaders:
        functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        for function in statements.functions:
            functions.setdefault(function.name, []).append(function)
        facts.loader_params = _loader_params(functions, calls, facts.loader_targets,
                                             facts.imports, rules)
    return facts


def _loader_targets(facts: FileFacts, assigns: list[ast.Assign | ast.AnnAssign],
                    rules: RuleSet) -> None:
    """:attr:`FileFacts.loader_targets` and :attr:`FileFacts.loader_iterators` from the file's
    assignments (:attr:`~distify.analysis.filemodel.Statements.assignments`, in source
    order; annotated ones are passed over)."""
    loaders, iterators = facts.loader_targets, facts.loader_iterators
    for node in assigns:
        value = node.value
        if type(node) is not ast.Assign or not isinstance(value, ast.Call):
            continue
        if rules.match("dataloaders", facts.imports.ast_qualname(value.func)):
            loaders.update(ast.unparse(t) for t in node.targets)
        elif isinstance(value.func, ast.Name) and value.func.id == "iter" and value.args \
                and ast.unparse(value.args[0]) in loaders:
            iterators.update(ast.unparse(t) for t in node.targets)


def _loader_params(functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]],
                   calls: list[ast.Call], targets: set[str], imports: ImportMap,
                   rules: RuleSet) -> dict[str, set[str]]:
    """See :attr:`FileFacts.loader_params`: calls by plain name (``evaluate(model, loader)``)
    and on ``self`` (``self.evaluate(loader)``), bound to the parameters of the file's
    functions of that name (the file's functions by name, and its calls from the walk of
    :func:`convert_facts`; ``targets``: :attr:`FileFacts.loader_targets`)."""
    loaders = {target for target in targets if target.isidentifier()}  # plain names

    def is_loader(value: ast.expr) -> bool:
        return is_loaderish(value, imports.ast_qualname,
                            known=lambda dotted: dotted.rsplit(".", 1)[-1] in loaders,
                            builds=lambda callee: rules.match("dataloaders", callee) is not None)

    found: dict[str, set[str]] = {}
    for call in calls:
        on_self = isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
            and call.func.value.id == "self"
        name = call.func.id if isinstance(call.func, ast.Name) else \
            call.func.attr if on_self else None
        for function in functions.get(name or "", []):
            params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
            if on_self and params[:1] == ["self"]:
                params = params[1:]
            filled = found.setdefault(function.name, set())
            for param, arg in zip(params, call.args):
                if isinstance(arg, ast.Starred):
                    break
                if is_loader(arg):
                    filled.add(param)
            filled.update(k.arg for k in call.keywords if k.arg and is_loader(k.value))
            if any(isinstance(arg, ast.Starred) for arg in call.args) \
                    or any(k.arg is None for k in call.keywords):
                filled.update(params)  # *args / **kwargs: anything may be a loader
    return found


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def model_classes(classes: list[ast.ClassDef], imports: ImportMap, rules: RuleSet) -> set[str]:
    """The names of ``classes`` that are models: a base a rule pack names (``nn.Module``), or
    another of these classes (``class Big(Small)``)."""
    found: set[str] = set()
    changed = True
    while changed:  # a class deriving from a local model class is a model class too
        changed = False
        for cls in classes:
            if cls.name in found:
                continue
            for base in cls.bases:
                dotted = imports.ast_qualname(base)
                if dotted in found or rules.match("model_bases", dotted):
                    found.add(cls.name)
                    changed = True
                    break
    return found
