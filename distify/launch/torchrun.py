"""From a launch config to a torchrun (``python -m torch.distributed.run``) job, and running it.

One machine runs ``--standalone`` (torchrun picks a free rendezvous port itself), or, when
workers may be restarted, a one-machine static rendezvous on a free port. Several
machines meet either through a static rendezvous (``--nnodes/--node-rank/--master-addr/
--master-port``: each machine knows its rank) or through c10d (``--rdzv-backend c10d
--rdzv-endpoint``: ranks are handed out as machines join). Settings the runtime reads travel in
the environment: ``DISTIFY_MIXED_PRECISION`` (and ``ACCELERATE_MIXED_PRECISION``, so a script on
Accelerate sees the same choice), ``DISTIFY_USE_CPU``, ``CUDA_VISIBLE_DEVICES`` and, for
``debug``, ``DISTIFY_DEBUG`` (the runtime's own checks) beside ``TORCH_DISTRIBUTED_DEBUG``.

The job runs in the foreground as an argument list, never through a shell. Its console shows
the main process (global rank 0) only: every worker's stdout goes to a file in the launch's log
folder (torchrun's ``--log-dir``/``--redirects``), which :class:`Console` copies to the terminal
for rank 0, or for every rank with a ``[rankN]:`` prefix. Stderr is not redirected: every rank's
errors reach the terminal, filtered and summarised as before, and the log folder keeps it whole.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from distify.errors import UserError
from distify.launch.config import LaunchConfig
from distify.launch.fsdp import FsdpConfig

TORCHRUN = ("-m", "torch.distributed.run")
_FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                   if hasattr(signal, name))


@dataclass(frozen=True)
class LaunchPlan:
    """A job ready to run: the argument list and the variables set on top of the environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str]


def torchrun_args(cfg: LaunchConfig) -> list[str]:
    """torchrun's own options for ``cfg`` (what goes between ``-m torch.distributed.run`` and
    the script).

    Raises:
        UserError: a job on several machines lacks ``main_process_ip`` or ``main_process_port``.
    """
    args = ["--nproc-per-node", str(cfg.nproc_per_node)]
    if cfg.num_machines == 1 and cfg.max_restarts:
        # torchrun's --standalone rendezvous hands restarted Gloo workers their peers' stale
        # addresses (torch 2.13: the restart fails to connect); a static rendezvous on one
        # port restarts cleanly.
        port = cfg.main_process_port or _free_port()
        args[:0] = ["--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
                    "--master-port", str(port)]
    elif cfg.num_machines == 1:
        args[:0] = ["--standalone"]
    else:
        ip, port = _main_process(cfg)
        args[:0] = ["--nnodes", str(cfg.num_machines)]
        if cfg.rdzv_backend == "c10d":
            args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{ip}:{port}"]
        else:
            args += ["--node-rank", str(cfg.machine_rank), "--master-addr", ip,
                     "--master-port", str(port)]
    if cfg.max_restarts:
        args += ["--max-restarts", str(cfg.max_restarts)]
    return args


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_env(cfg: LaunchConfig) -> dict[str, str]:
    """The environment variables a job of ``cfg`` needs, beyond the ones torchrun sets."""
    env = {"DISTIFY_MIXED_PRECISION": cfg.mixed_precision,
           "ACCELERATE_MIXED_PRECISION": cfg.mixed_precision}
    if cfg.on_cpu:
        env["DISTIFY_USE_CPU"] = "1"
        env["ACCELERATE_USE_CPU"] = "true"
    elif cfg.gpu_ids != "all":
        env["CUDA_VISIBLE_DEVICES"] = cfg.gpu_ids
    if cfg.debug:
        # What Accelerate's "debug" means: collectives are checked for mismatches across ranks.
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        env["ACCELERATE_DEBUG_MODE"] = "true"
        # distify's runtime: the ranks' collectives are fingerprinted and their weights compared.
        env["DISTIFY_DEBUG"] = "1"
    if cfg.distributed_type == "FSDP":
        # Accelerate's variables, which the runtime reads (so `accelerate launch` works too).
        env["DISTIFY_STRATEGY"] = "fsdp"
        env.update((cfg.fsdp_config or FsdpConfig()).env())
    if importlib.util.find_spec("numpy") is None:
        env["PYTHONWARNINGS"] = _quiet_numpy_warning(os.environ.get("PYTHONWARNINGS", ""))
    return env


