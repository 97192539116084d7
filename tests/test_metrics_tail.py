"""Metrics kept in containers (issue 21 items 2 and 3): per-class tallies summed elementwise,
and predictions collected for a corpus metric gathered, each converted right or reported.

Fixtures in tests/fixtures/metrics_tail/: NAME.in.py converts to NAME.out.py exactly (update with
DISTIFY_UPDATE_GOLDEN=1 and review the diff). Every one evaluates before training and after; the
2-process run must print what one process prints for the evaluation of the (seeded, same)
untrained model, where the pattern allows exactness.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from tests.fixture_runs import Plan, check_golden, fixture_name, run_side_by_side
from tests.helpers import FIXTURES, REPO, clean_env, run_torchrun

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

TAIL = FIXTURES / "metrics_tail"
GOLDEN = sorted(TAIL.glob("*.in.py"))
ELEMENTWISE = REPO / "tests" / "runtime_scripts" / "elementwise_reduce.py"


def _convert(source: str):
    return convert_source(textwrap.dedent(source).encode(), "t.py")


@pytest.mark.parametrize("source", GOLDEN, ids=fixture_name)
def test_golden_output_and_converting_twice_changes_nothing(source: Path) -> None:
    check_golden(source)


def _claims(result) -> dict[str, str]:
    return {c.message.split("`")[1]: c.message for c in result.changes
            if c.kind in ("reduce", "gather") and c.message.startswith("`")}


def test_the_report_claims_exact_tallies_only_for_per_sample_counts_in_evaluation() -> None:
    result = convert_source((TAIL / "confusion_matrix.in.py").read_bytes())
    claims = _claims(result)
    for name in ("confusion_matrix", "grid", "label_counts"):
        assert "every entry equals the single-process value" in claims[name], claims[name]
    assert "can exceed the single-process counts" in claims["seen"]  # a training loader pads
    per_batch = _convert("""\
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(torch.arange(10.), batch_size=3)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        per_class_loss = [0.0] * 2
        with torch.no_grad():
            for x in loader:
                loss = model(x.view(-1, 1)).mean()
                per_class_loss[int(x[0]) % 2] += loss.item()
        print(per_class_loss)
        """)
    claim = _claims(per_batch)["per_class_loss"]
    assert "per_class_loss = distify.reduce(per_class_loss)" in per_batch.output.decode()
    assert "cannot tell is a per-sample value" in claim
    assert "every entry equals the single-process value" not in claim


_UNSAFE = """\
    import torch
    from torch.utils.data import DataLoader
    loader = DataLoader(torch.arange(10), batch_size=3)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    {before}
    def evaluate(counts):
        {inside}
        model.eval()
        for {target} in loader:
            {body}
        return counts
    """


@pytest.mark.parametrize("before,inside,target,body,why", [
    pytest.param("", "", "y", "counts[int(y[0]) % 2] += 1", "not made of zeros in this function",
                 id="a-parameter"),
    pytest.param("", "counts = [0, 0]", "y", "counts[int(y[0]) % 2] += 1\n            "
                 "counts[0] = 0", "changes it otherwise", id="changed-otherwise"),
    pytest.param("", "counts = [0, 0]", "y", "counts[int(y[0]) % 2] -= 1",
                 "changes it otherwise", id="subtracted"),
], )
def test_a_tally_that_cannot_be_proven_safe_is_reported_not_reduced(before, inside, target, body,
                                                                   why) -> None:
    source = _UNSAFE.format(before=before, inside=inside, target=target, body=body)
    result = _convert(source)
    assert "distify.reduce(counts)" not in result.output.decode()
    notes = [n.message for n in result.notes if "`counts`" in n.message]
    assert notes and why in notes[0], [n.message for n in result.notes]


def test_a_tally_still_accumulating_in_an_enclosing_loop_is_reported() -> None:
    result = _convert("""\
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(torch.arange(10), batch_size=3)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        counts = [0, 0]
        model.eval()
        for repeat in range(2):
            for y in loader:
                counts[int(y[0]) % 2] += 1
        print(counts)
        """)
    assert "distify.reduce(counts)" not in result.output.decode()
    assert any("goes on accumulating in the enclosing loop" in n.message for n in result.notes)


def test_items_appended_in_an_inner_loop_are_never_gathered_inside_it() -> None:
    # the processes' last batches differ in size: a gather per item would hang
    out = convert_source((TAIL / "bleu_hypotheses.in.py").read_bytes()).output.decode()
    assert "append(distify.gather" not in out
    assert out.count("= distify.gather_list(") == 2


def test_a_per_batch_value_grown_into_an_array_is_reported_not_gathered() -> None:
    result = _convert("""\
        import numpy as np
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(torch.arange(10.), batch_size=3)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = np.array([])
        with torch.no_grad():
            for x in loader:
                loss = model(x.view(-1, 1)).mean()
                losses = np.append(losses, loss.item())
        print(losses.mean())
        """)
    assert "gather_for_metrics(loss.item())" not in result.output.decode()
    assert any("`losses` collects a per-batch value" in n.message for n in result.notes)


def test_lists_filled_by_an_eval_function_are_gathered_or_reported() -> None:
    result = _convert("""\
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(torch.arange(10.), batch_size=3)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        def predict(loader):
            predictions = []
            for x in loader:
                predictions.extend(model(x.view(-1, 1)).view(-1).tolist())
            return predictions
        with torch.no_grad():
            preds = predict(loader)
        print(len(preds))
        """)
    gathered = "gather_for_metrics(model(" in result.output.decode()
    reported = any("`predictions`" in n.message for n in result.notes)
    assert gathered or reported


def test_one_process_returns_the_same_objects() -> None:
    torch = pytest.importorskip("torch")
    import numpy as np

    from distify.runtime import _state
    from distify.runtime._collectives import gather_list, reduce

    _state.reset()
    try:
        for value in ([0.0, 1.0], np.zeros(3), {"a": 1}, [[0, 1]], torch.zeros(2)):
            assert reduce(value) is value
        items = ["a", torch.ones(1)]
        assert gather_list(items) is items
    finally:
        _state.reset()


PLANS = {fixture_name(path): Plan() for path in GOLDEN}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("metrics_tail")

    def elementwise():
        return run_torchrun(ELEMENTWISE, cwd=root, env=clean_env(PYTHONPATH=str(REPO)),
                            replicas=False, timeout=120)

    return run_side_by_side(root, TAIL, PLANS, also=elementwise)


def _evaluation_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("before training")
            or "labels seen in training" in line]


@pytest.mark.parametrize("name", sorted(PLANS))
def test_conversion_prints_the_original_metrics_on_one_process_and_on_two(runs, name) -> None:
    original, one, two = (runs[name, v] for v in ("original", "one", "two"))
    assert one.stdout == original.stdout  # world size 1: the same text, byte for byte
    expected = _evaluation_lines(original.stdout)
    assert expected and _evaluation_lines(two.stdout) == expected
    # only rank 0 printed, the same lines as the original (the trained weights differ)
    assert len(two.stdout.splitlines()) == len(original.stdout.splitlines())


def test_containers_are_summed_elementwise_and_lists_gathered_on_two_processes(runs) -> None:
    lines = [json.loads(line) for line in runs["also", ""].stdout.splitlines()]
    assert sorted(line["rank"] for line in lines) == [0, 1]
    first, second = sorted(lines, key=lambda line: line["rank"])
    assert {k: v for k, v in first.items() if k != "rank"} == \
        {k: v for k, v in second.items() if k != "rank"}  # every rank gets the same
    assert first["floats"] == [3.0, 1.0] and first["ints"] == [1, 2]
    assert first["grid"] == [[1, 0], [2, 2]] and first["array"] == [[1, 2], [4, 6]]
    assert first["array_dtype"] == "float32"
    assert first["dict"] == {"a": 1, "b": 3.0}
    assert first["defaultdict"] == [["even", 1], ["all", 4], ["odd", 1]]
    assert first["defaultdict_type"] == "defaultdict"
    assert first["counter"] == {"x": 3}
    assert first["mixed"] == [[1.0, 2.0], 4] and first["max"] == [1, 0]
    assert first["gathered"] == ["r0-0", "r1-0", "r1-1"]
    assert first["gathered_tensors"] == [[0], [1]]
    assert "differ in shape" in first["error"] and "rank 1" in first["error"]


def test_item_lists_still_filling_in_an_enclosing_loop_are_reported_not_gathered_twice() -> None:
    source = (TAIL / "bleu_hypotheses.in.py").read_text()
    lasting = source.replace("    references = list()  # references", "    # references") \
        .replace("validate(\"before training\")", "references = list()\nvalidate(\"before\")")
    assert lasting != source
    result = convert_source(lasting.encode(), "t.py")
    assert "gather_list" not in result.output.decode()
    assert any("`references` is not emptied right before this loop" in n.message
               for n in result.notes), [n.message for n in result.notes]


def test_a_list_made_anew_for_each_sentence_is_not_gathered() -> None:
    result = _convert("""\
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(torch.arange(10).view(5, 2), batch_size=2)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        hypotheses = []
        model.eval()
        for batch in loader:
            for row in batch.tolist():
                words = []
                for token in row:
                    words.append(str(token))
                hypotheses.append(" ".join(words))
        print(len(hypotheses))
        """)
    out = result.output.decode()
    assert "hypotheses = distify.gather_list(hypotheses)" in out
    assert "gather_list(words)" not in out and "gather_for_metrics" not in out


_METRIC_HELPER = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset


def corpus_score(references, hypotheses):
    hyp_len, matches = 0, 0
    for ref, hyp in zip(references, hypotheses):
        hyp_len += len(hyp)
        matches += sum(1 for a, b in zip(ref, hyp) if a == b)
    return matches / max(hyp_len, 1)


def evaluate(model, data):
    hypotheses, references = [], []
    with torch.no_grad():
        total = 0
        for x, y in data:
            total += x.shape[0]
            hypotheses.append(model(x).argmax(1).tolist())
            references.append(y.tolist())
    return corpus_score(references, hypotheses), total


loader = DataLoader(TensorDataset(torch.randn(40, 4), torch.randint(0, 3, (40,))), batch_size=8)
print(evaluate(torch.nn.Linear(4, 3), loader))
'''


def test_a_metric_helper_over_gathered_lists_is_not_a_loop_over_a_shard() -> None:
    """Its parameters are filled with lists at every call in the file, never a loader: its sums
    are over the gathered whole set, so neither reduced (that would count N times) nor reported
    as one shard's; the caller's parameter `data`, given a loader, still is one."""
    result = convert_source(_METRIC_HELPER.encode(), "train.py")
    output = result.output.decode()
    assert "hyp_len = distify.reduce" not in output and "matches = distify.reduce" not in output
    assert not [c for c in result.changes if "shard only" in c.message]
    assert "total = distify.reduce(total)" in output
    assert "hypotheses.append(distify.gather_for_metrics(" in output
