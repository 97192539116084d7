"""`distify test`: a short job on N processes of this machine that checks the distributed set-up.

Like ``accelerate test``: the job (:mod:`distify.selftest_job`) is copied into a temporary folder
and run through torchrun exactly as ``distify launch`` runs a script (the same launch config,
plan and environment), with its output captured. The main process's ``<check>: ok`` lines are
shown as they come; on a failure, a crash or a hang the command names the check, shows the tail
of the job's output and exits 1.

What it deliberately does not do: test several machines, mixed precision, or the user's own
launch config (``distify launch --dry-run`` shows what that would run).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from distify.errors import UserError

#: the job's checks, in order (``selftest_job.CHECKS``: not imported here, it imports torch)
CHECKS = ("all-reduce", "DDP step", "save/load", "gather_for_metrics")
_STEPS = ("start-up", *CHECKS)
_RESULT = re.compile(rf"^({'|'.join(map(re.escape, _STEPS))}): (ok|FAILED)\b(.*)$")
#: how long a collective may wait for a lost peer inside the job (seconds)
JOB_COLLECTIVE_TIMEOUT = "60"
_TAIL_LINES = 30
_LAUNCHER = "torch/distributed/run.py"  # a frame of torchrun itself
_BANNER = re.compile(r"^(\*+|Setting OMP_NUM_THREADS environment variable .*|\s*)$")
_STOP_WAIT_S = 40  # torchrun gives its workers 30 s to stop after a SIGTERM


@click.command(
    name="test",
    epilog="""\b
Examples:
  distify test                       # 2 processes: on the GPUs, or on CPUs where there are none
  distify test --cpu --num_processes 4
  distify test --timeout 600         # a slow or busy machine

\b
Exit status: 0 every check passed, 1 a check failed (or the job crashed or hung), 2 usage error.
""",
)
@click.option("--num_processes", "--num-processes", "num_processes", type=click.IntRange(1),
              default=2, show_default=True, help="Processes to start on this machine.")
@click.option("--cpu", "use_cpu", is_flag=True,
              help="Run on CPUs (Gloo) even where GPUs are present.")
@click.option("--timeout", type=click.IntRange(1), default=180, show_default=True,
              metavar="SECONDS", help="Stop the job and fail after this long.")
def test(num_processes: int, use_cpu: bool, timeout: int) -> None:
    """Check that N processes on this machine can train together.

    Runs a small job through torchrun, as `distify launch` would, that checks an all-reduce, one
    DDP step of a prepared model (gradients averaged, weights bit-identical on every rank), a
    checkpoint saved by the main process and loaded by all, and gather_for_metrics over uneven
    shards of a DataLoader. Each check prints one line; nothing else is shown unless one fails.
    """
    from distify.launch.config import local_gpu_count, make_config
    from distify.launch.torchrun import build_plan

    if importlib.util.find_spec("torch") is None:
        raise UserError(f"distify test needs torch, which this Python ({sys.executable}) "
                        "does not have: pip install torch")
    gpus = local_gpu_count()
    on_cpu = use_cpu or gpus == 0
    if not on_cpu and gpus < num_processes:
        raise UserError(f"{num_processes} processes need {num_processes} GPUs but {gpus} "
                        f"{'is' if gpus == 1 else 'are'} visible: run `distify test --cpu`, or "
                        f"`distify test --num_processes {gpus}`")
    cfg = make_config(num_processes=num_processes, use_cpu=on_cpu)
    where = "CPUs" if on_cpu else "GPUs"
    processes = f"{num_processes} process{'es' if num_processes > 1 else ''}"
    click.echo(f"distify test: {processes} on {where} through torchrun "
               f"(at most {timeout} s)")
    with tempfile.TemporaryDirectory(prefix="distify-test-") as folder:
        script = Path(folder) / "selftest_job.py"
        script.write_bytes(_job_source())
        plan = build_plan(cfg, str(script))
        job = run_job(plan.argv, {**os.environ, **plan.env, **_job_env()}, timeout,
                      cwd=folder, on_line=_echo_ok)
    failure = failure_message(job, timeout)
    if failure is None:
        click.echo(f"distify test: {len(CHECKS)} checks passed on {job.setup}")
        return
    click.echo(f"distify test: FAILED: {failure}", err=True)
    click.echo("distify test: the last lines of the job's output:", err=True)
    for line in workers_tail(job.lines):
        click.echo(f"  {line}", err=True)
    click.get_current_context().exit(1)


@dataclass(frozen=True)
class JobResult:
    """What the job did: its exit code (``None`` when it was stopped at the time limit) and
    every line it printed (stdout and stderr of torchrun and the workers, in order)."""

    code: int | None
    lines: tuple[str, ...]

    def results(self) -> list[tuple[str, str, str]]:
        """The (step, ``ok``/``FAILED``, rest of the line) lines, in order."""
        return [match.groups() for match in map(_RESULT.match, self.lines) if match]

    @property
    def setup(self) -> str:
        """``2 processes (gloo, cpu)``, from the job's start-up line."""
        for step, status, rest in self.results():
            if step == "start-up" and status == "ok":
                count, _, details = rest.strip(" ()").partition(", ")
                return f"{count} ({details})"
        return "an unknown set-up"