# torch warns at import when NumPy is missing (which torch does not require, nor the runtime):
# once in torchrun and once in every worker, on every launch. Nothing in the job needs NumPy, so
# the warning says nothing the user can act on; the filter is added only where NumPy is missing.
_NUMPY_WARNING = "ignore:Failed to initialize NumPy:UserWarning"


def _quiet_numpy_warning(existing: str) -> str:
    """``PYTHONWARNINGS`` with the filter for torch's missing-NumPy warning added."""
    filters = [f for f in existing.split(",") if f.strip()]
    # the last filter given wins: a user's blanket "error" must not turn this one into an error
    return ",".join([*filters, _NUMPY_WARNING]) if _NUMPY_WARNING not in filters else existing


def build_plan(cfg: LaunchConfig, script: str, script_args: Sequence[str] = (), *,
               python: str = sys.executable, log_dir: str | None = None) -> LaunchPlan:
    """The torchrun job that runs ``script script_args...`` as ``cfg`` describes.

    Args:
        cfg: a validated launch config.
        script: path of the training script.
        script_args: passed to the script unchanged.
        python: the interpreter that runs torchrun (and so the workers).
        log_dir: the launch's log folder: every worker's stdout goes to a file there (see
            :class:`Console`), not to the terminal. None: the workers share the terminal.
    """
    args = torchrun_args(cfg)
    env = launch_env(cfg)
    if log_dir is not None:
        args += ["--log-dir", log_dir, "--redirects", "1"]
        # The runtime lets writes there through (``_audit``), and line-buffers stdout, a file
        # now, as Python does a terminal: rank 0's prints reach the console as they come.
        env["DISTIFY_LOG_DIR"] = log_dir
    argv = (python, *TORCHRUN, *args, script, *script_args)
    return LaunchPlan(argv=argv, env=env)


def render_plan(plan: LaunchPlan) -> str:
    """The plan as shell lines to read or paste (display only: the job never uses a shell)."""
    lines = [f"export {name}={shlex.quote(value)}" for name, value in plan.env.items()]
    return "\n".join([*lines, shlex.join(plan.argv)]) + "\n"


@dataclass(frozen=True)
class JobResult:
    """How a job ended: torchrun's exit code, whether Ctrl-C ended it, and its stderr's log."""

    code: int
    interrupted: bool
    log: str


@dataclass(frozen=True)
class Console:
    """Which workers' stdout reaches the terminal; every worker's stays in ``log_dir``
    (``<run id>_<suffix>/attempt_<n>/<local rank>/stdout.log``, torchrun's layout).

    ``first_rank`` is the global rank of this machine's local rank 0 (``machine_rank`` ×
    processes per machine, as torchrun's static rendezvous numbers them), or None where ranks
    are handed out as machines join (c10d): then the workers' environments say which one is
    rank 0 (read from ``/proc``; where there is no ``/proc``, no worker's stdout is shown).
    """

    log_dir: str
    all_ranks: bool = False
    first_rank: int | None = 0


def console_for(cfg: LaunchConfig, log_dir: str, *, all_ranks: bool = False) -> Console:
    """The console of a ``cfg`` job on this machine: the main process only (global rank 0,
    which may run on another machine), or every local process with ``all_ranks``."""
    if cfg.num_machines > 1 and cfg.rdzv_backend == "c10d":
        return Console(log_dir, all_ranks, None)
    return Console(log_dir, all_ranks, cfg.machine_rank * cfg.nproc_per_node)


