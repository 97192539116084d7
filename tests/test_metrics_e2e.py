"""Every promise the report makes about metrics and result files holds when the job runs.

The fixture (``tests/fixtures/metrics/vae_style.in.py``) computes its metrics the ways real
scripts do (an epoch loss over ``len(loader.dataset)``, a sum of per-batch means over
``len(loader)``, prediction lists, AverageMeters) and writes and re-reads its results through
``open`` (``json.dump``, ``pickle.dump(obj, open(...))``) every epoch. Run on 2 processes at half
the per-process batch it must print what one process prints, as the report claims; its own
asserts fail if any process reads a stale or half-written file, and the run is repeated to give
such a race a chance.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from distify.convert.engine import convert_source  # noqa: E402
from tests.helpers import FIXTURES, REPO, clean_env, result_line, run_python, run_torchrun  # noqa: E402

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

METRICS = FIXTURES / "metrics"
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))
#: counted exactly; the rest are floats summed in another order
EXACT = ("correct", "n", "val_count", "accuracy")


def _convert() -> bytes:
    source = METRICS / "vae_style.in.py"
    return convert_source(source.read_bytes(), str(source)).output


def test_golden_output() -> None:
    output = _convert()
    if UPDATE:
        (METRICS / "vae_style.out.py").write_bytes(output)
    assert output.decode() == (METRICS / "vae_style.out.py").read_text()
    assert convert_source(output).output == output  # idempotent


def test_the_report_claims_equality_only_where_it_is_proven() -> None:
    result = convert_source((METRICS / "vae_style.in.py").read_bytes())
    claims = {c.message.split("`")[1]: c.message for c in result.changes
              if c.kind == "reduce" and c.message.startswith("`")}
    assert "equals the single-process value" in claims["correct"]
    assert "equals the single-process value when every batch is full" in claims["test_loss"]
    assert "not equal" in claims["train_loss"]
    assert not result.notes, [n.message for n in result.notes]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("metrics")
    folders = {}
    for variant, text in (("original", (METRICS / "vae_style.in.py").read_bytes()),
                          ("converted", (METRICS / "vae_style.out.py").read_bytes())):
        folder = folders[variant] = root / variant
        folder.mkdir()
        (folder / "train.py").write_bytes(text)
    return folders


def _env() -> dict:
    return clean_env(PYTHONPATH=str(REPO))


def test_one_process_is_bit_identical_to_the_original(runs) -> None:
    want = run_python(runs["original"] / "train.py", "--batch-size", "16",
                      cwd=runs["original"], env=_env())
    got = run_python(runs["converted"] / "train.py", "--batch-size", "16",
                     cwd=runs["converted"], env=_env())
    assert got.stdout == want.stdout
    history = "history.json"
    assert (runs["converted"] / history).read_bytes() == (runs["original"] / history).read_bytes()
    # a pickled tensor names its storage by memory address: compare what it holds
    mine, theirs = (pickle.loads((runs[v] / "model.pkl").read_bytes())
                    for v in ("converted", "original"))
    assert mine["epoch"] == theirs["epoch"] and mine["state"].keys() == theirs["state"].keys()
    assert all(torch.equal(mine["state"][k], theirs["state"][k]) for k in theirs["state"])


def test_two_processes_print_the_single_process_metrics(runs, tmp_path: Path) -> None:
    want = result_line(run_python(runs["original"] / "train.py", "--batch-size", "16",
                                  cwd=runs["original"], env=_env()).stdout)
    for attempt in range(3):  # a load racing the save fails the fixture's own asserts
        folder = tmp_path / f"two-{attempt}"
        folder.mkdir()
        shutil.copy(runs["converted"] / "train.py", folder / "train.py")
        proc = run_torchrun(folder / "train.py", "--batch-size", "8", cwd=folder, env=_env(),
                            replicas=True, distinct_data=True)
        got = result_line(proc.stdout)
        assert proc.stdout.count("RESULT ") == 1  # printed once
        assert len(got) == len(want)
        for epoch, (mine, theirs) in enumerate(zip(got, want)):
            assert mine.keys() == theirs.keys()
            for key, value in theirs.items():
                if key in EXACT:
                    assert mine[key] == value, (epoch, key)
                else:
                    assert mine[key] == pytest.approx(value, rel=1e-5), (epoch, key)
        # only the main process wrote, atomically: no scratch files left behind
        assert sorted(p.name for p in folder.iterdir()) == ["history.json", "model.pkl",
                                                             "train.py"]
