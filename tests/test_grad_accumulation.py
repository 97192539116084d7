"""Gradient accumulation in LLM-style loops: nested micro-steps (issue 21, item 16).

Fixtures in tests/fixtures/accumulation/: NAME.in.py converts to NAME.out.py exactly (update with
DISTIFY_UPDATE_GOLDEN=1 and review the diff). The 2-process run checks what a user checks by
hand: the loss printed at 2 processes with the total batch kept equals the 1-process run's
(same global batch: the ranks' micro-batches of a step are the single process's), replicas
identical, distinct data, rank 0 alone printing, world size 1 unchanged.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from tests.fixture_runs import Plan, check_golden, fixture_name, run_side_by_side, tagged
from tests.helpers import FIXTURES, simulated_rank

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

HERE = FIXTURES / "accumulation"
GOLDEN = sorted(HERE.glob("*.in.py"))


def _convert(name: str):
    return convert_source((HERE / f"{name}.in.py").read_bytes(), f"{name}.py")


@pytest.mark.parametrize("source", GOLDEN, ids=fixture_name)
def test_golden_output_and_converting_twice_changes_nothing(source: Path) -> None:
    check_golden(source)


def _said(result, kind: str) -> list[str]:
    return [c.message for c in result.changes if c.kind == kind]


def test_a_count_from_a_declared_total_is_shared_out_and_the_report_says_so() -> None:
    result = _convert("build_nanogpt_style")
    out = result.output.decode()
    assert "grad_accum_steps = distify.split_accumulation(grad_accum_steps)\n" in out
    assert "distify.sync_gradients(micro_step == grad_accum_steps - 1)" in out
    assert "tokens_processed = B * T * grad_accum_steps * distify.world_size()" in out
    # read on every step (an unguarded print): averaged right after the micro-steps, once
    assert out.count('loss_accum = distify.reduce(loss_accum, op="mean")') == 1
    assert "distify.reduce(loss_accum)" not in out  # no sum of per-step means
    said = " | ".join(_said(result, "accumulation"))
    assert "derived from a declared total batch (`total_batch_size // (B * T)`)" in said
    assert "still covers that total" in said and "N× the single-process" not in said


def test_a_comment_saying_larger_batch_marks_a_declared_total() -> None:
    result = _convert("nanogpt_style")
    out = result.output.decode()
    assert ("gradient_accumulation_steps = distify.split_accumulation("
            "gradient_accumulation_steps)") in out
    assert "tokens_per_iter = gradient_accumulation_steps * batch_size * block_size * " \
           "distify.world_size()" in out
    said = " | ".join(_said(result, "accumulation"))
    assert "its comment: `used to simulate larger batch sizes`" in said
    # the logged loss is one micro-batch's of this process: said, not claimed global
    assert "`lossf`: the last micro-batch's loss of this process" in said
    assert "distify.reduce(lossf" not in out


def test_a_plain_count_is_kept_and_the_report_says_the_step_covers_n_times_the_batch() -> None:
    result = _convert("constant_accum_steps")
    out = result.output.decode()
    assert "split_accumulation" not in out
    # read only under the log test (the same on every process): averaged there, not per step
    assert ('    if step % log_every == 0:\n'
            '        running_loss = distify.reduce(running_loss, op="mean")\n') in out
    said = " | ".join(_said(result, "accumulation"))
    assert ("`accum_steps` is the script's own count, kept on every process: on N processes an "
            "optimizer step covers N × `accum_steps` micro-batches") in said
    assert "`samples_seen` counts every process's share" in said


_LOOP = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    accum = 4
    batches = iter(loader)
    for step in range(3):
        total = 0.0
        for k in range(accum):
            x, y = next(batches)
            loss = nn.functional.mse_loss(model(x), y) / accum
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        spike = total > 1.0
        if spike:
            print(f"step {step}: loss {total:.4f}")
    """)


def test_a_sum_read_under_a_test_computed_in_the_step_is_averaged_before_the_test() -> None:
    # `spike` is computed from this process's loss: a collective under it could hang, so the
    # mean is taken right after the micro-steps, where every process is
    out = convert_source(_LOOP.encode(), "t.py").output.decode()
    assert ('        total += loss.item()\n'
            '    total = distify.reduce(total, op="mean")\n'
            '    optimizer.step()\n') in out
    assert out.count("distify.reduce(") == 1


