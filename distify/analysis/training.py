"""What trains what: the models behind each optimizer and each backward pass, found by data flow.

A script's model must end up under DDP however its optimizer is spelled. ``SGD(model.parameters())``
is the easy case; real scripts also write grouped parameters built a few lines above
(``[{"params": [p for n, p in model.named_parameters() if ...]}]``), ``filter(...)`` and
``itertools.chain(...)`` over several modules, an optimizer built by a method or a helper
(``model.configure_optimizers(...)``, ``set_optimizer(opt, model)``, ``Lion(...)`` from an unknown
library), or no optimizer at all (manual SGD on ``p.data``). This pre-pass, over the standard
library's ``ast`` (cheap, and usable by ``distify check`` too), answers two questions per scope:

- for each optimizer built there, which models does it train (``Training.optimizer_models``)?
- for each ``X.backward()``, which models computed ``X``, and where is each of them built, so that
  a model no optimizer names is prepared where it is built (``Training.build_sites``)?

What it deliberately does not do: it follows names within one function (and a model passed down
one or two calls within the file), not through containers, attributes of other objects or other
files. Where it cannot tell, it says so (``Training.unresolved``): the report names the line, and
the runtime stops a job whose loss did not come from a prepared model.

Names are dotted: ``model``, or ``self.model`` for a model kept on an object. A scope is the path
of enclosing classes and functions, ``()`` for the module.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from distify.analysis.astwalk import child_nodes, plan_of, walk
from distify.analysis.names import ImportMap, ast_dotted_name
from distify.rules import RuleSet

Scope = tuple[str, ...]

#: methods only a module has (not an optimizer, a tensor or a loader)
_MODEL_METHODS = {"train", "eval", "parameters", "named_parameters", "modules", "named_modules",
                  "children", "named_children", "requires_grad_", "configure_optimizers"}
_PARAM_METHODS = {"parameters", "named_parameters"}
#: calls whose result is their first argument, prepared or compiled
_MODEL_PASSTHROUGH = ("torch.compile", "torch.nn.DataParallel", "torch.nn.parallel.DataParallel")
_MOVES = ("to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train")
#: words in a name that is never a model (``criterion``, ``config``, ``tokenizer``)
_NOT_MODEL_WORDS = ("loss", "criterion", "config", "tokenizer", "processor")
#: classes whose ``from_pretrained`` loads something other than a model (Transformers, diffusers)
_NOT_MODEL_CLASSES = ("Config", "Tokenizer", "TokenizerFast", "Processor", "FeatureExtractor",
                      "ImageProcessor", "Scheduler")
_MAX_HOPS = 3  # a model passed down this many calls within the file is still followed


@dataclass(frozen=True)
class BuildSite:
    """Where a model is built: the ``index``-th assignment to ``name`` in ``scope``."""

    scope: Scope
    name: str
    index: int


@dataclass
class Training:
    """What the training code of one file trains."""

    #: scope → optimizer target (``""`` for an unassigned one, e.g. returned) → models it trains
    optimizer_models: dict[Scope, dict[str, list[str]]] = field(default_factory=dict)
    #: models only a backward pass reaches (no optimizer names them), prepared where built
    build_sites: list[BuildSite] = field(default_factory=list)
    #: scope → ordinals of the ``.backward()`` calls whose model could not be found
    unresolved: dict[Scope, set[int]] = field(default_factory=dict)
    #: scope → ordinals of the ``.backward()`` calls on a loss from a model's method
    #: (``model.compute_loss(...)``): that forward does not go through DDP
    method_losses: dict[Scope, dict[int, str]] = field(default_factory=dict)
    #: the functions (and the module, ``()``) that run a backward pass themselves
    backward_scopes: set[Scope] = field(default_factory=set)
    #: lines of the backward passes whose loss is computed from plain tensors by torch
    #: functions and tensor methods alone (an autograd example: ``y = (x * x).sum()``)
    tensor_only_backwards: list[int] = field(default_factory=list)
    #: scope → ordinals of those backward passes in it (the k-th ``.backward()`` call of the
    #: scope, in source order, as the rewrite counts them)
    tensor_only: dict[Scope, set[int]] = field(default_factory=dict)
    #: how many backward passes the file has
    backward_count: int = 0

    @property
    def trains_no_model(self) -> bool:
        """Every backward pass differentiates plain tensors and nothing here is a model or an
        optimizer: DDP has nothing to wrap (``y.backward()`` in an autograd demo)."""
        return (self.backward_count > 0
                and len(self.tensor_only_backwards) == self.backward_count
                and not self.build_sites
                and not any(self.optimizer_models.values()))


@dataclass
class _Scope:
    path: Scope
    params: list[str] = field(default_factory=list)
    #: dotted target → the values assigned to it, in source order
    assigns: dict[str, list[ast.expr]] = field(default_factory=dict)
    #: dotted target → for each of its assignments, its position in an unpacked tuple (or None)
    unpacked: dict[str, list[int | None]] = field(default_factory=dict)
    #: the expressions the function returns
    returns: list[ast.expr] = field(default_factory=list)
    #: receivers of ``.backward()``, in source order
    backwards: list[ast.expr] = field(default_factory=list)
    #: dotted names with a method called on them → those methods
    methods: dict[str, set[str]] = field(default_factory=dict)
    #: optimizers built by a known constructor: (target or "", the call)
    known_optimizers: list[tuple[str, ast.Call]] = field(default_factory=list)
    #: calls passing arguments to functions defined in the file: (callee name, call)
    calls: list[tuple[str, ast.Call]] = field(default_factory=list)
    #: names passed to ``scaler.step(X)``
    scaler_steps: set[str] = field(default_factory=set)


def dotted(node: ast.AST) -> str | None:
    """``model`` or ``self.model`` (one attribute of ``self``), else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _root(node: ast.AST) -> str | None:
    """``model.fc.weight`` → ``model``; ``self.net.fc`` → ``self.net``."""
    parts = (ast_dotted_name(node) or "").split(".")
    if not parts[0]:
        return None
    return ".".join(parts[:2]) if parts[0] == "self" and len(parts) > 1 else parts[0]


