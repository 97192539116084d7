"""Data-dependent exits from training loops, decided alike on every process (issue 12 item 7).

Before/after cases of the rewrite, cases it must leave alone (values already equal on every
process), and cases it must report instead (no place where a collective is reached alike), then
two fixtures run for real (``tests/fixtures/stops/``):

- ``poly_regression``: pytorch/examples' regression, in small: ``get_batch()`` draws random
  batches, the weights are updated by hand, and ``if loss < 1e-3: break`` ends an endless
  ``for batch_idx in count(1)``;
- ``reinforce_corridor``: pytorch/examples' REINFORCE on a tiny corridor: each episode starts at
  a random place, and ``if running_reward > args.reward_threshold: break`` ends training;
- ``eval_when_close``: the MNIST example's layout, where ``test()`` (whose sums the conversion
  reduces over the processes) runs only once ``train()``'s last loss is under a threshold. Left
  as written, the processes whose loss is not under it skip the reduce and the others wait for
  them forever; the test (a "gate" to a collective) is decided on the processes' mean.

World size 1: the conversion prints, draws and saves exactly what the original does. Two
processes (torchrun, Gloo): each draws its own batches, both leave the loop at the same step
(the test is decided on the processes' mean), the job ends, the replicas end bit-identical, and
training is as good as one process's. ``tests/runtime_scripts/decisions.py`` checks the runtime's
``any_process``/``all_processes`` with ranks that disagree.

Set ``DISTIFY_UPDATE_GOLDEN=1`` to rewrite the golden files after an intended change.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from distify.convert.engine import convert_source
from distify.lint import lint_text
from tests.fixture_runs import Plan, run_side_by_side, tagged
from tests.helpers import FIXTURES, REPO, clean_env, result_line, run_torchrun

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

HERE = FIXTURES / "stops"
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))
NAMES = ["poly_regression", "reinforce_corridor"]
#: fixtures whose test leads to a collective rather than out of the loop
GATES = ["eval_when_close"]
PLANS = {**{name: Plan() for name in NAMES},
         "eval_when_close": Plan(two_args=("--batch-size", "8"))}
CHECKPOINTS = {"poly_regression": "fc.pt", "reinforce_corridor": "policy.pt",
               "eval_when_close": "best.pt"}

_HEAD = """\
import math
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
val_loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=8)
"""
#: one training step on a batch (x, y), at the indentation of a loop body
_STEP = """\
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _convert(body: str):
    return convert_source((_HEAD + textwrap.dedent(body)).encode(), "train.py")


def _loop(exit_lines: str, header: str = "for x, y in loader:") -> str:
    return f"{header}\n{_STEP}{textwrap.indent(textwrap.dedent(exit_lines), '    ')}"


