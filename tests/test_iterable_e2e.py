"""An IterableDataset script converted end to end (issue 12 item 3).

``tests/fixtures/iterable/stream_classifier.in.py`` trains a classifier on a stream: a
``SyntheticStream(IterableDataset)`` whose ``__iter__`` returns a generator of samples, batched
by a DataLoader; another stream is evaluated before training and after every epoch (summed loss,
correct and seen counts), and a non-finite loss ends the job (``sys.exit(1)``, decided on every
process at once). The conversion prepares both loaders (the runtime shards a stream by position:
rank r keeps every world_size-th sample) and reduces the evaluation sums.

World size 1: the conversion prints and saves exactly what the original does. Two processes with
half the per-process batch (the same global batches): each process trains on its own samples, the
two together on exactly the single process's, and the evaluation counts each sample once, so the
metrics equal the single process's (counts exactly, losses within float rounding).

Set ``DISTIFY_UPDATE_GOLDEN=1`` to rewrite the golden file after an intended change.
"""

from __future__ import annotations

import ast
import os

import pytest

from distify.convert.engine import convert_source
from tests.fixture_runs import Plan, run_side_by_side, tagged
from tests.helpers import FIXTURES, compare_state, flatten, result_line

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

HERE = FIXTURES / "iterable"
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))
PLANS = {"stream_classifier": Plan(two_args=("--batch-size", "8"))}
EPOCHS, TRAIN_SAMPLES, TEST_SAMPLES = 3, 600, 203


def test_golden_output_idempotence_and_report() -> None:
    source = HERE / "stream_classifier.in.py"
    result = convert_source(source.read_bytes(), str(source))
    if UPDATE:
        (HERE / "stream_classifier.out.py").write_bytes(result.output)
    assert result.output.decode() == (HERE / "stream_classifier.out.py").read_text()
    assert convert_source(result.output).output == result.output
    assert not result.notes and result.ready
    kinds = [change.kind for change in result.changes]
    assert kinds.count("prepare-dataloader") == 2 and kinds.count("stop") == 1
    assert kinds.count("reduce") == 3  # test_loss, correct, seen


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("iterable")
    return root, run_side_by_side(root, HERE, PLANS)


def test_one_process_is_bit_identical_to_the_original(runs) -> None:
    import torch

    root, procs = runs
    one, original = procs["stream_classifier", "one"], procs["stream_classifier", "original"]
    assert one.stdout == original.stdout
    assert list(tagged(one.stderr, "DRAW").values()) == \
        list(tagged(original.stderr, "DRAW").values())
    name = "stream_classifier.pt"
    compare_state(flatten(torch.load(root / "stream_classifier-one" / name, weights_only=True)),
                  flatten(torch.load(root / "stream_classifier-original" / name,
                                     weights_only=True)),
                  exact=True)


def _samples(lines: list[str]) -> list[float]:
    return [value for line in lines for value in ast.literal_eval(line)]


def test_two_processes_share_out_the_stream(runs) -> None:
    _, procs = runs
    one = _samples(*tagged(procs["stream_classifier", "one"].stderr, "DRAW").values())
    assert len(one) == EPOCHS * TRAIN_SAMPLES
    ranks = [_samples(lines) for lines in
             tagged(procs["stream_classifier", "two"].stderr, "DRAW").values()]
    assert len(ranks) == 2 and len(ranks[0]) == len(ranks[1]) == len(one) // 2
    assert set(ranks[0]).isdisjoint(ranks[1])  # no sample trained on twice in an epoch
    assert sorted(ranks[0] + ranks[1]) == sorted(one)  # and together every sample


def test_two_processes_evaluate_as_one_process(runs) -> None:
    _, procs = runs
    one = result_line(procs["stream_classifier", "one"].stdout)["history"]
    two = result_line(procs["stream_classifier", "two"].stdout)["history"]
    assert len(two) == len(one) == EPOCHS + 1
    assert [seen for *_, seen in two] == [TEST_SAMPLES] * (EPOCHS + 1)  # each sample once
    assert two[0][1] == one[0][1]  # the untrained model: the same predictions, exactly
    for (loss_two, correct_two, _), (loss_one, correct_one, _) in zip(two, one):
        assert loss_two == pytest.approx(loss_one, rel=1e-5)
        assert abs(correct_two - correct_one) <= 1  # the same global batches, trained alike