class _Back:
    """On :meth:`Collector.collect`'s stack: the scope to return to."""

    __slots__ = ("scope",)

    def __init__(self, scope: _Scope) -> None:
        self.scope = scope


class Collector:
    """One source-ordered walk (an explicit stack: several times cheaper than an
    ``ast.NodeVisitor``) that files each fact under its scope. Everything under a ``def`` or a
    ``class`` statement, its decorators and defaults included, belongs to its scope, as the
    rewrite's own scope path has it."""

    def __init__(self, imports: ImportMap, rules: RuleSet, model_classes: set[str]) -> None:
        self.imports, self.rules, self.model_classes = imports, rules, model_classes
        self.scopes: dict[Scope, _Scope] = {(): _Scope(())}
        self.functions: dict[str, list[Scope]] = {}  # local def/class name → its scopes
        self.classes: dict[str, Scope] = {}
        # node type → the method that files it, as a plain function of the class (called with
        # the collector): bound methods kept here would make a cycle, and the collector, its
        # scopes and the `ast` nodes they hold would wait for the garbage collector instead of
        # being freed with the file's conversion (28 ms on a 5,000-line file)
        kind = type(self)
        self._handlers = {ast.FunctionDef: kind._function, ast.AsyncFunctionDef: kind._function,
                          ast.ClassDef: kind._class, ast.Assign: kind._assign_statement,
                          ast.AnnAssign: kind._annotated, ast.AugAssign: kind._augmented,
                          ast.Return: kind._return, ast.Call: kind._call}

    def collect(self, tree: ast.AST, each: Callable[[ast.AST], None] | None = None) -> None:
        """Walk ``tree`` once; ``each`` (if given) is called on every node too (but the
        context and operator singletons: :func:`~.astwalk.child_nodes`), so a caller with facts
        of its own to gather needs no walk of its own."""
        # The scope changes only at a def or a class: a marker below its children on the
        # stack puts the scope around it back once they are done (no (node, scope) per node).
        stack: list[ast.AST | _Back] = [tree]
        scope = self.scopes[()]
        handlers = self._handlers
        plans: dict[type, tuple[tuple[str, bool], ...]] = {}
        while stack:
            node = stack.pop()
            kind = type(node)
            if kind is _Back:
                scope = node.scope
                continue
            if each is not None:
                each(node)
            handler = handlers.get(kind)
            if handler is not None:
                inner = handler(self, node, scope)
                if inner is not None and inner is not scope:
                    stack.append(_Back(scope))
                    scope = inner
            plan = plans.get(kind)
            if plan is None:
                plan = plan_of(kind)
                if plan is None:
                    children = child_nodes(node)
                    children.reverse()
                    stack.extend(children)
                    continue
                plans[kind] = plan
            if not plan:  # a leaf (a name, a constant)
                continue
            children = []  # child_nodes, inline (a call per node is much of the walk)
            for name, many in plan:
                value = getattr(node, name, None)
                if value is None:
                    continue
                if many:
                    for item in value:
                        if item is not None:
                            children.append(item)
                else:
                    children.append(value)
            children.reverse()
            stack.extend(children)

    def _enter(self, scope: _Scope, name: str, params: list[str]) -> _Scope:
        path = (*scope.path, name)
        inner = self.scopes.setdefault(path, _Scope(path))
        inner.params = params
        self.functions.setdefault(name, []).append(path)
        return inner

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, scope: _Scope) -> _Scope:
        args = node.args
        return self._enter(scope, node.name,
                           [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)])

    def _class(self, node: ast.ClassDef, scope: _Scope) -> _Scope:
        inner = self._enter(scope, node.name, [])
        self.classes[node.name] = inner.path
        return inner

    def _assign_statement(self, node: ast.Assign, scope: _Scope) -> None:
        for target in node.targets:
            self._assign(scope, target, node.value)

    def _annotated(self, node: ast.AnnAssign, scope: _Scope) -> None:
        if node.value is not None:
            self._assign(scope, node.target, node.value)

    def _augmented(self, node: ast.AugAssign, scope: _Scope) -> None:
        name = dotted(node.target)
        if name is not None:  # `loss += criterion(out, y)`: the new value depends on both
            scope.assigns.setdefault(name, []).append(node.value)
            scope.unpacked.setdefault(name, []).append(None)

    def _assign(self, scope: _Scope, target: ast.expr, value: ast.expr,
                position: int | None = None) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for index, elem in enumerate(target.elts):  # `logits, loss = model(x, y)`
                self._assign(scope, elem, value, index)  # each depends on the whole call
            return
        name = dotted(target)
        if name is None:
            return
        scope.assigns.setdefault(name, []).append(value)
        scope.unpacked.setdefault(name, []).append(position)
        if isinstance(value, ast.Call) and self._is_known_optimizer(value):
            scope.known_optimizers.append((name, value))

    def _is_known_optimizer(self, call: ast.Call) -> bool:
        return self.rules.match("optimizers", self.imports.ast_qualname(call.func)) is not None

    def _return(self, node: ast.Return, scope: _Scope) -> None:
        if node.value is not None:
            scope.returns.append(node.value)
        if isinstance(node.value, ast.Call) and self._is_known_optimizer(node.value):
            scope.known_optimizers.append(("", node.value))

    def _call(self, node: ast.Call, scope: _Scope) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = dotted(func.value) or _root(func.value)
            if func.attr == "backward":  # `loss.backward()`; `torch.autograd.backward(loss)`
                scope.backwards.append(node.args[0] if node.args and self.imports.ast_qualname(
                    func) == "torch.autograd.backward" else func.value)
            if receiver is not None:
                scope.methods.setdefault(receiver, set()).add(func.attr)
            if func.attr == "step" and node.args and "scaler" in (receiver or "").lower():
                name = dotted(node.args[0])  # scaler.step(optimizer)
                if name is not None:
                    scope.scaler_steps.add(name)
            if isinstance(func.value, ast.Name) and func.value.id == "self":
                scope.calls.append((func.attr, node))
        elif isinstance(func, ast.Name):
            scope.calls.append((func.id, node))


