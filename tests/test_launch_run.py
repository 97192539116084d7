"""Real jobs: `distify launch` (and `accelerate launch` on a written config) on CPU with Gloo.

Every run trains the same tiny model; its result must equal the single-process result, and
every rank must end with bit-identical parameters, having trained on its own batches
(``replicas_env`` / ``check_replicas``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from distify.launch.config import default_config, with_overrides, write_config
from tests.helpers import (
    FIXTURES,
    check_replicas,
    clean_env,
    free_port,
    replicas_env,
    run_python,
)

pytest.importorskip("torch", reason="real launches need torch")

pytestmark = pytest.mark.pool

TRAIN = FIXTURES / "launch" / "train_ddp.py"
SLEEPER = FIXTURES / "launch" / "sleeper.py"
EXITS = FIXTURES / "launch" / "exits.py"
TIMEOUT = 180


def distify_launch(*args: str, cwd, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "distify", "launch", *args], cwd=cwd,
                            env=env or clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"timed out\n{out}\n{err}")
    return proc.returncode, out, err


def result(out: str, err: str = "") -> dict:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, f"expected one result line from rank 0\n{out}\n{err}"
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict:
    """The script's result as one plain process (no launcher)."""
    return result(run_python(TRAIN, cwd=tmp_path_factory.mktemp("single")).stdout)


def assert_same_training(run: dict, single: dict) -> None:
    assert run["weights"] == pytest.approx(single["weights"], rel=1e-12, abs=1e-12)
    assert run["last_loss"] == pytest.approx(single["last_loss"], rel=1e-12)


def test_two_processes_on_cpu(tmp_path, single):
    replicas = tmp_path / "replicas"
    code, out, err = finish(distify_launch("--num_processes", "2", "--mixed_precision", "bf16",
                                           str(TRAIN), "--", "--tag", "x y", cwd=tmp_path,
                                           env=replicas_env(None, replicas)))
    assert code == 0, err
    check_replicas(replicas, 2, distinct_data=True, output=err)
    run = result(out, err)
    assert (run["world_size"], run["ranks"], run["args"]) == (2, [0, 1], ["--tag", "x y"])
    assert run["env"]["LOCAL_WORLD_SIZE"] == "2"
    assert (run["env"]["DISTIFY_MIXED_PRECISION"], run["env"]["ACCELERATE_MIXED_PRECISION"]) == (
        "bf16", "bf16")
    assert_same_training(run, single)
    assert "2 process(es) on 1 machine" in err


@pytest.mark.parametrize("rdzv", ["static", "c10d"])
def test_two_machines_simulated_on_this_one(tmp_path, single, rdzv):
    common = ["--num_machines", "2", "--num_processes", "2", "--main_process_ip", "127.0.0.1",
              "--main_process_port", str(free_port()), "--rdzv_backend", rdzv]
    replicas = tmp_path / "replicas"  # both machines' ranks write here
    machines = [distify_launch(*common, "--machine_rank", str(rank), str(TRAIN), cwd=tmp_path,
                               env=replicas_env(None, replicas))
                for rank in (1, 0)]
    (code1, out1, err1), (code0, out0, err0) = (finish(proc) for proc in machines)
    assert (code0, code1) == (0, 0), f"{err0}\n{err1}"
    check_replicas(replicas, 2, distinct_data=True, output=err0 + err1)
    run = result(out0 + out1)
    assert (run["world_size"], run["ranks"], run["env"]["LOCAL_WORLD_SIZE"]) == (2, [0, 1], "1")
    assert_same_training(run, single)


def test_accelerate_launch_runs_a_written_config(tmp_path, single):
    pytest.importorskip("accelerate", reason="accelerate is a test dependency: "
                                             "pip install accelerate")
    # What `distify convert` writes beside a converted script, asked for 2 processes.
    cfg = with_overrides(default_config(num_processes=2, mixed_precision="fp16"),
                         main_process_port=free_port())
    write_config(cfg, tmp_path / "train_dist.yaml")
    replicas = tmp_path / "replicas"
    proc = subprocess.Popen([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                             str(tmp_path / "train_dist.yaml"), str(TRAIN)], cwd=tmp_path,
                            env=replicas_env(None, replicas), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    code, out, err = finish(proc)
    assert code == 0, err
    check_replicas(replicas, 2, distinct_data=True, output=err)
    run = result(out, err)
    assert (run["world_size"], run["env"]["ACCELERATE_MIXED_PRECISION"]) == (2, "fp16")
    assert_same_training(run, single)


def test_converted_script_with_its_written_config(tmp_path):
    """The user's flow: `distify convert` wrote train_dist.py and train_dist.yaml beside it."""
    script = tmp_path / "train_dist.py"
    shutil.copy(FIXTURES / "launch" / "train_runtime.py", script)
    write_config(default_config(num_processes=2, mixed_precision="bf16"),
                 tmp_path / "train_dist.yaml")
    replicas = tmp_path / "replicas"
    code, out, err = finish(distify_launch("train_dist.py", cwd=tmp_path,
                                           env=replicas_env(None, replicas)))
    run = result(out, err)
    assert code == 0, err  # no worker aborts at exit: the runtime tears Gloo down cleanly
    check_replicas(replicas, 2, distinct_data=True, output=err)
    assert (run["world_size"], run["device"], run["mixed_precision"]) == (2, "cpu", "bf16")
    # Both epochs covered every sample exactly once, across the two ranks.
    assert run["seen"] == [list(range(24))] * 2


def test_failing_job_exit_code_comes_back(tmp_path):
    code, _, err = finish(distify_launch("--num_processes", "2", str(EXITS), "3", cwd=tmp_path))
    assert code == 3, err  # the worker's own exit code (issue 25 item 8), not torchrun's 1
    assert "exit code 3" in err


def test_interrupt_is_forwarded_and_stops_the_workers(tmp_path):
    pid_file = tmp_path / "worker.pid"
    proc = distify_launch("--num_processes", "1", str(SLEEPER), str(pid_file), cwd=tmp_path)
    deadline = time.monotonic() + TIMEOUT
    while not pid_file.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the worker never started"
        time.sleep(0.1)
    worker = int(pid_file.read_text())
    # Only `distify launch` gets the signal: the job runs in its own session, as it does when
    # Ctrl-C is pressed in a terminal.
    os.kill(proc.pid, signal.SIGINT)
    code, _, err = finish(proc)
    assert code != 0, err
    assert not _alive(worker), "the worker survived"


def _alive(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.1)
    return True
