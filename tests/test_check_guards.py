"""Guard recognition (distify.analysis.guards): who sees each condition true."""

from __future__ import annotations

import ast

import pytest

from distify.analysis.filemodel import FileModel
from distify.analysis.guards import ALL, MAIN, NOT_MAIN, SOME
from distify.lint.matcher import Matcher
from distify.rules import default_rules

PRELUDE = """
import os
import torch.distributed as dist
import distify.runtime as distify
rank = dist.get_rank()
is_master = rank == 0
not_main = rank != 0
def is_primary():
    return int(os.environ.get("RANK", 0)) == 0
"""


def _true_side(condition: str):
    tree = ast.parse(PRELUDE + f"\nif {condition}:\n    pass\n")
    facts = FileModel(tree, b"", default_rules(), Matcher(default_rules())).guards
    test = facts.test(tree.body[-1].test)
    return None if test is None else test.true


@pytest.mark.parametrize(("condition", "reach"), [
    ("rank == 0", MAIN), ("0 == rank", MAIN), ("dist.get_rank() == 0", MAIN),
    ("args.local_rank in [-1, 0]", MAIN), ("args.local_rank not in (-1, 0)", NOT_MAIN),
    ('int(os.environ["RANK"]) == 0', MAIN), ('os.environ["LOCAL_RANK"] == "0"', MAIN),
    ("args.rank % ngpus_per_node == 0", MAIN), ("local_rank <= 0", MAIN),
    ("rank > 0", NOT_MAIN), ("rank >= 1", NOT_MAIN), ("rank != 0", NOT_MAIN),
    ("not rank", MAIN), ("rank", NOT_MAIN), ("rank == 3", SOME), ("rank < 4", SOME),
    ("accelerator.is_main_process", MAIN), ("self.trainer.is_global_zero", MAIN),
    ("distify.is_main_process()", MAIN), ("accelerator.process_index == 0", MAIN),
    ("is_master", MAIN), ("not is_master", NOT_MAIN), ("not_main", NOT_MAIN),
    ("is_primary()", MAIN), ("xm.is_master_ordinal()", MAIN),
    ("args.local_rank == -1 or dist.get_rank() == 0", MAIN),
    ("rank == 0 and step % 100 == 0", MAIN),
    ("not args.distributed or (args.distributed and args.rank % 8 == 0)", MAIN),
])
def test_guard_shapes(condition, reach):
    assert _true_side(condition) is reach


@pytest.mark.parametrize("condition", [
    "args.local_rank == -1", "args.local_rank != -1", "world_size > 1", "dist.is_initialized()",
    "step % 10 == 0", "rank >= 0", "epoch == 0",
])
def test_rank_independent_conditions(condition):
    assert _true_side(condition) in (None, ALL)
