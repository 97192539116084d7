"""A warm worker pool for the tests' script runs: torch imported once, a forked child per rank.

A plain ``python script.py`` or a ``torchrun`` job pays interpreter start-up and ``import torch``
in every process (and torchrun's launcher on top): about 7 s of wall time for a trivial 2-process
job on the test machine. The pool is a server process (this file, run as a script) that imports
torch once and then, per job, forks a *job manager*, which forks one child per rank. Each child
sets up what a fresh process of that job would see, then runs the script:

- the environment: exactly the job's (``os.environ`` replaced), plus for a 2-process job what
  torchrun gives its workers (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
  ``GROUP_RANK``, ``ROLE_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` (a free port per job),
  ``TORCHELASTIC_RUN_ID``, ...); no agent store, so rank 0 hosts the rendezvous store;
- ``cwd``, ``sys.argv``, ``sys.path`` (the script's folder, the job's ``PYTHONPATH``, then the
  server's own site paths), and the job's ``sitecustomize`` (a ``PYTHONPATH`` folder's, as
  Python's start-up would import it: the replica recorder and the device stand-in start there);
- fds 0/1/2: ``/dev/null`` and one capture file each for stdout and stderr, so C-level output is
  captured too;
- a fresh seed for torch's default generator and for numpy's global one when torch imported
  numpy (a fresh process seeds both from the OS; Python's ``random`` reseeds itself after a
  fork).

The script runs as the interpreter runs a main script (``runpy.run_path`` would change
``sys.argv[0]`` and take its ``__main__`` module away afterwards). Its end is mapped like the
interpreter maps it: ``SystemExit`` to its code, an uncaught exception to its traceback on stderr
(through ``sys.excepthook``, with ``sys.last_value`` set) and exit code 1; then non-daemon threads
are joined and the atexit handlers run (the ones ``import torch`` registered in the server are
kept: a fresh process that imports torch has them too; the server registers none of its own),
the streams are flushed and the child leaves with ``os._exit``.

What it deliberately does not do:

- import anything but torch in the server (with what torch imports, and the torch modules of
  ``PRELOAD`` that every DDP job imports lazily; their import reads only ``TORCH*`` and
  ``SYMPY_*`` variables, start-up variables here): not distify (its runtime reads the
  environment at import), not the test's modules; and it runs no torch operation before forking
  (thread pools do not survive a fork; the server checks that it has no thread but its own);
- run jobs whose start-up differs from the server's: a ``PYTHON*`` variable (hash seed,
  warnings, ...), or one of ``torch``'s or OpenMP's (read at ``import torch``) that is not the
  server's. :func:`pooled` says so and the caller runs those the old way;
- imitate torchrun's launcher: restarts, its signal handling, its error-file reports. A test
  about launching keeps real torchrun (``pool=False`` in ``tests/helpers.py``).

Protocol: one connection per job on a Unix socket; the client sends one JSON line (script, args,
cwd, env, nproc, timeout, capture folder), the job manager answers one JSON line (exit code per
rank, ``timed_out``) once every rank has ended; the output is in the capture folder
(``rank<N>.out``/``rank<N>.err``). A client that goes away (its test interrupted) makes the job
manager kill the job.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# variables read at interpreter start-up or at ``import torch``: a job that sets them otherwise
# than the server cannot be forked from it
STARTUP_PREFIXES = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "KMP_", "MKL_", "CUDA_", "LD_",
                    "SYMPY_")
STARTUP_EXEMPT = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE"}
# after one rank fails, the others get SIGTERM, then SIGKILL this much later (torchrun: 30 s)
GRACE_S = 5.0
_SITE_PATH: list[str] = []
_FRESH_SEED = False  # the server's torch seeded itself from the OS: so does every fresh process
# the seed of torch's default generator in a fresh process of a torch that seeds it so
TORCH_DEFAULT_SEED = 67280421310721
# torch's own modules that a job imports lazily (DDP's constructor imports torch._dynamo, distify's
# FSDP check torch.distributed.fsdp, and with them torch.distributed.tensor and sympy): about 840
# modules, 2-4 s of every 2-rank job's wall time on the test machine. The server imports them once.
PRELOAD = ("torch.distributed", "torch.nn.parallel", "torch.distributed.fsdp",
           "torch.distributed.checkpoint", "torch._dynamo", "torch.utils.data")


def startup_mismatch(env: dict[str, str], server_env: dict[str, str]) -> list[str]:
    """The start-up variables whose value in ``env`` differs from the server's."""
    keys = {k for k in (*env, *server_env)
            if k.startswith(STARTUP_PREFIXES) and k not in STARTUP_EXEMPT}
    return sorted(k for k in keys if env.get(k) != server_env.get(k))


# ------------------------------------------------------------------------------- the server


