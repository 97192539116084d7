"""`distify launch` as a newcomer meets it, through the real command line (issue 13): a Slurm
script from a machine without GPUs, failed jobs summarised, Ctrl-C, a worker machine waiting for
its main machine, mistyped options, unconverted scripts and GPUs that are not there."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import clean_env, free_port

TIMEOUT = 180


def distify_launch(*args: str, cwd, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    # clean_env hides every GPU: this is a machine without GPUs, like a login node.
    return subprocess.run([sys.executable, "-m", "distify", "launch", *args], cwd=cwd,
                          env=clean_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "train_dist.py").write_text("import distify.runtime\nprint('trained')\n")
    return tmp_path


def test_readme_slurm_command_works_on_a_machine_without_gpus(folder):
    proc = distify_launch("--slurm", "--num_machines", "4", "train_dist.py", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --nodes=4" in lines and "#SBATCH --gpus-per-node=1" in lines
    assert any("--nnodes 4 --nproc-per-node 1" in line for line in lines)
    subprocess.run(["bash", "-n"], input=proc.stdout, text=True, check=True)
    assert "1 process(es) per node" in proc.stderr and "--num_processes" in proc.stderr


def test_slurm_keeps_the_configs_processes_per_machine(folder):
    (folder / "train_dist.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 8\n")
    proc = distify_launch("--slurm", "--num_machines", "2", "train_dist.py", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --gpus-per-node=8" in proc.stdout.splitlines()


def test_slurm_failure_prints_no_script(folder):
    proc = distify_launch("--slurm", "--num_machines", "4", "--num_processes", "3",
                          "train_dist.py", cwd=folder)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a multiple of num_machines" in lines[0], proc.stderr
    assert "no batch script was printed" in lines[0]


@pytest.mark.parametrize("args,message", [
    (["--num_proceses", "2"], "no such option: --num_proceses (did you mean --num_processes?)"),
    (["--num-proceses=2"], "no such option: --num-proceses (did you mean --num-processes?)"),
    (["--tee", "3"], "no such option: --tee (see distify launch --help)"),
], ids=["typo", "typo-with-equals", "torchrun-only-option"])
def test_unknown_option_before_the_script_is_named(folder, args, message):
    proc = distify_launch(*args, "train_dist.py", cwd=folder)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "script not found" not in proc.stderr


def test_options_after_the_script_still_go_to_it(folder):
    proc = distify_launch("--dry-run", "train_dist.py", "--num_proceses", "2", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].endswith("train_dist.py --num_proceses 2")


def test_unconverted_script_on_several_processes_warns_once(folder):
    (folder / "train.py").write_text("import torch\nprint('trained')\n")
    proc = distify_launch("--num_processes", "2", "--cpu", "train.py", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("trained") == 1  # rank 0's: the console shows the main process
    assert proc.stderr.count("will train on the full data on its own") == 1, proc.stderr
    assert "distify convert train.py" in proc.stderr


@pytest.mark.parametrize("script,processes", [("train_dist.py", "2"), ("train.py", "1")],
                         ids=["converted", "one-process"])
def test_no_warning_for_converted_script_or_one_process(folder, script, processes):
    (folder / "train.py").write_text("print('trained')\n")
    proc = distify_launch("--dry-run", "--num_processes", processes, script, cwd=folder)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr


def test_gpu_ids_without_gpus_is_an_error(folder):
    proc = distify_launch("--gpu_ids", "0,1", "--num_processes", "2", "train_dist.py", cwd=folder)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distify: error: --gpu_ids 0,1: this machine "
                                                   "has no GPUs"), proc.stderr
    assert "trained" not in proc.stdout


BOOM = """\
import time
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(0.5)
    settings = {"lr": 1}
    value = settings["batch_size"]
dist.barrier()
"""


def test_failed_job_ends_with_a_summary_of_the_first_failure(folder):
    (folder / "boom.py").write_text(BOOM)
    proc = distify_launch("--num_processes", "2", "--cpu", "boom.py", cwd=folder)
    assert proc.returncode == 1, proc.stderr  # torchrun's exit code for a failed worker
    summary = [line for line in proc.stderr.splitlines() if line.startswith("distify: ")][-3:]
    assert summary[0] == "distify: rank 1 failed first: KeyError: 'batch_size'", proc.stderr
    assert summary[1] == 'distify:   at boom.py:8: value = settings["batch_size"]'
    log = summary[2].rsplit(" ", 1)[1]
    assert "exit code 1" in summary[2]
    assert "Connection closed by peer" in Path(log).read_text()  # rank 0 was in the log too


def _wait_for(lines: list[str], proc: subprocess.Popen, text: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not any(text in line for line in lines):
        assert time.monotonic() < deadline and proc.poll() is None, lines
        time.sleep(0.2)


def test_worker_machine_says_it_waits_then_ctrl_c_exits_130(folder):
    port = str(free_port())
    proc = subprocess.Popen([sys.executable, "-m", "distify", "launch", "--num_machines", "2",
                             "--machine_rank", "1", "--num_processes", "2", "--cpu",
                             "--main_process_ip", "127.0.0.1", "--main_process_port", port,
                             "train_dist.py"], cwd=folder, env=clean_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        _wait_for(lines, proc, f"waiting for the main machine 127.0.0.1:{port} (machine_rank 0)",
                  60)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(10)
    finally:
        proc.kill()
    assert proc.returncode == 130, lines
    assert not any("distify/" in line and "File" in line for line in lines), lines
    assert any(line.startswith("distify: interrupted") for line in lines), lines
