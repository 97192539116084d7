"""The runs of ``distify verify``: each in its own temporary copy of the script's folder.

A run on 1 process is ``python SCRIPT`` (what a converted script must match at world size 1:
no launcher). A run on N processes is the torchrun job ``distify launch`` would start
(:func:`distify.launch.torchrun.build_plan`, with its log folder: every rank's stdout lands in
its own file there). Every process is instrumented by ``hooks/sitecustomize.py`` on
``PYTHONPATH`` (see ``hooks/_distify_verify.py``); each run has a timeout, after which its whole
process group is killed.

Files of 16 MiB or more (data sets, checkpoints) are linked into the copy, not copied; a run
that opens one for writing (``open``, ``os.open``, ``torch.save``) first gets a copy of its own
in the link's place (``hooks/_distify_verify.py``), so the user's file is never written. What
that does not cover: native code that writes without an audit event, and files under a linked
folder of the user's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

HOOKS = Path(__file__).resolve().parent / "hooks"
_LINK_FROM = 16 << 20
_SKIP = shutil.ignore_patterns(".git", "__pycache__", ".venv", "venv", ".ipynb_checkpoints")


@dataclass(frozen=True)
class Caps:
    """What the hooks change in a run: ``steps`` caps training DataLoader loops, ``eval_steps``
    evaluation loops (None: whole); ``frozen``: optimizer steps undone, BatchNorm statistics
    kept (check 5's runs)."""

    steps: int | None = None
    eval_steps: int | None = None
    frozen: bool = False
    loose_steps: int | None = None  # a loop without a DataLoader (None: ``steps``)

    def spread(self, processes: int, ranks: int) -> Caps:
        """Check 5's frozen runs: the DataLoader caps of a run on ``processes`` processes that
        together read what a run on ``ranks`` processes reads (a sharded loader gives each rank
        its slice of each global batch, so k batches on each of N ranks cover N x k batches of
        one process): ceil(K/N) per rank on N ranks, N x ceil(K/N) on 1."""
        def cap(value: int | None) -> int | None:
            return value and -(-value // ranks) * ranks // processes
        return Caps(cap(self.steps), cap(self.eval_steps), True, self.steps)


@dataclass(frozen=True)
class Run:
    """How one run ended and what its processes recorded."""

    name: str
    processes: int
    folder: Path
    code: int
    timed_out: bool
    seconds: float
    stdout: dict[int, str]  # rank -> its stdout
    stderr: str
    records: dict[int, dict] = field(default_factory=dict)  # rank -> _distify_verify's record
    files: tuple[str, ...] = ()  # written or changed in the folder, relative paths
    log: str | None = None  # the job's stderr as a file (for failure_summary), N processes
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> its threads' stacks, taken
    # just before a run that timed out was stopped (faulthandler's text; see the hooks)

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.timed_out


def copy_folder(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` (big files linked, not copied: see the module docstring)."""

    def copy(src: str, dst: str) -> str:
        if os.path.getsize(src) >= _LINK_FROM:
            os.symlink(os.path.abspath(src), dst)
            return dst
        return shutil.copy2(src, dst)

    shutil.copytree(source, target, ignore=_SKIP, copy_function=copy, symlinks=True)


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    found = {}
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and "__pycache__" not in path.parts:
            stat = path.stat()
            found[path.relative_to(folder).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


def _env(records: Path, script: Path, caps: Caps, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTIFY_VERIFY")}
    env.update(extra)
    python_path = [str(HOOKS), *filter(None, [env.get("PYTHONPATH")])]
    env.update({"PYTHONPATH": os.pathsep.join(python_path), "DISTIFY_VERIFY_DIR": str(records),
                "DISTIFY_VERIFY_SCRIPT": str(script), "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1"})
    if caps.steps:
        env["DISTIFY_VERIFY_STEPS"] = str(caps.steps)
    if caps.eval_steps:
        env["DISTIFY_VERIFY_EVAL_STEPS"] = str(caps.eval_steps)
    if caps.loose_steps:
        env["DISTIFY_VERIFY_LOOSE_STEPS"] = str(caps.loose_steps)
    if caps.frozen:
        env["DISTIFY_VERIFY_FROZEN"] = "1"
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        env.pop(name, None)  # verify itself run under a launcher: each run starts afresh
    return env


def _execute(argv: Sequence[str], cwd: Path, env: dict[str, str], timeout: float,
             records: Path) -> tuple[int, bool, str, str, float]:
    started = time.monotonic()
    child = subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    timed_out = False
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _ask_for_stacks(records)
        _kill_tree(child.pid)
        out, err = child.communicate()
    except BaseException:  # Ctrl-C: leave nothing running
        _kill_tree(child.pid)
        raise
    seconds = time.monotonic() - started
    return (child.returncode, timed_out, out.decode(errors="replace"),
            err.decode(errors="replace"), seconds)


def _ask_for_stacks(records: Path, wait: float = 2.0) -> None:
    """Ask every process of the run that set up a stack dump (the hooks' ``stack<rank>-<pid>
    .txt``) to write its threads' stacks, and give them ``wait`` seconds to. Only those
    processes are signalled: SIGUSR2 would end any other."""
    asked = False
    for path in records.glob("stack*-*.txt"):
        with contextlib.suppress(ValueError, ProcessLookupError, PermissionError):
            os.kill(int(path.stem.rpartition("-")[2]), signal.SIGUSR2)
            asked = True
    if asked:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not all(
                path.stat().st_size for path in records.glob("stack*-*.txt")):
            time.sleep(0.1)
        time.sleep(0.2)  # the last lines of a dump being written


def _stacks(records: Path, folder: Path) -> dict[int, str]:
    """rank -> the stacks it wrote on request (none: it had ended, or wrote nothing). Of a
    rank's processes (a spawned DataLoader worker starts the hooks too), the one whose stack
    shows the run's folder."""
    found: dict[int, str] = {}
    ours = str(folder.resolve())
    for path in sorted(records.glob("stack*-*.txt")):
        with contextlib.suppress(OSError, ValueError):
            text = path.read_text(errors="replace")
            rank = int(path.stem[len("stack"):].partition("-")[0])
            if text.strip() and (rank not in found or ours not in found[rank]):
                found[rank] = text
    return found


def _kill_tree(pid: int) -> None:
    """Kill ``pid``, its process group and every process below it: torchrun starts each worker
    in a session of its own, which a signal to torchrun's group does not reach (and a worker
    left running would keep our pipes open)."""
    family = _descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for member in family:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(member, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from ``/proc`` (Linux; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = Path(entry.path, "stat").read_text()
                    parent = int(stat.rpartition(")")[2].split()[1])
                    children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _records(directory: Path) -> dict[int, dict]:
    found = {}
    for path in sorted(directory.glob("rank*.json")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            found[int(record["rank"])] = record
    return found


def run_single(name: str, script: Path, folder: Path, args: Sequence[str], *, cpu: bool,
               timeout: float, caps: Caps, work: Path) -> Run:
    """``python script args`` in ``folder`` (the run's copy), 1 process, no launcher; ``cpu``
    hides the GPUs (``CUDA_VISIBLE_DEVICES=""``), as the runtime's ``DISTIFY_USE_CPU`` does."""
    records = work / f"{name}-records"
    records.mkdir(parents=True)
    before = _snapshot(folder)
    code, timed_out, out, err, seconds = _execute(
        [sys.executable, str(script), *args], folder,
        _env(records, script, caps, {"CUDA_VISIBLE_DEVICES": "", "DISTIFY_USE_CPU": "1"}
             if cpu else {}),
        timeout, records)
    return Run(name, 1, folder, code, timed_out, seconds, {0: out}, err, _records(records),
               _changed(folder, before), stacks=_stacks(records, folder) if timed_out else {})


def run_parallel(name: str, script: Path, folder: Path, args: Sequence[str], *, processes: int,
                 cpu: bool, timeout: float, caps: Caps, work: Path) -> Run:
    """The job ``distify launch --num_processes N [--cpu] script args`` runs, in ``folder``."""
    from distify.launch.config import default_config, with_overrides
    from distify.launch.torchrun import build_plan

    records, log_dir = work / f"{name}-records", work / f"{name}-logs"
    records.mkdir(parents=True)
    log_dir.mkdir(parents=True)
    cfg = with_overrides(default_config(), num_processes=processes, use_cpu=cpu or None)
    plan = build_plan(cfg, str(script), list(args), log_dir=str(log_dir))
    before = _snapshot(folder)
    env = _env(records, script, caps, {**plan.env, "DISTIFY_VERIFY_LAUNCHED": "1"})
    code, timed_out, out, err, seconds = _execute(plan.argv, folder, env, timeout, records)
    log = work / f"{name}-stderr.log"
    log.write_text(err)
    return Run(name, processes, folder, code, timed_out, seconds, _rank_stdout(log_dir), err,
               _records(records), _changed(folder, before), str(log),
               _stacks(records, folder) if timed_out else {})


def _rank_stdout(log_dir: Path) -> dict[int, str]:
    """Each local rank's stdout (torchrun's ``<run>/attempt_<n>/<local rank>/stdout.log``; one
    machine, so local rank = global rank); the last attempt's."""
    found: dict[int, str] = {}
    for path in sorted(log_dir.glob("*/attempt_*/*/stdout.log")):
        with contextlib.suppress(OSError, ValueError):
            found[int(path.parent.name)] = path.read_text(errors="replace")
    return found


def _changed(folder: Path, before: dict[str, tuple[int, int]]) -> tuple[str, ...]:
    after = _snapshot(folder)
    return tuple(sorted(name for name, stat in after.items() if before.get(name) != stat))