def serve(path: str) -> None:
    global _SITE_PATH, _FRESH_SEED
    import importlib

    import torch  # (the point of the pool; nothing runs on it here)

    _FRESH_SEED = torch.initial_seed() != TORCH_DEFAULT_SEED

    for name in PRELOAD:
        importlib.import_module(name)
    if threading.active_count() != 1:  # a thread does not survive the fork: the ranks would hang
        raise RuntimeError(f"importing {PRELOAD} started threads: {threading.enumerate()}")

    _SITE_PATH = sys.path[1:]  # without this file's folder; the server has no PYTHONPATH

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    while True:
        readable, _, _ = select.select([listener], [], [], 1.0)
        _reap()
        if os.getppid() == 1:  # the test process is gone
            return
        if not readable:
            continue
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            code = 1
            try:
                _manage(conn)
                code = 0
            finally:
                os._exit(code)
        conn.close()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _manage(conn: socket.socket) -> None:
    """The job manager: fork the ranks, wait for them, answer."""
    request = json.loads(conn.makefile("rb").readline())
    nproc = request["nproc"]
    env = dict(request["env"])
    if request["torchrun"]:
        env.update(_launcher_env(nproc))
    pids = []
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            conn.close()
            _child(request, env, rank)  # never returns
        with contextlib.suppress(OSError):  # the child does it too: whichever comes first
            os.setpgid(pid, pid)
        pids.append(pid)
    codes, timed_out = _wait(pids, conn, time.monotonic() + request["timeout"],
                             request["torchrun"])
    conn.sendall((json.dumps({"codes": codes, "timed_out": timed_out}) + "\n").encode())
    conn.close()


def _launcher_env(nproc: int) -> dict[str, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "localhost", "MASTER_PORT": str(port),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": f"pool-{os.getpid()}-{port}",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def _wait(pids: list[int], conn: socket.socket, deadline: float,
          torchrun: bool) -> tuple[list[int | None], bool]:
    """Wait for every rank; kill the rest when one fails (torchrun's way), when the deadline
    passes or when the client goes away. Exit codes as ``subprocess`` gives them."""
    codes: dict[int, int] = {}
    kill_at: float | None = None
    timed_out = False
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
                if codes[pid] != 0 and torchrun and kill_at is None:
                    _signal(pids, codes, signal.SIGTERM)
                    kill_at = time.monotonic() + GRACE_S
        now = time.monotonic()
        if now > deadline and not timed_out:
            timed_out = True
            _signal(pids, codes, signal.SIGUSR1)  # the stacks of a hang, into each rank's stderr
            time.sleep(0.5)
            _signal(pids, codes, signal.SIGKILL)
        if kill_at is not None and now > kill_at:
            _signal(pids, codes, signal.SIGKILL)
        readable, _, _ = select.select([conn], [], [], 0.02)
        if readable and not conn.recv(1):  # the client is gone
            _signal(pids, codes, signal.SIGKILL)
            deadline = now
    return [codes[pid] for pid in pids], timed_out


def _signal(pids: list[int], codes: dict[int, int], signum: int) -> None:
    for pid in pids:
        if pid not in codes:
            # the rank and what it started (DataLoader workers)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signum)


# -------------------------------------------------------------------------------- a rank


def _child(request: dict, env: dict[str, str], rank: int) -> None:
    code = 1
    try:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                          else signal.SIG_DFL)
        if request["torchrun"]:
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank))
        capture = request["capture"]
        _redirect(os.path.join(capture, f"rank{rank}.out"),
                  os.path.join(capture, f"rank{rank}.err"))
        # a rank past the job's deadline writes where each of its threads is (see _wait)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        script = request["script"]
        sys.argv = [script, *request["args"]]
        entries = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
        sys.path[:] = [os.path.dirname(os.path.realpath(script)), *entries, *_SITE_PATH]
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        _reseed()
        _startup_hook(entries)
        code = _run(os.path.abspath(os.path.join(request["cwd"], script)))
    except BaseException:  # the set-up itself failed: say so, as a start-up error would
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _redirect(out: str, err: str) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)


def _reseed() -> None:
    # this torch seeds its default generator from the OS in every fresh process (so two ranks
    # of a script that seeds nothing draw differently); a fork would share the server's seed
    if _FRESH_SEED:
        sys.modules["torch"].default_generator.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _startup_hook(entries: list[str]) -> None:
    """Import the ``sitecustomize`` of a ``PYTHONPATH`` folder, as start-up would have."""
    import importlib

    for entry in entries:
        if os.path.isfile(os.path.join(entry, "sitecustomize.py")):
            sys.modules.pop("sitecustomize", None)
            importlib.import_module("sitecustomize")
            return