def failure_message(job: JobResult, timeout: float) -> str | None:
    """Why the job failed, in one line naming the step; ``None`` when every check passed."""
    results = job.results()
    failed = [f"{step}{rest}" for step, status, rest in results if status == "FAILED"]
    if failed:
        return failed[0]
    passed = {step for step, status, _ in results if status == "ok"}
    missing = next((step for step in _STEPS if step not in passed), None)
    if job.code is None:
        return f"{missing or 'the end'}: the job did not finish within {timeout:g} s and was " \
               "stopped (a hang, or a machine too busy: try --timeout 600)"
    if missing:
        return f"{missing}: the job ended (exit code {job.code}) before reporting it"
    if job.code:
        return f"the job exited with code {job.code} after every check passed"
    return None


def run_job(argv: tuple[str, ...], env: dict[str, str], timeout: float, *, cwd: str,
            on_line: Callable[[str], None]) -> JobResult:
    """Run the job, capturing its output line by line; stop it after ``timeout`` seconds.

    It runs in its own session, so a Ctrl-C here stops it (through torchrun, which stops its
    workers) rather than reaching it twice.
    """
    lines: list[str] = []
    try:
        child = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, errors="replace",
                                 start_new_session=True)
    except OSError as err:
        raise UserError(f"cannot start {argv[0]}: {err.strerror}") from None

    def read() -> None:
        for line in child.stdout:  # type: ignore[union-attr]
            lines.append(line.rstrip("\n"))
            on_line(lines[-1])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code: int | None = None
    try:
        code = child.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if child.poll() is None:
            _stop(child)
    reader.join(5)  # a worker that outlived torchrun may still hold the pipe open
    if not reader.is_alive():
        child.stdout.close()  # type: ignore[union-attr]
    return JobResult(code, tuple(lines))


def workers_tail(lines: tuple[str, ...], count: int = _TAIL_LINES) -> list[str]:
    """The job's last ``count`` lines without torchrun's own noise: its OMP_NUM_THREADS banner
    and its Python tracebacks (its summary of the failed workers, with their exit codes and
    signals, stays; so do the workers' own tracebacks)."""
    kept: list[str] = []
    block: list[str] = []  # the traceback being read
    for line in lines:
        if line.startswith("Traceback (most recent call last):"):
            kept += block
            block = [line]
        elif block and line.startswith(" "):
            block.append(line)
        else:
            if block and not any(_LAUNCHER in frame for frame in block):
                kept += [*block, line]
            elif not block and not _BANNER.match(line):
                kept.append(line)
            block = []
    return (kept + block)[-count:]


def _stop(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(_STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _echo_ok(line: str) -> None:
    match = _RESULT.match(line)
    if match and match[1] != "start-up" and match[2] == "ok":
        click.echo(line)


def _job_source() -> bytes:
    spec = importlib.util.find_spec("distify.selftest_job")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).read_bytes()


def _job_env() -> dict[str, str]:
    """What the job needs beyond the launch environment: a bound on every wait, output as it
    happens, and distify importable from the temporary folder."""
    env = {"DISTIFY_TIMEOUT": JOB_COLLECTIVE_TIMEOUT, "PYTHONUNBUFFERED": "1"}
    spec = importlib.util.find_spec("distify")
    assert spec is not None and spec.origin is not None
    root = str(Path(spec.origin).resolve().parent.parent)
    # sys.path[0] is this command's own folder or the current one: the workers will not have it.
    if root not in {str(Path(entry).resolve()) for entry in sys.path[1:] if entry}:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return env