# (before, after): the training loop as written, and the lines the conversion must contain
REWRITES = [
    pytest.param(_loop("if loss.item() < 0.01:\n    break\n"),
                 '    if distify.reduce(loss.item(), op="mean") < 0.01:\n        break\n',
                 id="loss-item-threshold"),
    pytest.param(_loop("if 0.01 > loss:\n    break\n"),
                 '    if 0.01 > distify.reduce(loss, op="mean"):\n', id="tensor-on-the-right"),
    pytest.param(_loop("if not math.isfinite(loss.item()):\n    print('diverged')\n"
                       "    sys.exit(1)\n"),
                 "    if distify.any_process(not math.isfinite(loss.item())):\n"
                 "        distify.print('diverged')\n        sys.exit(1)\n",
                 id="non-finite-loss-exit"),
    pytest.param(_loop("if loss.item() < 0.01 and epoch > 2:\n    break\n",
                       "for epoch, (x, y) in enumerate(loader):"),
                 "    if distify.any_process(loss.item() < 0.01 and epoch > 2):\n",
                 id="and-of-two-tests"),
    pytest.param(_loop("if math.isfinite(loss.item()):\n    pass\nelse:\n    break\n"),
                 "    if distify.all_processes(math.isfinite(loss.item())):\n",
                 id="exit-in-the-else-branch"),
    pytest.param("loss = torch.tensor(1.0)\n"
                 + _loop("", "while loss > 0.01:").replace("    loss =", "    x, y = next(it)\n"
                                                              "    loss =", 1),
                 'while distify.reduce(loss, op="mean") > 0.01:\n', id="while-loss-above"),
    pytest.param("steps = 0\n" + _loop("steps += 1\n", "while loss > 0.01 and steps < 10:"),
                 "while distify.all_processes(loss > 0.01 and steps < 10):\n",
                 id="while-and-test"),
    pytest.param("def train():\n" + textwrap.indent(_loop("if loss.item() < 0.01:\n"
                                                          "    return\n"), "    "),
                 '        if distify.reduce(loss.item(), op="mean") < 0.01:\n            return\n',
                 id="return-from-a-training-function"),
    pytest.param(_loop("if step % 10 == 0:\n    print(step)\n    if loss.item() < 0.01:\n"
                       "        break\n", "for step, (x, y) in enumerate(loader):"),
                 '        if distify.reduce(loss.item(), op="mean") < 0.01:\n',
                 id="under-a-step-counter-branch"),
    pytest.param("start = time.time()\n" + _loop("if time.time() - start > 3600:\n    break\n"),
                 '    if distify.reduce(time.time() - start, op="mean") > 3600:\n',
                 id="time-budget"),
    pytest.param("done = False\nfor epoch in range(10):\n" + textwrap.indent(
        _loop("if loss.item() < 0.01:\n    done = True\n    break\n"), "    ")
        + "    if done:\n        break\n",
        '        if distify.reduce(loss.item(), op="mean") < 0.01:\n'
        "            done = True\n            break\n    if done:\n        break\n",
        id="a-flag-set-by-a-decided-exit-stays"),
    pytest.param("def finish_episode(loss):\n    optimizer.zero_grad()\n    loss.backward()\n"
                 "    optimizer.step()\n\n\nrunning_reward = 10\nfor episode in range(1000):\n"
                 "    reward = play(model)\n"
                 "    running_reward = 0.05 * reward + 0.95 * running_reward\n"
                 "    finish_episode(model.loss)\n    if running_reward > 195:\n        break\n",
                 '    if distify.reduce(running_reward, op="mean") > 195:\n',
                 id="running-reward-the-backward-in-a-function"),
    pytest.param("""\
        def train():
            for x, y in loader:
                F.mse_loss(model(x), y).backward()
                optimizer.step()


        def score(batches):
            total = 0
            for x, y in batches:
                total += (model(x) - y).abs().sum().item()
            return total


        for epoch in range(100):
            train()
            if score(loader) < 1:
                break
        """, '    if distify.reduce(score(loader), op="mean") < 1:\n',
                 id="metric-of-a-function-that-does-not-reduce"),
    pytest.param("batches = [next(it) for _ in range(steps())]\n"
                 + _loop("if loss.item() < 0.01:\n    break\n", "for x, y in batches:"),
                 '    if distify.reduce(loss.item(), op="mean") < 0.01:\n',
                 id="per-process-batches-with-a-backward-every-step"),
    pytest.param(_loop("if not math.isfinite(loss.item()) or loss.item() > 1e6 or time.time() "
                       "> deadline:\n    break\n"),
                 "    if distify.any_process(\n            not math.isfinite(loss.item()) or "
                 "loss.item() > 1e6 or time.time() > deadline):\n",
                 id="a-long-test-wraps"),
]


@pytest.mark.parametrize("before, after", REWRITES)
def test_data_dependent_exits_are_decided_alike(before: str, after: str) -> None:
    result = _convert(before)
    out = result.output.decode()
    assert after in out, out
    assert [c.kind for c in result.changes].count("stop") == after.count("distify.") - \
        after.count("distify.print") - after.count("distify.backward")
    assert not [n for n in result.notes if n.kind == "divergence"]
    assert result.ready
    assert not [f for f in lint_text(out, "train.py", check_all=True) if f.code[3] == "2"]