class Flow:
    """Questions about the collected facts, answered across scopes."""

    def __init__(self, collector: Collector) -> None:
        self.c = collector
        self.scopes = collector.scopes
        self.imports, self.rules = collector.imports, collector.rules
        self._class_methods: dict[Scope, dict[str, set[str]]] = {}
        self._models: dict[tuple[Scope, str], bool] = {}  # is_model answers (at hop 0)
        self._by_callee: dict[str, list[tuple[_Scope, ast.Call]]] | None = None

    # ------------------------------------------------------------------ what is a model?
    def is_model(self, scope: _Scope, name: str, hops: int = 0) -> bool:
        """Does ``name`` (in ``scope``) behave like a module: a module-only method called on it
        (here or in a function it is passed to), or built by a model constructor?"""
        if hops == 0:
            key = (scope.path, name)
            if key not in self._models:
                self._models[key] = self._is_model(scope, name, 0)
            return self._models[key]
        return self._is_model(scope, name, hops)

    def _is_model(self, scope: _Scope, name: str, hops: int) -> bool:
        short = name.split(".")[-1].lower()
        # a loss module computes, it is not trained; a config or a tokenizer builds or feeds one
        if any(word in short for word in _NOT_MODEL_WORDS):
            return False
        if self.methods(scope, name) & _MODEL_METHODS:
            return True
        if hops >= _MAX_HOPS:
            return False
        owner = self.owner(scope, name)
        if owner is not None and any(self._builds_model(owner, value, hops)
                                     for value in owner.assigns.get(name, ())):
            return True
        if owner is not None and name in owner.params and name not in owner.assigns:
            return any(self.is_model(caller, passed, hops + 1)
                       for caller, arg in self.arguments_for(owner, name)
                       if (passed := dotted(arg)) is not None)
        return False

    def _builds_model(self, scope: _Scope, value: ast.expr, hops: int) -> bool:
        value = _moved(value)  # `Net().to(device)`
        name = dotted(value)
        if name is not None:  # `self.model = model.to(gpu_id)`
            return self.is_model(scope, name, hops + 1)
        if not isinstance(value, ast.Call):
            return False
        if any(self.is_model(function, returned, hops + 1)
               for function, returned in self.returned(value, None)):
            return True  # `model, optimizer = load_train_objs()`
        qual = self.imports.ast_qualname(value.func) or ""
        if qual.split(".")[-1] in self.c.model_classes:
            return True
        if qual.endswith(".from_pretrained"):  # `AutoConfig.from_pretrained(...)` is no model
            return not qual.rsplit(".", 2)[-2].endswith(_NOT_MODEL_CLASSES)
        if self.rules.match("models", qual) is not None:
            return True
        if (qual in _MODEL_PASSTHROUGH or self.rules.match("data_parallel", qual)) and value.args:
            inner = dotted(value.args[0])
            return inner is not None and self.is_model(scope, inner, hops + 1)
        return False

    def methods(self, scope: _Scope, name: str, hops: int = 0) -> set[str]:
        """The methods called on ``name``: in the scope that binds it, and in the functions of
        the file it is passed to (``train(model, optimizer)`` steps ``optimizer``)."""
        if name.startswith("self."):
            return self._class_wide(scope).get(name, set())
        owner = self.owner(scope, name)
        if owner is None:
            return set()
        found = set(owner.methods.get(name, set()))
        if hops < _MAX_HOPS:
            for callee, param in self._passed_to(owner, name):
                found |= self.methods(callee, param, hops + 1)
        return found

    def _passed_to(self, scope: _Scope, name: str) -> Iterator[tuple[_Scope, str]]:
        """(function scope, parameter) for each call in ``scope`` that passes ``name`` to a
        function or class of the file."""
        for called, call in scope.calls:
            for path in self.c.functions.get(called, ()):
                target = self.scopes[path]
                if path[-1] in self.c.classes:  # `Trainer(model, ...)`: its __init__
                    target = self.scopes.get((*path, "__init__"))
                    if target is None:
                        continue
                params = target.params[1:] if target.params[:1] == ["self"] else target.params
                for index, arg in enumerate(call.args):
                    if isinstance(arg, ast.Starred):
                        break
                    if dotted(arg) == name and index < len(params):
                        yield target, params[index]
                for keyword in call.keywords:
                    if keyword.arg in params and dotted(keyword.value) == name:
                        yield target, keyword.arg

    def _class_wide(self, scope: _Scope) -> dict[str, set[str]]:
        """``self.x`` facts are shared by every method of the class."""
        cls = self._class_of(scope)
        if cls not in self._class_methods:
            merged: dict[str, set[str]] = {}
            for path, other in self.scopes.items():
                if path[:len(cls)] == cls and len(path) == len(cls) + 1:
                    for name, methods in other.methods.items():
                        if name.startswith("self."):
                            merged.setdefault(name, set()).update(methods)
            self._class_methods[cls] = merged
        return self._class_methods[cls]

    def _class_of(self, scope: _Scope) -> Scope:
        return scope.path[:-1] if scope.path[:-1] in self.c.classes.values() else scope.path

    def owner(self, scope: _Scope, name: str) -> _Scope | None:
        """The scope whose assignments bind ``name`` as seen from ``scope``."""
        if name.startswith("self."):
            cls = self._class_of(scope)
            methods = [s for p, s in self.scopes.items()
                       if p[:len(cls)] == cls and len(p) == len(cls) + 1 and name in s.assigns]
            init = [s for s in methods if s.path[-1] == "__init__"]
            return (init or methods or [None])[0]
        if name in scope.assigns or name in scope.params:
            return scope
        module = self.scopes[()]
        return module if name in module.assigns else None

    # ------------------------------------------------------------------ data flow
    def depends(self, scope: _Scope, expr: ast.expr) -> tuple[set[str], list[ast.Call]]:
        """The names ``expr`` depends on through assignments in its scope, and every call made
        along the way."""
        names: set[str] = set()
        calls: list[ast.Call] = []
        todo = [expr]
        while todo:
            node = todo.pop()
            for sub in walk(node):  # ast.walk's order; its context and operator nodes
                if isinstance(sub, ast.Call):  # are neither names nor calls
                    calls.append(sub)
                name = dotted(sub) if isinstance(sub, (ast.Name, ast.Attribute)) else None
                if name is None or name in names:
                    continue
                names.add(name)
                todo.extend(scope.assigns.get(name, ()))
        return names, calls

    def parameter_roots(self, scope: _Scope, expr: ast.expr) -> list[str]:
        """Models whose parameters flow into ``expr``: roots of ``X.parameters()``, and models
        handed to a call on the way (``get_param_groups(model)``)."""
        names, calls = self.depends(scope, expr)
        found: list[str] = []
        for call in calls:
            func = call.func
            if isinstance(func, ast.Attribute) and func.attr in _PARAM_METHODS:
                root = _root(func.value)
                if root and root != "self" and root not in found:
                    found.append(root)
        for call in calls:
            for arg in _arguments(call):
                name = dotted(arg)
                if name and name not in found and self.is_model(scope, name):
                    found.append(name)
        return found

    def models_of_loss(self, scope: _Scope, loss: ast.expr) -> tuple[list[str], str | None]:
        """The models that compute ``loss``: called, or handed to a call, on its way; and the
        method call, if the loss comes from a model's method rather than its forward."""
        _, calls = self.depends(scope, loss)
        found: list[str] = []
        methods: dict[str, str] = {}  # model → one of its methods the loss goes through
        for call in calls:
            func = call.func
            callee = dotted(func)
            candidates = [callee] if callee else []
            if isinstance(func, ast.Attribute) and callee is None:
                receiver = dotted(func.value)
                if receiver and func.attr not in _MODEL_METHODS and func.attr != "forward" \
                        and self.is_model(scope, receiver):
                    methods.setdefault(receiver, f"{receiver}.{func.attr}(...)")
                    candidates.append(receiver)
            candidates += [dotted(arg) for arg in _arguments(call)]
            for name in candidates:
                if name and name not in found and self.is_model(scope, name):
                    found.append(name)
        called = {dotted(call.func) for call in calls}
        method = next((text for model, text in methods.items() if model not in called), None)
        return found, method

    def optimizer_like(self, scope: _Scope, name: str) -> bool:
        """Is ``name`` an optimizer: stepped, and zeroed or named like one?"""
        short = name.split(".")[-1].lower()
        if "sched" in short or short.startswith("lr"):
            return False
        named = "optim" in short or short.startswith("opt")
        if not named and "step" not in scope.methods.get(name, ()) \
                and name not in scope.scaler_steps:
            return False  # cheap first: most names are neither named nor stepped here
        methods = self.methods(scope, name)
        if "step" not in methods and name not in scope.scaler_steps:
            return False
        return "zero_grad" in methods or "optim" in short or short.startswith("opt") \
            or name in scope.scaler_steps

    def returned(self, call: ast.Call, position: int | None) -> Iterator[tuple[_Scope, str]]:
        """(function scope, name) for each name a local function called by ``call`` returns
        (at ``position`` of a returned tuple, or any element when None)."""
        callee = call.func.id if isinstance(call.func, ast.Name) else None
        for path in self.c.functions.get(callee or "", ()):
            function = self.scopes[path]
            for returned in function.returns:
                elements = returned.elts if isinstance(returned, ast.Tuple) else [returned]
                if isinstance(returned, ast.Tuple) and position is not None:
                    elements = elements[position:position + 1]
                for element in elements:
                    if (name := dotted(element)) is not None:
                        yield function, name

    def origin(self, scope: _Scope, name: str, hops: int = 0) -> tuple[Scope, str]:
        """The (scope, name) a model was first built under: through ``x = y.to(device)``,
        parameters (to their callers' arguments) and values returned by local functions, so two
        names of one model are recognised as one."""
        owner = self.owner(scope, name)
        if owner is None:
            return scope.path, name
        here = owner.path, name
        if hops >= _MAX_HOPS:
            return here
        values = owner.assigns.get(name)
        if values:
            value = _moved(values[-1])
            inner = dotted(value)
            if inner is not None and inner != name:
                return self.origin(owner, inner, hops + 1)
            if isinstance(value, ast.Call):
                position = owner.unpacked[name][-1]
                for function, returned in self.returned(value, position):
                    return self.origin(function, returned, hops + 1)
            return here
        if name in owner.params:
            for caller, arg in self.arguments_for(owner, name):
                if (passed := dotted(arg)) is not None:
                    return self.origin(caller, passed, hops + 1)
        return here

    # ------------------------------------------------------------------ where built
    def build_site(self, scope: _Scope, name: str, hops: int = 0) -> BuildSite | None:
        """Where ``name`` (seen from ``scope``) is built: its last assignment in the scope that
        binds it and builds a model (not ``model = torch.load(f)`` of a test pass at the end),
        following a parameter to the arguments of its callers in the file."""
        owner = self.owner(scope, name)
        if owner is None:
            return None
        if name in owner.assigns:
            values = owner.assigns[name]
            building = [i for i, value in enumerate(values) if self._builds_model(owner, value, 0)]
            return BuildSite(owner.path, name, building[-1] if building else len(values) - 1)
        if hops >= _MAX_HOPS or name not in owner.params:
            return None
        for caller, arg in self.arguments_for(owner, name):
            passed = dotted(arg)
            if passed is not None:
                site = self.build_site(caller, passed, hops + 1)
                if site is not None:
                    return site
        return None

    def arguments_for(self, function: _Scope, param: str,
                      calls: dict[Scope, list[tuple[str, ast.Call]]] | None = None,
                      ) -> Iterator[tuple[_Scope, ast.expr]]:
        """The arguments callers in the file pass for ``param`` of ``function``: through the
        calls the walk recorded (by plain name, or on ``self``), or through ``calls`` (scope →
        its (callee name, call) pairs) when given."""
        name = function.path[-1]
        is_init = name == "__init__"
        callee_name = function.path[-2] if is_init and len(function.path) > 1 else name
        position = function.params.index(param)
        if is_init or (function.params and function.params[0] == "self"):
            position -= 1  # bound: `self` is not passed
        if calls is None:
            found = self._calls_by_callee().get(callee_name, ())
        else:
            found = [(scope, call) for scope in self.scopes.values()
                     for called, call in calls.get(scope.path, ()) if called == callee_name]
        for scope, call in found:
            keyword = next((k.value for k in call.keywords if k.arg == param), None)
            if keyword is not None:
                yield scope, keyword
            elif 0 <= position < len(call.args) and not any(
                    isinstance(a, ast.Starred) for a in call.args[:position + 1]):
                yield scope, call.args[position]

    def _calls_by_callee(self) -> dict[str, list[tuple[_Scope, ast.Call]]]:
        """Callee name → (scope, call) for each call the walk recorded, scope by scope in
        order (built on the first question: every function's callers are one look-up)."""
        if self._by_callee is None:
            self._by_callee = {}
            for scope in self.scopes.values():
                for called, call in scope.calls:
                    self._by_callee.setdefault(called, []).append((scope, call))
        return self._by_callee