def test_loops_that_are_not_micro_steps_are_left_alone() -> None:
    # no division by the count: not the accumulation idiom; a step inside: not micro-steps
    for old, new in (("/ accum\n", "\n"),
                     ("        total += loss.item()\n",
                      "        total += loss.item()\n        optimizer.step()\n")):
        src = _LOOP.replace(old, new)
        assert src != _LOOP
        out = convert_source(src.encode(), "t.py").output.decode()
        assert "sync_gradients" not in out and 'op="mean"' not in out, out


def test_two_optimizers_on_their_own_schedules_are_not_accumulation() -> None:
    out = (FIXTURES / "long_tail" / "gan_n_critic.out.py").read_text()
    assert "sync_gradients" not in out and "split_accumulation" not in out


def test_products_left_as_written_say_what_they_count() -> None:
    src = _LOOP.replace("accum = 4\n", "accum = 16 // 4\n").replace(
        "    spike = total > 1.0\n    if spike:\n",
        "    mfu = model_flops(4 * accum)\n    if step % 2 == 0:\n").replace(
        '{total:.4f}")', '{loss.item() * accum:.4f} "\n'
        '              f"{4 * accum / 0.5:.1f} samples/s")')
    src = src.replace("model = nn.Linear", "model_flops = float\nmodel = nn.Linear")
    result = convert_source(src.encode(), "t.py")
    out = result.output.decode()
    assert "distify.split_accumulation(accum)" in out and "* distify.world_size()" not in out
    said = {(c.line, c.message.split(":")[0]) for c in result.changes if c.kind == "accumulation"}
    mfu = out.splitlines().index("    mfu = model_flops(4 * accum)") + 1
    printed = next(i for i, line in enumerate(out.splitlines(), 1) if "distify.print(" in line)
    assert {(mfu, "`4 * accum` counts this process's share of an optimizer step (all "
                  "processes"),
            (printed, "`loss.item() * accum`"),
            (printed, "`4 * accum` counts this process's share of an optimizer step (all "
                      "processes")} <= said, said
    # the sum is read nowhere now: nothing to average
    assert 'op="mean"' not in out


def test_a_total_is_not_shared_out_where_every_process_trains_on_the_same_batches() -> None:
    # batches sliced by hand: the ranks' micro-steps would repeat each other, and sharing the
    # count out would shrink the step to 1/N of the distinct data; kept, and said so
    src = _LOOP.replace("accum = 4\n", "accum = 16 // 4\n").replace(
        "next(batches)", "loader.dataset[4 * k:4 * k + 4]").replace(
        "    spike = total > 1.0\n", "    tokens_seen = 4 * accum\n    spike = total > 1.0\n")
    result = convert_source(src.encode(), "t.py")
    out = result.output.decode()
    assert "split_accumulation(accum)\n" not in out and "world_size()" not in out
    assert "distify.sync_gradients(k == accum - 1)" in out
    said = " | ".join(_said(result, "accumulation"))
    assert "`accum` is kept: these micro-steps' batches are not known to differ" in said
    assert "counts" not in said
    assert any("every process trains on the same batches" in n.message for n in result.notes)


def test_the_batch_size_line_says_a_step_keeps_the_declared_total() -> None:
    result = _convert("build_nanogpt_style")
    assert result.batch_sizes == ("B (per micro-step; an optimizer step keeps the declared "
                                  "total, as `grad_accum_steps` is shared out)",)
    assert _convert("constant_accum_steps").batch_sizes == ("args.batch_size",)


@pytest.mark.parametrize(("steps", "rank", "world", "share"), [
    (8, 0, 2, 4), (8, 1, 4, 2), (5, 0, 1, 5)])
def test_split_accumulation_gives_each_process_its_share(monkeypatch, steps, rank, world,
                                                          share) -> None:
    from distify.runtime import _accumulation, _state

    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(rank, world))
    assert _accumulation.split_accumulation(steps) == share