class _StdoutCopy(threading.Thread):
    """Copies the workers' stdout files to ``out`` as they grow (looked at every 50 ms): global
    rank 0's as it is, or with ``all_ranks`` every local worker's, each line prefixed with
    ``[rankN]: `` (the prefix torch gives their stderr). After a restart it follows torchrun's
    newest attempt. Bytes are copied as written: ``\\r`` progress lines stay progress lines."""

    def __init__(self, console: Console, torchrun_pid: int, out) -> None:
        super().__init__(name="distify-stdout", daemon=True)
        self.console, self.torchrun_pid, self.out = console, torchrun_pid, out
        self.ended = threading.Event()
        self.muted = False
        self.attempt: Path | None = None
        self.ranks: dict[int, int] = {}  # local rank -> global rank, in this attempt
        self.files: dict[int, list] = {}  # local rank -> [file, prefix, at a line's start]
        self.open_line: int | None = None  # the worker whose line the terminal is in
        self.next_lookup = 0.0

    def mute(self) -> None:
        self.muted = True

    def finish(self) -> None:
        """The job ended: copy what is left, then stop."""
        self.ended.set()
        self.join(timeout=10)

    def run(self) -> None:
        try:
            while True:
                last = self.ended.is_set()  # set before the final pass, which drains
                self._follow()
                copied = self._copy()
                if last:
                    return
                if not copied:
                    self.ended.wait(0.05)
        finally:
            for entry in self.files.values():
                entry[0].close()

    def _follow(self) -> None:
        """Open the shown workers' files of the newest attempt once they exist."""
        attempts = sorted(Path(self.console.log_dir).glob("*/attempt_*"),
                          key=lambda path: int(path.name.rpartition("_")[2] or 0))
        if attempts and attempts[-1] != self.attempt:
            self._copy()  # the previous attempt's last lines first
            for entry in self.files.values():
                entry[0].close()
            self.attempt, self.ranks, self.files = attempts[-1], {}, {}
            self.open_line, self.next_lookup = None, 0.0
        if self.attempt is None:
            return
        if self._replaced():
            self._copy()  # the old files' last lines
            for entry in self.files.values():
                entry[0].close()
            self.ranks, self.files, self.open_line, self.next_lookup = {}, {}, None, 0.0
        locals_ = [int(p.name) for p in self.attempt.iterdir() if p.name.isdigit()]
        if len(self.ranks) < len(locals_) and time.monotonic() >= self.next_lookup:
            self.ranks = self._global_ranks(locals_)
            self.next_lookup = time.monotonic() + 0.5  # c10d: /proc read twice a second at most
        for local, rank in self.ranks.items():
            if local in self.files or not (self.console.all_ranks or rank == 0):
                continue
            with contextlib.suppress(OSError):
                prefix = f"[rank{rank}]: ".encode() if self.console.all_ranks else b""
                stdout = open(self.attempt / str(local) / "stdout.log", "rb")  # noqa: SIM115
                self.files[local] = [stdout, prefix, True]

    def _replaced(self) -> bool:
        """Whether torchrun made the attempt's files anew: an agent whose own workers did not
        fail restarts them under the same attempt number, and torchrun deletes its folder."""
        for local, entry in self.files.items():
            try:
                if os.stat(self.attempt / str(local) / "stdout.log").st_ino != \
                        os.fstat(entry[0].fileno()).st_ino:
                    return True
            except OSError:
                return True
        return False

    def _global_ranks(self, locals_: list[int]) -> dict[int, int]:
        first = self.console.first_rank
        if first is not None:
            return {local: first + local for local in locals_}
        return _worker_ranks(self.torchrun_pid)

    def _copy(self) -> bool:
        copied = False
        for local, entry in self.files.items():
            while chunk := entry[0].read(65536):
                copied = True
                if entry[1]:
                    chunk = self._own_line(local, entry, chunk)
                if not self.muted:
                    with contextlib.suppress(OSError, ValueError):
                        self.out.write(chunk)
        if copied and not self.muted:
            with contextlib.suppress(OSError, ValueError):
                self.out.flush()
        return copied

    def _own_line(self, local: int, entry: list, chunk: bytes) -> bytes:
        """``chunk`` prefixed, on a line of its own: another worker's unfinished line (a
        progress line) is ended first."""
        start = b""
        if self.open_line not in (None, local):
            start = b"\n"
            self.files[self.open_line][2] = True
            entry[2] = True
        chunk, entry[2] = _prefixed(chunk, entry[1], entry[2])
        self.open_line = None if entry[2] else local
        return start + chunk


_LINE_END = re.compile(rb"(\r\n|\r|\n)")


def _prefixed(data: bytes, prefix: bytes, at_start: bool) -> tuple[bytes, bool]:
    """``data`` with ``prefix`` at the start of each of its lines, ``\\r`` ending a line too (a
    progress line keeps its prefix); the first only if ``at_start`` (else it continues a
    line). Also returns whether ``data`` ends at a line's end."""
    out = []
    pieces = _LINE_END.split(data)
    for text, end in zip(pieces[::2], [*pieces[1::2], b""]):
        if text or end:
            out += [prefix if at_start else b"", text, end]
            at_start = bool(end)
    return b"".join(out), at_start


