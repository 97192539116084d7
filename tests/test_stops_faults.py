"""Per-process decisions that hang the job or fail to stop it (issue 26 items 1-3, issue 20 item 2).

Three faults of the data-dependent stops, each with a fixture in ``tests/fixtures/stops_faults/``
run for real (original and conversion at one process, the conversion at two under torchrun on
Gloo), and with the conversion *as it was before the fix* run at two processes too, so each test
shows the fault first:

- ``skip_bad_batches`` (item 1): ``if not math.isfinite(loss.item()): continue`` and a loss-spike
  skip (``if running is not None and loss.item() > args.spike * running: continue``) before the
  backward. Left as written, the process with the bad batch skips its backward and the other waits
  in the gradient all-reduce until ``DISTIFY_TIMEOUT``. Now each test is decided with
  ``distify.any_process``: every process skips the step when any would.
- ``sanity_exit`` (item 2): ``sanity_check(batch)``, called on every step, calls ``sys.exit(0)``
  when its batch holds a NaN. The analysis follows the call into the function, and the test in it
  is decided with ``distify.any_process`` (every call of the function in the file is in the
  training loop), so every process ends at the same step and the main process prints why.
- ``max_input_exit`` (item 3): ``if batch.abs().max() > args.max_abs: sys.exit()`` was decided on
  the processes' *mean* of the maximum: one process's 15 and the other's 1 average under the
  limit of 10, so two processes never stopped. Now the largest value of all processes is compared
  (``distify.reduce(..., op="max")``): the global batch's maximum.

The before-fix runs use ``DISTIFY_TIMEOUT=10``; the fixed runs use 20 s, and succeed only if no
collective waited that long (the runtime raises after the timeout, and the job then fails).

Set ``DISTIFY_UPDATE_GOLDEN=1`` to rewrite the golden files after an intended change.
"""

from __future__ import annotations

import os
import re
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from distify.convert.engine import convert_source
from distify.lint import lint_text
from tests.fixture_runs import tagged
from tests.helpers import FIXTURES, REPO, clean_env, run_python, run_torchrun

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

HERE = FIXTURES / "stops_faults"
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))
NAMES = ["skip_bad_batches", "sanity_exit", "max_input_exit"]
FIXED_TIMEOUT = 20
BEFORE_TIMEOUT = 10

_HEAD = """\
import math
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
val_loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)
"""


def _convert(body: str):
    return convert_source((_HEAD + textwrap.dedent(body)).encode(), "train.py")


def _step(before_backward: str = "", after_backward: str = "",
          header: str = "for x, y in loader:") -> str:
    """A training loop with ``before_backward`` lines between the loss and the backward."""
    return (f"{header}\n    loss = F.mse_loss(model(x), y)\n"
            + textwrap.indent(textwrap.dedent(before_backward), "    ")
            + "    optimizer.zero_grad()\n    loss.backward()\n"
            + textwrap.indent(textwrap.dedent(after_backward), "    ")
            + "    optimizer.step()\n")


def _stops(result) -> list[str]:
    return [c.message for c in result.changes if c.kind == "stop"]


def _notes(result) -> list:
    return [n for n in result.notes if n.kind == "divergence"]


def _dst203(code: str) -> list:
    return [f for f in lint_text(code, "train.py", check_all=True) if f.code == "DST203"]


# ------------------------------------------------------------------ item 1: a per-process continue