NO_OPS = [
    pytest.param(_loop("if step >= 100:\n    break\n", "for step, (x, y) in enumerate(loader):"),
                 id="step-counter"),
    pytest.param("import argparse\nargs = argparse.ArgumentParser().parse_args()\n"
                 + _loop("if args.dry_run:\n    break\n"), id="dry-run-flag"),
    pytest.param("""\
        best, bad_epochs = float("inf"), 0
        for epoch in range(100):
            for x, y in loader:
                loss = F.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            val_loss = 0.0
            with torch.no_grad():
                for x, y in val_loader:
                    val_loss += F.mse_loss(model(x), y, reduction="sum").item()
            val_loss /= len(val_loader.dataset)
            if val_loss < best:
                best, bad_epochs = val_loss, 0
            else:
                bad_epochs += 1
            if bad_epochs >= 5 or val_loss < 1e-4:
                break
        """, id="patience-fed-by-a-reduced-validation-loss"),
    pytest.param("""\
        def train():
            for x, y in loader:
                F.mse_loss(model(x), y).backward()
                optimizer.step()


        @torch.no_grad()
        def evaluate(loader):
            correct = total = 0
            for x, y in loader:
                correct += (model(x) > 0).eq(y > 0).sum().item()
                total += y.size(0)
            return correct / total


        for epoch in range(100):
            train()
            if evaluate(val_loader) > 0.99:
                break
        """, id="metric-of-an-evaluation-function"),
    pytest.param(_loop("pass\n") + """\
with torch.no_grad():
    for x, y in val_loader:
        if F.mse_loss(model(x), y).item() > 10:
            break
""", id="exit-from-an-evaluation-loop"),
    pytest.param("""\
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            if loss.item() < 0.01:
                break
        """, id="a-loop-that-does-not-train"),
]


@pytest.mark.parametrize("source", NO_OPS)
def test_exits_already_alike_stay_as_they_are(source: str) -> None:
    result = _convert(source)
    assert not [c for c in result.changes if c.kind == "stop"], result.output.decode()
    assert not [n for n in result.notes if n.kind == "divergence"]


NOTES = [
    pytest.param(_loop("if loss.item() > 5:\n    print('large')\n    if step > 100:\n"
                       "        break\n", "for step, (x, y) in enumerate(loader):"),
                 "        if step > 100:", "only in a branch of `if loss.item() > 5:`",
                 id="under-a-branch-on-the-loss"),
    pytest.param(_loop("if loss.item() < 0.01:\n    break\n").replace(
        "    optimizer.zero_grad()\n",
        "    try:\n        check(loss)\n    except ValueError:\n        continue\n"
        "    optimizer.zero_grad()\n"),
        "    if loss.item() < 0.01:", "after a `continue` that only some processes",
        id="after-a-data-dependent-continue"),
    pytest.param("def run():\n    for epoch in range(10):\n"
                 + textwrap.indent(_loop(""), "        ")
                 + "        with torch.no_grad():\n            for x, y in val_loader:\n"
                 "                if F.mse_loss(model(x), y).item() < 0.01:\n"
                 "                    return epoch\n",
                 "                if F.mse_loss(model(x), y).item() < 0.01:",
                 "evaluation DataLoader's shards differ in length",
                 id="return-from-an-evaluation-loop"),
    pytest.param("batches = [next(it) for _ in range(steps())]\n"
                 + _loop("if loss.item() < 0.01:\n    break\n", "for x, y in batches:").replace(
                     "    loss.backward()\n", "    if loss.requires_grad:\n"
                     "        loss.backward()\n"),
                 "    if loss.item() < 0.01:", "it iterates `batches`, which may hold a different",
                 id="per-process-batches-without-a-backward-every-step"),
    pytest.param(_loop("try:\n    if loss.item() < 0.01:\n        break\nexcept ValueError:\n"
                       "    pass\n"),
                 "        if loss.item() < 0.01:", "a process that raises leaves early",
                 id="in-a-try-block"),
    pytest.param("it = iter(loader)\nwhile True:\n    try:\n        x, y = next(it)\n"
                 "    except StopIteration:\n        break\n"
                 + _STEP + "    if loss.item() < 0.01:\n        break\n",
                 "    if loss.item() < 0.01:", "can also be left by `break`",
                 id="loop-also-left-from-an-exception-handler"),
]


