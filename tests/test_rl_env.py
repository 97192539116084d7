"""Reinforcement learning: the training data is what the environment produces (issue 12).

``tests/fixtures/rl/reinforce_env.in.py`` is pytorch/examples' REINFORCE in small: a corridor
environment with Gymnasium's interface, seeded once with ``env.reset(seed=args.seed)``, the
policy gradient taken in ``finish_episode()``, and a stop on the running reward. Converted, the
environment is seeded with the seed plus the process's rank, so the processes play their own
episodes; left as it was, both would play the same episodes with the same weights and the same
actions: two processes doing one's work.

World size 1: the conversion plays, prints and saves exactly what the original does. Two
processes (torchrun, Gloo): each starts its episodes from its own positions, both leave the
loop at the same episode, the job ends and the replicas end bit-identical.

Set ``DISTIFY_UPDATE_GOLDEN=1`` to rewrite the golden file after an intended change.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from distify.convert.engine import convert_source
from tests.fixture_runs import Plan, run_side_by_side, tagged
from tests.helpers import FIXTURES, result_line

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

HERE = FIXTURES / "rl"
NAME = "reinforce_env"
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))


def _convert(source: str):
    return convert_source(textwrap.dedent(source).encode(), "train.py")


def test_golden_output_idempotence_and_report() -> None:
    source = HERE / f"{NAME}.in.py"
    result = convert_source(source.read_bytes(), str(source))
    if UPDATE:
        (HERE / f"{NAME}.out.py").write_bytes(result.output)
    assert result.output.decode() == (HERE / f"{NAME}.out.py").read_text()
    assert convert_source(result.output).output == result.output
    seeded = [c for c in result.changes if c.kind == "random-env"]
    assert len(seeded) == 1 and "each process plays its own episodes" in seeded[0].message
    lines = result.output.decode().splitlines()
    assert lines[seeded[0].line - 1] == "env.reset(seed=args.seed + distify.rank())"
    assert not result.notes, [n.message for n in result.notes]


@pytest.mark.parametrize("before, after", [
    ("env.reset(seed=args.seed)", "env.reset(seed=args.seed + distify.rank())"),
    ("obs, info = envs.reset(seed=seed)", "obs, info = envs.reset(seed=seed + distify.rank())"),
    ("self.env.reset(seed=a if b else c)", "self.env.reset(seed=(a if b else c) + distify.rank())"),
    ("env.action_space.seed(args.seed)", "env.action_space.seed(args.seed + distify.rank())"),
    ("env.observation_space.seed(7)", "env.observation_space.seed(7 + distify.rank())"),
])
def test_an_environment_seeded_with_the_scripts_seed_is_seeded_per_process(before: str,
                                                                         after: str) -> None:
    out = _convert(f"import torch\nmodel = torch.nn.Linear(2, 2)\n{before}\n").output.decode()
    assert after in out.splitlines(), out


@pytest.mark.parametrize("line", [
    "env.reset()",  # the environment seeds itself from the operating system: per process
    "env.reset(seed=None)",
    "env.reset(seed=args.seed + distify.rank())",  # converted already
    "random.seed(args.seed)",  # not an environment's space
    "np.random.seed(args.seed)",
    "torch.manual_seed(args.seed)",  # the model's initialisation: the same everywhere
])
def test_other_resets_and_seeds_stay(line: str) -> None:
    source = f"import random\nimport numpy as np\nimport torch\nimport distify.runtime as " \
             f"distify\nmodel = torch.nn.Linear(2, 2)\n{line}\n" if "distify." in line else \
             f"import random\nimport numpy as np\nimport torch\nmodel = torch.nn.Linear(2, 2)\n" \
             f"{line}\n"
    result = _convert(source)
    assert not [c for c in result.changes if c.kind == "random-env"], result.output.decode()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    return root, run_side_by_side(root, HERE, {NAME: Plan()})


def test_one_process_plays_exactly_what_the_original_plays(runs) -> None:
    import torch

    from tests.helpers import compare_state, flatten

    root, procs = runs
    original, converted = procs[NAME, "original"], procs[NAME, "one"]
    assert converted.stdout == original.stdout
    assert list(tagged(converted.stderr, "DRAW").values()) == \
        list(tagged(original.stderr, "DRAW").values())
    compare_state(flatten(torch.load(root / f"{NAME}-one" / "policy.pt", weights_only=True)),
                  flatten(torch.load(root / f"{NAME}-original" / "policy.pt",
                                     weights_only=True)), exact=True)


def test_two_processes_play_their_own_episodes_and_stop_together(runs) -> None:
    _, procs = runs
    two = procs[NAME, "two"]  # it ended, and the replicas are bit-identical (run_torchrun)
    starts = list(tagged(two.stderr, "DRAW").values())
    assert len(starts) == 2 and len(starts[0]) == len(starts[1]) > 5
    # each process's own start positions (the same ones would mean the same episodes)
    assert starts[0] != starts[1]
    assert sum(a != b for a, b in zip(*starts)) > len(starts[0]) // 2
    stops = [lines[0].split()[0] for lines in tagged(two.stderr, "STOP").values()]
    assert len(stops) == 2 and stops[0] == stops[1]
    assert int(stops[0]) == len(starts[0])  # one start per episode: they left together
    assert result_line(two.stdout)["episodes"] < 400  # solved, not stopped by the cap
    assert two.stdout.count("RESULT") == 1