SKIPS = [
    pytest.param(_step("if not math.isfinite(loss.item()):\n    continue\n"),
                 "    if distify.any_process(not math.isfinite(loss.item())):\n        continue\n",
                 id="non-finite-loss-item"),
    pytest.param(_step("if not torch.isfinite(loss):\n    continue\n"),
                 "    if distify.any_process(not torch.isfinite(loss)):\n", id="torch-isfinite"),
    pytest.param("avg = 1.0\n" + _step("if loss.item() > 3 * avg:\n    print('spike')\n"
                                       "    continue\n", "avg = 0.9 * avg + 0.1 * loss.item()\n"),
                 "    if distify.any_process(loss.item() > 3 * avg):\n"
                 "        distify.print('spike')\n        continue\n",
                 id="loss-spike-never-on-the-mean"),
    pytest.param(_step("if math.isfinite(loss.item()):\n    pass\nelse:\n    continue\n"),
                 "    if distify.all_processes(math.isfinite(loss.item())):\n",
                 id="continue-in-the-else-branch"),
    pytest.param(_step("", "if not torch.isfinite(loss):\n    continue\n"),
                 "    if distify.any_process(not torch.isfinite(loss)):\n",
                 id="between-backward-and-step"),
    pytest.param("for epoch in range(3):\n" + textwrap.indent(
        _step("if torch.isnan(loss):\n    skipped += 1\n    continue\n",
              header="for i, (x, y) in enumerate(loader):"), "    "),
        "        if distify.any_process(torch.isnan(loss)):\n", id="nested-in-an-epoch-loop"),
]


@pytest.mark.parametrize("before, after", SKIPS)
def test_a_per_process_continue_before_the_optimizers_work_is_decided_alike(
        before: str, after: str) -> None:
    result = _convert(before)
    out = result.output.decode()
    assert after in out, out
    assert len(_stops(result)) == 1 and "skip" in _stops(result)[0]
    assert not _notes(result)
    assert convert_source(result.output).output == result.output  # idempotent
    assert not _dst203(out)  # check passes the conversion
    assert _dst203(out.replace("distify.any_process(", "(").replace(
        "distify.all_processes(", "("))  # ... and flags the test left as written


SKIPS_ALONE = [
    pytest.param(_step("", "", "for x, y in loader:") + "    if loss.item() > 10:\n"
                 "        print('large')\n        continue\n    print('ok')\n",
                 id="after-all-the-work-of-the-step"),
    pytest.param("for x, y in loader:\n    loss = F.mse_loss(model(x), y)\n"
                 "    if not math.isfinite(loss.item()):\n        continue\n"
                 "    print(loss.item())\n", id="a-loop-that-does-not-train"),
    pytest.param(_step("if args.skip_first and i == 0:\n    continue\n",
                       header="for i, (x, y) in enumerate(loader):"),
                 id="a-test-alike-on-every-process"),
]


@pytest.mark.parametrize("source", SKIPS_ALONE)
def test_a_continue_that_skips_nothing_shared_stays(source: str) -> None:
    result = _convert(source)
    assert not _stops(result), result.output.decode()
    assert not _notes(result)


def test_a_continue_no_collective_can_decide_is_reported() -> None:
    result = _convert(_step("if loss.item() > 5:\n    print('large')\n"
                            "    if torch.isnan(loss):\n        continue\n"))
    out = result.output.decode()
    assert not _stops(result), out
    notes = _notes(result)
    assert [out.splitlines()[n.line - 1] for n in notes] == ["        if torch.isnan(loss):"]
    assert "data-dependent skip" in notes[0].message
    assert "only in a branch of `if loss.item() > 5:`" in notes[0].message
    assert _dst203(out)


# ------------------------------------------------------------------ item 2: sys.exit in a helper

_SANITY = """\
def sanity_check(batch):
    if torch.isnan(batch).any():
        print("bad batch")
        sys.exit(0)


"""


def test_an_exit_in_a_function_the_loop_calls_is_decided_alike() -> None:
    result = _convert(_SANITY + _step().replace("    loss =", "    sanity_check(x)\n    loss =", 1))
    out = result.output.decode()
    assert "    if distify.any_process(torch.isnan(batch).any()):\n" \
        '        distify.print("bad batch")\n        sys.exit(0)\n' in out, out
    stops = [c for c in result.changes if c.kind == "stop"]
    assert len(stops) == 1 and "in `sanity_check`, which the training loop calls" \
        in stops[0].message and "every process ends when any of them would" in stops[0].message
    assert out.splitlines()[stops[0].line - 1].startswith("    if distify.any_process(")
    assert not _notes(result)
    assert convert_source(result.output).output == result.output
    assert not _dst203(out)
    original = out.replace("distify.any_process(torch.isnan(batch).any())",
                           "torch.isnan(batch).any()")
    findings = _dst203(original)
    assert [f.line for f in findings] == [original.splitlines().index(
        "    if torch.isnan(batch).any():") + 1]
    assert "in `sanity_check`, which a training loop calls" in findings[0].message


