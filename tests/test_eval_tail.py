"""Evaluation metrics of real scripts (issue 21 items 4-6): meters fed by a per-batch accuracy
helper, evaluation without its own ``torch.no_grad()``, and sums of a criterion's means.

Fixtures in tests/fixtures/eval_tail/: NAME.in.py converts to NAME.out.py exactly (update with
DISTIFY_UPDATE_GOLDEN=1 and review the diff). Each runs side by side (tests/fixture_runs.py):
the conversion on 1 process prints what the original prints, and on 2 processes (the same
per-process batch) the evaluation before training, with the same weights on every process,
prints the single-process metrics where the report says they are equal.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from tests.fixture_runs import Plan, check_golden, fixture_name, run_side_by_side, tagged
from tests.helpers import FIXTURES

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

EVAL_TAIL = FIXTURES / "eval_tail"
GOLDEN = sorted(EVAL_TAIL.glob("*.in.py"))


def _convert(name: str):
    return convert_source((EVAL_TAIL / f"{name}.in.py").read_bytes(), f"{name}.py")


@pytest.mark.parametrize("source", GOLDEN, ids=fixture_name)
def test_golden_output_and_converting_twice_changes_nothing(source: Path) -> None:
    check_golden(source)


def _said(result, kind: str = "reduce") -> list[str]:
    return [c.message for c in result.changes if c.kind == kind]


def test_the_accuracy_helper_is_not_gathered_and_the_meters_are_reduced() -> None:
    result = _convert("imagenet_meters")
    out = result.output.decode()
    assert "gather" not in out  # accuracy() returns one process's values for one batch
    assert out.count("distify.reduce_meters(losses, top1, top5)") == 2
    said = _said(result)
    assert any("is the whole data set's: no sample is repeated in evaluation" in m
               for m in said), said
    assert any("close to one process's value, not equal" in m for m in said), said
    shown = [m for m in said if "shown during the loop" in m]
    assert len(shown) == 2 and "per-batch values are this process's own" in shown[0]
    assert not result.notes, [n.message for n in result.notes]


def test_evaluation_called_under_the_callers_no_grad_or_after_eval_is_reduced() -> None:
    result = _convert("eval_without_no_grad")
    out = result.output.decode()
    for name in ("total_loss", "correct", "test_correct", "test_seen"):
        assert f"{name} = distify.reduce({name})" in out, name
    assert not [n for n in result.notes if "shard only" in n.message]


def test_a_mean_criterion_summed_is_reported_as_per_batch_means() -> None:
    said = {m.split("`")[1]: m for m in _said(_convert("criterion_mean_sum"))
            if m.startswith("`")}
    for name in ("test_loss", "batch_means"):  # criterion(...).sum().item(), F.cross_entropy
        assert "adds one mean per batch" in said[name]
        assert "per-sample" not in said[name]
        assert "when every batch is full on every process" in said[name]
    assert "adds per-sample values" in said["loss_sum"]  # reduction="sum"
    assert "equals the single-process value" in said["loss_sum"]



def test_a_change_inside_a_renamed_prints_arguments_is_reported() -> None:
    """`distify.reduce(len(test_loader))` is written inside `print(...)`'s arguments, which the
    rename to `distify.print` re-aligns: the report says so on its line (it once dropped every
    change inside re-aligned arguments, since they were rebuilt node by node)."""
    result = _convert("criterion_mean_sum")
    lines = result.output.decode().splitlines()
    reported = {item.line for item in result.changes if item.kind == "reduce"
                and "`len(test_loader)` counts this process's batches" in item.message}
    written = {number for number, line in enumerate(lines, 1)
               if "distify.reduce(len(test_loader))" in line}
    assert len(written) == 2 and reported == written, (reported, written)

# ---------------------------------------------------------------- real runs
PLANS = {"imagenet_meters": Plan(), "eval_without_no_grad": Plan(),
         "criterion_mean_sum": Plan()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    return run_side_by_side(tmp_path_factory.mktemp("eval_tail"), EVAL_TAIL, PLANS)


def _numbers(line: str) -> list[float]:
    return [float(n) for n in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?", line)]


def _same_metrics(mine: str, theirs: str) -> None:
    """The same line, its numbers equal up to the order of a float sum."""
    assert re.sub(r"-?\d+\.\d+(e[-+]\d+)?", "#", mine) == \
        re.sub(r"-?\d+\.\d+(e[-+]\d+)?", "#", theirs), (mine, theirs)
    assert _numbers(mine) == pytest.approx(_numbers(theirs), rel=1e-5, abs=1e-6), (mine, theirs)


def _lines(proc, start: str) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith(start)]


def test_one_process_prints_what_the_original_prints(runs) -> None:
    for name in PLANS:
        assert runs[name, "one"].stdout == runs[name, "original"].stdout, name


def test_meters_give_the_single_process_average_on_two_processes(runs) -> None:
    original, two = runs["imagenet_meters", "original"], runs["imagenet_meters", "two"]
    # the sanity validation before training: 75 samples, uneven shards of 38 and 37
    _same_metrics(_lines(two, " * ")[0], _lines(original, " * ")[0])
    assert len(_lines(two, " * ")) == len(_lines(original, " * ")) == 3  # rank 0 printed
    assert len(_lines(two, "best Acc@1")) == 1
    best = tagged(two.stderr, "BEST")
    assert len(best) == 2 and len({tuple(lines) for lines in best.values()}) == 1, best


def test_evaluation_without_no_grad_picks_one_checkpoint_on_every_rank(runs) -> None:
    original, two = (runs["eval_without_no_grad", v] for v in ("original", "two"))
    _same_metrics(_lines(two, "before training")[0], _lines(original, "before training")[0])
    best = tagged(two.stderr, "BEST")  # the global validation loss: the same choice
    assert len(best) == 2 and len({tuple(lines) for lines in best.values()}) == 1, best
    assert _lines(two, "test accuracy")[0].endswith(" over 40")  # every test sample, once


def test_sums_of_losses_equal_where_the_report_says_so(runs) -> None:
    original, two = (runs["criterion_mean_sum", v] for v in ("original", "two"))
    # 64 test samples, batches of 8: every batch is full at 1 and at 2 processes
    _same_metrics(_lines(two, "before training")[0], _lines(original, "before training")[0])
    assert len(two.stdout.splitlines()) == len(original.stdout.splitlines())


NESTED = '''def validate(val_loader, model, criterion, args):

    def run_validate(loader, base_progress=0):
        with torch.no_grad():
            for i, (images, target) in enumerate(loader):
                i = base_progress + i
                output = model(images)
                loss = criterion(output, target)
                acc1, acc5 = accuracy(output, target, topk=(1, 5))
                losses.update(loss.item(), images.size(0))
                top1.update(acc1[0], images.size(0))
                top5.update(acc5[0], images.size(0))
                if i % args.print_freq == 0:
                    progress.display(i + 1)

    losses = AverageMeter('Loss', ':.4e', Summary.AVERAGE)
    top1 = AverageMeter('Acc@1', ':6.2f', Summary.AVERAGE)
    top5 = AverageMeter('Acc@5', ':6.2f', Summary.AVERAGE)
    progress = ProgressMeter(len(val_loader), [losses, top1, top5], prefix='Test: ')
    model.eval()
    run_validate(val_loader)
    progress.display_summary()
    return top1.avg


'''


def test_meters_of_the_enclosing_function_are_reduced_in_a_nested_loop() -> None:
    """The newer ImageNet example: validate() binds the meters, run_validate() inside it
    updates them in its loop."""
    source = (EVAL_TAIL / "imagenet_meters.in.py").read_text()
    start, end = source.index("def validate("), source.index("def main():")
    result = convert_source((source[:start] + NESTED + source[end:]).encode(), "nested.py")
    out = result.output.decode()
    assert "gather" not in out
    begin = out.index("def run_validate(")
    nested = out[begin:out.index("    losses = AverageMeter('Loss'", begin)]
    assert nested.rstrip().endswith("distify.reduce_meters(losses, top1, top5)")
