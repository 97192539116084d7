"""DST305: a model trained in a distributed script but never wrapped in DDP/FSDP or prepared."""

from __future__ import annotations

import ast

from distify.analysis.wrapping import model_flow
from distify.lint.engine import Site
from distify.lint.rule import Invalid, LintRule, Valid


class ModelNotWrapped(LintRule):
    """A model is trained in a distributed script but never wrapped in DDP/FSDP or prepared.

    In a file that starts a process group or is launched distributed (it calls
    ``torch.distributed``, Accelerate, Fabric, DeepSpeed, Horovod, Ray Train or the distify
    runtime, or reads ``RANK`` / ``LOCAL_RANK``), an optimizer is built over a model's
    parameters and stepped, but the model is never handed to ``DistributedDataParallel``,
    ``FSDP`` / ``fully_shard``, ``accelerator.prepare``, ``distify.prepare``, ``fabric.setup``
    or Ray's ``prepare_model``. Nothing averages the gradients: every rank trains its own copy
    on its own shard and the replicas drift apart, silently.

    What each optimizer trains is the converter's own training flow
    (:mod:`distify.analysis.training`, read through :mod:`distify.analysis.wrapping`): it may take
    ``model.parameters()``, a filtered or chained iterable of them, parameter groups built from
    ``named_parameters()`` (through a variable or a helper the model is handed to), come from
    ``model.configure_optimizers(...)`` or from any library (``Lion(model.parameters())``) as
    long as the file steps it (``optimizer.step()``, ``scaler.step(optimizer)``). Two names are
    one model when the flow traces them to one place: ``self.model = model``, a function's
    parameter and what its callers pass (also ``trainer.attach(model)``), a value a local
    function returns, ``net = model.to(device)``; a wrap of any of them (before or after the
    optimizer, ``ddp_model = DDP(model)``, ``torch.compile(DDP(model))``) covers the model. The
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
        self.values: set[int] = set()  # calls whose value is bound: optimizers of any library
        self.sites: dict[int, Site] = {}

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call):
            self.values.add(id(node.value))

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.value, ast.Call):
            self.values.add(id(node.value))

    def visit_Call(self, node: ast.Call) -> None:
        if id(node) in self.values or self.ctx.match("optimizers", self.ctx.callee(node)):
            self.sites[id(node)] = self.ctx.site()

    def finish(self) -> None:
        ctx = self.ctx
        if b"step" not in ctx.source:  # every finding names the line its optimizer steps on
            return
        flow = model_flow(ctx.tree, ctx.imports, ctx.matcher.rules, ctx.matcher, ctx.callee)
        if not flow.needs_wrapping:
            return
        hint = ctx.segment(flow.prepare_call.func) if flow.prepare_call is not None else None
        for optimizer in flow.optimizers:
            site = self.sites.get(id(optimizer.call))
            models = optimizer.unwrapped
            if optimizer.in_framework or optimizer.synced or optimizer.step_line is None \
                    or not models or (site and not ctx.on_every_rank(ctx.reaches(site))):
                continue
            first = models[0]
            example = f"{first} = {hint}({first})" if hint else \
                f"{first} = DDP({first}, device_ids=[local_rank])"
            self.report(optimizer.call, self.MESSAGE.format(
                model="`, `".join(models), verb="is" if len(models) == 1 else "are",
                line=optimizer.step_line, it="it" if len(models) == 1 else "them",
                example=example), site=site)
