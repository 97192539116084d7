"""Batches and noise a script draws itself are drawn per process (issue 12 items 1 and 6).

Fixtures (``tests/fixtures/random_batches/``): ``char_gpt`` is nanoGPT in small (``get_batch``
draws random windows with ``torch.randint``, ``estimate_loss`` averages random-batch losses,
the best validation loss is checkpointed); ``tiny_gan`` draws its latent noise in the training
loop over a DataLoader and a ``fixed_noise`` before it. Both seed themselves, so without the
rewrite every rank would draw alike. With ``SHOW_DRAWS=1`` they write what each process drew
(tagged with its pid) to stderr.

Set ``DISTIFY_UPDATE_GOLDEN=1`` to rewrite the golden files after an intended change.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from distify.convert.engine import convert_source  # noqa: E402
from tests.helpers import (  # noqa: E402
    FIXTURES,
    REPO,
    clean_env,
    compare_state,
    flatten,
    result_line,
    run_python,
    run_torchrun,
    simulated_rank,
)

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

HERE = FIXTURES / "random_batches"
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))
NAMES = ["char_gpt", "tiny_gan"]
CHECKPOINTS = {"char_gpt": "ckpt.pt", "tiny_gan": "gan.pt"}


def _convert(name: str):
    source = HERE / f"{name}.in.py"
    return convert_source(source.read_bytes(), str(source))


@pytest.mark.parametrize("name", NAMES)
def test_golden_output_and_idempotence(name: str) -> None:
    output = _convert(name).output
    if UPDATE:
        (HERE / f"{name}.out.py").write_bytes(output)
    assert output.decode() == (HERE / f"{name}.out.py").read_text()
    assert convert_source(output).output == output


def test_the_report_says_what_was_done_and_drops_the_data_note() -> None:
    result = _convert("char_gpt")
    assert not result.notes, [n.message for n in result.notes]
    kinds = {c.kind: c.message for c in result.changes}
    assert "batches drawn per process" in kinds["random-batches"]
    assert 'op="mean"' in kinds["reduce"]
    gan = _convert("tiny_gan")
    noise = [c for c in gan.changes if c.kind == "random-noise"]
    assert len(noise) == 1 and noise[0].line == 36  # not fixed_noise, not the data


def _convert_text(src: str):
    return convert_source(src.encode())


_LOOP = """
model = nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    x = get_batch()
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("draw, want", [
    ("ix = np.random.randint(0, 90, size=4)", "ix = distify.numpy_random().randint(0, 90, size=4)"),
    ("ix = random.sample(range(90), 4)", "ix = distify.python_random().sample(range(90), 4)"),
    ("ix = torch.randperm(90)[:4]",
     "ix = torch.randperm(90, generator=distify.data_generator())[:4]"),
], ids=["numpy", "random", "randperm"])
def test_other_draws_in_a_batch_function(draw: str, want: str) -> None:
    src = ("import random\nimport numpy as np\nimport torch\nimport torch.nn as nn\n"
           "data = torch.randn(100, 4)\n\n\ndef get_batch():\n"
           f"    {draw}\n    return data[ix]\n" + _LOOP)
    result = _convert_text(src)
    out = result.output.decode()
    assert want in out, out
    assert not [n for n in result.notes if n.kind == "data"]
    assert convert_source(result.output).output == result.output


def test_a_loop_fed_otherwise_keeps_its_note() -> None:
    src = ("import torch\nimport torch.nn as nn\ndata = torch.randn(100, 4)\n\n\n"
           "def get_batch():\n    return data[:8]\n" + _LOOP)
    result = _convert_text(src)
    assert "data_generator" not in result.output.decode()
    assert [n.kind for n in result.notes] == ["data"]


def test_draws_outside_training_loops_and_in_branch_tests_stay() -> None:
    src = ("import torch\nimport torch.nn as nn\n"
           "w = torch.randn(4, 4)\n" + _LOOP.replace(
               "    x = get_batch()\n",
               "    x = torch.rand(8, 4)\n    if torch.rand(1) < 0.5:\n        x = -x\n")
           + "with torch.no_grad():\n    for _ in range(3):\n        z = torch.randn(2, 4)\n")
    out = _convert_text(src).output.decode()
    # not a per-process draw; the file seeds nothing, so every process draws the main one's
    assert "w = torch.randn(4, 4, generator=distify.shared_generator())\n" in out
    assert "x = torch.rand(8, 4, generator=distify.data_generator())" in out
    assert "if torch.rand(1) < 0.5:" in out
    assert "z = torch.randn(2, 4)\n" in out


# ------------------------------------------------------------------ running them


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("random_batches")
    folders = {}
    for name in NAMES:
        for variant, suffix in (("original", "in"), ("converted", "out")):
            folder = folders[name, variant] = root / f"{name}-{variant}"
            folder.mkdir()
            (folder / "train.py").write_bytes((HERE / f"{name}.{suffix}.py").read_bytes())
    return folders


def _env(**extra: str) -> dict:
    return clean_env(PYTHONPATH=str(REPO), **extra)