def _moved(value: ast.expr) -> ast.expr:
    """``model.to(device)`` → ``model``: the same module, moved or cast."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in _MOVES:
        value = value.func.value
    return value


def _arguments(call: ast.Call) -> Iterator[ast.expr]:
    for arg in call.args:
        yield arg.value if isinstance(arg, ast.Starred) else arg
    for keyword in call.keywords:
        yield keyword.value


def collect(tree: ast.Module, imports: ImportMap, rules: RuleSet,
            each: Callable[[ast.AST], None] | None = None) -> Collector:
    """The facts :func:`analyse` needs, in one walk of ``tree`` (calling ``each`` on every
    node on the way, for a caller's own facts)."""
    collector = Collector(imports, rules, set())
    collector.collect(tree, each)
    return collector


def analyse_training(tree: ast.Module, imports: ImportMap, rules: RuleSet,
                     model_classes: set[str]) -> Training:
    """Find what each optimizer and each backward pass of ``tree`` trains.

    Args:
        tree: the file's ``ast``.
        imports: its import table (qualified names).
        rules: the rule packs (``optimizers``, ``models``, ...).
        model_classes: the file's own ``nn.Module`` subclasses.
    """
    return analyse(collect(tree, imports, rules), model_classes)


def analyse(collector: Collector, model_classes: set[str]) -> Training:
    """:func:`analyse_training` over facts already collected."""
    collector.model_classes = model_classes
    flow = Flow(collector)
    training = Training()
    for path in collector.scopes:
        training.optimizer_models[path] = {}
    for optimizer in optimizers(flow):
        found = training.optimizer_models[optimizer.scope].setdefault(optimizer.target, [])
        found.extend(m for m in optimizer.models if m not in found)
    covered: set[tuple[Scope, str]] = set()  # (owner scope, model) an optimizer prepares
    for path, trained in training.optimizer_models.items():
        for models in trained.values():
            covered.update(flow.origin(collector.scopes[path], m) for m in models)
    for scope in collector.scopes.values():
        if scope.backwards:
            training.backward_scopes.add(scope.path)
        for ordinal, loss in enumerate(scope.backwards):
            training.backward_count += 1
            if _tensor_only(flow, scope, loss):
                training.tensor_only_backwards.append(loss.lineno)
                training.tensor_only.setdefault(scope.path, set()).add(ordinal)
                continue  # no model computes it: none to find, none to prepare
            models, method = flow.models_of_loss(scope, loss)
            if method is not None:
                training.method_losses.setdefault(scope.path, {})[ordinal] = method
            if not models and not _steps_a_known_optimizer(flow, training, scope):
                training.unresolved.setdefault(scope.path, set()).add(ordinal)
            for model in models:
                origin = flow.origin(scope, model)
                if origin in covered:
                    continue
                site = flow.build_site(scope, model)
                if site is None:
                    training.unresolved.setdefault(scope.path, set()).add(ordinal)
                elif site not in training.build_sites:
                    training.build_sites.append(site)
                    covered.add(origin)
    return training


@dataclass(frozen=True)
class Optimizer:
    """One optimizer built in the file, and the models whose parameters it takes."""

    scope: Scope
    #: the name it is bound to, ``""`` when it is not (``return SGD(...)``)
    target: str
    call: ast.Call
    #: a rule pack names its class; else it is stepped and zeroed or named like an optimizer
    known: bool
    models: tuple[str, ...]


def optimizers(flow: Flow) -> Iterator[Optimizer]:
    """Every optimizer of the file, scope by scope in source order: those a rule pack names,
    then the names that behave like one (``Lion(...)``, ``model.configure_optimizers(...)``)."""
    for scope in flow.scopes.values():
        known: set[str] = set()
        for target, call in scope.known_optimizers:
            known.add(target)
            yield Optimizer(scope.path, target, call, True,
                            tuple(flow.parameter_roots(scope, call)))
        for target, values in scope.assigns.items():
            if target in known or not flow.optimizer_like(scope, target):
                continue
            models = _unknown_optimizer_models(flow, scope, values[-1])
            if models:
                yield Optimizer(scope.path, target, values[-1], False, tuple(models))


#: torch functions that make a tensor from numbers (``torch.tensor(1., requires_grad=True)``)
_TENSOR_MAKERS = frozenset({"tensor", "ones", "zeros", "rand", "randn", "randint", "arange",
                            "linspace", "full", "empty", "eye", "as_tensor", "from_numpy"})
#: a tensor's attributes that are tensors of its own (``a.grad``)
_TENSOR_VIEWS = frozenset({"grad", "data", "T", "mT"})
#: how many assignments and calls :func:`_tensor_only` follows back from a loss
_TENSOR_DEPTH = 16
#: how many expressions it reads for one loss at most (a loss past it is not plain)
_TENSOR_STEPS = 2000


def _tensor_only(flow: Flow, scope: _Scope, loss: ast.expr) -> bool:
    """Is ``loss`` computed from tensors the file makes with torch (``torch.tensor(1.,
    requires_grad=True)``) by arithmetic, torch functions and tensor methods alone, with no
    module, criterion or other call in between (``y = w * x + b; y.backward()``)? A name is
    followed through every assignment of it in its scope (or the module's), an in-place update
    from its own gradient too (``a -= lr * a.grad``); anything not seen through (a parameter, a
    loop variable, another attribute) is not, nor a loss too tangled to follow."""
    only, saw = _Plain(flow).test(scope, loss, 0, frozenset())
    return only and saw


class _Plain:
    """One :func:`_tensor_only` question: every assignment of a name is followed, so a budget
    of steps bounds a file that reassigns many names many times."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self.steps = _TENSOR_STEPS

    def test(self, scope: _Scope, node: ast.expr, depth: int,
             following: frozenset[str]) -> tuple[bool, bool]:
        """(computed from plain tensors and numbers only, a tensor made by torch seen); the
        names in ``following`` are being followed already (a name updated from itself adds
        nothing)."""
        self.steps -= 1
        if depth > _TENSOR_DEPTH or self.steps < 0:
            return False, False
        if isinstance(node, ast.Constant):
            return type(node.value) in (int, float), False
        if isinstance(node, ast.Name):
            if node.id in following:
                return True, False
            owner = self.flow.owner(scope, node.id)
            values = owner.assigns.get(node.id, []) if owner is not None else []
            if not values:
                return False, False
            if owner is scope:  # the assignments above the use, where there are some: an
                # autograd demo's `x` is a tensor there, whatever the file assigns it later
                values = [v for v in values if v.lineno < node.lineno] or values
            return self.all(owner, values, depth, following | {node.id})
        if isinstance(node, ast.Attribute) and node.attr in _TENSOR_VIEWS:
            return self.test(scope, node.value, depth + 1, following)
        if isinstance(node, ast.BinOp):
            return self.all(scope, [node.left, node.right], depth, following)
        if isinstance(node, ast.UnaryOp):
            return self.test(scope, node.operand, depth + 1, following)
        if isinstance(node, ast.Subscript):
            return self.test(scope, node.value, depth + 1, following)
        if not isinstance(node, ast.Call):
            return False, False
        qual = self.flow.imports.ast_qualname(node.func) or ""
        if qual.startswith("torch.") and not qual.startswith(("torch.nn.", "torch.optim.")):
            if qual.rsplit(".", 1)[-1] in _TENSOR_MAKERS:
                return True, True
            args = [a.value if isinstance(a, ast.Starred) else a for a in node.args]
            return self.all(scope, args, depth, following)
        if isinstance(node.func, ast.Attribute) and not qual.startswith("torch."):
            return self.test(scope, node.func.value, depth + 1, following)  # `(x * x).sum()`
        return False, False

    def all(self, scope: _Scope, nodes: list[ast.expr], depth: int,
            following: frozenset[str]) -> tuple[bool, bool]:
        only, saw = True, False
        for node in nodes:
            one, seen = self.test(scope, node, depth + 1, following)
            only, saw = only and one, saw or seen
            if not only:
                break  # one impure part settles it
        return only, saw


def _steps_a_known_optimizer(flow: Flow, training: Training, scope: _Scope) -> bool:
    """Does ``scope`` step an optimizer whose models are known (and so prepared)? Then a loss
    the analysis cannot follow (through lists, attributes of other objects) still trains them:
    ``policy_loss = torch.cat(policy.saved_log_probs).sum(); policy_loss.backward();
    optimizer.step()``."""
    for name, methods in scope.methods.items():
        if "step" in methods:
            path, origin = flow.origin(scope, name)
            if training.optimizer_models.get(path, {}).get(origin):
                return True
    return False


def _unknown_optimizer_models(flow: Flow, scope: _Scope, value: ast.expr) -> list[str]:
    """``model.configure_optimizers(...)``, ``set_optimizer(opt, model)``, ``Lion(...)``: the
    receiver (a model, or a method named for optimizers) and the models among the arguments."""
    if not isinstance(value, ast.Call):
        return []
    found = flow.parameter_roots(scope, value)
    func = value.func
    if isinstance(func, ast.Attribute):
        receiver = _root(func.value)
        if receiver and receiver != "self" and receiver not in found and (
                "optim" in func.attr or flow.is_model(scope, receiver)):
            found.insert(0, receiver)
    return found
