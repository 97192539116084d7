"""`distify launch` friction a new user hit (issue 25 items 5-9 and 13, issue 26 item 9), through
the real command line: a syntax error stops the launch in one line; Ctrl-C, a wrong FSDP layer
class and a failed job end in a few lines; the worker's own exit code comes back; a rank killed
by a signal is named; --gpu_ids is checked on --dry-run and against CPU jobs; the config that
`distify config` writes is the one `launch` (and `env`) then use. Real 2-process jobs run with
torchrun on CPUs (Gloo)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, clean_env

HERE = FIXTURES / "launch_friction"
TIMEOUT = 180
CONVERTED = "import distify.runtime\nprint('trained')\n"


def distify(*args: str, cwd, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    # clean_env hides every GPU: a machine without GPUs
    return subprocess.run([sys.executable, "-m", "distify", *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=timeout)


def fixture(name: str, folder: Path) -> str:
    shutil.copy(HERE / name, folder / name)
    return name


def summary(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("distify: ")]


def log_of(stderr: str) -> Path:
    path = Path(summary(stderr)[-1].rsplit(" ", 1)[1])
    assert path.is_file(), stderr
    return path


# ---------------------------------------------------------------- item 5: syntax errors


@pytest.mark.parametrize("source,position,message", [
    ("import torch\n\ndef train(:\n    pass\n", "3:11", "SyntaxError: invalid syntax"),
    ("def train():\nreturn 1\n", "2:1",
     "IndentationError: expected an indented block after function definition on line 1"),
], ids=["syntax", "indentation"])
def test_syntax_error_is_one_line_with_its_position_and_nothing_starts(tmp_path, source,
                                                                       position, message):
    (tmp_path / "train_dist.py").write_text(source)
    proc = distify("launch", "--num_processes", "2", "--cpu", "train_dist.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"distify: error: train_dist.py:{position}: {message}; nothing was launched"]
    assert proc.stdout == ""


def test_the_syntax_check_compiles_but_never_runs_the_script(tmp_path):
    (tmp_path / "train_dist.py").write_text("import distify.runtime\nopen('ran', 'w').close()\n")
    proc = distify("launch", "--dry-run", "--num_processes", "2", "train_dist.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "ran").exists()
    assert "train_dist.py" in proc.stdout.splitlines()[-1]


# ---------------------------------------------------------------- item 6: Ctrl-C


def test_ctrl_c_exits_130_with_one_line_per_rank(tmp_path):
    script = fixture("sleeps.py", tmp_path)
    # Its own process group, signalled as a whole: what a terminal does on Ctrl-C.
    # --all-ranks: both ranks' "started" reach the console (by default only rank 0's would)
    proc = subprocess.Popen([sys.executable, "-m", "distify", "launch", "--num_processes", "2",
                             "--cpu", "--all-ranks", script], cwd=tmp_path, env=clean_env(),
                            text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while sum(line.startswith("[rank") and "started" in line for line in out) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, (out, proc.stderr.read())
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.stderr.read()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    lines = err.splitlines()
    assert len(lines) <= 4, err  # what the job is, one line per rank, where the log is
    assert lines[1:3] == ["distify: rank 0 stopped at sleeps.py:9: time.sleep(120)",
                          "distify: rank 1 stopped at sleeps.py:9: time.sleep(120)"], err
    assert lines[-1].startswith("distify: interrupted; the job's stderr is in ")
    assert "KeyboardInterrupt" in log_of(err).read_text()  # kept, in the log


# ---------------------------------------------------------------- item 7: a wrong FSDP class


def test_wrong_fsdp_layer_class_in_the_config_ends_in_its_summary_alone(tmp_path):
    script = fixture("fsdp_blocks.py", tmp_path)
    (tmp_path / "fsdp_blocks.yaml").write_text(
        "distributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\nfsdp_config:\n"
        "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
        "  fsdp_transformer_layer_cls_to_wrap: Blok\n")
    proc = distify("launch", script, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 4, proc.stderr
    assert lines[0].startswith("distify: 2 process(es) on 1 machine; CPUs only")
    assert lines[1].startswith("distify: rank ") and " failed first: " in lines[1]
    assert "DistifyError: fsdp_transformer_layer_cls_to_wrap: " in lines[1]
    assert "Blok" in lines[1]
    assert lines[2] == ("distify:   at fsdp_blocks.py:20: model, optimizer = "
                        "distify.prepare(model, optimizer)")
    assert lines[3].startswith("distify: the job failed with exit code 1; its full stderr")
    full = log_of(proc.stderr).read_text()
    assert full.count("Traceback") >= 2 and "ChildFailedError" in full  # all of it, in the log


def test_a_bug_in_the_script_still_shows_its_traceback(tmp_path):
    script = fixture("raises.py", tmp_path)
    proc = distify("launch", script, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback (most recent call last):" in proc.stderr
    assert "KeyError: 'batch_size'" in proc.stderr
    assert "ChildFailedError" not in proc.stderr and "Root Cause" not in proc.stderr
    assert summary(proc.stderr)[-3:-1] == ["distify: a process failed first: KeyError: "
                                           "'batch_size'",
                                           "distify:   at raises.py:4: "
                                           "print(settings[\"batch_size\"])"]


# ---------------------------------------------------------------- item 8: the child's exit code


def test_the_workers_own_exit_code_is_reported_and_returned(tmp_path):
    script = fixture("needs_lr.py", tmp_path)
    proc = distify("launch", "--num_processes", "2", "--cpu", script, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr  # argparse's, not torchrun's 1
    assert "the following arguments are required: --lr" in proc.stderr
    last = summary(proc.stderr)[-2:]
    assert last[0].startswith("distify: rank ") and last[0].endswith(" exited with code 2")
    assert last[1].startswith("distify: the job failed with exit code 2 (rank ")
    assert "ChildFailedError" not in proc.stderr


# ---------------------------------------------------------------- issue 26 item 9: a signal


def test_a_rank_killed_by_a_signal_is_named_not_the_rank_that_lost_it(tmp_path):
    script = fixture("oom_killed.py", tmp_path)
    proc = distify("launch", "--num_processes", "2", "--cpu", script, cwd=tmp_path)
    assert proc.returncode == 128 + 9, proc.stderr
    last = summary(proc.stderr)[-2:]
    assert last[0] == ("distify: rank 1 was killed by SIGKILL (exit -9): "
                       "out of memory or preempted?"), proc.stderr
    assert last[1].startswith("distify: the job failed with exit code 137 (rank 1's own)")
    assert "failed first" not in proc.stderr


# ---------------------------------------------------------------- item 9: --gpu_ids


def test_gpu_ids_without_gpus_fails_on_dry_run_as_on_a_real_run(tmp_path):
    (tmp_path / "train_dist.py").write_text(CONVERTED)
    args = ("--gpu_ids", "0,1", "--num_processes", "2", "train_dist.py")
    dry = distify("launch", "--dry-run", *args, cwd=tmp_path)
    real = distify("launch", *args, cwd=tmp_path)
    for proc in (dry, real):
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.splitlines() == [
            "distify: error: --gpu_ids 0,1: this machine has no GPUs (none visible); drop it to "
            "run where the runtime finds a device, or pass --cpu to run on CPUs"]


@pytest.mark.parametrize("config,args,why", [
    ("distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n", (),
     "use_cpu: true in distify_config.yaml"),
    ("distributed_type: MULTI_CPU\nnum_processes: 2\n", (),
     "distributed_type: MULTI_CPU in distify_config.yaml"),
    (None, ("--cpu", "--num_processes", "2"), "--cpu"),
], ids=["use_cpu-config", "multi_cpu-config", "cpu-option"])
def test_gpu_ids_on_a_cpu_job_is_an_error_not_ignored(tmp_path, config, args, why):
    (tmp_path / "train_dist.py").write_text(CONVERTED)
    if config:
        (tmp_path / "distify_config.yaml").write_text(config)
    for dry_run in (("--dry-run",), ()):
        proc = distify("launch", *dry_run, *args, "--gpu_ids", "0,1", "train_dist.py",
                       cwd=tmp_path)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert errors == [f"distify: error: --gpu_ids 0,1: the job runs on CPUs ({why}), where "
                          "GPU ids mean nothing; drop --gpu_ids, or the CPU setting to run on "
                          "GPUs"], proc.stderr


# ---------------------------------------------------------------- item 13: the default config


def test_launch_uses_the_config_that_distify_config_wrote(tmp_path):
    (tmp_path / "train_dist.py").write_text(CONVERTED)
    wrote = distify("config", "--num_processes", "2", "--cpu", "--yes", cwd=tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    assert "Launch with: distify launch SCRIPT (from this folder" in wrote.stdout

    dry = distify("launch", "--dry-run", "train_dist.py", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stderr.splitlines() == [
        "distify: config: distify_config.yaml (the default config in this folder; "
        "--config_file to use another)"]
    assert "--nproc-per-node 2" in dry.stdout and "DISTIFY_USE_CPU=1" in dry.stdout

    real = distify("launch", "train_dist.py", cwd=tmp_path)
    assert real.returncode == 0, real.stderr
    assert real.stdout.count("trained") == 1  # rank 0's: the console shows the main process
    assert real.stderr.splitlines()[0] == (
        "distify: 2 process(es) on 1 machine; CPUs only; mixed precision no (config: "
        "distify_config.yaml, the default config in this folder; --config_file to use another)")


def test_the_scripts_own_config_and_the_option_come_before_the_default(tmp_path):
    (tmp_path / "train_dist.py").write_text(CONVERTED)
    (tmp_path / "distify_config.yaml").write_text("distributed_type: MULTI_GPU\n"
                                                  "num_processes: 2\n")
    (tmp_path / "three.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 3\n")
    chosen = distify("launch", "--dry-run", "--config_file", "three.yaml", "train_dist.py",
                     cwd=tmp_path)
    assert "--nproc-per-node 3" in chosen.stdout and chosen.stderr == "", chosen.stderr
    (tmp_path / "train_dist.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 4\n")
    sibling = distify("launch", "--dry-run", "train_dist.py", cwd=tmp_path)
    assert "--nproc-per-node 4" in sibling.stdout and sibling.stderr == "", sibling.stderr
    # the default file is the current folder's, wherever the script is (as Accelerate's)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "job.py").write_text(CONVERTED)
    other = distify("launch", "--dry-run", "elsewhere/job.py", cwd=tmp_path)
    assert "--nproc-per-node 2" in other.stdout, other.stderr
    assert "distify_config.yaml" in other.stderr


def test_env_reports_the_default_config_launch_would_use(tmp_path):
    (tmp_path / "distify_config.yaml").write_text("distributed_type: MULTI_GPU\n"
                                                  "num_processes: 2\n")
    text = distify("env", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert ("- Launch config: distify_config.yaml (the default in this folder, which "
            "`distify launch` reads):\n    distributed_type: MULTI_GPU\n") in text.stdout
    facts = json.loads(distify("env", "--json", cwd=tmp_path).stdout)["launch_config"]
    assert (facts["path"], facts["found_as"]) == ("distify_config.yaml", "default")
    (tmp_path / "distify_config.yaml").write_text("distributed_type: MULTI_GPU\nnum_procs: 2\n")
    broken = distify("env", cwd=tmp_path)
    assert ("- Launch config: distify_config.yaml (the default in this folder, which "
            "`distify launch` reads) does not load: distify_config.yaml:2:1: num_procs: "
            "unknown key") in broken.stdout
