"""One model of a file: the converter and the lints read the analysis' answers
(``distify/analysis/``) instead of deriving them again (issue 23, item 2)."""

from __future__ import annotations

import ast

from distify.analysis import facts as facts_module
from distify.analysis import wrapping
from distify.analysis.names import ImportMap
from distify.rules import default_rules


def test_model_classes_is_one_public_answer_for_facts_and_wrapping() -> None:
    tree = ast.parse("import torch.nn as nn\n"
                     "class Big(Small):\n    pass\n"
                     "class Small(nn.Module):\n    pass\n"
                     "class Config:\n    pass\n")
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    found = facts_module.model_classes(classes, ImportMap.from_ast(tree), default_rules())
    assert found == {"Big", "Small"}  # a subclass of a local model, defined before its base
    assert wrapping.model_classes is facts_module.model_classes


_COUNTED = """\
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(torch.randn(64, 4), batch_size=8)
{counter} = 0
for x in loader:
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    {counter} += x.numel()
"""


def _counter_walks(monkeypatch, source: str) -> tuple[list[str], list[str]]:
    """The throughput notes of ``source``'s conversion, and the counter walks it made."""
    from distify.convert import accumulation
    from distify.convert.engine import convert_source

    walks: list[str] = []
    real = accumulation.counter_lines

    def counting(*args, **kwargs):
        walks.append("walk")
        return real(*args, **kwargs)

    monkeypatch.setattr(accumulation, "counter_lines", counting)
    result = convert_source(source.encode(), "train.py")
    return [c.message for c in result.changes if c.kind == "throughput"], walks


def test_the_counter_walk_runs_only_when_the_file_binds_a_counters_name(monkeypatch) -> None:
    notes, walks = _counter_walks(monkeypatch, _COUNTED.format(counter="num_tokens"))
    assert walks == ["walk"] and len(notes) == 1 and "`num_tokens`" in notes[0]
    notes, walks = _counter_walks(monkeypatch, _COUNTED.format(counter="total"))
    assert walks == [] and notes == []  # `total` names no counter: nothing to find, no walk
