"""Where a file's models are wrapped or prepared, and which models its optimizers train unwrapped.

A view of :mod:`distify.analysis.training` for ``distify check``: the optimizers and the models
they train come from the training flow (``X.parameters()``, grouped parameters, ``filter`` and
``itertools.chain``, optimizers of unknown libraries), and so does the aliasing: two names are one
model when the flow traces them to one origin (``net = model.to(device)``, ``self.model = model``,
a function's parameter and what its callers pass, a value a local function returns). On top of
that this module records, in the same walk:

- where models are wrapped or prepared: ``DDP(model)``, ``FSDP``/``fully_shard``,
  ``accelerator.prepare(...)``, ``fabric.setup(...)``, ``distify.prepare(...)``, Ray's
  ``prepare_model``, a helper named like ``shard_model``/``apply_fsdp``, ``model = wrap(model)``
  (any call bound back to the name, ``torch.compile`` alone excepted), ``model.module``; and
  models handed to a framework that syncs at the optimizer (Horovod, DeepSpeed);
- what makes wrapping unnecessary: no process group at all, gradients averaged by hand (a
  collective over ``.grad`` or inside a loop over ``parameters()``), RPC training, Hogwild
  (``share_memory()``);
- whether each trained model is *built* in the file (a class call, a model factory,
  ``from_pretrained``) on every path it comes from, rather than received from elsewhere;
- where each optimizer is stepped, and whether it sits in a framework's module class
  (``LightningModule``) or in a model's own method (where ``self`` is not a name to follow).

What it deliberately does not do: follow models through containers or attributes of other
objects, or into other files; a model it cannot trace is neither built nor wrapped here, and the
lint rule stays silent about it (a false alarm in a pre-commit hook costs more than a miss).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from distify.analysis.facts import model_classes
from distify.analysis.names import ImportMap, ast_dotted_name
from distify.analysis.training import Collector, Flow, Scope, dotted, optimizers
from distify.rules import Entry, RuleSet

if TYPE_CHECKING:
    from distify.analysis.training import Optimizer, _Scope

Match = Callable[[str, "str | None"], "Entry | None"]


class Lookup(Protocol):
    def match(self, category: str, name: str | None) -> Entry | None: ...


Origin = tuple[Scope, str]

#: methods that return the module they are called on (``model.to(device).train()``)
_SAME_MODULE = frozenset({"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "train",
                          "eval", "requires_grad_", "to_empty", "share_memory"})
_PARAMETERS = frozenset({"parameters", "named_parameters"})
#: methods through which Accelerate and Fabric take a model over (``fabric.setup(model, opt)``)
_SETUP_METHODS = frozenset({"prepare", "prepare_model", "setup", "setup_module"})
#: calls known to hand the model back unwrapped: rebinding through them wraps nothing
_NOT_WRAPPERS = frozenset({"torch.compile", "torch.nn.SyncBatchNorm.convert_sync_batchnorm"})
#: helpers from other modules whose name says they wrap or shard what they are given
_WRAPPER_HINT = re.compile(r"shard|parallel|fsdp|ddp|wrap|distribut|accelerat", re.IGNORECASE)
_MULTIPROCESSING = ("torch.multiprocessing", "multiprocessing")
#: RPC training: a parameter server or an agent owns the model, the other ranks only observe
_RPC = ("torch.distributed.rpc", "torch.distributed.autograd")
_CONSTRUCTORS = ("from_pretrained", "from_config")
#: nodes without children that no handler of the walk looks at
_LEAVES = frozenset({ast.Constant, ast.Load, ast.Store, ast.Del, *(
    cls for base in (ast.operator, ast.boolop, ast.unaryop, ast.cmpop)
    for cls in base.__subclasses__())})


class Wrappers:
    """Which names in a file hold an ``Accelerator`` (or the distify runtime module).

    Feed it every ``Assign`` (:meth:`learn`); then :meth:`entry` tells whether an expression is
    one: an instance assigned from a wrapper class in the file, a conventional instance name
    (``accelerator``, ``self.accelerator``), or a wrapper module (``distify``).
    """

    def __init__(self, imports: ImportMap, match: Match, rules: RuleSet) -> None:
        self.imports, self.match = imports, match
        self.instances: dict[str, Entry] = {}
        self.conventional: dict[str, Entry] = {}
        for entry in rules.entries.get("wrappers", ()):
            for name in entry.get("conventional_names") or ():
                self.conventional.setdefault(name, entry)

    def learn(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.value, ast.Call):
            entry = self.match("wrappers", self.imports.loose_qualname(node.value.func))
            name = ast_dotted_name(node.targets[0])
            if entry is not None and name and not entry.get("module"):
                self.instances[name] = entry

    def entry(self, expr: ast.expr) -> Entry | None:
        name = ast_dotted_name(expr)
        if name is None:
            return None
        if name in self.instances:
            return self.instances[name]
        module = self.match("wrappers", self.imports.resolve(name))
        if module is not None and module.get("module"):
            return module
        return self.conventional.get(name.rpartition(".")[2])

    def prepare_receiver(self, call: ast.Call) -> tuple[ast.expr, Entry] | None:
        """``(accelerator, entry)`` for ``accelerator.prepare(...)``, else None."""
        func = call.func
        if isinstance(func, ast.Attribute):
            entry = self.entry(func.value)
            if entry is not None and func.attr == entry.get("prepare"):
                return func.value, entry
        return None


@dataclass(frozen=True)
class TrainedModel:
    """A model an optimizer trains, as the optimizer's scope names it (``model``,
    ``self.model``)."""

    name: str
    #: the file builds it (a class call, a model factory) on every path it comes from
    built: bool
    #: it, or a name traced to the same origin, is wrapped, prepared, shared or handed off
    wrapped: bool


@dataclass(frozen=True)
class OptimizerFlow:
    """One optimizer construction, with what it trains and where it is stepped."""

    call: ast.Call
    scope: Scope
    #: the name it is bound to, ``""`` when it is not
    target: str
    #: the first line that steps it (``opt.step()``, ``scaler.step(opt)``), or None
    step_line: int | None
    #: given to a framework that averages at the optimizer (Horovod, DeepSpeed), or built by one
    #: (``ZeroRedundancyOptimizer``)
    synced: bool
    #: inside a class a framework wraps (a ``LightningModule``)
    in_framework: bool
    #: inside a class with bases (a model's own method): ``self`` is not a name to follow
    self_unknown: bool
    models: tuple[TrainedModel, ...]

    @property
    def unwrapped(self) -> list[str]:
        """The models it trains that the file builds and never wraps."""
        return [model.name for model in self.models if model.built and not model.wrapped
                and not (self.self_unknown and model.name.startswith("self."))]


@dataclass(frozen=True)
class ModelFlow:
    """What a file's optimizers train, and whether anything keeps the replicas in sync."""

    #: a process group is started or the script is launched distributed
    process_group: bool = False
    #: gradients or parameters are averaged by hand with a collective
    manual_sync: bool = False
    #: RPC training (``torch.distributed.rpc``)
    rpc: bool = False
    optimizers: tuple[OptimizerFlow, ...] = ()
    #: the first ``accelerator.prepare`` / ``fabric.setup`` call, to spell the fix like the file
    prepare_call: ast.Call | None = None

    @property
    def needs_wrapping(self) -> bool:
        """Replicas drift unless a model wrapper averages the gradients."""
        return self.process_group and not self.manual_sync and not self.rpc