def _run(script: str) -> int:
    """Run ``script`` (an absolute path; ``sys.argv[0]`` as given) as the interpreter runs a
    main script: a fresh ``__main__`` module that stays in ``sys.modules`` (pickling and
    atexit handlers find it), its code compiled under the absolute path; the exit code."""
    import atexit
    import threading
    import types

    try:
        main = types.ModuleType("__main__")
        main.__file__ = script
        main.__builtins__ = __builtins__
        sys.modules["__main__"] = main
        with open(script, "rb") as file:
            code = compile(file.read(), script, "exec", dont_inherit=True)
        exec(code, main.__dict__)
        status = 0
    except SystemExit as stop:
        status = _exit_code(stop.code)
    except BaseException as error:  # the interpreter's own top level
        trace = error.__traceback__
        while trace is not None and trace.tb_frame.f_code.co_filename != script:
            trace = trace.tb_next  # this file's frames are no part of the script's traceback
        trace = trace or error.__traceback__
        error.__traceback__ = trace
        sys.last_type, sys.last_value, sys.last_traceback = type(error), error, trace
        if sys.version_info >= (3, 12):
            sys.last_exc = error
        sys.excepthook(type(error), error, trace)
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]  (as the interpreter does at exit)
    atexit._run_exitfuncs()
    return status


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1

# ------------------------------------------------------------------------------- the client

#: set per test by ``tests/conftest.py``: the test's module is marked ``pytest.mark.pool``
ALLOWED = False
#: jobs of pool-marked tests: forked from the pool, or run the old way (printed by conftest)
STATS = {"pooled": 0, "old way": 0}
_lock = threading.Lock()
_server: dict = {}


def enabled() -> bool:
    """``DISTIFY_TEST_POOL=0`` runs every job the old way (real ``python``, real torchrun)."""
    return os.environ.get("DISTIFY_TEST_POOL", "1") != "0"


def pooled(env: dict[str, str], use: bool | None) -> bool:
    """Whether a job with this environment runs in the pool: ``use`` (None: the test's module
    is marked), the pool is on, and the job's start-up variables are the server's."""
    if not (ALLOWED if use is None else use):
        return False
    if enabled() and not startup_mismatch(env, _server_env()):
        STATS["pooled"] += 1
        return True
    STATS["old way"] += 1
    return False


def _server_env() -> dict[str, str]:
    from tests.helpers import clean_env

    env = clean_env()
    env.pop("PYTHONPATH", None)
    return env


def _address() -> str:
    with _lock:
        if _server and _server["process"].poll() is None:
            return _server["path"]
        folder = tempfile.mkdtemp(prefix="distify-pool-")
        path = os.path.join(folder, "socket")
        log = open(os.path.join(folder, "server.log"), "wb")  # noqa: SIM115 (the server's)
        process = subprocess.Popen([sys.executable, os.path.abspath(__file__), path],
                                   env=_server_env(), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=log, cwd=folder)
        ready = process.stdout.readline() if process.stdout else b""
        if ready.strip() != b"ready":
            process.kill()
            raise RuntimeError(f"the test worker pool did not start: see "
                               f"{os.path.join(folder, 'server.log')}")
        if not _server:
            atexit.register(_stop)
        _server.update(process=process, path=path, folder=folder)
        return path


def _stop() -> None:
    process = _server.get("process")
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
    shutil.rmtree(_server.get("folder", ""), ignore_errors=True)


def run(script: str, args: list[str], *, cwd: str, env: dict[str, str], nproc: int,
        torchrun: bool, timeout: float, command: list[str]) -> subprocess.CompletedProcess:
    """Run ``script`` on ``nproc`` forked ranks (``torchrun``: with a launcher's environment,
    else one plain process); the result as ``subprocess.run(command, capture_output=True,
    text=True)`` would give it: ranks' outputs one after the other, in rank order, and
    ``subprocess.TimeoutExpired`` past ``timeout``."""
    with tempfile.TemporaryDirectory(prefix="distify-pool-job-") as capture:
        request = {"script": str(script), "args": [str(a) for a in args], "cwd": str(cwd),
                   "env": env, "nproc": nproc, "torchrun": torchrun, "timeout": timeout,
                   "capture": capture}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout + 60)  # the job manager keeps the deadline; this is a backstop
            conn.connect(_address())
            conn.sendall((json.dumps(request) + "\n").encode())
            answer = json.loads(conn.makefile("rb").readline())
        outs = [_read(os.path.join(capture, f"rank{r}.out")) for r in range(nproc)]
        errs = [_read(os.path.join(capture, f"rank{r}.err")) for r in range(nproc)]
    codes = answer["codes"]
    stdout, stderr = "".join(outs), "".join(errs)
    if answer["timed_out"]:
        # the ranks' outputs (each one's stacks at the deadline among them) for the report
        print(f"pooled job timed out after {timeout} s; its ranks' output:\n{stdout}\n{stderr}",
              file=sys.stderr)
        raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
    if not torchrun:
        return subprocess.CompletedProcess(command, codes[0], stdout, stderr)
    failed = [(rank, code) for rank, code in enumerate(codes) if code != 0]
    if failed:
        stderr += "".join(f"[test pool] rank {rank} exited with code {code}\n"
                          for rank, code in failed)
    return subprocess.CompletedProcess(command, 1 if failed else 0, stdout, stderr)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read()
    except FileNotFoundError:
        return ""


if __name__ == "__main__":
    serve(sys.argv[1])
