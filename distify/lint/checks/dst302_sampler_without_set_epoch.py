"""DST302: a shuffling DistributedSampler whose ``set_epoch`` is never called."""

from __future__ import annotations

import ast

from distify.analysis.names import ast_dotted_name
from distify.lint.rule import Invalid, LintRule, Valid


class SamplerWithoutSetEpoch(LintRule):
    """A ``DistributedSampler`` shuffles, but ``set_epoch`` is never called on it.

    ``DistributedSampler`` seeds its shuffle with the epoch it is told; without
    ``sampler.set_epoch(epoch)`` at the start of each epoch, every epoch sees the same order
    (the classic silent accuracy loss). Call it (on the sampler, or ``loader.sampler``), or pass
    ``shuffle=False`` for an evaluation sampler. The distify runtime and Accelerate reshuffle
    their prepared loaders themselves.

    A sampler bound to a name is satisfied by a ``set_epoch`` on that name, on any
    ``.sampler`` attribute, or on a name the file does not bind to another sampler. No fix:
    where the epoch loop is needs a human.
    """

    CODE = "DST302"
    MESSAGE = ("`{name}` shuffles but `set_epoch` is never called on it: every epoch sees the "
               "same order; call `{target}.set_epoch(epoch)` at the start of each epoch")

    VALID = (
        Valid("""
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler

            sampler = DistributedSampler(dataset)
            loader = DataLoader(dataset, sampler=sampler)
            for epoch in range(10):
                sampler.set_epoch(epoch)
                train(loader)
        """),
        Valid("""
            from torch.utils.data import DataLoader, DistributedSampler

            loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
            for epoch in range(10):
                loader.sampler.set_epoch(epoch)
        """),
        Valid("""
            from torch.utils.data import DistributedSampler

            eval_sampler = DistributedSampler(eval_set, shuffle=False)
        """),
    )
    INVALID = (
        Invalid("""
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler

            train_sampler = DistributedSampler(train_set)
            loader = DataLoader(train_set, sampler=train_sampler, batch_size=64)
            for epoch in range(10):
                train(loader)
        """, line=4),
        Invalid("""
            import torch.utils.data as data

            train_sampler = data.DistributedSampler(train_set, shuffle=True)
            val_sampler = data.DistributedSampler(val_set)
            for epoch in range(10):
                val_sampler.set_epoch(epoch)
        """, line=3),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.samplers: list[tuple[ast.Call, str | None]] = []
        self.receivers: list[str] = []
        self._bound: dict[int, str] = {}

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.value, ast.Call):
            name = ast_dotted_name(node.targets[0])
            if name:
                self._bound[id(node.value)] = name

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "set_epoch":
            self.receivers.append(ast_dotted_name(func.value) or "<expr>")
        elif (self.ctx.match("distributed_samplers", self.ctx.callee(node))
              and not _no_shuffle(node)):
            self.samplers.append((node, self._bound.get(id(node))))

    def finish(self) -> None:
        last = {name.rpartition(".")[2] for _, name in self.samplers if name}
        covered = {receiver.rpartition(".")[2] for receiver in self.receivers}
        covers_all = bool(covered - last)
        for node, name in self.samplers:
            short = name.rpartition(".")[2] if name else None
            if covers_all or (short in covered) or (short is None and self.receivers):
                continue
            target = name or "loader.sampler"
            self.report(node, self.MESSAGE.format(name=name or self.ctx.segment(node.func),
                                                  target=target))


def _no_shuffle(node: ast.Call) -> bool:
    return any(keyword.arg == "shuffle" and isinstance(keyword.value, ast.Constant)
               and not keyword.value.value for keyword in node.keywords)