def model_flow(tree: ast.Module, imports: ImportMap, rules: RuleSet,
               lookup: Lookup | None = None,
               callee: Callable[[ast.Call], str | None] | None = None) -> ModelFlow:
    """Analyse ``tree``: its training flow and where its models are wrapped.

    Args:
        tree: the file's ``ast``.
        imports: its import table.
        rules: the rule packs.
        lookup: what answers ``match(category, name)`` (default ``rules``; the linter passes
            its cached matcher).
        callee: a call's loose qualified name (default from ``imports``; the linter passes its
            cached one).
    """
    collector = _Collector(imports, lookup or rules, rules, callee)
    collector.walk(tree)
    if not collector.process_group:
        return ModelFlow()
    collector.model_classes = model_classes(list(collector.class_nodes.values()), imports, rules)
    return _Query(collector).result()


class _Collector(Collector):
    """The training flow's walk, recording wrapping facts on the way (one walk for both)."""

    def __init__(self, imports: ImportMap, lookup: Lookup, rules: RuleSet,
                 callee: Callable[[ast.Call], str | None] | None) -> None:
        super().__init__(imports, lookup, set())
        self._callee = callee or (lambda call: imports.loose_qualname(call.func))
        self.match = lookup.match
        self.wrappers = Wrappers(imports, lookup.match, rules)
        self.process_group = self.manual_sync = self.rpc = False
        #: calls that hand their arguments to a wrapper, in source order
        self.wraps: list[tuple[_Scope, ast.Call]] = []
        self.wrap_ids: set[int] = set()
        #: (scope, dotted targets, value) of every assignment
        self.assigned: list[tuple[_Scope, list[str], ast.expr]] = []
        #: names read as ``X.module`` or ``share_memory()``'d: wrapped or shared by the script
        self.kept: list[tuple[_Scope, str]] = []
        #: (scope, name, line) of each ``X.step()`` and ``scaler.step(X)``
        self.steps: list[tuple[_Scope, str, int]] = []
        #: the first ``opt*.step()``, for an optimizer that is not bound to a name
        self.first_optimizer_step: int | None = None
        self.class_nodes: dict[Scope, ast.ClassDef] = {}
        #: calls of methods on other objects than ``self`` (``trainer.setup(model)``), which
        #: the training walk leaves out: scope → (method name, call)
        self.method_calls: dict[Scope, list[tuple[str, ast.Call]]] = {}
        self.marker_instances: set[str] = set()
        self.loop_calls: set[int] = set()  # calls inside a loop over `parameters()`
        kind = type(self)  # plain functions, as the base's (no cycle through the instance)
        self._handlers.update({ast.Attribute: kind._attribute, ast.Subscript: kind._subscript,
                               ast.For: kind._loop})

    def callee(self, call: ast.Call) -> str:
        return self._callee(call) or ""

    def walk(self, tree: ast.Module) -> None:
        """:meth:`Collector.collect` in the same order, cheaper: ``ast.iter_child_nodes`` costs
        a generator per node, and the contexts, operators and constants it yields (half the
        nodes of a script) have no handler."""
        stack: list[tuple[ast.AST, _Scope]] = [(tree, self.scopes[()])]
        handlers = self._handlers
        while stack:
            node, scope = stack.pop()
            handler = handlers.get(type(node))
            if handler is not None:
                scope = handler(self, node, scope) or scope
            children: list[ast.AST] = []
            for name in node._fields:
                value = getattr(node, name, None)
                if type(value) is list:
                    children.extend(item for item in value if isinstance(item, ast.AST)
                                    and type(item) not in _LEAVES)
                elif isinstance(value, ast.AST) and type(value) not in _LEAVES:
                    children.append(value)
            children.reverse()
            stack.extend((child, scope) for child in children)

    def _class(self, node: ast.ClassDef, scope: _Scope) -> _Scope:
        inner = super()._class(node, scope)
        self.class_nodes[inner.path] = node
        return inner

    def _assign_statement(self, node: ast.Assign, scope: _Scope) -> None:
        super()._assign_statement(node, scope)
        self.wrappers.learn(node)
        self._assigned(scope, node.targets, node.value)

    def _annotated(self, node: ast.AnnAssign, scope: _Scope) -> None:
        super()._annotated(node, scope)
        if node.value is not None:
            self._assigned(scope, [node.target], node.value)

    def _assigned(self, scope: _Scope, targets: list[ast.expr], value: ast.expr) -> None:
        names = [name for name in map(dotted, _flat(targets)) if name]
        self.assigned.append((scope, names, value))
        if len(targets) == 1 and isinstance(value, ast.Call) \
                and self.match("distributed_markers", self.callee(value)):
            name = ast_dotted_name(targets[0])
            if name:
                self.marker_instances.add(name)

    def _loop(self, node: ast.For, scope: _Scope) -> None:
        if _calls_parameters(node.iter):
            self.loop_calls.update(id(sub) for sub in ast.walk(node) if isinstance(sub, ast.Call))

    def _subscript(self, node: ast.Subscript, scope: _Scope) -> None:
        environ = ast_dotted_name(node.value) or ""
        if environ.endswith("environ") and self._rank_var(node.slice):
            self.process_group = True

    def _attribute(self, node: ast.Attribute, scope: _Scope) -> None:
        if node.attr == "module":  # `model.module`: the script wrapped `model` somewhere
            name = dotted(node.value)
            if name and name != "self":
                self.kept.append((scope, name))

    def _call(self, node: ast.Call, scope: _Scope) -> None:
        super()._call(node, scope)
        name = self.callee(node)
        marker = self.match("distributed_markers", name) is not None
        self._evidence(node, name, marker)
        if self._wraps(node, name, marker):
            self.wraps.append((scope, node))
            self.wrap_ids.add(id(node))
        func = node.func
        if not isinstance(func, ast.Attribute):
            return
        receiver = dotted(func.value)
        if receiver != "self" and (node.args or node.keywords):
            self.method_calls.setdefault(scope.path, []).append((func.attr, node))
        if func.attr == "step":
            if receiver:
                self.steps.append((scope, receiver, node.lineno))
                short = receiver.rpartition(".")[2]
                if "opt" in short.lower() and self.first_optimizer_step is None:
                    self.first_optimizer_step = node.lineno
            for arg in node.args:  # `scaler.step(optimizer)`
                if (stepped := dotted(arg)) is not None:
                    self.steps.append((scope, stepped, node.lineno))
        elif func.attr == "share_memory" and receiver:
            self.kept.append((scope, receiver))

    def _evidence(self, node: ast.Call, name: str, marker: bool) -> None:
        """A process group: a distributed call other than plain multiprocessing, a rank read
        from the environment; gradients averaged by hand: a collective over them."""
        reads_rank = (name.endswith(("environ.get", "getenv")) and bool(node.args)
                      and self._rank_var(node.args[0]))
        if reads_rank or (marker and not name.startswith(_MULTIPROCESSING)):
            self.process_group = True
        if name.startswith(_RPC):
            self.rpc = True
        if self._reduces(name) and (id(node) in self.loop_calls or _mentions_gradients(node)):
            self.manual_sync = True

    def _rank_var(self, node: ast.expr) -> bool:
        return (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and self.match("rank_env_vars", node.value) is not None)

    def _reduces(self, name: str) -> bool:
        """A collective that can average tensors (``all_reduce``, ``broadcast``, ...)."""
        if self.match("collectives", name):
            return True
        last = name.rpartition(".")[2]
        return name.startswith("torch.distributed.") and any(
            word in last for word in ("reduce", "broadcast", "gather", "scatter"))

    def _wraps(self, node: ast.Call, name: str, marker: bool) -> bool:
        """Whether ``node`` hands what it is given to a wrapper (conservatively: yes)."""
        if marker or not (node.args or node.keywords):
            return marker
        func = node.func
        if isinstance(func, ast.Attribute) and (
                func.attr in _SETUP_METHODS or ast_dotted_name(func.value) in self.marker_instances
                or self.wrappers.prepare_receiver(node) is not None):
            return True
        return _WRAPPER_HINT.search(name.rpartition(".")[2]) is not None

    def prepares(self, node: ast.Call) -> bool:
        """``accelerator.prepare(...)``, ``distify.prepare(...)``, ``fabric.setup(...)``: these
        sync only the models they are given, not every parameter their optimizer steps."""
        return self.wrappers.prepare_receiver(node) is not None or (
            isinstance(node.func, ast.Attribute) and node.func.attr in _SETUP_METHODS)


