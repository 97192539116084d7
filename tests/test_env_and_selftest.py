"""`distify env` (facts for a bug report) and `distify test` (a 2-process sanity job), run as a
user runs them: `python -m distify ...` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from distify.cli import main
from distify.commands import selftest
from tests.helpers import clean_env

OK_LINES = ["all-reduce: ok", "DDP step: ok", "save/load: ok", "gather_for_metrics: ok"]


def _distify(*args: str, cwd: Path, timeout: float = 300,
             **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distify", *args], cwd=cwd,
                          env=clean_env(**env), capture_output=True, text=True, timeout=timeout)


def _without_torch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from distify.cli import main\nmain(sys.argv[1:])\n")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=120)


def _config_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("- Launch config"))


@pytest.mark.parametrize("command", ["env", "test"])
def test_both_commands_are_listed_and_have_help_with_an_example(command: str) -> None:
    listing = CliRunner().invoke(main, ["--help"])
    assert f"  {command} " in listing.output
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output
    assert f"distify {command}" in result.output.split("Examples:")[1]


def test_env_reports_versions_backends_and_the_relevant_variables(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    proc = _distify("env", cwd=tmp_path, NCCL_DEBUG="INFO", DISTIFY_TIMEOUT="42",
                    MY_API_TOKEN="secret")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "- distify version: 0.1.0" in out
    assert f"- Python: {sys.version.split()[0]} (CPython" in out
    assert f"- torch: {torch.__version__} (" in out
    assert "- CUDA available: no" in out  # CUDA_VISIBLE_DEVICES is empty in clean_env
    assert "- torch.distributed: available (gloo: yes" in out
    assert "; FSDP2 fully_shard: yes)" in out  # torch 2.13 has it, on the CPU too
    assert "    NCCL_DEBUG=INFO" in out and "    DISTIFY_TIMEOUT=42" in out
    assert "    CUDA_VISIBLE_DEVICES=" in out
    assert "secret" not in out
    assert _config_line(out) == "- Launch config: none found (give SCRIPT or --config_file)"


def test_env_json_has_the_same_facts(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    proc = _distify("env", "--json", cwd=tmp_path, NCCL_DEBUG="INFO")
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["distify"]["version"] == "0.1.0"
    assert facts["torch"]["version"] == torch.__version__
    assert facts["torch"]["cuda_available"] is False
    assert facts["torch"]["distributed"]["backends"]["gloo"] is True
    assert facts["environment"]["NCCL_DEBUG"] == "INFO"
    assert facts["launch_config"] == {"path": None, "looked_for": None}


def test_env_shows_the_config_launch_would_use(tmp_path: Path) -> None:
    (tmp_path / "train_dist.py").write_text("print('hi')\n")
    text = ("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
            "num_processes: 4\nmixed_precision: bf16\n")
    (tmp_path / "train_dist.yaml").write_text(text)
    (tmp_path / "other.yaml").write_text(text.replace("num_processes: 4", "num_processes: 2"))

    beside = _distify("env", "train_dist.py", cwd=tmp_path)
    assert beside.returncode == 0, beside.stderr
    assert "- Launch config: train_dist.yaml:\n    compute_environment: LOCAL_MACHINE\n" \
           "    distributed_type: MULTI_GPU\n    num_processes: 4\n" in beside.stdout

    given = _distify("env", "--config_file", "other.yaml", "--json", "train_dist.py",
                     cwd=tmp_path)
    assert json.loads(given.stdout)["launch_config"] == {"path": "other.yaml",
                                                         "content": (tmp_path / "other.yaml")
                                                         .read_text()}

    missing = _distify("env", "nothing_beside.py", cwd=tmp_path)
    assert _config_line(missing.stdout) == \
        "- Launch config: none found (no nothing_beside.yaml beside the script)"


@pytest.mark.parametrize(("content", "error"), [
    pytest.param("distributed_type: MULTI_GPU\nnum_processes: [2\n",
                 "bad.yaml:3:1: malformed YAML: ", id="malformed-yaml"),
    pytest.param("distributed_type: MULTI_GPU\nnum_procesess: 2\n",
                 "bad.yaml:2:1: num_procesess: unknown key (did you mean 'num_processes'?)",
                 id="unknown-key"),
])
def test_env_shows_a_bad_config_as_its_one_line_error(tmp_path: Path, content: str,
                                                      error: str) -> None:
    (tmp_path / "bad.yaml").write_text(content)
    proc = _distify("env", "--config_file", "bad.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert _config_line(proc.stdout).startswith(f"- Launch config: bad.yaml does not load: {error}")
    assert json.loads(_distify("env", "--json", "--config_file", "bad.yaml",
                               cwd=tmp_path).stdout)["launch_config"]["error"].startswith(error)


def test_env_works_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    proc = _without_torch("env", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "- torch: not installed\n" in proc.stdout
    assert "CUDA available" not in proc.stdout
    assert json.loads(_without_torch("env", "--json", cwd=tmp_path).stdout)["torch"] == \
        {"version": None}


def test_test_needs_torch_and_says_so_in_one_line(tmp_path: Path) -> None:
    proc = _without_torch("test", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"distify: error: distify test needs torch, which this Python ({sys.executable}) does "
        "not have: pip install torch"]


def test_test_runs_two_processes_and_passes_its_four_checks(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = _distify("test", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "distify test: 2 processes on CPUs through torchrun (at most 180 s)", *OK_LINES,
        "distify test: 4 checks passed on 2 processes (gloo, cpu)"]
    assert proc.stderr == ""  # torchrun's banner and logs are captured
    assert list(tmp_path.iterdir()) == []  # the job and its checkpoint lived in a temp folder


def test_a_job_that_cannot_start_fails_naming_the_step_and_the_cause(tmp_path: Path) -> None:
    """A network interface that does not exist (a real cluster misconfiguration)."""
    pytest.importorskip("torch")
    proc = _distify("test", cwd=tmp_path, GLOO_SOCKET_IFNAME="nonexistent0")
    assert proc.returncode == 1
    first, *rest = proc.stderr.splitlines()
    assert first.startswith("distify test: FAILED: start-up on rank ")
    assert first.endswith("Unable to find address for: nonexistent0")
    assert rest[0] == "distify test: the last lines of the job's output:"
    assert "Root Cause (first observed failure):" in proc.stderr  # torchrun's summary stays
    assert "torch/distributed/run.py" not in proc.stderr  # its own traceback does not
    assert not any(line in proc.stdout for line in OK_LINES)


def _job(*lines: str, code: int | None = 1) -> selftest.JobResult:
    return selftest.JobResult(code, ("W1201 torchrun noise", *lines))


@pytest.mark.parametrize(("job", "message"), [
    pytest.param(_job("start-up: ok (2 processes, gloo, cpu)", "all-reduce: ok",
                      "DDP step: FAILED on rank 1: after one step the ranks' parameters differ"),
                 "DDP step on rank 1: after one step the ranks' parameters differ",
                 id="a-check-fails"),
    pytest.param(_job("start-up: ok (2 processes, gloo, cpu)", "all-reduce: ok",
                      "Segmentation fault", code=-11),
                 "DDP step: the job ended (exit code -11) before reporting it", id="a-crash"),
    pytest.param(_job("start-up: ok (2 processes, gloo, cpu)", code=None),
                 "all-reduce: the job did not finish within 60 s and was stopped (a hang, or a "
                 "machine too busy: try --timeout 600)", id="a-hang"),
    pytest.param(_job("start-up: ok (2 processes, gloo, cpu)", *OK_LINES, code=0), None,
                 id="all-pass"),
])
def test_the_failure_names_the_step(job: selftest.JobResult, message: str | None) -> None:
    assert selftest.failure_message(job, 60) == message


def test_the_tail_drops_torchruns_traceback_but_keeps_the_workers() -> None:
    worker = ["Traceback (most recent call last):", '  File "/tmp/job.py", line 3, in <module>',
              "ValueError: boom"]
    launcher = ["Traceback (most recent call last):",
                '  File "/venv/torch/distributed/run.py", line 1032, in <module>',
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    box = ["======", "Root Cause (first observed failure):", "======"]
    banner = ["*****", "Setting OMP_NUM_THREADS environment variable for each process to be 1"
              " in default", "*****"]
    lines = (*banner, *worker, "W1201 closing signal SIGTERM", *launcher, *box)
    assert selftest.workers_tail(lines) == [*worker, "W1201 closing signal SIGTERM", *box]


def test_the_command_knows_the_jobs_checks() -> None:
    pytest.importorskip("torch")
    from distify import selftest_job

    assert selftest.CHECKS == selftest_job.CHECKS


def test_env_renders_a_gpu_machine() -> None:
    """What CI cannot show: the lines of a machine with GPUs (facts as torch reports them)."""
    from types import SimpleNamespace

    from distify.commands import env

    cudnn = SimpleNamespace(is_available=lambda: True, version=lambda: 90100)
    assert env._cudnn_version(SimpleNamespace(backends=SimpleNamespace(cudnn=cudnn))) == "9.1.0"
    facts = env.collect()
    facts["torch"] = {"version": "2.13.0+cu128", "location": "/site/torch",
                      "cuda_available": True, "cuda_build": "12.8", "hip_build": None,
                      "cudnn": "9.1.0", "nccl": "2.27.3", "gpus": ["NVIDIA H200"] * 2,
                      "mps_available": False,
                      "distributed": {"available": True,
                                      "backends": {"gloo": True, "nccl": True, "mpi": False}}}
    text = env.render(facts)
    assert ("- torch: 2.13.0+cu128 (/site/torch)\n- CUDA available: yes (CUDA 12.8)\n"
            "- cuDNN: 9.1.0\n- NCCL: 2.27.3\n- GPUs: 2 (NVIDIA H200, NVIDIA H200)\n"
            "- MPS available: no\n"
            "- torch.distributed: available (gloo: yes, nccl: yes, mpi: no)\n") in text
