"""End to end: run each training fixture and its conversion, and compare what they compute.

- world size 1, plain ``python``: the conversion prints exactly what the original prints and
  saves a checkpoint with the same keys and the same values;
- world size 2 under ``torchrun`` (Gloo, CPU) with half the per-process batch: the same global
  batches, so the results match the original within float tolerance, evaluation counts exactly,
  and only one process prints and writes; the ranks train on different batches and end with
  bit-identical parameters.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.helpers import (  # noqa: E402
    FIXTURES,
    REPO,
    clean_env,
    flatten,
    result_line,
    run_python,
    run_torchrun,
)

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

CONVERT = FIXTURES / "convert"

# fixture → (arguments with the batch size as {bs}, batch size, checkpoint written)
CASES = {
    "mnist_style": (["--batch-size", "{bs}", "--epochs", "2", "--save-model"], 32,
                    "synthetic_cnn.pt"),
    "flat_script": (["{bs}"], 32, "flat.pt"),
    "trainer_class": (["--batch-size", "{bs}", "--epochs", "2"], 32, "trainer.pt"),
}


def _args(name: str, batch: int) -> list[str]:
    return [a.replace("{bs}", str(batch)) for a in CASES[name][0]]


def _prepare(tmp: Path, name: str, variant: str) -> Path:
    folder = tmp / variant
    folder.mkdir()
    suffix = "in" if variant == "original" else "out"
    shutil.copy(CONVERT / f"{name}.{suffix}.py", folder / "train.py")
    return folder


def _env() -> dict:
    return clean_env(PYTHONPATH=str(REPO))


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> dict[str, tuple[str, dict]]:
    """Each original fixture run once with plain python: its stdout and checkpoint."""
    runs = {}
    for name, (_, batch, ckpt) in CASES.items():
        folder = _prepare(tmp_path_factory.mktemp(name), name, "original")
        proc = run_python(folder / "train.py", *_args(name, batch), cwd=folder, env=_env())
        runs[name] = (proc.stdout, flatten(torch.load(folder / ckpt)))
    return runs


@pytest.mark.parametrize("name", sorted(CASES))
def test_world_size_one_is_exactly_the_original(name, originals, tmp_path) -> None:
    _, batch, ckpt = CASES[name]
    folder = _prepare(tmp_path, name, "converted")
    proc = run_python(folder / "train.py", *_args(name, batch), cwd=folder, env=_env())
    stdout, state = originals[name]
    assert proc.stdout == stdout
    converted = flatten(torch.load(folder / ckpt))
    assert converted.keys() == state.keys()
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(converted[key], value), key
        else:
            assert converted[key] == value, key
    assert sorted(p.name for p in folder.iterdir()) == sorted([ckpt, "train.py"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_processes_match_the_original(name, originals, tmp_path) -> None:
    _, batch, ckpt = CASES[name]
    folder = _prepare(tmp_path, name, "converted")
    proc = run_torchrun(folder / "train.py", *_args(name, batch // 2), nproc=2, cwd=folder,
                        env=_env(), replicas=True, distinct_data=True)
    stdout, state = originals[name]
    # one writer: every line printed once, one checkpoint, no stray temporary files
    assert len(proc.stdout.splitlines()) == len(stdout.splitlines())
    assert sorted(p.name for p in folder.iterdir()) == sorted([ckpt, "train.py"])
    converted = flatten(torch.load(folder / ckpt))
    assert converted.keys() == state.keys()
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            torch.testing.assert_close(converted[key], value, rtol=1e-3, atol=1e-4)
    _compare_metrics(name, result_line(proc.stdout, required=False),
                     result_line(stdout, required=False), proc.stdout, stdout)


def _compare_metrics(name, got, want, got_text, want_text) -> None:
    if name == "flat_script":
        assert got["seen"] == want["seen"] == 203
        assert got["val_mse"] == pytest.approx(want["val_mse"], rel=1e-3)
        assert got["lr"] == pytest.approx(want["lr"])
    elif name == "trainer_class":
        # the model before training is the same on every process: counts exactly equal
        assert got["before"]["correct"] == want["before"]["correct"]
        assert got["before"]["seen"] == want["before"]["seen"] == 251
        assert got["before"]["loss"] == pytest.approx(want["before"]["loss"], rel=1e-6)
        assert got["after"]["seen"] == 251
        assert got["after"]["loss"] == pytest.approx(want["after"]["loss"], rel=1e-3)
    else:
        got_tests = [line for line in got_text.splitlines() if "Test set" in line]
        want_tests = [line for line in want_text.splitlines() if "Test set" in line]
        assert len(got_tests) == len(want_tests) == 2
        for g, w in zip(got_tests, want_tests):
            assert g.split("Accuracy: ")[1].endswith("/251")
            g_loss = float(g.split("Average loss: ")[1].split(",")[0])
            w_loss = float(w.split("Average loss: ")[1].split(",")[0])
            assert g_loss == pytest.approx(w_loss, abs=2e-4)


def test_an_unseeded_split_is_the_same_split_on_every_process(tmp_path) -> None:
    # Nothing seeds the script, so each process would split the data its own way; converted,
    # the split comes from the main process's generator and the two sets still partition the
    # data: each sample evaluated once, in exactly one of them.
    folder = _prepare(tmp_path, "unseeded_split", "converted")
    for nproc in (1, 2):
        if nproc == 1:
            proc = run_python(folder / "train.py", "16", cwd=folder, env=_env())
        else:
            # unseeded initialisation too: DDP starts every rank from rank 0's parameters
            proc = run_torchrun(folder / "train.py", "8", nproc=2, cwd=folder, env=_env(),
                                replicas=True, distinct_data=True)
        got = result_line(proc.stdout)
        assert (got["train_count"], got["val_count"]) == (90, 30)
        assert got["train_ids"] + got["val_ids"] == sum(range(120)), (nproc, got)


def test_a_checkpoint_saved_and_reloaded_through_file_objects_is_the_new_one_everywhere(
        tmp_path) -> None:
    """word_language_model's ``with open(path, "wb") as f: torch.save(model, f)`` then ``with
    open(path, "rb") as f: model = torch.load(f)``, every epoch: every process must reload the
    model just saved, never a half-written file or the previous epoch's. The race is timing
    dependent, so the job runs three times; the reloaded model's evaluation (summed over both
    processes) is the original's each time."""
    original = _prepare(tmp_path, "save_through_file", "original")
    want = run_python(original / "train.py", "--batch_size", "16", cwd=original, env=_env())
    want_reloads = [line for line in want.stdout.splitlines() if line.startswith("reloaded")]
    converted = _prepare(tmp_path, "save_through_file", "converted")
    for _ in range(3):
        proc = run_torchrun(converted / "train.py", "--batch_size", "8", nproc=2,
                            cwd=converted, env=_env(), replicas=True, distinct_data=True)
        reloads = [line for line in proc.stdout.splitlines() if line.startswith("reloaded")]
        assert [line.split(", ")[1] for line in reloads] == \
            [line.split(", ")[1] for line in want_reloads]  # the counts, exactly
        assert result_line(proc.stdout)["correct"] == result_line(want.stdout)["correct"]
        assert sorted(p.name for p in converted.iterdir()) == ["model.pt", "train.py"]