@dataclass(frozen=True)
class _Trace:
    #: the (scope, name) pairs passed through: two names meeting in one are one model
    names: set[Origin]
    #: how the values at the end are made: ``built`` by a constructor, or ``unknown``
    kinds: set[str]
    #: the local functions whose returned values were followed (and at which position)
    returns: set[tuple[Scope, int | None]] = field(default_factory=set)


class _Query:
    """The collected facts, resolved to origins through the training flow."""

    def __init__(self, collector: _Collector) -> None:
        self.c = collector
        self.flow = Flow(collector)
        self.wrapped: set[Origin] = set()
        self.handed: set[Origin] = set()  # given to a framework call that is not a prepare
        self.prepare_call: ast.Call | None = None
        classes = set(collector.classes.values())
        self.functions = {name: [path for path in paths if path not in classes]
                          for name, paths in collector.functions.items()}

    def aliases(self, scope: _Scope, name: str) -> set[Origin]:
        """Every (scope, name) that ``name`` may hold the same model as, towards where it is
        built: see :meth:`trace`."""
        return self.trace(scope, name).names

    def result(self) -> ModelFlow:
        c = self.c
        for scope, call in c.wraps:
            names = set()
            for name in _mentioned(_direct_args(call)):
                names |= self.aliases(scope, name)
            self.wrapped |= names
            if not c.prepares(call):  # Horovod's DistributedOptimizer, deepspeed.initialize
                self.handed |= names
            elif self.prepare_call is None:
                self.prepare_call = call
        for scope, targets, value in c.assigned:
            self._rebound(scope, targets, value)
        for scope, name in c.kept:
            self.wrapped |= self.aliases(scope, name)
        steps: dict[Origin, int] = {}
        for scope, name, line in c.steps:
            for alias in self.aliases(scope, name):
                steps[alias] = min(line, steps.get(alias, line))
        found = [self._optimizer(optimizer, steps) for optimizer in optimizers(self.flow)]
        found.sort(key=lambda optimizer: (optimizer.call.lineno, optimizer.call.col_offset))
        return ModelFlow(True, c.manual_sync, c.rpc, tuple(found), self.prepare_call)

    def _rebound(self, scope: _Scope, targets: list[str], value: ast.expr) -> None:
        """``ddp = DDP(model)``, ``model = wrap(model)``: the targets hold a wrapped model."""
        if self._contains_wrap(value):
            wrapped = targets
        elif isinstance(value, ast.Call) and self.c.callee(value) not in _NOT_WRAPPERS:
            passed = set(_mentioned(_direct_args(value), deep=False))
            wrapped = [name for name in targets if name in passed]
        else:
            return
        for name in wrapped:
            self.wrapped |= self.aliases(scope, name)

    def _contains_wrap(self, value: ast.expr) -> bool:
        """``DDP(model)``, ``DDP(model).to(device)``, ``torch.compile(DDP(model))``, ``DDP(model)
        if ddp else model`` (not ``Net().to(dist.get_rank())``)."""
        value = _strip_same_module(value)
        if isinstance(value, ast.IfExp):
            return self._contains_wrap(value.body) or self._contains_wrap(value.orelse)
        if not isinstance(value, ast.Call):
            return False
        if id(value) in self.c.wrap_ids:
            return True
        return (self.c.callee(value) in _NOT_WRAPPERS and bool(value.args)
                and self._contains_wrap(value.args[0]))

    def _optimizer(self, optimizer: Optimizer, steps: dict[Origin, int]) -> OptimizerFlow:
        scope = self.c.scopes[optimizer.scope]
        if optimizer.target:
            aliases = self.aliases(scope, optimizer.target)
            step_line = min((steps[a] for a in aliases if a in steps), default=None)
            handed = not aliases.isdisjoint(self.handed)
        else:
            step_line = self.c.first_optimizer_step if optimizer.known else None
            handed = False
        synced = handed or self.c.match("distributed_markers",
                                        self.c.callee(optimizer.call)) is not None
        models = []
        for name in optimizer.models:
            trace = self.trace(scope, name)
            models.append(TrainedModel(name, trace.kinds == {"built"},
                                       not trace.names.isdisjoint(self.wrapped)))
        return OptimizerFlow(optimizer.call, optimizer.scope, optimizer.target, step_line,
                             synced, *self._class_facts(optimizer.scope), tuple(models))

    def _class_facts(self, path: Scope) -> tuple[bool, bool]:
        """Whether ``path`` is in a class a framework wraps (a ``LightningModule``), and in one
        with bases at all (a model's own method)."""
        classes = [self.c.class_nodes[path[:end]] for end in range(1, len(path) + 1)
                   if path[:end] in self.c.class_nodes]
        bases = [base for cls in classes for base in cls.bases]
        framework = any(self.c.match("distributed_markers", self.c.imports.loose_qualname(base))
                        for base in bases)
        inner = classes[-1].bases if classes else []
        return framework, any(ast_dotted_name(base) != "object" for base in inner)

    # --- where a model comes from ---------------------------------------------------------

    def trace(self, scope: _Scope, name: str) -> _Trace:
        """Follow ``name`` through every value the flow shows for it (each assignment, what
        callers pass for a parameter, what a local function returns) to where it is made."""
        trace = _Trace(set(), set())
        self._name(scope, name, trace)
        return trace

    def _name(self, scope: _Scope, name: str, trace: _Trace) -> None:
        owner = self.flow.owner(scope, name)
        if owner is None or (owner.path, name) in trace.names:
            return
        trace.names.add((owner.path, name))
        for value, position in zip(owner.assigns.get(name, ()), owner.unpacked.get(name, ())):
            self._value(owner, value, position, trace)
        if name in owner.params:
            for caller, arg in self.flow.arguments_for(owner, name):
                self._value(caller, arg, None, trace)
            if owner.params[0] == "self":  # `trainer.setup_model(model)`
                for caller, arg in self.flow.arguments_for(owner, name, self.c.method_calls):
                    self._value(caller, arg, None, trace)

    def _value(self, scope: _Scope, value: ast.expr, position: int | None,
               trace: _Trace) -> None:
        value = _strip_same_module(value)
        if position is not None:  # `encoder, decoder = Encoder(), Decoder()`
            if isinstance(value, (ast.Tuple, ast.List)) and position < len(value.elts):
                self._value(scope, value.elts[position], None, trace)
            elif isinstance(value, ast.Call) and self._local_functions(value):
                self._returned(value, position, trace)
            else:
                trace.kinds.add("unknown")
            return
        if isinstance(value, ast.IfExp):
            self._value(scope, value.body, None, trace)
            self._value(scope, value.orelse, None, trace)
            return
        name = dotted(value)
        if name is not None:
            self._name(scope, name, trace)
        elif isinstance(value, ast.Call):
            self._call(scope, value, trace)
        elif not isinstance(value, ast.Attribute):  # `cfg.model`: not followed, no kind
            trace.kinds.add("unknown")

    def _call(self, scope: _Scope, call: ast.Call, trace: _Trace) -> None:
        callee = self.c.callee(call)
        if callee in _NOT_WRAPPERS:
            if call.args:
                self._value(scope, call.args[0], None, trace)
        elif self._contains_wrap(call):
            return
        elif self._local_functions(call):
            self._returned(call, None, trace)
        else:
            last = callee.rpartition(".")[2]
            built = self.c.match("models", callee) or last[:1].isupper() or last in _CONSTRUCTORS
            trace.kinds.add("built" if built else "unknown")

    def _returned(self, call: ast.Call, position: int | None, trace: _Trace) -> None:
        for path in self._local_functions(call):
            if (path, position) in trace.returns:
                continue
            trace.returns.add((path, position))
            function = self.c.scopes[path]
            for returned in function.returns:
                if position is None:
                    self._value(function, returned, None, trace)
                elif isinstance(returned, (ast.Tuple, ast.List)) and position < len(returned.elts):
                    self._value(function, returned.elts[position], None, trace)
                else:
                    trace.kinds.add("unknown")

    def _local_functions(self, call: ast.Call) -> list[Scope]:
        func = call.func
        name = func.id if isinstance(func, ast.Name) else \
            func.attr if isinstance(func, ast.Attribute) else None
        return self.functions.get(name or "", [])