def hidden_output_note(console: Console) -> str | None:
    """One line naming the workers whose stdout the console left out and where it is, or None
    when none wrote any (or every one was shown)."""
    if console.all_ranks:
        return None
    runs = sorted(Path(console.log_dir).glob("*/attempt_*"),
                  key=lambda path: int(path.name.rpartition("_")[2] or 0))
    if not runs:
        return None
    wrote = sorted(int(p.parent.name) for p in runs[-1].glob("*/stdout.log")
                   if p.parent.name.isdigit() and p.stat().st_size)
    first = console.first_rank
    where = f"each process's is in <local rank>/stdout.log of {runs[-1]}"
    if first is None:  # c10d: which local process was rank 0 is not known here any more
        return (f"the console showed the main process's stdout (--all-ranks shows all); "
                f"{where}" if wrote else None)
    hidden = [local for local in wrote if first + local != 0]
    if not hidden:
        return None
    who = ", ".join(f"rank {first + local}" for local in hidden)
    return (f"not shown here: {who}'s stdout (the console shows the main process's; "
            f"--all-ranks shows all); {where}")


def _worker_ranks(torchrun_pid: int) -> dict[int, int]:
    """Local rank -> global rank of torchrun's workers, from their environments (Linux)."""
    ranks = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                stat = Path(entry.path, "stat").read_text()
                if int(stat.rpartition(")")[2].split()[1]) != torchrun_pid:
                    continue
                env = dict(item.split("=", 1) for item in
                           Path(entry.path, "environ").read_bytes().decode(errors="replace")
                           .split("\0") if "=" in item)
                ranks[int(env["LOCAL_RANK"])] = int(env["RANK"])
            except (OSError, ValueError, KeyError, IndexError):
                continue
    return ranks


def run_plan(plan: LaunchPlan, *, console: Console | None = None,
             waiting_notice: str | None = None, notice_after: float = 10.0) -> JobResult:
    """Run the job in the foreground; its stderr (torchrun's and the workers') is streamed as it
    comes and kept, whole, in a log file for :func:`failure_summary` (``stderr.log`` in the
    console's log folder, when there is one). ``console`` copies the workers' stdout, which the
    plan sends to files (``build_plan(log_dir=...)``), to ours as it comes.

    What reaches the terminal leaves out what the summary says better (see
    :class:`_TerminalFilter`): torchrun's own failure report, tracebacks of the runtime's
    one-line errors (``DistifyError``), and everything after a Ctrl-C.

    The job gets its own session, so a Ctrl-C in the terminal reaches torchrun exactly once:
    through this process, which forwards SIGINT, SIGTERM and SIGHUP to it and keeps waiting
    while torchrun shuts its workers down. The exit code is 128 + N if killed by signal N,
    and 130 after a Ctrl-C.

    Args:
        plan: the job.
        console: which workers' stdout to show; None: the plan's workers write to the terminal.
        waiting_notice: printed once if nothing reaches stderr for ``notice_after`` seconds
            (a worker machine silently waiting for its main machine).
        notice_after: seconds.
    """
    if console is not None:
        log = open(Path(console.log_dir) / "stderr.log", "wb")  # noqa: SIM115
    else:
        log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="distify-launch-", suffix=".log", delete=False)
    with log:
        code, interrupted = _run(plan, log, console, waiting_notice, notice_after)
    return JobResult(code=code, interrupted=interrupted, log=log.name)


