"""No silent single-process training (issue 10), in real 2-process runs (torchrun, Gloo on CPU).

With more than one process the runtime refuses gradients that DDP would not average (a loss no
prepared model's forward made, an optimizer stepping parameters outside DDP), unless
DISTIFY_ALLOW_UNSYNCED=1; at world size 1 nothing changes. Debug mode (DISTIFY_DEBUG=1, also set
by `distify launch --debug`) turns drifting replicas and mismatched collectives into errors that
name the parameter or the script lines, within seconds instead of a hang until the timeout.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from tests.helpers import REPO, clean_env, result_line, run_python, run_torchrun

pytestmark = pytest.mark.pool

SCRIPTS = REPO / "tests" / "runtime_scripts"
UNSYNCED = SCRIPTS / "guard_unsynced.py"
MISMATCH = SCRIPTS / "guard_mismatch.py"
#: short, so that a check that does not work fails the test quickly instead of hanging it
# The jobs must end well inside the collective timeout (a hang would last it out); 40 s leaves
# room for a loaded 2-core machine, where these 2-3 s jobs have taken 12 s.
TIMEOUT_S = 40
NO_FORWARD = ("DistifyError: distify.backward: no prepared model ran a training forward since "
              "the last backward, so these gradients are not averaged across the 2 processes")


def _env(**extra: str) -> dict[str, str]:
    return clean_env(DISTIFY_TIMEOUT=str(TIMEOUT_S), **extra)


def _two(script, *args: str, cwd, **env: str) -> subprocess.CompletedProcess:
    return run_torchrun(script, *args, nproc=2, cwd=cwd, env=_env(**env), timeout=180,
                        check=False)


def _seconds_after_start(proc: subprocess.CompletedProcess, ended: float) -> float:
    """From the first rank reaching the checked code ("STARTED <time>") to the job's end."""
    # not anchored to lines: the two processes' prints may share one
    starts = [float(t) for t in re.findall(r"STARTED (\d+\.\d{3})", proc.stdout)]
    assert starts, proc.stdout + proc.stderr
    return ended - min(starts)


def _line(script, mark: str) -> str:
    """``name.py:N`` of the line marked ``# MARK: mark`` in ``script``."""
    for number, text in enumerate(script.read_text().splitlines(), 1):
        if text.endswith(f"# MARK: {mark}"):
            return f"{script.name}:{number}"
    raise AssertionError(f"no line marked {mark} in {script}")


@pytest.mark.parametrize("mode", ["unprepared", "submodule", "method"])
def test_backward_without_a_ddp_forward_is_refused(tmp_path, mode):
    proc = _two(UNSYNCED, mode, cwd=tmp_path)
    assert proc.returncode != 0
    assert NO_FORWARD in proc.stderr
    assert "distify.prepare(model)" in proc.stderr and "DISTIFY_ALLOW_UNSYNCED=1" in proc.stderr
    assert "trained" not in proc.stdout


@pytest.mark.parametrize("precision", ["no", "fp16"])
def test_optimizer_stepping_unprepared_parameters_is_refused(tmp_path, precision):
    # under fp16 the step goes through the GradScaler: the check must hold there too
    proc = _two(UNSYNCED, "extra_params", cwd=tmp_path, DISTIFY_MIXED_PRECISION=precision)
    assert proc.returncode != 0
    assert ("DistifyError: optimizer.step(): 2 parameter tensors with a gradient (shapes (1, 1), "
            "(1,)) belong to no prepared model under DDP") in proc.stderr
    assert "`module = distify.prepare(module)`" in proc.stderr
    assert "trained" not in proc.stdout


def test_layer_unfrozen_after_prepare_is_refused(tmp_path):
    proc = _two(UNSYNCED, "unfrozen", cwd=tmp_path)
    assert proc.returncode != 0
    assert ("the first, Net.out.weight, did not require grad when its model was prepared"
            in proc.stderr)
    assert "trained" not in proc.stdout


def test_allow_unsynced_warns_once_per_cause_and_trains(tmp_path):
    proc = _two(UNSYNCED, "unprepared", cwd=tmp_path, DISTIFY_ALLOW_UNSYNCED="1")
    assert proc.returncode == 0, proc.stderr
    assert "trained 5 steps" in proc.stdout
    assert "DistifyError" not in proc.stderr
    # 5 steps on each of the 2 processes: one warning per cause and process, not one per step
    assert proc.stderr.count("UserWarning: distify.backward: no prepared model") == 2
    assert proc.stderr.count("UserWarning: optimizer.step(): 4 parameter tensors") == 2
    assert proc.stderr.count("DISTIFY_ALLOW_UNSYNCED is set, so training goes on") == 4


