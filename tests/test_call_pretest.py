"""convert/transformer: ``_may_rewrite_call``, the pre-test that lets a call of a name no
rewrite knows skip the rewrites of calls by name, is only ever a shortcut. Every fixture is
converted with the full rewrites run behind each of its "no": they must return nothing and
record nothing (no report line, no download mark, no batch size, no mixed-precision flag)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from distify.convert.transformer import DistifyTransformer
from distify.errors import UserError

FIXTURES = Path(__file__).parent / "fixtures"


def _state(transformer: DistifyTransformer) -> tuple:
    ctx = transformer.ctx
    return (len(transformer.edits), list(ctx.downloads), list(transformer.batch_sizes),
            transformer.own_mixed_precision, len(ctx.after), len(ctx.skip_sites))


@pytest.fixture
def checked(monkeypatch):
    """Count the pre-test's answers, and check each "no" against the full rewrites."""
    answers = {True: 0, False: 0}
    may = DistifyTransformer._may_rewrite_call

    def checking(self, call, qual):
        answer = may(self, call, qual)
        answers[answer] += 1
        if not answer:
            before = _state(self)
            for rewrite in (self._rewrite_side_effect_call, self._rewrite_prepare,
                            self._rewrite_device, self._rewrite_random_draw):
                assert rewrite(call, call, qual) is None, (rewrite.__name__, qual)
            assert _state(self) == before, qual
        return answer

    monkeypatch.setattr(DistifyTransformer, "_may_rewrite_call", checking)
    return answers


def test_every_no_of_the_fixtures_changes_nothing(checked) -> None:
    for path in sorted(FIXTURES.rglob("*.py")):
        try:
            convert_source(path.read_bytes(), str(path))
        except UserError:
            continue
    assert checked[False] > 3 * checked[True] > 2_000  # a shortcut taken for most calls


@pytest.mark.parametrize("source", [
    # a download asked by keyword, whatever the callee's name
    "import torch\nfrom mydata import Fetch\nfrom torch.utils.data import DataLoader\n"
    "ds = Fetch('data', download=True)\nmodel = torch.nn.Linear(2, 2)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "for x in DataLoader(ds):\n    model(x).sum().backward()\n    opt.step()\n",
    # an estimate over random batches the draw flow picked out (nanoGPT's estimate_loss),
    # a call of a name no rewrite knows by name: `losses.mean()`
    "import torch\nmodel = torch.nn.Linear(2, 1)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\ndata = torch.randn(100, 2)\n"
    "def get_batch():\n    return data[torch.randint(len(data), (4,))]\n"
    "@torch.no_grad()\ndef estimate_loss():\n    losses = torch.zeros(10)\n"
    "    for k in range(10):\n        losses[k] = model(get_batch()).pow(2).mean().item()\n"
    "    return losses.mean()\n"
    "for it in range(100):\n    if it % 10 == 0:\n        print(estimate_loss())\n"
    "    model(get_batch()).pow(2).mean().backward()\n    opt.step()\n",
])
def test_calls_the_pre_test_must_let_through(checked, source: str) -> None:
    result = convert_source(source.encode(), "train.py")
    assert result.status == "converted"
    assert checked[True] and checked[False]
    output = result.output.decode()
    assert "download=True" not in source or "main_process_first" in output, output
    assert "estimate_loss" not in source or 'reduce(losses.mean(), op="mean")' in output, output