def _run(plan: LaunchPlan, log, console: Console | None, waiting_notice: str | None,
         notice_after: float) -> tuple[int, bool]:
    try:
        child = subprocess.Popen(plan.argv, env={**os.environ, **plan.env},
                                 start_new_session=True, stderr=subprocess.PIPE)
    except OSError as err:
        raise UserError(f"cannot start {plan.argv[0]}: {err.strerror}") from None
    shown = _StdoutCopy(console, child.pid, sys.stdout.buffer) if console else None
    if shown is not None:
        shown.start()
    heard = threading.Event()
    terminal = _TerminalFilter(sys.stderr.buffer)
    pump = threading.Thread(target=_tee, args=(child.stderr, log, terminal, heard), daemon=True)
    pump.start()
    interrupted = []

    def forward(signum: int, _frame: object) -> None:
        if signum == signal.SIGINT:
            interrupted.append(signum)
            terminal.mute()  # the workers' KeyboardInterrupt tracebacks: summed up after
            if shown is not None:
                shown.mute()
        if child.poll() is None:
            child.send_signal(signum)

    previous = {}
    try:
        for signum in _FORWARDED:
            previous[signum] = signal.signal(signum, forward)
    except ValueError:
        pass  # not the main thread: signals stay with whoever owns them
    try:
        if waiting_notice and not heard.wait(notice_after) and child.poll() is None:
            print(f"distify: {waiting_notice}", file=sys.stderr, flush=True)
        code = _wait(child, interrupted)
        pump.join(timeout=10)  # a worker outliving torchrun may hold the pipe open
        if shown is not None:
            shown.finish()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if interrupted:
        return 130, True
    return (code if code >= 0 else 128 - code), False


# torchrun blocked in a rendezvous (a worker machine waiting for its main machine) does not
# act on signals: after a Ctrl-C it gets this long, then the job's process group is killed.
_INTERRUPT_GRACE = 15.0


def _wait(child: subprocess.Popen, interrupted: list) -> int:
    deadline = None
    while True:
        try:
            return child.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        if interrupted and deadline is None:
            deadline = time.monotonic() + _INTERRUPT_GRACE
        if deadline is not None and time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)


def _tee(source, log, terminal: _TerminalFilter, heard: threading.Event) -> None:
    """Copy the job's stderr to the log, whole, and through ``terminal`` to ours as it comes."""
    try:
        while chunk := os.read(source.fileno(), 65536):
            heard.set()
            log.write(chunk)
            terminal.feed(chunk)
    finally:
        terminal.close()


# torch prefixes what a worker writes to stderr with its rank once its process group exists.
_RANK = re.compile(r"^\[rank(\d+)\]:\s?")
_FRAME = re.compile(r'^\s*File "(.+)", line (\d+), in ')
_TRACEBACK = "Traceback (most recent call last):"
# The runtime's errors say in one line what is wrong and how to fix it; their tracebacks (one
# per rank) add nothing but length, and the summary names the first.
_ONE_LINE_ERRORS = re.compile(r"^(distify\.runtime\._errors\.)?Distify(Type)?Error: ")
_CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
# torchrun's log lines about workers it stops or saw fail: the summary says it in words.
_TORCHRUN_NOISE = re.compile(r"^[IWE]\d{4} [\d:.]+ +\d+ torch/distributed/elastic/"
                             r"multiprocessing/api\.py:\d+\] (Sending process \d+ closing signal"
                             r"|failed \(exitcode: )")


_MAY_BE_LEFT_OUT = re.compile(rb"\[|T|[IWE]\d")