@pytest.mark.parametrize("mode", ["unprepared", "submodule", "method", "extra_params",
                                  "unfrozen"])
def test_world_size_1_trains_as_before(tmp_path, mode):
    # DISTIFY_DEBUG changes nothing either: there is no other process to compare with
    proc = run_python(UNSYNCED, mode, cwd=tmp_path, env=_env(DISTIFY_DEBUG="1"))
    assert "trained 5 steps" in proc.stdout
    assert "Warning" not in proc.stderr and "DistifyError" not in proc.stderr


@pytest.mark.parametrize("env", [{}, {"DISTIFY_DEBUG": "1", "DISTIFY_DEBUG_EVERY": "1",
                                      "DISTIFY_MIXED_PRECISION": "fp16"}],
                         ids=["plain", "debug_fp16"])
def test_correct_job_runs_without_error_or_warning(tmp_path, env):
    proc = _two(SCRIPTS / "guard_correct.py", cwd=tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert result_line(proc.stdout) == {"steps": 4, "seen": 32, "gathered": 32, "run": "r0",
                                        "same_weights": True}
    assert "Warning" not in proc.stderr and "DistifyError" not in proc.stderr


@pytest.mark.parametrize("every,when", [
    (None, "equal at backward call 1, compared before backward call 10"),  # the default, 10
    ("1", "equal at backward call 4, compared before backward call 5"),  # edited after step 4
])
def test_debug_mode_stops_replicas_that_diverge(tmp_path, every, when):
    script = SCRIPTS / "guard_diverge.py"
    env = {"DISTIFY_DEBUG": "1", **({"DISTIFY_DEBUG_EVERY": every} if every else {})}
    proc = _two(script, cwd=tmp_path, **env)
    ended = time.time()
    assert proc.returncode != 0
    assert ("DistifyError: distify debug: replicas diverged: Net.head.weight differs from rank "
            "0's on rank 1 (" + when) in proc.stderr
    assert _line(script, "backward") in proc.stderr
    assert "finished" not in proc.stdout
    assert _seconds_after_start(proc, ended) < TIMEOUT_S / 2


def test_debug_mode_names_both_lines_of_mismatched_collectives(tmp_path):
    proc = _two(MISMATCH, "reduce_vs_backward", cwd=tmp_path, DISTIFY_DEBUG="1")
    ended = time.time()
    assert proc.returncode != 0
    assert ("DistifyError: distify debug: mismatched collectives: rank 0 is at reduce(sum, "
            "float32[]) ") in proc.stderr
    assert f"{_line(MISMATCH, 'rank0_reduce')}, rank 1 is at backward (DDP all-reduce) " \
        in proc.stderr
    assert _line(MISMATCH, "rank1_backward") in proc.stderr
    assert _seconds_after_start(proc, ended) < TIMEOUT_S / 2  # not the timeout


def test_launch_debug_names_the_line_a_rank_waits_at_when_the_other_ends(tmp_path):
    # `distify launch --debug`, as a user runs it: rank 1 skips a reduce and reaches the end
    proc = subprocess.run([sys.executable, "-m", "distify", "launch", "--debug", "--cpu",
                           "--num_processes", "2", str(MISMATCH), "skip_reduce"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    ended = time.time()
    assert proc.returncode != 0
    assert "distify debug: mismatched collectives: rank 0 is at reduce(sum, int) " in proc.stderr
    assert f"{_line(MISMATCH, 'skipped_reduce')}, rank 1 is at exit (the script ended)" \
        in proc.stderr
    assert "finished" not in proc.stdout
    # --debug also sets TORCH_DISTRIBUTED_DEBUG=DETAIL, with which DDP on Gloo used to crash
    assert "SIGSEGV" not in proc.stderr
    assert _seconds_after_start(proc, ended) < TIMEOUT_S / 2


@pytest.mark.parametrize("args,config,debug", [
    (["--debug"], None, True),
    ([], {"num_processes": 2, "debug": True}, True),
    (["--num_processes", "2"], None, False),
], ids=["flag", "config", "neither"])
def test_launch_debug_sets_distify_debug_for_the_workers(tmp_path, monkeypatch, args, config,
                                                         debug):
    from distify.cli import main
    from distify.launch.config import make_config, write_config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("distify.launch.config.local_gpu_count", lambda: 0)
    (tmp_path / "train.py").write_text("print('trained')\n")
    if config:
        write_config(make_config(**config), tmp_path / "train.yaml")
    result = CliRunner().invoke(main, ["launch", "--dry-run", *args, "train.py"])
    assert result.exit_code == 0, result.output
    assert ("export DISTIFY_DEBUG=1" in result.output.splitlines()) is debug
