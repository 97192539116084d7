"""Replicas compared always (issue 20 item 1), and prepared models moved and back (item 7).

Real 2-process jobs (torchrun, Gloo on CPU) of scripts written the way real ones are: each
ends either correct (bit-identical replicas, checked by tests/replicas) or stopped with the
named error, within the first epoch (a loader's) or at the first periodic check (a loop
without epochs).
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from distify.runtime import _replicas, _state
from distify.runtime._errors import DistifyError
from tests.helpers import REPO, clean_env, run_torchrun, simulated_rank

pytestmark = pytest.mark.pool

SCRIPTS = REPO / "tests" / "runtime_scripts"
SKIP = SCRIPTS / "replicas_skip.py"
CHECKPOINT = SCRIPTS / "replicas_checkpoint.py"
DIVERGED = "DistifyError: distify: replicas diverged: "


def _two(script, *args: str, cwd, check: bool = True, replicas: bool | None = False,
         **env: str) -> subprocess.CompletedProcess:
    return run_torchrun(script, *args, nproc=2, cwd=cwd, timeout=180, check=check,
                        replicas=replicas,
                        env=clean_env(DISTIFY_TIMEOUT="60", CKPT_DIR=str(cwd), **env))


def _line(script, mark: str) -> str:
    for number, text in enumerate(script.read_text().splitlines(), 1):
        if text.endswith(f"# MARK: {mark}"):
            return f"{script.name}:{number}"
    raise AssertionError(f"no line marked {mark} in {script}")


def test_a_model_cast_for_checkpoints_and_back_keeps_averaging(tmp_path):
    # .double()/.float() and .to(float64)/.to(float32) every 20 steps on every rank: without
    # re-attaching DDP's hooks the ranks' weights differ after the first checkpoint (and the
    # replica check, on here, would stop the job at backward 200).
    proc = _two(CHECKPOINT, "all", cwd=tmp_path, replicas=True)
    assert "finished" in proc.stdout
    assert proc.replicas.records[0]["trained"] == proc.replicas.records[1]["trained"]
    assert (tmp_path / "ckpt.pt").is_file()


def test_a_model_moved_on_the_main_process_only_is_caught_by_the_periodic_check(tmp_path):
    proc = _two(CHECKPOINT, "main-half", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "finished" not in proc.stdout
    assert (f"{DIVERGED}Sequential.0.weight differs from rank 0's on rank 1, found at "
            f"backward {_replicas.DEFAULT_EVERY} (") in proc.stderr, proc.stderr[-3000:]
    assert "a model moved after distify.prepare" in proc.stderr


def test_training_a_model_moved_away_is_refused_at_the_line_of_the_move(tmp_path):
    proc = _two(CHECKPOINT, "away", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "finished" not in proc.stdout
    assert "DistifyError: distify: Sequential was moved to torch.float64 on cpu at " in \
        proc.stderr, proc.stderr[-3000:]
    assert f"{_line(CHECKPOINT, 'away')} after distify.prepare" in proc.stderr


def test_per_process_loss_spike_skipping_stops_at_the_end_of_the_first_epoch(tmp_path):
    proc = _two(SKIP, cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "epoch 0 done" not in proc.stdout, proc.stdout
    assert (f"{DIVERGED}Sequential.0.weight differs from rank 0's on rank 1, found at the end "
            "of an epoch of a prepared DataLoader (backward 8) (optimizer steps per "
            "rank: rank 0 ") in proc.stderr, proc.stderr[-3000:]
    assert "a per-process decision before optimizer.step()" in proc.stderr
    # Off: the same job runs to its end, its replicas different (what the check caught).
    off = _two(SKIP, cwd=tmp_path, DISTIFY_REPLICA_CHECK="0")
    assert "epoch 2 done" in off.stdout and "finished" in off.stdout
    assert DIVERGED not in off.stderr


@pytest.mark.parametrize("variable, value, wanted", [
    ("DISTIFY_REPLICA_CHECK", "maybe", "DISTIFY_REPLICA_CHECK='maybe' must be 1"),
    ("DISTIFY_REPLICA_CHECK_EVERY", "0", "DISTIFY_REPLICA_CHECK_EVERY='0' must be a whole"),
    ("DISTIFY_REPLICA_CHECK_EVERY", "ten", "DISTIFY_REPLICA_CHECK_EVERY='ten' must be a whole"),
])
def test_bad_settings_are_one_line_errors(monkeypatch, variable, value, wanted):
    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(0))
    monkeypatch.setenv(variable, value)
    with pytest.raises(DistifyError, match=wanted):
        _replicas.backwards()


@pytest.mark.parametrize("value, enabled, every", [
    ("0", False, _replicas.DEFAULT_EVERY), ("off", False, _replicas.DEFAULT_EVERY),
    ("", True, _replicas.DEFAULT_EVERY), ("1", True, 7)])
def test_settings(monkeypatch, value, enabled, every):
    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(1))
    monkeypatch.setenv("DISTIFY_REPLICA_CHECK", value)
    monkeypatch.setenv("DISTIFY_REPLICA_CHECK_EVERY", "7" if every == 7 else "")
    part = _replicas._part()
    assert (part.enabled, part.every) == (enabled, every)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.complex64, torch.int64, torch.bool])
def test_checksum_sees_a_change_of_one_element(dtype):
    tensor = (torch.arange(1000) % 2 == 0).to(dtype) if dtype is torch.bool else \
        torch.randn(1000, dtype=torch.float64).mul(1000).to(dtype)
    same = tensor.clone()
    changed = tensor.clone()
    changed[500] = ~changed[500] if dtype is torch.bool else changed[500] * 2 + 1
    assert _replicas._checksum(tensor).item() == _replicas._checksum(same).item()
    assert _replicas._checksum(tensor).item() != _replicas._checksum(changed).item()
    assert _replicas._checksum(tensor).dtype is torch.int64


def test_under_fsdp_the_ranks_optimizer_steps_are_compared(tmp_path):
    # FSDP's shards are not comparable between ranks; a step skipped on some ranks is caught
    # by the step counts, at the end of the first epoch too.
    proc = _two(SKIP, cwd=tmp_path, check=False, DISTIFY_STRATEGY="fsdp")
    assert proc.returncode != 0
    assert "epoch 0 done" not in proc.stdout, proc.stdout
    assert (f"{DIVERGED}the processes made different numbers of optimizer steps, found at the "
            "end of an epoch of a prepared DataLoader (backward 8) (optimizer steps per "
            "rank: rank 0 ") in proc.stderr, proc.stderr[-3000:]


def test_when_the_checks_run(monkeypatch):
    # the schedule alone (one process, no process group): `check` records instead of comparing
    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(0))
    monkeypatch.delenv("DISTIFY_REPLICA_CHECK", raising=False)
    monkeypatch.delenv("DISTIFY_REPLICA_CHECK_EVERY", raising=False)
    made = []

    def check(when, buffers=False):
        made.append((_replicas.backwards(), buffers))
        _replicas._part().since = 0

    monkeypatch.setattr(_replicas, "check", check)
    for _ in range(30):  # epochs of 8 backwards
        start = _replicas.backwards()
        for _ in range(8):
            _replicas.after_backward()
        _replicas.epoch_ended(start)
        _replicas.epoch_ended(_replicas.backwards())  # an evaluation epoch: nothing trained
    gap = _replicas.EPOCH_GAP
    assert made == [(8, False)] + [(8 + 8 * -(-gap // 8) * n, False) for n in range(1, 5)]
    last, every = made[-1][0], _replicas.DEFAULT_EVERY
    made.clear()
    for _ in range(2 * every + 50):  # then a loop without epochs: every K from the last check
        _replicas.after_backward()
    assert made == [(last + every, True), (last + 2 * every, True)]