@pytest.mark.parametrize("source, line, why", NOTES)
def test_exits_no_collective_can_decide_are_reported(source: str, line: str, why: str) -> None:
    result = _convert(source)
    out = result.output.decode()
    assert not [c for c in result.changes if c.kind == "stop"], out
    lines = out.splitlines()
    notes = [n for n in result.notes if n.kind == "divergence"]
    assert [lines[n.line - 1] for n in notes] == [line]
    assert why in notes[0].message


# ------------------------------------------------------------------ tests that lead to a collective

_EVALUATE = """\
@torch.no_grad()
def evaluate(loader):
    correct = total = 0
    for x, y in loader:
        correct += (model(x) > 0).eq(y > 0).sum().item()
        total += y.size(0)
    return correct / total


"""

def _epochs(after_training: str, before: str = "") -> str:
    """``_EVALUATE``, then an epoch loop that trains on ``loader`` and then runs
    ``after_training`` (lines at the epoch loop's body indentation)."""
    return (_EVALUATE + before + "for epoch in range(10):\n" + textwrap.indent(_loop(""), "    ")
            + after_training)


GATES_DECIDED = [
    pytest.param(_epochs("    if loss.item() < 0.5:\n        print(epoch, evaluate(val_loader))\n"),
                 '    if distify.reduce(loss.item(), op="mean") < 0.5:\n', "evaluate(val_loader)",
                 id="evaluate-once-the-loss-is-low"),
    pytest.param(_epochs("    if not math.isfinite(loss.item()) or epoch == 9:\n"
                         "        accuracy = evaluate(val_loader)\n"),
                 "    if distify.any_process(not math.isfinite(loss.item()) or epoch == 9):\n",
                 "evaluate(val_loader)", id="any-process-for-a-compound-test"),
    pytest.param(_epochs("    if loss.item() < 0.5:\n        accuracy = validate()\n",
                         "def validate():\n    return evaluate(val_loader)\n\n\n"),
                 '    if distify.reduce(loss.item(), op="mean") < 0.5:\n', "validate()",
                 id="through-a-function-that-calls-the-evaluation"),
    pytest.param(_epochs("    if loss.item() > 2:\n        pass\n    else:\n"
                         "        accuracy = evaluate(val_loader)\n"),
                 '    if distify.reduce(loss.item(), op="mean") > 2:\n', "evaluate(val_loader)",
                 id="the-collective-in-the-else-branch"),
]


@pytest.mark.parametrize("before, after, collective", GATES_DECIDED)
def test_tests_that_lead_to_a_collective_are_decided_alike(before: str, after: str,
                                                          collective: str) -> None:
    result = _convert(before)
    out = result.output.decode()
    assert after in out, out
    stops = [c for c in result.changes if c.kind == "stop"]
    assert len(stops) == 1 and f"(to `{collective}`, which every process must join)" \
        in stops[0].message, [c.message for c in result.changes]
    assert out.splitlines()[stops[0].line - 1] + "\n" == after
    assert not [n for n in result.notes if n.kind == "divergence"]
    # the report keeps every change of the loop it rewrote (the backward, a print)
    assert "backward" in [c.kind for c in result.changes]
    assert convert_source(result.output).output == result.output


GATES_ALONE = [
    pytest.param(_epochs("    if epoch % 5 == 0:\n        print(evaluate(val_loader))\n"),
                 id="a-test-on-the-epoch"),
    pytest.param(_epochs("    accuracy = evaluate(val_loader)\n    if accuracy > best:\n"
                         "        best = accuracy\n        print(evaluate(val_loader))\n",
                         "best = 0\n"),
                 id="a-test-on-a-reduced-metric"),
    pytest.param(_loop("if loss.item() > 1:\n    print(loss.item())\n"),
                 id="no-collective-in-the-branch"),
]


