"""The runtime trains exactly like the original script: bit for bit at world size 1, and within
float tolerance on 2 processes with half the per-process batch (the same global batches)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.helpers import REPO, run_python, run_torchrun

pytestmark = pytest.mark.pool

SCRIPT = REPO / "tests" / "runtime_scripts" / "train_compare.py"


def _train(tmp_path_factory, name: str, *args: str, nproc: int = 0) -> tuple[dict, object]:
    out = tmp_path_factory.mktemp(name)
    if nproc:
        proc = run_torchrun(SCRIPT, *args, "--out", str(out), nproc=nproc, cwd=out,
                            replicas=True, distinct_data=True)
    else:
        proc = run_python(SCRIPT, *args, "--out", str(out), cwd=out)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout  # one process prints
    return json.loads(lines[0]), out


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The reference: the script without distify, one process, batches of 16."""
    return _train(tmp_path_factory, "plain")


def test_world_size_1_is_bit_identical(tmp_path_factory, plain):
    (reference, plain_dir), (converted, out) = plain, _train(tmp_path_factory, "one", "--distify")
    assert converted["losses"] == reference["losses"]
    assert converted["weights"] == reference["weights"]
    assert converted["lrs"] == reference["lrs"]
    # No extra random numbers drawn anywhere: the generator ends in the same state.
    assert converted["rng_after"] == reference["rng_after"]
    for name in ("checkpoint.pt", "model.pt"):  # checkpoints: byte for byte
        assert (out / name).read_bytes() == (plain_dir / name).read_bytes(), name
    assert type(torch.load(out / "model.pt", weights_only=False)) is torch.nn.Sequential


def test_two_processes_with_half_batch_match_one_process(tmp_path_factory, plain):
    reference, _ = plain
    converted, out = _train(tmp_path_factory, "ddp", "--batch", "8", "--distify", nproc=2)
    assert converted["steps_per_epoch"] == reference["steps_per_epoch"] == [8, 8]
    assert converted["len_loader"] == 8
    # Scheduler stepped once per call (not once per process): the same learning rates.
    assert converted["lrs"] == reference["lrs"]
    for key in ("losses", "weights"):
        got = [float.fromhex(v) for v in converted[key]]
        want = [float.fromhex(v) for v in reference[key]]
        assert all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) for a, b in zip(got, want)), key
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "model.pt"]