def _mentioned(args: Iterable[ast.expr], *, deep: bool = True) -> Iterable[str]:
    """The names (``model``, ``self.model``) in ``args``: anywhere inside them when ``deep``
    (``DDP(model.to(rank))``), else only the arguments that are names (``wrap(model)``)."""
    for arg in args:
        if not deep:
            if (name := dotted(arg)) is not None:
                yield name
            continue
        for node in ast.walk(arg):
            if isinstance(node, (ast.Name, ast.Attribute)):
                name = dotted(node)
                if name is not None and name != "self":
                    yield name


def _strip_same_module(value: ast.expr) -> ast.expr:
    while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
           and value.func.attr in _SAME_MODULE):
        value = value.func.value
    return value


def _calls_parameters(expr: ast.expr) -> bool:
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in _PARAMETERS for node in ast.walk(expr))


def _mentions_gradients(call: ast.Call) -> bool:
    """``dist.all_reduce(param.grad)``, ``dist.broadcast(params, 0)``: synchronised by hand."""
    for arg in _direct_args(call):
        for node in ast.walk(arg):
            text = node.id if isinstance(node, ast.Name) else \
                node.attr if isinstance(node, ast.Attribute) else ""
            if "grad" in text.lower() or "param" in text.lower():
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) \
                    and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) \
                    in _PARAMETERS:
                return True
    return False


def _direct_args(call: ast.Call) -> list[ast.expr]:
    args = [arg.value if isinstance(arg, ast.Starred) else arg for arg in call.args]
    return args + [keyword.value for keyword in call.keywords]


def _flat(targets: list[ast.expr]) -> list[ast.expr]:
    flat: list[ast.expr] = []
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            flat.extend(_flat(target.elts))
        elif isinstance(target, ast.Starred):
            flat.extend(_flat([target.value]))
        else:
            flat.append(target)
    return flat