@pytest.mark.parametrize("source", GATES_ALONE)
def test_tests_every_process_decides_alike_stay(source: str) -> None:
    result = _convert(source)
    assert not [c for c in result.changes if c.kind == "stop"], result.output.decode()
    assert not [n for n in result.notes if n.kind == "divergence"]


SITES = [
    pytest.param(_EVALUATE + _loop("if step % 10 == 0:\n    print(evaluate(val_loader))\n",
                                   "for step, (x, y) in enumerate(loader):").replace(
        "    optimizer.zero_grad()\n",
        "    try:\n        check(loss)\n    except ValueError:\n        continue\n"
        "    optimizer.zero_grad()\n"),
        "        print(evaluate(val_loader))",
        "after a `continue` that only some processes may take", id="after-a-per-process-continue"),
    pytest.param(_epochs("    try:\n        loss.item()\n    except RuntimeError:\n"
                         "        print(evaluate(val_loader))\n"),
                 "        print(evaluate(val_loader))", "in an exception handler",
                 id="in-an-exception-handler"),
]


@pytest.mark.parametrize("source, line, why", SITES)
def test_collectives_only_some_processes_reach_are_reported(source: str, line: str,
                                                             why: str) -> None:
    result = _convert(source)
    out = result.output.decode()
    assert not [c for c in result.changes if c.kind == "stop"], out
    notes = [n for n in result.notes if n.kind == "divergence"]
    assert [out.splitlines()[n.line - 1] for n in notes] == [line.replace("print", "distify.print")]
    assert why in notes[0].message and "hang" in notes[0].message
    assert "`evaluate(val_loader)` needs every process" in notes[0].message


def test_a_gate_no_collective_can_decide_is_reported() -> None:
    source = _EVALUATE + _loop("if loss.item() < 0.5:\n    print(evaluate(val_loader))\n",
                               "for x, y in loader:").replace(
        "    optimizer.zero_grad()\n",
        "    try:\n        check(loss)\n    except ValueError:\n        continue\n"
        "    optimizer.zero_grad()\n")
    result = _convert(source)
    out = result.output.decode()
    assert not [c for c in result.changes if c.kind == "stop"], out
    notes = [n for n in result.notes if n.kind == "divergence"]
    assert [out.splitlines()[n.line - 1] for n in notes] == ["    if loss.item() < 0.5:"]
    assert "leads to `evaluate(val_loader)`, which every process must join: the job may hang" \
        in notes[0].message
    assert "after a `continue`" in notes[0].message


# ------------------------------------------------------------------ the fixtures


def _fixture(name: str):
    source = HERE / f"{name}.in.py"
    return convert_source(source.read_bytes(), str(source))


@pytest.mark.parametrize("name", NAMES + GATES)
def test_golden_output_and_idempotence(name: str) -> None:
    output = _fixture(name).output
    if UPDATE:
        (HERE / f"{name}.out.py").write_bytes(output)
    assert output.decode() == (HERE / f"{name}.out.py").read_text()
    assert convert_source(output).output == output


@pytest.mark.parametrize("name, test", [
    ("poly_regression", 'if distify.reduce(loss, op="mean") < 1e-3:'),
    ("reinforce_corridor", 'if distify.reduce(running_reward, op="mean") > args.reward_threshold:'),
])
def test_the_report_says_the_stop_is_decided_on_the_mean(name: str, test: str) -> None:
    result = _fixture(name)
    assert not result.notes, [n.message for n in result.notes]
    stops = [c for c in result.changes if c.kind == "stop"]
    assert len(stops) == 1 and "mean" in stops[0].message
    assert result.output.decode().splitlines()[stops[0].line - 1].strip() == test


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("stops")

    def decisions():
        return run_torchrun(REPO / "tests" / "runtime_scripts" / "decisions.py", nproc=2,
                            cwd=root, env=clean_env(PYTHONPATH=str(REPO)), replicas=False)

    procs = run_side_by_side(root, HERE, PLANS, also=decisions)
    return root, procs, procs.pop(("also", ""))