def test_a_function_that_always_exits_makes_its_callers_test_an_exit() -> None:
    source = "def die(msg):\n    print(msg)\n    sys.exit(1)\n\n\n" + _step(
        "if loss.item() > 1e4:\n    die('diverged')\n")
    result = _convert(source)
    out = result.output.decode()
    assert "    if distify.any_process(loss.item() > 1e4):\n        die('diverged')\n" in out, out
    assert not _notes(result)


def test_an_exit_in_a_function_also_called_elsewhere_is_reported() -> None:
    source = _SANITY + _step().replace("    loss =", "    sanity_check(x)\n    loss =", 1) + \
        "with torch.no_grad():\n    for x, y in val_loader:\n        sanity_check(x)\n"
    result = _convert(source)
    out = result.output.decode()
    assert not _stops(result) and "any_process" not in out, out
    notes = _notes(result)
    assert [out.splitlines()[n.line - 1] for n in notes] == ["    if torch.isnan(batch).any():"]
    assert "in `sanity_check`, which the training loop calls" in notes[0].message
    assert "also called where not every process may reach it" in notes[0].message
    assert _dst203(out)


def test_a_function_given_only_settings_is_left_alone() -> None:
    source = ("def check_config(cfg):\n    if cfg.lr <= 0:\n        sys.exit('bad lr')\n\n\n"
              + _step().replace("    loss =", "    check_config(args)\n    loss =", 1))
    result = _convert(source)
    assert not _stops(result) and not _notes(result), result.output.decode()


# ------------------------------------------------------------------ item 3: which operation decides

OPERATIONS = [
    pytest.param(_step("if x.abs().max() > 10:\n    sys.exit()\n"),
                 '    if distify.reduce(x.abs().max(), op="max") > 10:\n', "largest",
                 id="max-above-a-limit-exits"),
    pytest.param(_step("if x.min().item() < -10:\n    break\n"),
                 '    if distify.reduce(x.min().item(), op="min") < -10:\n', "smallest",
                 id="min-below-a-limit-breaks"),
    pytest.param(_step("if torch.amax(x) > 10:\n    break\n"),
                 '    if distify.reduce(torch.amax(x), op="max") > 10:\n', "largest",
                 id="torch-amax"),
    pytest.param(_step("if loss.item() > 1e4:\n    print('diverged')\n    sys.exit(1)\n"),
                 "    if distify.any_process(loss.item() > 1e4):\n", "any_process",
                 id="a-per-batch-guard-that-ends-the-process-is-never-on-the-mean"),
    pytest.param(_step("", "", "for x, y in loader:") + "    if loss.item() < 1e-3:\n"
                 "        break\n",
                 '    if distify.reduce(loss.item(), op="mean") < 1e-3:\n', "mean of",
                 id="a-loss-goal-that-ends-the-loop-is-on-the-mean"),
]


@pytest.mark.parametrize("before, after, how", OPERATIONS)
def test_each_test_is_decided_by_the_operation_that_keeps_its_meaning(
        before: str, after: str, how: str) -> None:
    result = _convert(before)
    out = result.output.decode()
    assert after in out, out
    assert len(_stops(result)) == 1 and how in _stops(result)[0], _stops(result)
    assert not _notes(result)
    assert not _dst203(out)


def test_the_report_says_what_is_decided_and_how() -> None:
    result = _convert(_step("if x.abs().max() > 10:\n    sys.exit()\n"))
    (message,) = _stops(result)
    assert message.startswith("`x.abs().max() > 10` is decided on the largest `x.abs().max()` "
                              "of all processes (the global batch's maximum: the test holds as "
                              "soon as it would on any process's batch)"), message
    result = _convert(_step("", "", "for x, y in loader:") + "    if loss.item() < 1e-3:\n"
                      "        break\n")
    (message,) = _stops(result)
    assert "on the mean of `loss.item()` over all processes (the global batch's value" in message


# ------------------------------------------------------------------ the fixtures, run