class _TerminalFilter:
    """What of the job's stderr reaches the terminal; the log keeps everything.

    Line by line, it leaves out torchrun's own failure report (its ``ChildFailedError``
    traceback and the ``====`` block: :func:`failure_summary` says which rank failed and how),
    torchrun's "closing signal" and "failed (exitcode" lines, the tracebacks of the runtime's
    one-line errors (the summary quotes the error), and, once :meth:`mute` is called (Ctrl-C),
    everything. A traceback is held until its last line says what it is; any other one is
    shown whole. Text without a newline yet (a progress bar) is shown at once, unless it may
    start a traceback or a torchrun line.
    """

    def __init__(self, out) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.muted = False
        self.pending = b""  # the current line's text not yet decided on
        self.shown = False  # part of the current line is already on the terminal
        self.held: dict[int | None, list[bytes]] = {}  # a traceback in progress, by rank
        self.report = 0  # inside torchrun's report: "====" lines seen so far

    def mute(self) -> None:
        with self.lock:
            self.muted = True

    def feed(self, chunk: bytes) -> None:
        with self.lock:
            if self.muted:
                return
            *lines, self.pending = (self.pending + chunk).split(b"\n")
            for raw in lines:
                self._line(raw + b"\n")
            if self.pending and (self.shown or self._partial_is_plain(self.pending)):
                self._write(self.pending)
                self.pending, self.shown = b"", True
            self.out.flush()

    def close(self) -> None:
        """The job's stderr ended: show what was held back (a traceback cut short)."""
        with self.lock:
            if not self.muted:
                for lines in self.held.values():
                    self._write(b"".join(lines))
                self._write(self.pending)
                self.out.flush()
            self.held, self.pending = {}, b""

    def _write(self, data: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.out.write(data)

    def _partial_is_plain(self, raw: bytes) -> bool:
        """Whether text without its newline yet can be shown now: not if it may begin a line
        that is left out (a traceback, a torchrun log line), nor inside a held block."""
        if self.held or self.report:
            return False
        return b"\r" in raw or not _MAY_BE_LEFT_OUT.match(raw)

    def _line(self, raw: bytes) -> None:
        if self.shown:  # the rest of a line already begun on the terminal
            self._write(raw)
            self.shown = False
            return
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        if self.report:
            if text.startswith("=") and not text.strip("="):
                self.report += 1
                if self.report == 3:  # the block's closing line
                    self.report = 0
            return
        match = _RANK.match(text)
        rank = int(match.group(1)) if match else None
        body = text[match.end():] if match else text
        if rank in self.held:
            self.held[rank].append(raw)
            if body.startswith((" ", "\t")) or not body.strip():
                return
            lines = self.held.pop(rank)
            if body.startswith(_CHILD_FAILED):
                self.report = 1
            elif not _ONE_LINE_ERRORS.match(body):
                self._write(b"".join(lines))
            return
        if body.startswith(_TRACEBACK):
            self.held[rank] = [raw]
        elif not _TORCHRUN_NOISE.match(text):
            self._write(raw)


def failure_summary(result: JobResult, script: str) -> list[str]:
    """Short lines that end a failed job: the rank that failed first and how (a Python
    exception and the line of ``script`` it was at, a signal, or an exit code), then the exit
    code (see :func:`job_exit_code`) and where the full log is."""
    text = Path(result.log).read_text(encoding="utf-8", errors="replace")
    cause = _root_cause(text)
    lines = []
    if cause is not None and cause[1] < 0:
        rank, code = cause
        lines.append(f"rank {rank} was killed by {_signal_name(-code)} (exit {code}): "
                     f"{_KILLED_HINT.get(-code, 'killed from outside the job?')}")
    elif (first := _first_traceback(text)) is not None:
        rank, frames, exception = first
        who = f"rank {rank}" if rank is not None else "a process"
        lines.append(f"{who} failed first: {exception}")
        target = os.path.realpath(script)
        at_script = [(path, line, code) for path, line, code in frames
                     if os.path.realpath(path) == target]
        if at_script:
            _, line, code = at_script[-1]
            lines.append(f"  at {script}:{line}: {code}")
    elif cause is not None:
        lines.append(f"rank {cause[0]} exited with code {cause[1]}")
    code = job_exit_code(result)
    own = f" (rank {cause[0]}'s own)" if cause is not None and code != result.code else ""
    lines.append(f"the job failed with exit code {code}{own}; its full stderr, every rank's: "
                 f"{result.log}")
    return lines


_KILLED_HINT = {signal.SIGKILL: "out of memory or preempted?",
                signal.SIGTERM: "stopped from outside (preempted, or a time limit)?",
                signal.SIGSEGV: "a crash in native code (a library, a driver)?",
                signal.SIGABRT: "a crash in native code (a library, a driver)?",
                signal.SIGBUS: "a crash in native code, or /dev/shm full?"}


def job_exit_code(result: JobResult) -> int:
    """The exit code ``distify launch`` returns: the code of the worker that failed first
    (torchrun's root cause; 128 + N for one killed by signal N), else torchrun's own."""
    if result.interrupted or not result.code:
        return result.code
    cause = _root_cause(Path(result.log).read_text(encoding="utf-8", errors="replace"))
    if cause is None or cause[1] == 0:
        return result.code
    return cause[1] if cause[1] > 0 else 128 - cause[1]


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# One failure in torchrun's report ("Failures:" and "Root Cause (first observed failure):").
_REPORTED = re.compile(r"^\[\d+\]:\n  time +: (\S+)\n(?:  .*\n)*?  rank +: (\d+)[^\n]*\n"
                       r"(?:  .*\n)*?  exitcode +: (-?\d+)", re.MULTILINE)
_ROOT = "Root Cause (first observed failure):"
# Signals torchrun itself sends to the workers it stops once one has failed.
_STOPPING = (signal.SIGTERM, signal.SIGINT)


def _root_cause(text: str) -> tuple[int, int] | None:
    """(rank, exit code) of the worker that failed first by torchrun's report.

    torchrun's root cause is the earliest failure to the second, ties going to the lowest
    local rank: a rank killed by a signal (the OOM killer, a preemption) and a rank that then
    fails on the lost connection often tie, and the report names the second. So a worker
    killed by a signal other than torchrun's own SIGTERM within 2 seconds of the root cause
    is named instead."""
    root_at = text.rfind(_ROOT)
    if root_at < 0:
        return None
    base = max(text.rfind("Failures:", 0, root_at), 0)
    entries = [(match.start() > root_at, _seconds(match.group(1)),
                int(match.group(2)), int(match.group(3)))
               for match in _REPORTED.finditer(text, base)]
    root = next(((when, rank, code) for is_root, when, rank, code in entries if is_root), None)
    if root is None:
        return None
    when, rank, code = root
    if code >= 0:
        for _, other_when, other_rank, other_code in entries:
            if (other_code < 0 and -other_code not in _STOPPING and None not in (when, other_when)
                    and abs(other_when - when) <= 2):
                return other_rank, other_code
    return rank, code


def _seconds(stamp: str) -> float | None:
    """torchrun's failure time (2026-12-03_09:20:09) in seconds, or None."""
    import datetime

    try:
        return datetime.datetime.strptime(stamp, "%Y-%m-%d_%H:%M:%S").timestamp()
    except ValueError:
        return None


def interrupt_summary(result: JobResult, script: str) -> list[str]:
    """One line per rank at most after a Ctrl-C: the line of ``script`` it was stopped at."""
    lines = []
    target = os.path.realpath(script)
    for rank, frames, exception in _tracebacks(Path(result.log).read_text(
            encoding="utf-8", errors="replace")):
        if rank is None or not exception.startswith("KeyboardInterrupt"):
            continue
        at_script = [(line, code) for path, line, code in frames
                     if os.path.realpath(path) == target]
        if at_script and not any(line.startswith(f"rank {rank} ") for line in lines):
            lines.append(f"rank {rank} stopped at {script}:{at_script[-1][0]}: "
                         f"{at_script[-1][1]}")
    return sorted(lines, key=lambda line: int(line.split()[1]))


def _first_traceback(text: str):
    """(rank or None, [(path, line, code)], 'Type: message') of the first traceback a worker
    printed, skipping torchrun's own (whose frames are all in torch)."""
    for rank, frames, exception in _tracebacks(text):
        if not all("/torch/" in path or path.startswith("<") for path, _, _ in frames):
            return rank, frames, exception
    return None


def _tracebacks(text: str) -> list:
    """Every traceback in ``text``, in the order they end: (rank or None, frames, exception)."""
    streams: dict[int | None, list[str]] = {}
    done = []
    for raw in text.splitlines():
        match = _RANK.match(raw)
        rank = int(match.group(1)) if match else None
        line = raw[match.end():] if match else raw
        if line.startswith(_TRACEBACK):
            streams[rank] = []
        elif rank in streams:
            if line.startswith((" ", "\t")) or not line.strip():
                streams[rank].append(line)
            else:
                done.append((rank, _frames(streams.pop(rank)), line.strip()))
    return done


def _frames(lines: list[str]) -> list[tuple[str, int, str]]:
    frames = []
    for i, line in enumerate(lines):
        match = _FRAME.match(line)
        if match:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            frames.append((match.group(1), int(match.group(2)), code))
    return frames


def _main_process(cfg: LaunchConfig) -> tuple[str, int]:
    missing = [f"--{key}" for key in ("main_process_ip", "main_process_port")
               if getattr(cfg, key) is None]
    if missing:
        raise UserError(f"a job on {cfg.num_machines} machines needs {' and '.join(missing)} "
                        "(the address and port of the machine with machine_rank 0)")
    return cfg.main_process_ip, cfg.main_process_port