@pytest.mark.parametrize("name", NAMES + GATES)
def test_one_process_is_bit_identical_to_the_original(runs, name: str) -> None:
    import torch

    from tests.helpers import compare_state, flatten

    root, procs, _ = runs
    original, converted = procs[name, "original"], procs[name, "one"]
    assert converted.stdout == original.stdout
    assert list(tagged(converted.stderr, "DRAW").values()) == \
        list(tagged(original.stderr, "DRAW").values())
    checkpoint = CHECKPOINTS[name]
    compare_state(flatten(torch.load(root / f"{name}-one" / checkpoint, weights_only=True)),
                  flatten(torch.load(root / f"{name}-original" / checkpoint, weights_only=True)),
                  exact=True)


@pytest.mark.parametrize("name", NAMES)
def test_two_processes_draw_apart_and_leave_the_loop_at_the_same_step(runs, name: str) -> None:
    _, procs, _ = runs
    two = procs[name, "two"]
    draws = list(tagged(two.stderr, "DRAW").values())
    assert len(draws) == 2 and len(draws[0]) == len(draws[1]) > 1
    assert all(a != b for a, b in zip(*draws))  # each process its own batches
    stops = [lines[0].split()[0] for lines in tagged(two.stderr, "STOP").values()]
    assert len(stops) == 2 and stops[0] == stops[1], stops
    assert int(stops[0]) == len(draws[0])  # one draw per step: the loop ended where they agreed


def test_the_fit_is_as_good_as_one_processs(runs) -> None:
    _, procs, _ = runs
    one = result_line(procs["poly_regression", "one"].stdout)
    two = result_line(procs["poly_regression", "two"].stdout)
    # the loss (each process's batch) fell under 1e-3 on average: the polynomial is found
    assert one["fit"] < 1e-3 and two["fit"] < 1e-3
    assert two["fit"] < 3 * one["fit"]


def test_the_corridor_is_solved_on_the_mean_of_the_running_rewards(runs) -> None:
    _, procs, _ = runs
    threshold = 0.8
    assert result_line(procs["reinforce_corridor", "one"].stdout)["running_reward"] > threshold
    two = procs["reinforce_corridor", "two"]
    rewards = [float(lines[0].split()[1]) for lines in tagged(two.stderr, "STOP").values()]
    assert len(rewards) == 2 and sum(rewards) / 2 > threshold
    assert rewards[0] != rewards[1]  # each process's own episodes, and yet they left together
    assert "Solved!" in two.stdout and two.stdout.count("RESULT") == 1


def test_a_gated_evaluation_runs_on_every_process_at_the_same_epochs(runs) -> None:
    _, procs, _ = runs
    one = procs["eval_when_close", "one"]
    two = procs["eval_when_close", "two"]  # it ended: no process waited alone in a reduce
    evals = list(tagged(two.stderr, "EVAL").values())
    assert len(evals) == 2 and evals[0] == evals[1] and len(evals[0]) >= 2, evals
    draws = list(tagged(two.stderr, "DRAW").values())
    assert len(draws) == 2 and all(a != b for a, b in zip(*draws))
    # the same global batch as one process: as good a model
    assert result_line(two.stdout)["best"] >= result_line(one.stdout)["best"] - 10
    assert two.stdout.count("RESULT") == 1


def test_the_runtime_decides_alike_when_the_ranks_disagree(runs) -> None:
    _, _, decisions = runs
    got = [json.loads(lines[0]) for lines in tagged(decisions.stderr, "DECISIONS").values()]
    assert len(got) == 2 and got[0] == got[1]
    assert got[0] == {"any_one": True, "any_none": False, "all_one": False, "all_every": True,
                      "mean": 0.5, "steps": 4}


def test_the_runtime_decides_a_single_process_by_the_test_itself() -> None:
    import torch

    import distify.runtime as distify

    assert distify.any_process(torch.tensor(2.0)) is True
    assert distify.any_process([]) is False
    assert distify.all_processes(1) is True and distify.all_processes(0.0) is False
    with pytest.raises(RuntimeError):  # what `if tensor:` raises, raised the same way
        distify.any_process(torch.ones(2))
