"""DST304: a random split of the data set that each rank draws for itself."""

from __future__ import annotations

import ast

from distify.analysis.draws import counts_the_data, how_to_seed, must_agree, seeds_itself
from distify.lint.rule import Invalid, LintRule, Valid


class UnseededRandomSplit(LintRule):
    """The data set is split (or its indices permuted) with an unseeded random draw.

    ``random_split(dataset, [n_train, n_val])``, ``torch.randperm(len(dataset))``,
    ``np.random.permutation``, ``train_test_split`` without ``random_state=`` (the
    ``random_splits`` rule category): each rank draws its own split, so the training shards
    overlap and validation samples leak into training, silently. Pass a seeded generator
    (``generator=torch.Generator().manual_seed(0)``, or ``distify.shared_generator()``), a
    ``random_state=``, or seed every rank with the same number first.

    Seeding counts only with a seed that is the same on every rank: ``torch.manual_seed(seed +
    rank)`` does not make the ranks agree. A ``randperm`` of anything but a length (a batch's
    ``size(0)``, as mixup does) need not agree and is not reported. No fix: which seed is a
    choice for a human.
    """

    CODE = "DST304"
    MESSAGE = ("`{name}` is unseeded: each rank draws its own split, so training shards overlap "
               "and validation leaks into training; {how}")

    VALID = (
        Valid("""
            import torch
            from torch.utils.data import random_split

            torch.manual_seed(0)
            train_set, val_set = random_split(dataset, [0.9, 0.1])
        """),
        Valid("""
            import torch
            from torch.utils.data import random_split

            g = torch.Generator().manual_seed(42)
            train_set, val_set = random_split(dataset, [0.9, 0.1], generator=g)
            index = torch.randperm(batch.size(0))
            shuffle = torch.randperm(batch_size)
        """),
        Valid("""
            from sklearn.model_selection import train_test_split

            train_idx, val_idx = train_test_split(indices, test_size=0.1, random_state=0)
        """),
    )
    INVALID = (
        Invalid("""
            import torch.distributed as dist
            from torch.utils.data import random_split

            dist.init_process_group("nccl")
            train_set, val_set = random_split(dataset, [0.9, 0.1])
        """, line=5),
        Invalid("""
            import torch
            import torch.distributed as dist

            torch.manual_seed(1234 + dist.get_rank())
            perm = torch.randperm(len(dataset))
        """, line=5),
        Invalid("""
            import torch
            import torch.distributed as dist

            perm = torch.randperm(data.num_nodes)
            train_mask = perm[:140]
        """, line=4),
        Invalid("""
            import numpy as np
            import torch.distributed as dist
            from sklearn.model_selection import train_test_split

            order = np.random.permutation(len(files))
            a, b = train_test_split(files, test_size=0.2)
        """, line=5),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.draws: list[tuple[ast.Call, str, str]] = []
        self.seeded = False

    def visit_Call(self, node: ast.Call) -> None:
        name = self.ctx.callee(node)
        if self.ctx.match("seeds", name):
            self.seeded = self.seeded or not _mentions_rank(node)
            return
        entry = self.ctx.match("random_splits", name)
        if entry is None or any(isinstance(arg, ast.Starred) for arg in node.args) \
                or any(keyword.arg is None for keyword in node.keywords):
            return
        keywords = {keyword.arg for keyword in node.keywords if keyword.arg}
        if seeds_itself(entry, keywords, len(node.args)):
            return
        short = (name or "").rpartition(".")[2]
        if must_agree(short, bool(node.args) and counts_the_data(ast.unparse(node.args[0]))):
            self.draws.append((node, short, how_to_seed(entry)))

    def finish(self) -> None:
        if self.seeded:
            return
        for node, name, how in self.draws:
            self.report(node, self.MESSAGE.format(name=name, how=how))


def _mentions_rank(call: ast.Call) -> bool:
    for node in ast.walk(call):
        text = node.id if isinstance(node, ast.Name) else \
            node.attr if isinstance(node, ast.Attribute) else ""
        if "rank" in text.lower():
            return True
    return False