def _fixture(name: str):
    source = HERE / f"{name}.in.py"
    return convert_source(source.read_bytes(), str(source))


@pytest.mark.parametrize("name", NAMES)
def test_golden_output_and_idempotence(name: str) -> None:
    result = _fixture(name)
    output = result.output
    if UPDATE:
        (HERE / f"{name}.out.py").write_bytes(output)
    assert output.decode() == (HERE / f"{name}.out.py").read_text()
    assert convert_source(output).output == output
    assert not result.notes, [n.message for n in result.notes]
    assert result.ready
    assert not [f for f in lint_text(output.decode(), "train.py", check_all=True)
                if f.code.startswith("DST2")]


def _before_the_fix(converted: str) -> str:
    """The conversion as distify wrote it before issue 26: ``continue`` tests and tests in
    called functions left as written, a maximum decided on the mean."""
    undecided = re.sub(r"\bif distify\.any_process\((.*)\):\n", r"if \1:\n", converted)
    return undecided.replace('op="max"', 'op="mean"')


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("stops_faults")
    jobs = {}
    for name in NAMES:
        converted = (HERE / f"{name}.out.py").read_text()
        sources = {"original": (HERE / f"{name}.in.py").read_text(), "one": converted,
                   "two": converted, "before": _before_the_fix(converted)}
        assert sources["before"] != converted
        for variant, text in sources.items():
            folder = root / f"{name}-{variant}"
            folder.mkdir()
            (folder / "train.py").write_text(text)
            jobs[name, variant] = folder

    def run(key):
        name, variant = key
        folder = jobs[key]
        script = folder / "train.py"
        if variant in ("original", "one"):
            return run_python(script, cwd=folder, env=clean_env(PYTHONPATH=str(REPO))), 0.0
        timeout = FIXED_TIMEOUT if variant == "two" else BEFORE_TIMEOUT
        env = clean_env(PYTHONPATH=str(REPO), SHOW_DRAWS="1", DISTIFY_TIMEOUT=str(timeout))
        start = time.monotonic()
        proc = run_torchrun(script, nproc=2, cwd=folder, env=env, timeout=240,
                            check=variant == "two",
                            replicas=variant == "two",
                            distinct_data=variant == "two")
        return proc, time.monotonic() - start

    # the torchrun jobs first: they take longest
    order = sorted(jobs, key=lambda key: key[1] not in ("two", "before"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {key: pool.submit(run, key) for key in order}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize("name", NAMES)
def test_one_process_prints_what_the_original_prints(runs, name: str) -> None:
    original, converted = runs[name, "original"][0], runs[name, "one"][0]
    assert converted.stdout == original.stdout
    assert converted.stdout


def test_skip_before_the_fix_hangs_until_the_timeout(runs) -> None:
    proc, elapsed = runs["skip_bad_batches", "before"]
    assert proc.returncode != 0, proc.stdout
    # a process waited in the all-reduce for the others until the timeout; or, sooner, the
    # ranks' unpaired backwards met another collective (the replica check's, issue 20 item 1)
    # and Gloo or the runtime stopped the job: loud either way, never a finished job
    assert elapsed >= BEFORE_TIMEOUT or any(
        sign in proc.stderr for sign in ("mismatch", "DistifyError", "differ", "Connection reset",
                                         "gave up")), proc.stderr[-3000:]
    assert "RESULT" not in proc.stdout


def test_skips_are_taken_together_and_the_replicas_stay_identical(runs) -> None:
    proc, _ = runs["skip_bad_batches", "two"]  # ended, replicas checked bit-identical
    counts = [lines[-1] for lines in tagged(proc.stderr, "STEPS").values()]
    assert len(counts) == 2 and counts[0] == counts[1], counts  # same steps, same skips
    steps, skipped = map(int, counts[0].split())
    assert steps > 0 and skipped >= 2  # the bad batch and the spike, every epoch
    assert "loss is not finite, batch skipped" in proc.stdout
    assert "loss spike, batch skipped" in proc.stdout
    assert proc.stdout.count("RESULT") == 1


def test_exit_in_a_helper_before_the_fix_hangs_until_the_timeout(runs) -> None:
    proc, elapsed = runs["sanity_exit", "before"]
    assert proc.returncode != 0, proc.stdout
    assert elapsed >= BEFORE_TIMEOUT


def test_exit_in_a_helper_ends_every_process_at_the_same_step_and_says_why(runs) -> None:
    proc, _ = runs["sanity_exit", "two"]
    steps = list(tagged(proc.stderr, "STEP").values())
    assert len(steps) == 2 and steps[0] == steps[1], steps  # both stopped after the same step
    assert "bad batch: NaN in the inputs, stopping" in proc.stdout
    assert "finished all epochs" not in proc.stdout
    one = runs["sanity_exit", "one"][0]
    assert "bad batch: NaN in the inputs, stopping" in one.stdout


def test_a_max_decided_on_the_mean_never_stopped_two_processes(runs) -> None:
    proc, _ = runs["max_input_exit", "before"]
    assert proc.returncode == 0
    assert "input out of range" not in proc.stdout and "trained all epochs" in proc.stdout
    assert not tagged(proc.stderr, "STOP")


def test_a_max_decided_on_the_largest_value_stops_two_processes_together(runs) -> None:
    proc, _ = runs["max_input_exit", "two"]
    stops = [lines for lines in tagged(proc.stderr, "STOP").values()]
    assert len(stops) == 2 and stops[0] == stops[1], stops
    assert "input out of range, stopping" in proc.stdout
    assert "trained all epochs" not in proc.stdout
    one = runs["max_input_exit", "one"][0]
    assert "input out of range, stopping" in one.stdout and "trained all epochs" not in one.stdout


def test_a_process_that_may_leave_alone_still_says_why() -> None:
    source = _SANITY + _step().replace("    loss =", "    sanity_check(x)\n    loss =", 1) + \
        "with torch.no_grad():\n    for x, y in val_loader:\n        sanity_check(x)\n"
    result = _convert(source)
    out = result.output.decode()
    # reported, not decided: the print before the exit stays on every process
    assert '        print("bad batch")\n        sys.exit(0)\n' in out, out
    assert all(out.splitlines()[c.line - 1].strip() != 'print("bad batch")'
               for c in result.changes)
    assert convert_source(result.output).output == result.output
    result = _convert(_step("if loss.item() > 5:\n    if not math.isfinite(loss.item()):\n"
                            "        print('diverged, stopping')\n        sys.exit(1)\n"))
    out = result.output.decode()
    assert "            print('diverged, stopping')\n            sys.exit(1)\n" in out, out
    assert len(_notes(result)) == 1


_CHAIN = _SANITY + """\
def train_step(x, y):
    sanity_check(x)
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


for x, y in loader:
    train_step(x, y)
"""


def test_an_exit_reached_through_two_functions_is_decided_when_each_is_called_in_step() -> None:
    result = _convert(_CHAIN)
    out = result.output.decode()
    assert "    if distify.any_process(torch.isnan(batch).any()):\n" in out, out
    assert not _notes(result)
    # one more call of the function in between, outside the training loop: not every process
    # may reach it there, so the test is reported instead
    result = _convert(_CHAIN + "if torch.rand(1).item() > 0.5:\n    train_step(x, y)\n")
    out = result.output.decode()
    assert "any_process" not in out, out
    notes = _notes(result)
    assert len(notes) == 1 and "`train_step` is also called where not every process" \
        in notes[0].message


def test_an_exit_in_a_function_defined_below_the_loop_is_decided_too() -> None:
    source = ("def main():\n" + textwrap.indent(
        _step().replace("    loss =", "    sanity_check(x)\n    loss =", 1), "    ")
        + "\n\n" + _SANITY + "main()\n")
    result = _convert(source)
    out = result.output.decode()
    assert "    if distify.any_process(torch.isnan(batch).any()):\n" in out, out
    stops = [c for c in result.changes if c.kind == "stop"]
    assert len(stops) == 1 and out.splitlines()[stops[0].line - 1] == \
        "    if distify.any_process(torch.isnan(batch).any()):"
    assert not _notes(result)
    assert not _dst203(out)
