"""DST305 as a query over the training flow (``distify.analysis.wrapping``).

The facts DST305 reads (which optimizer trains which model, where it is stepped, whether the
model is built here and wrapped anywhere) are asserted directly; then the cases where reading
the training flow finds more than DST305's former private analysis did, and the cases where it
must stay silent.
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from distify.analysis.names import ImportMap
from distify.analysis.wrapping import model_flow
from distify.lint import lint_text
from distify.rules import default_rules


def _flow(source: str):
    tree = ast.parse(textwrap.dedent(source))
    return model_flow(tree, ImportMap.from_ast(tree), default_rules())


def _dst305(source: str) -> list[tuple[int, str]]:
    return [(f.line, f.message) for f in lint_text(textwrap.dedent(source), codes=["DST305"])]


TRAINER = """\
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Trainer:
        def __init__(self, model, gpu):
            self.model = model.to(gpu)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            {wrap}

        def step(self, x):
            self.model(x).sum().backward()
            self.optimizer.step()

    def load():
        model = Net()
        return model, 2

    dist.init_process_group("nccl")
    model, gpu = load()
    Trainer(model, gpu).step(x)
"""


def test_facts_name_the_optimizer_its_model_and_its_step():
    flow = _flow(TRAINER.format(wrap="pass"))
    assert flow.needs_wrapping
    (optimizer,) = flow.optimizers
    assert (optimizer.scope, optimizer.target, optimizer.step_line) == (
        ("Trainer", "__init__"), "self.optimizer", 13)
    assert [(m.name, m.built, m.wrapped) for m in optimizer.models] == [
        ("self.model", True, False)]
    assert optimizer.unwrapped == ["self.model"]


def test_a_wrap_of_an_alias_covers_the_model_built_two_calls_away():
    # `self.model` ← parameter `model` ← `load()`'s returned `model`: one model, wrapped
    flow = _flow(TRAINER.format(wrap="self.model = DDP(self.model)"))
    (optimizer,) = flow.optimizers
    assert [(m.name, m.built, m.wrapped) for m in optimizer.models] == [
        ("self.model", True, True)]
    assert _dst305(TRAINER.format(wrap="self.model = DDP(self.model)")) == []
    assert [line for line, _ in _dst305(TRAINER.format(wrap="pass"))] == [8]


def test_without_a_process_group_there_is_nothing_to_query():
    flow = _flow("""\
        import torch
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.step()
    """)
    assert not flow.needs_wrapping and flow.optimizers == ()


# Found now, silent before: the training flow knows more ways to build an optimizer, and its
# aliasing does not merge unrelated names that share a last segment.
FINDS_MORE = [
    pytest.param("""\
        import torch
        import torch.distributed as dist

        def param_groups(model, wd):
            return [{"params": [p for p in model.parameters() if p.ndim >= 2],
                     "weight_decay": wd}]

        dist.init_process_group("nccl")
        model = GPT(config).cuda()
        model.train()
        optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=6e-4)
        model(x, y).backward()
        optimizer.step()
    """, 11, "`model`", id="groups-built-by-a-helper"),
    pytest.param("""\
        import torch.distributed as dist

        dist.init_process_group("nccl")
        model = GPT(config).cuda()
        optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
        model(x, y).backward()
        optimizer.step()
    """, 5, "`model`", id="configure-optimizers"),
    pytest.param("""\
        import torch
        import torch.distributed as dist

        model = load_model()

        class Trainer:
            def __init__(self):
                self.model = Net()
                self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def step(self):
                self.optimizer.step()

        dist.init_process_group("nccl")
        Trainer().step()
    """, 9, "`self.model`", id="unrelated-model-of-the-same-name"),
]


@pytest.mark.parametrize(("source", "line", "model"), FINDS_MORE)
def test_finds_more_than_the_private_analysis_did(source, line, model):
    findings = _dst305(source)
    assert [found for found, _ in findings] == [line]
    assert findings[0][1].startswith(f"{model} is trained")


SILENT = [
    pytest.param("""\
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Trainer:
            def setup_model(self, model):
                self.model = DDP(model)

        dist.init_process_group("nccl")
        model = Net()
        trainer = Trainer()
        trainer.setup_model(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.step()
    """, id="wrapped-by-a-method-called-on-another-object"),
    pytest.param("""\
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def build():
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            return model, optimizer

        def main():
            dist.init_process_group("nccl")
            model, optimizer = build()
            model = DDP(model)
            optimizer.step()
    """, id="wrapped-after-a-helper-returns-it"),
    pytest.param("""\
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Runner:
            def __init__(self, net):
                self.net = net
                self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)

            def wrap(self):
                self.net = DDP(self.net)

            def run(self):
                self.opt.step()

        dist.init_process_group("nccl")
        runner = Runner(Net())
        runner.wrap()
        runner.run()
    """, id="wrapped-in-another-method"),
    pytest.param("""\
        import torch
        import torch.distributed as dist

        def build(model):
            return build(model)

        dist.init_process_group("nccl")
        model = build(Net())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.step()
    """, id="recursive-helper-origin-unknown"),
]


@pytest.mark.parametrize("source", SILENT)
def test_silent(source):
    assert _dst305(source) == []
