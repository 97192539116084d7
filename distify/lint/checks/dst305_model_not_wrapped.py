"""DST305: a model trained in a distributed script but never wrapped in DDP/FSDP or prepared."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass

from distify.analysis.names import ast_dotted_name
from distify.lint.checks._wrappers import Wrappers
from distify.lint.engine import Site
from distify.lint.rule import Invalid, LintRule, Valid

_PARAMETERS = frozenset({"parameters", "named_parameters"})
#: methods that return the module they are called on (``model.to(device).train()``)
_SAME_MODULE = frozenset({"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "train",
                          "eval", "requires_grad_", "to_empty", "share_memory"})
#: methods through which Accelerate and Fabric take a model over (``fabric.setup(model, opt)``)
_SETUP_METHODS = frozenset({"prepare", "prepare_model", "setup", "setup_module"})
#: calls known to hand the model back unwrapped: rebinding through them wraps nothing
_NOT_WRAPPERS = frozenset({"torch.compile", "torch.nn.SyncBatchNorm.convert_sync_batchnorm"})
#: helpers from other modules whose name says they wrap or shard what they are given
_WRAPPER_HINT = re.compile(r"shard|parallel|fsdp|ddp|wrap|distribut|accelerat", re.IGNORECASE)
_MULTIPROCESSING = ("torch.multiprocessing", "multiprocessing")
#: RPC training: a parameter server or an agent owns the model, the other ranks only observe
_RPC = ("torch.distributed.rpc", "torch.distributed.autograd")
_MAX_DEPTH = 4


@dataclass(frozen=True)
class _Optimizer:
    """An optimizer construction: the call, its site, the name it is bound to (last segment)."""

    call: ast.Call
    site: Site
    name: str | None
    known: bool  # an ``optimizers`` entry; an unknown class counts only when bound and stepped
    params: ast.expr
    in_framework: bool  # inside a LightningModule-like class: the framework wraps the model
    self_unknown: bool  # inside a class with bases (a model's own method): `self` is unknown


class _Aliases:
    """Union-find over names (their last dotted segment) that may hold the same object.

    Merging is deliberately generous (``self.model = model``, a function's parameter and the
    arguments its calls pass, ``net = model.to(device)``): a name is wrapped when any name it
    is merged with is, so a loose merge mostly hides findings rather than inventing them.
    """

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, name: str) -> str:
        parent = self.parent.setdefault(name, name)
        if parent != name:
            parent = self.parent[name] = self.find(parent)
        return parent

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)

    def roots(self, names) -> set[str]:
        return {self.find(name) for name in names}


class ModelNotWrapped(LintRule):
    """A model is trained in a distributed script but never wrapped in DDP/FSDP or prepared.

    In a file that starts a process group or is launched distributed (it calls
    ``torch.distributed``, Accelerate, Fabric, DeepSpeed, Horovod, Ray Train or the distify
    runtime, or reads ``RANK`` / ``LOCAL_RANK``), an optimizer is built over a model's
    parameters and stepped, but the model is never handed to ``DistributedDataParallel``,
    ``FSDP`` / ``fully_shard``, ``accelerator.prepare``, ``distify.prepare``, ``fabric.setup``
    or Ray's ``prepare_model``. Nothing averages the gradients: every rank trains its own copy
    on its own shard and the replicas drift apart, silently.

    The optimizer may take ``model.parameters()``, a filtered or chained iterable of them,
    parameter groups built from ``named_parameters()`` (also through a variable), and may come
    from any library (``Lion(model.parameters())``) as long as the file steps it
    (``optimizer.step()``, ``scaler.step(optimizer)``). Names are matched loosely across the
    file: ``self.model = model``, a function's parameter and what its callers pass, ``net =
    model.to(device)`` all count as the same model, and a wrap anywhere (before or after the
    optimizer, ``ddp_model = DDP(model)``, ``torch.compile(DDP(model))``) covers it. The
    finding is at the optimizer's construction and names the step.

    Deliberately not reported, because a false alarm in a pre-commit hook costs more than a
    miss: a model whose origin the file does not show (a function parameter nobody in the file
    passes, ``load_model()`` from elsewhere, ``self`` in a model's own ``configure_optimizers``);
    a model passed to any call whose result is bound back to its name (``model =
    wrap(model)``; ``torch.compile`` alone does not count), to a helper named like
    ``shard_model`` / ``apply_fsdp``, or used as ``model.module``; an optimizer handed to a
    framework (Horovod's ``DistributedOptimizer``, DeepSpeed) or from ``torch.distributed.optim``
    (``ZeroRedundancyOptimizer``); files that average gradients themselves (a collective over
    ``.grad`` or over ``model.parameters()``), RPC training (a parameter server owns the
    model), Hogwild (the model goes to ``mp.Process`` or is ``share_memory()``'d) and plain
    multiprocessing without a process group; optimizers built only on some ranks or inside a
    Lightning module.

    No fix: the wrapper needs the device ids and the process group the script chose, and where
    to rebind the model (so that the forward goes through the wrapper) is a human's call.
    """

    CODE = "DST305"
    MESSAGE = ("`{model}` {verb} trained (optimizer stepped at line {line}) but never wrapped in "
               "DistributedDataParallel/FSDP or prepared: every rank trains its own copy and the "
               "replicas drift apart; wrap {it}, e.g. `{example}`")

    VALID = (
        Valid("""
            import os
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            dist.init_process_group("nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            model = Net().to(local_rank)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model = DDP(model, device_ids=[local_rank])
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
        """),
        Valid("""
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel
            from torch.optim import SGD

            def main(rank, world_size):
                dist.init_process_group("gloo", rank=rank, world_size=world_size)
                model = ToyModel().to(rank)
                ddp_model = DistributedDataParallel(model, device_ids=[rank])
                optimizer = SGD(ddp_model.parameters(), lr=0.001)
                loss_fn(ddp_model(inputs), labels).backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            from accelerate import Accelerator

            accelerator = Accelerator()
            model = AutoModelForSequenceClassification.from_pretrained("bert-base-cased")
            optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                accelerator.backward(model(**batch).loss)
                optimizer.step()
        """),
        Valid("""
            import lightning as L
            import torch

            fabric = L.Fabric(accelerator="cuda", devices=8, strategy="ddp")
            fabric.launch()
            model = Net()
            optimizer = torch.optim.Adam(model.parameters())
            model, optimizer = fabric.setup(model, optimizer)
            fabric.backward(model(x).sum())
            optimizer.step()
        """),
        Valid("""
            import torch

            model = Net().cuda()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loss_fn(model(x), y).backward()
            optimizer.step()
        """),
        Valid("""
            import torch
            import torch.distributed as dist
            from torch.distributed.optim import ZeroRedundancyOptimizer
            from torch.nn.parallel import DistributedDataParallel as DDP

            dist.init_process_group("nccl")
            teacher = Teacher().eval()
            student = DDP(Student().cuda(), device_ids=[local_rank])
            optimizer = ZeroRedundancyOptimizer(student.parameters(),
                                                optimizer_class=torch.optim.Adam, lr=0.01)
            with torch.no_grad():
                target = teacher(x)
            loss_fn(student(x), target).backward()
            optimizer.step()
        """),
        Valid("""
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            def wrap(module):
                return DDP(module, device_ids=[dist.get_rank()])

            dist.init_process_group("nccl")
            model = GPT(config).cuda()
            optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
            model = torch.compile(DDP(model)) if compile else wrap(model)
            optimizer.step()
        """),
        Valid("""
            import torch
            import torch.multiprocessing as mp

            def train(model):
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
                for x, y in loader:
                    loss_fn(model(x), y).backward()
                    optimizer.step()

            model = Net()
            model.share_memory()
            processes = [mp.Process(target=train, args=(model,)) for _ in range(4)]
        """),
        Valid("""
            import torch
            import torch.distributed as dist

            def average_gradients(model):
                for param in model.parameters():
                    dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
                    param.grad.data /= dist.get_world_size()

            dist.init_process_group("gloo")
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
            loss_fn(model(x), y).backward()
            average_gradients(model)
            optimizer.step()
        """),
    )
    INVALID = (
        Invalid("""
            import os
            import torch
            import torch.distributed as dist
            from torch import nn

            dist.init_process_group("nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            model = nn.Linear(10, 1).to(local_rank)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
        """, line=9),
        Invalid("""
            import torch
            import torch.distributed as dist
            from transformers import AutoModelForCausalLM

            dist.init_process_group("nccl")
            model = AutoModelForCausalLM.from_pretrained("gpt2").cuda()
            no_decay = ["bias", "LayerNorm.weight"]
            groups = [
                {"params": [p for n, p in model.named_parameters()
                            if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
                {"params": [p for n, p in model.named_parameters()
                            if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
            ]
            optimizer = torch.optim.AdamW(groups, lr=5e-5)
            scaler = torch.amp.GradScaler()
            scaler.scale(model(**batch).loss).backward()
            scaler.step(optimizer)
        """, line=14),
        Invalid("""
            import itertools
            import torch.distributed as dist
            from lion_pytorch import Lion

            dist.init_process_group("nccl")
            encoder, decoder = Encoder().cuda(), Decoder().cuda()
            optimizer = Lion(itertools.chain(encoder.parameters(), decoder.parameters()), lr=1e-4)
            loss_fn(decoder(encoder(x)), x).backward()
            optimizer.step()
        """, line=7),
        Invalid("""
            import torch
            import torch.distributed as dist

            class Trainer:
                def __init__(self, model, local_rank):
                    self.model = model.to(local_rank)
                    self.optimizer = torch.optim.Adam(
                        filter(lambda p: p.requires_grad, self.model.parameters()), lr=1e-3)

                def train_step(self, x, y):
                    self.optimizer.zero_grad()
                    loss_fn(self.model(x), y).backward()
                    self.optimizer.step()

            dist.init_process_group("nccl")
            trainer = Trainer(ResNet(), dist.get_rank())
        """, line=7),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.wrappers = Wrappers(ctx)
        self.process_group = False
        self.manual_sync = False
        self.rpc = False
        self.optimizers: list[_Optimizer] = []
        self.assigns: list[tuple[list[ast.expr], ast.expr]] = []
        self.scoped: dict[tuple[ast.AST | None, str], list[ast.expr]] = defaultdict(list)
        self.bound: dict[int, str] = {}
        self.local_calls: list[ast.Call] = []
        self.returns: dict[ast.AST, list[ast.expr]] = defaultdict(list)
        self.classes: dict[str, ast.ClassDef] = {}
        self.class_stack: list[ast.ClassDef] = []
        self.parameter_loops: list[bool] = []
        self.marker_instances: set[str] = set()
        self.wrap_calls: dict[int, ast.Call] = {}
        self.wrapped: set[str] = set()  # names passed to a wrapper or bound from one
        self.handed_off: set[str] = set()  # passed to a framework call that is not a prepare
        self.shared: set[str] = set()  # names whose share_memory() is called
        self.steps: dict[str, int] = {}  # name → first line it is stepped on
        self.optimizer_step: int | None = None  # first `opt*.step()`, for unbound optimizers
        self.origins: dict[str, set[str]] = defaultdict(set)
        self.prepare_hint: str | None = None  # `accelerator.prepare`, when the file uses one

    # --- collecting -----------------------------------------------------------------------

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.setdefault(node.name, node)
        self.class_stack.append(node)

    def leave_ClassDef(self, node: ast.ClassDef) -> None:
        self.class_stack.pop()

    def visit_For(self, node: ast.For) -> None:
        self.parameter_loops.append(_calls_parameters(node.iter))

    def leave_For(self, node: ast.For) -> None:
        self.parameter_loops.pop()

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None and self.ctx.function is not None:
            self.returns[self.ctx.function].append(node.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.wrappers.learn(node)
        self._assign(node.targets, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._assign([node.target], node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self.scoped[self.ctx.function, node.target.id].append(node.value)

    def _assign(self, targets: list[ast.expr], value: ast.expr) -> None:
        self.assigns.append((targets, value))
        for target in _flat(targets):
            if isinstance(target, ast.Name):
                self.scoped[self.ctx.function, target.id].append(value)
        name = ast_dotted_name(targets[0]) if len(targets) == 1 else None
        if name and isinstance(value, ast.Call):
            self.bound[id(value)] = _short(name)
            if self.ctx.match("distributed_markers", self.ctx.callee(value)):
                self.marker_instances.add(name)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        environ = ast_dotted_name(node.value) or ""
        if environ.endswith("environ") and self._rank_var(node.slice):
            self.process_group = True

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "module":  # `model.module`: the script wrapped `model` somewhere
            name = ast_dotted_name(node.value)
            if name and name != "self":
                self.wrapped.add(_short(name))

    def visit_Call(self, node: ast.Call) -> None:
        ctx = self.ctx
        name = ctx.callee(node) or ""
        marker = ctx.match("distributed_markers", name) is not None
        self._evidence(node, name, marker)
        if self._wraps(node, name, marker):
            self.wrap_calls[id(node)] = node
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr == "step":
                self._step(node)
            elif func.attr == "share_memory":
                self.shared.add(_short(ast_dotted_name(func.value) or ""))
        if _local_name(func) in ctx.function_names or isinstance(func, ast.Name):
            self.local_calls.append(node)
        known = ctx.match("optimizers", name) is not None
        bound = self.bound.get(id(node))
        if marker or not (known or bound):
            return
        params = _params_argument(node)
        if params is not None and (known or _calls_parameters(params)):
            self.optimizers.append(_Optimizer(node, ctx.site(), bound, known, params,
                                              *self._class_facts()))

    def _class_facts(self) -> tuple[bool, bool]:
        """Whether the call is in a class a framework wraps (a ``LightningModule``), and in one
        with bases at all (a model's own method, where ``self`` is not a name we can follow)."""
        bases = [base for cls in self.class_stack for base in cls.bases]
        framework = any(self.ctx.match("distributed_markers", self.ctx.loose_qualname(base))
                        for base in bases)
        inner = self.class_stack[-1].bases if self.class_stack else []
        return framework, any(ast_dotted_name(base) != "object" for base in inner)

    def _evidence(self, node: ast.Call, name: str, marker: bool) -> None:
        """A process group: a distributed call other than plain multiprocessing, a rank read
        from the environment; gradients averaged by hand: a collective over them."""
        reads_rank = (name.endswith(("environ.get", "getenv")) and bool(node.args)
                      and self._rank_var(node.args[0]))
        if reads_rank or (marker and not name.startswith(_MULTIPROCESSING)):
            self.process_group = True
        if name.startswith(_RPC):
            self.rpc = True
        if _reduces(self.ctx, name) and (any(self.parameter_loops) or _mentions_gradients(node)):
            self.manual_sync = True

    def _rank_var(self, node: ast.expr) -> bool:
        return (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and self.ctx.match("rank_env_vars", node.value) is not None)

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

    def _prepares(self, node: ast.Call) -> bool:
        """``accelerator.prepare(...)``, ``distify.prepare(...)``, ``fabric.setup(...)``: these
        sync only the models they are given, not every parameter their optimizer steps."""
        return self.wrappers.prepare_receiver(node) is not None or (
            isinstance(node.func, ast.Attribute) and node.func.attr in _SETUP_METHODS)

    def _step(self, node: ast.Call) -> None:
        receiver = _short(ast_dotted_name(node.func.value) or "")
        if receiver:
            self.steps.setdefault(receiver, node.lineno)
            if "opt" in receiver.lower() and self.optimizer_step is None:
                self.optimizer_step = node.lineno
        for arg in node.args:  # `scaler.step(optimizer)`
            name = ast_dotted_name(arg)
            if name:
                self.steps.setdefault(_short(name), node.lineno)

    # --- deciding -------------------------------------------------------------------------

    def finish(self) -> None:
        if not self.process_group or self.manual_sync or self.rpc or not self.optimizers:
            return
        for call in self.wrap_calls.values():
            names = _names_in_args(call)
            self.wrapped |= names
            if not self._prepares(call):  # Horovod's DistributedOptimizer, deepspeed.initialize
                self.handed_off |= names
            elif self.prepare_hint is None:
                self.prepare_hint = self.ctx.segment(call.func)
        self.by_name: dict[str, list[ast.AST]] = defaultdict(list)
        for function in self.ctx.functions:
            self.by_name[function.name].append(function)
        aliases = _Aliases()
        for targets, value in self.assigns:
            self._learn(aliases, targets, value, 0)
        for call in self.local_calls:
            self._learn_call(aliases, call)
        self.blocked = aliases.roots(self.wrapped | self.shared)
        self.handed = aliases.roots(self.handed_off)
        self.kinds: dict[str, set[str]] = defaultdict(set)
        for name, found in self.origins.items():
            self.kinds[aliases.find(name)] |= found
        self.step_lines: dict[str, int] = {}
        for name, line in self.steps.items():
            root = aliases.find(name)
            self.step_lines[root] = min(line, self.step_lines.get(root, line))
        for optimizer in self.optimizers:
            self._check(aliases, optimizer)

    def _check(self, aliases: _Aliases, optimizer: _Optimizer) -> None:
        if optimizer.in_framework or not self.ctx.on_every_rank(self.ctx.reaches(optimizer.site)):
            return
        line = self._step_line(aliases, optimizer)
        if line is None:
            return
        if optimizer.name and aliases.find(optimizer.name) in self.handed:
            return  # Horovod / DeepSpeed average the gradients at the optimizer
        function = optimizer.site.function
        models = []
        for receiver in self._receivers(optimizer.params, function, set(), 0):
            if receiver.startswith("self.") and optimizer.self_unknown:
                continue
            model = self._unwrapped(aliases, receiver)
            if model and model not in models:
                models.append(model)
        if not models:
            return
        first = models[0]
        example = f"{first} = {self.prepare_hint}({first})" if self.prepare_hint else \
            f"{first} = DDP({first}, device_ids=[local_rank])"
        self.report(optimizer.call, self.MESSAGE.format(
            model="`, `".join(models), verb="is" if len(models) == 1 else "are", line=line,
            it="it" if len(models) == 1 else "them", example=example), site=optimizer.site)

    def _step_line(self, aliases: _Aliases, optimizer: _Optimizer) -> int | None:
        if optimizer.name is None:
            return self.optimizer_step if optimizer.known else None
        return self.step_lines.get(aliases.find(optimizer.name))

    def _unwrapped(self, aliases: _Aliases, receiver: str) -> str | None:
        """The model's name when ``receiver`` (whose parameters are trained) is a model the file
        builds and never wraps, else None."""
        parts = receiver.split(".")
        prefix = ""
        if parts[0] == "self":
            parts, prefix = parts[1:], "self."
        if not parts or "module" in parts[1:]:  # `model.module`: wrapped
            return None
        if aliases.roots(parts) & self.blocked or self.kinds[aliases.find(parts[0])] != {"built"}:
            return None
        return prefix + parts[0]

    def _receivers(self, expr: ast.expr, function: ast.AST | None, seen: set[str],
                   depth: int) -> list[str]:
        """The dotted names whose ``parameters()`` / ``named_parameters()`` ``expr`` uses,
        following names assigned in the same function (or at module level)."""
        found: list[str] = []
        for node in ast.walk(expr):
            if isinstance(node, ast.Call) and _local_name(node.func) in _PARAMETERS \
                    and isinstance(node.func, ast.Attribute):
                name = ast_dotted_name(node.func.value)
                if name:
                    found.append(name)
            elif (isinstance(node, ast.Name) and depth < _MAX_DEPTH and node.id not in seen
                  and isinstance(node.ctx, ast.Load)):
                seen.add(node.id)
                values = self.scoped.get((function, node.id)) or self.scoped.get((None, node.id))
                for value in values or ():
                    found.extend(self._receivers(value, function, seen, depth + 1))
        return found

    # --- aliases and origins ---------------------------------------------------------------

    def _learn(self, aliases: _Aliases, targets: list[ast.expr], value: ast.expr,
               depth: int) -> None:
        """What ``targets = value`` says: wrapped, rebound, an alias, or where a model comes
        from (``built`` by a class or model factory, ``unknown`` otherwise)."""
        names = [_short(name) for name in map(ast_dotted_name, _flat(targets)) if name]
        if self._contains_wrap(value):
            self.wrapped.update(names)
            return
        if isinstance(value, ast.Call) and self.ctx.callee(value) not in _NOT_WRAPPERS:
            passed = {_short(name) for name in map(ast_dotted_name, _direct_args(value)) if name}
            self.wrapped.update(passed & set(names))  # `model = wrap(model)`
        functions = self._local_functions(value)
        if functions:
            for function in functions:
                for returned in self.returns.get(function, ()):
                    if depth < _MAX_DEPTH:
                        self._learn(aliases, targets, returned, depth + 1)
            return
        single = len(targets) == 1 and not isinstance(targets[0], (ast.Tuple, ast.List))
        if single and names:
            for source in _sources(self.ctx, value):
                aliases.union(names[0], source)
            origin = self._origin(value)
            if origin:
                self.origins[names[0]].add(origin)
        elif not single and isinstance(targets[0], (ast.Tuple, ast.List)):
            elements = targets[0].elts
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(elements):
                for target, item in zip(elements, value.elts):
                    self._learn(aliases, [target], item, depth + 1)
            else:
                for name in names:
                    self.origins[name].add("unknown")

    def _learn_call(self, aliases: _Aliases, call: ast.Call) -> None:
        """A call of a function or class of this file: its parameters alias the arguments
        (``f(model)`` a function, ``Trainer(model)`` a class, ``x.f(model)`` a method)."""
        for params in self._parameters(call):
            pairs = list(zip(params, call.args))
            pairs += [(keyword.arg, keyword.value) for keyword in call.keywords if keyword.arg]
            for param, arg in pairs:
                if isinstance(arg, ast.Starred):
                    break
                for source in _sources(self.ctx, arg):
                    aliases.union(param, source)
                origin = self._origin(arg)
                if origin:
                    self.origins[param].add(origin)

    def _parameters(self, call: ast.Call):
        """The parameter names (``self`` left out) of each local definition ``call`` may run."""
        name = _local_name(call.func)
        if name in self.classes:
            functions = [stmt for stmt in self.classes[name].body
                         if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__"]
            method = True
        else:
            functions = self.by_name.get(name, ())
            method = isinstance(call.func, ast.Attribute)
        for function in functions:
            args = function.args
            params = [arg.arg for arg in (*args.posonlyargs, *args.args)]
            if bool(params) and params[0] in ("self", "cls") and method:
                yield params[1:]
            elif not method and not (params and params[0] in ("self", "cls")):
                yield params

    def _origin(self, value: ast.expr) -> str | None:
        value = _strip_same_module(value)
        if isinstance(value, (ast.Name, ast.Attribute, ast.IfExp)):
            return None  # an alias (see _sources)
        if not isinstance(value, ast.Call):
            return "unknown"
        callee = self.ctx.callee(value) or ""
        if callee in _NOT_WRAPPERS or self._local_functions(value):
            return None  # an alias, or followed through the function's returns
        last = callee.rpartition(".")[2]
        if self.ctx.match("models", callee) or last[:1].isupper() \
                or last in ("from_pretrained", "from_config"):
            return "built"
        return "unknown"

    def _local_functions(self, value: ast.expr) -> list[ast.AST]:
        if not isinstance(value, ast.Call):
            return []
        name = _local_name(value.func)
        if name is None or name in self.classes:
            return []
        return self.by_name.get(name, [])

    def _contains_wrap(self, value: ast.expr) -> bool:
        """``DDP(model)``, ``DDP(model).to(device)``, ``torch.compile(DDP(model))``, ``DDP(model)
        if ddp else model`` (not ``Net().to(dist.get_rank())``)."""
        value = _strip_same_module(value)
        if isinstance(value, ast.IfExp):
            return self._contains_wrap(value.body) or self._contains_wrap(value.orelse)
        if not isinstance(value, ast.Call):
            return False
        if id(value) in self.wrap_calls:
            return True
        return (self.ctx.callee(value) in _NOT_WRAPPERS and bool(value.args)
                and self._contains_wrap(value.args[0]))


def _sources(ctx, value: ast.expr) -> list[str]:
    """The names ``value`` may be the same object as (``model``, ``model.to(device)``,
    ``torch.compile(model)``, ``model.module if ddp else model``)."""
    value = _strip_same_module(value)
    if isinstance(value, ast.IfExp):
        return _sources(ctx, value.body) + _sources(ctx, value.orelse)
    if isinstance(value, ast.Call):
        if ctx.callee(value) in _NOT_WRAPPERS and value.args:
            return _sources(ctx, value.args[0])
        return []
    name = ast_dotted_name(value)
    if name is None:
        return []
    if name.endswith(".module"):
        name = name.removesuffix(".module")
    return [_short(name)]


def _strip_same_module(value: ast.expr) -> ast.expr:
    while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
           and value.func.attr in _SAME_MODULE):
        value = value.func.value
    return value


def _params_argument(call: ast.Call) -> ast.expr | None:
    """The ``params`` an optimizer-like call takes, when it mentions ``parameters()`` at all."""
    arg = call.args[0] if call.args else next(
        (keyword.value for keyword in call.keywords if keyword.arg == "params"), None)
    if arg is None or isinstance(arg, ast.Starred):
        return None
    if isinstance(arg, ast.Name) or _calls_parameters(arg):
        return arg
    return None


def _calls_parameters(expr: ast.expr) -> bool:
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in _PARAMETERS for node in ast.walk(expr))


def _reduces(ctx, name: str) -> bool:
    """A collective that can average tensors (``all_reduce``, ``broadcast``, ``reduce_scatter``)."""
    if ctx.match("collectives", name):
        return True
    last = name.rpartition(".")[2]
    return name.startswith("torch.distributed.") and any(
        word in last for word in ("reduce", "broadcast", "gather", "scatter"))


def _mentions_gradients(call: ast.Call) -> bool:
    """``dist.all_reduce(param.grad)``, ``dist.broadcast(params, 0)``: synchronised by hand."""
    for arg in _direct_args(call):
        for node in ast.walk(arg):
            text = node.id if isinstance(node, ast.Name) else \
                node.attr if isinstance(node, ast.Attribute) else ""
            if "grad" in text.lower() or "param" in text.lower():
                return True
            if isinstance(node, ast.Call) and _local_name(node.func) in _PARAMETERS:
                return True
    return False


def _names_in_args(call: ast.Call) -> set[str]:
    names = set()
    for arg in _direct_args(call):
        for node in ast.walk(arg):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
    return names


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


def _local_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _short(name: str) -> str:
    return name.rpartition(".")[2]
