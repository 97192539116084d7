"""Runtime faults under a real launcher: a crashed rank ends the job, a restarted job resumes.

Restarts are tested on one machine and on two agents meeting through c10d rendezvous. (A crash
during `save` leaving the previous checkpoint intact is tested in test_runtime_unit.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import FIXTURES, REPO, check_replicas, clean_env, free_port, replicas_env

pytest.importorskip("torch")

RESUMABLE = FIXTURES / "launch" / "resumable.py"


def _start(*args: str, cwd, replicas=None) -> subprocess.Popen:
    """``replicas``: a folder where every rank records what it trained (see check_replicas)."""
    cmd = [sys.executable, "-m", "distify", "launch", "--cpu", *args]
    env = clean_env(PYTHONPATH=str(REPO))
    if replicas is not None:
        env = replicas_env(env, replicas)
    return subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> subprocess.CompletedProcess:
    """Wait for a job; a job that hangs fails the test and leaves no worker behind."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job hung for {timeout} s\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _launch(*args: str, cwd, timeout: float = 240, replicas=None) -> subprocess.CompletedProcess:
    return _finish(_start(*args, cwd=cwd, replicas=replicas), timeout)


def _final(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def test_a_rank_that_crashes_ends_the_whole_job_with_an_error(tmp_path) -> None:
    # Rank 1 dies at epoch 1 while rank 0 trains on: without a restart budget the launcher
    # must stop rank 0 (waiting for rank 1 in DDP's all-reduce) and fail, not hang.
    proc = _launch("--num_processes", "2", str(RESUMABLE), str(tmp_path), "1", cwd=tmp_path,
                   timeout=120)
    assert proc.returncode != 0
    assert "simulated crash of rank 1" in proc.stderr
    assert not _has_final(proc.stdout)


def _has_final(stdout: str) -> bool:
    return any(line.startswith("{") for line in stdout.splitlines())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The resumable job's result when nothing crashes (both restart tests compare with it)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    clean = _launch("--num_processes", "2", str(RESUMABLE), str(folder), cwd=folder,
                    replicas=folder / "replicas")
    assert clean.returncode == 0, clean.stderr
    check_replicas(folder / "replicas", 2, distinct_data=True, output=clean.stderr)
    return _final(clean.stdout)


def _assert_resumed(stdout: str, restarted, want: dict) -> None:
    assert "resumed at epoch 2" in stdout  # epochs 0 and 1 were checkpointed
    assert (restarted / "crashed").exists()
    got = _final(stdout)
    assert got["weight"] == pytest.approx(want["weight"], rel=1e-6)
    assert got["bias"] == pytest.approx(want["bias"], rel=1e-6)


def test_a_restarted_job_resumes_from_the_last_checkpoint(tmp_path, uninterrupted) -> None:
    # Gloo on torch 2.13 sometimes fails to reconnect a restarted group; a restart budget of
    # 3 is what a real job would use, and the job must still resume from its checkpoint.
    proc = _launch("--num_processes", "2", "--max_restarts", "3", str(RESUMABLE),
                   str(tmp_path), "2", cwd=tmp_path, replicas=tmp_path / "replicas")
    assert proc.returncode == 0, proc.stderr
    _assert_resumed(proc.stdout, tmp_path, uninterrupted)
    # the last attempt's ranks (their records replace the crashed attempt's) agree
    check_replicas(tmp_path / "replicas", 2, distinct_data=True, output=proc.stderr)


def test_a_restarted_two_machine_job_resumes_through_c10d_rendezvous(tmp_path,
                                                                       uninterrupted) -> None:
    # Two agents on this machine stand for two machines; rank 1 (on one of them) crashes once.
    # Both agents restart their workers in a new rendezvous round, and the job resumes.
    common = ["--num_machines", "2", "--num_processes", "2", "--main_process_ip", "127.0.0.1",
              "--main_process_port", str(free_port()), "--rdzv_backend", "c10d",
              "--max_restarts", "3"]
    agents = [_start(*common, "--machine_rank", str(rank), str(RESUMABLE), str(tmp_path), "2",
                     cwd=tmp_path, replicas=tmp_path / "replicas") for rank in (0, 1)]
    done = [_finish(agent) for agent in agents]
    assert [proc.returncode for proc in done] == [0, 0], "\n".join(p.stderr for p in done)
    _assert_resumed("".join(proc.stdout for proc in done), tmp_path, uninterrupted)
    check_replicas(tmp_path / "replicas", 2, distinct_data=True,
                   output="".join(proc.stderr for proc in done))