@pytest.mark.parametrize("name", NAMES)
def test_one_process_is_bit_identical_to_the_original(runs, name: str) -> None:
    original, converted = runs[name, "original"], runs[name, "converted"]
    want = run_python(original / "train.py", cwd=original, env=_env(SHOW_DRAWS="1"))
    got = run_python(converted / "train.py", cwd=converted, env=_env(SHOW_DRAWS="1"))
    assert got.stdout == want.stdout
    assert _draws(got.stderr, "") == _draws(want.stderr, "")  # the same draws, in order
    checkpoint = CHECKPOINTS[name]
    compare_state(flatten(torch.load(converted / checkpoint, weights_only=True)),
                  flatten(torch.load(original / checkpoint, weights_only=True)), exact=True)


def _draws(stderr: str, kind: str) -> dict[str, list[str]]:
    """What each process (by pid) drew: ``{pid: [line, ...]}``, ``kind`` the line's tag
    (``""``: all tags)."""
    drawn: dict[str, list[str]] = {}
    for line in stderr.splitlines():
        match = re.match(r"(DRAW|NOISE|EVAL|FIXED) (\d+) (.*)", line)
        if match and (not kind or match[1] == kind):
            drawn.setdefault(match[2] if kind else "all", []).append(f"{match[1]} {match[3]}")
    return drawn


def test_two_processes_draw_their_own_batches_and_agree_on_the_evaluation(runs) -> None:
    folder = runs["char_gpt", "converted"]
    proc = run_torchrun(folder / "train.py", nproc=2, cwd=folder, env=_env(SHOW_DRAWS="1"),
                        replicas=True, distinct_data=True, timeout=240)
    draws = _draws(proc.stderr, "DRAW")
    assert len(draws) == 2, proc.stderr[-3000:]
    first, second = draws.values()
    assert len(first) == len(second)
    assert all(a != b for a, b in zip(first, second)), (first[:3], second[:3])
    evals = [json.loads(lines[0][len("EVAL "):]) for lines in _draws(proc.stderr,
                                                                      "EVAL").values()]
    assert len(evals) == 2 and evals[0] == evals[1]
    assert [step for step, *_ in evals[0]] == [0, 10, 20, 30]
    result = result_line(proc.stdout)
    assert result["history"] == evals[0]
    saved = torch.load(folder / "ckpt.pt", weights_only=True)
    assert saved["best_val_loss"] == result["best_val_loss"]


def test_two_processes_draw_their_own_noise_and_keep_the_fixed_noise(runs) -> None:
    folder = runs["tiny_gan", "converted"]
    proc = run_torchrun(folder / "train.py", nproc=2, cwd=folder, env=_env(SHOW_DRAWS="1"),
                        replicas=True, timeout=240)
    noise = list(_draws(proc.stderr, "NOISE").values())
    assert len(noise) == 2 and len(noise[0]) == len(noise[1]) > 0
    assert all(a != b for a, b in zip(*noise))
    fixed = list(_draws(proc.stderr, "FIXED").values())  # drawn before the loop: alike
    assert len(fixed) == 2 and fixed[0] == fixed[1]


# ------------------------------------------------------------------ the runtime's generators


def _as_rank(monkeypatch, rank: int, world_size: int = 2):
    from distify.runtime import _draws, _state

    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(rank, world_size))
    return _draws


def test_one_process_draws_from_the_global_generators() -> None:
    import random

    import distify.runtime as distify

    assert distify.data_generator() is None and distify.data_generator("cpu") is None
    assert distify.python_random() is random
    np = pytest.importorskip("numpy")
    assert distify.numpy_random() is np.random


def test_each_rank_draws_its_own_and_leaves_the_global_generators_alone(monkeypatch) -> None:
    import random

    np = pytest.importorskip("numpy")
    drawn = {}
    for rank in (0, 1):
        draws = _as_rank(monkeypatch, rank)
        torch.manual_seed(3)
        random.seed(3)
        np.random.seed(3)
        generator = draws.data_generator()
        assert draws.data_generator("cpu") is generator  # one per device, kept
        drawn[rank] = (torch.randint(1000, (8,), generator=generator).tolist(),
                       draws.numpy_random().randint(1000, size=8).tolist(),
                       draws.python_random().sample(range(1000), 8))
        # the global generators did not move: the model's initialisation stays alike
        torch.manual_seed(3)
        before = torch.rand(2)
        torch.manual_seed(3)
        draws.data_generator()
        torch.randint(1000, (8,), generator=draws.data_generator())
        assert torch.equal(torch.rand(2), before)
        # seeding torch with another seed starts this rank's draws anew, as the original's
        torch.manual_seed(4)
        assert torch.randint(1000, (8,), generator=draws.data_generator()).tolist() \
            != drawn[rank][0]
        torch.manual_seed(3)
        assert torch.randint(1000, (8,), generator=draws.data_generator()).tolist() \
            == drawn[rank][0]
    for a, b in zip(drawn[0], drawn[1]):
        assert a != b