def test_split_accumulation_stops_when_the_world_size_does_not_divide_the_count(
        monkeypatch) -> None:
    import distify.runtime as distify
    from distify.runtime import _state

    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(0, 4))
    with pytest.raises(distify.DistifyError, match=r"6 micro-steps per optimizer step do not "
                       r"split evenly over 4 processes.*divides 6"):
        distify.split_accumulation(6)
    with pytest.raises(distify.DistifyTypeError, match="int count"):
        distify.split_accumulation(2.0)


# ---------------------------------------------------------------- real runs
PLANS = {
    "build_nanogpt_style": Plan(),
    # the same global batch: 2 processes × 4 samples × 4 micro-steps
    "constant_accum_steps": Plan(two_args=("--batch-size", "4")),
    "nanogpt_style": Plan(),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_side_by_side(tmp_path_factory.mktemp("accumulation"), HERE, PLANS)


def _numbers(stdout: str, field: str) -> list[float]:
    return [float(m) for m in re.findall(rf"{field}:? ([0-9.]+)", stdout)]


def _without_timing(stdout: str) -> str:
    return re.sub(r"(time|tok/sec:) [0-9.]+", r"\1 -", stdout)


def test_world_size_1_prints_what_the_original_prints(runs) -> None:
    for name in PLANS:
        original, one = runs[name, "original"], runs[name, "one"]
        assert _without_timing(one.stdout) == _without_timing(original.stdout), name
        assert tagged(one.stderr, "DRAW") and \
            list(tagged(one.stderr, "DRAW").values()) == list(tagged(original.stderr,
                                                                     "DRAW").values()), name


@pytest.mark.parametrize("name", ["build_nanogpt_style", "constant_accum_steps"])
def test_two_processes_with_the_total_batch_kept_log_the_single_process_losses(runs,
                                                                             name) -> None:
    original, two = runs[name, "original"], runs[name, "two"]
    want, got = _numbers(original.stdout, "loss"), _numbers(two.stdout, "loss")
    assert len(want) >= 3 and got == pytest.approx(want, rel=1e-5, abs=1e-6), two.stdout
    # rank 0 alone printed: the same lines, the throughput counting both processes
    assert len(two.stdout.splitlines()) == len(original.stdout.splitlines())
    counter = "tokens" if name == "build_nanogpt_style" else "samples"
    assert _numbers(two.stdout, counter) == _numbers(original.stdout, counter)
    # every step's micro-batches, over both ranks, are the single process's
    steps_one = _by_step(original.stderr)
    ranks = tagged(two.stderr, "DRAW")
    assert len(ranks) == 2
    for step, drawn in steps_one.items():
        both = sorted(x for lines in ranks.values() for s, xs in _steps(lines) if s == step
                      for x in xs)
        assert both == sorted(drawn), (step, both, drawn)


def _steps(lines: list[str]):
    for line in lines:
        step, rest = line.split(" ", 1)
        yield int(step), [float(x) for x in rest.strip("[]").split(", ")]


def _by_step(stderr: str) -> dict[int, list[float]]:
    (lines,) = tagged(stderr, "DRAW").values()
    found: dict[int, list[float]] = {}
    for step, xs in _steps(lines):
        found.setdefault(step, []).extend(xs)
    return found


def test_the_count_is_shared_out_at_two_processes(runs) -> None:
    original, two = runs["build_nanogpt_style", "original"], runs["build_nanogpt_style", "two"]
    assert "=> calculated gradient accumulation steps: 4" in original.stdout
    assert "=> calculated gradient accumulation steps: 2" in two.stdout
    # nanoGPT style: random windows drawn per process, half the micro-steps each
    original, two = runs["nanogpt_style", "original"], runs["nanogpt_style", "two"]
    one_draws = next(iter(tagged(original.stderr, "DRAW").values()))
    rank_draws = list(tagged(two.stderr, "DRAW").values())
    assert len(rank_draws) == 2 and rank_draws[0] != rank_draws[1]
    # 7 steps of 4 micro-steps (+ the first batch) on one process, of 2 on each of two
    assert [len(d) for d in rank_draws] == [1 + (len(one_draws) - 1) // 2] * 2
    assert "tokens per iteration will be: 128" in original.stdout
    assert "tokens per iteration will be: 128" in two.stdout
    assert len(re.findall(r"^iter \d+: loss", two.stdout, re.M)) == \
        len(re.findall(r"^iter \d+: loss", original.stdout, re.M))
