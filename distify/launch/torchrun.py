"""From a launch config to a torchrun (``python -m torch.distributed.run``) job, and running it.

One machine runs ``--standalone`` (torchrun picks a free rendezvous port itself), or, when
workers may be restarted, a one-machine static rendezvous on a free port. Several
machines meet either through a static rendezvous (``--nnodes/--node-rank/--master-addr/
--master-port``: each machine knows its rank) or through c10d (``--rdzv-backend c10d
--rdzv-endpoint``: ranks are handed out as machines join). Settings the runtime reads travel in
the environment: ``DISTIFY_MIXED_PRECISION`` (and ``ACCELERATE_MIXED_PRECISION``, so a script on
Accelerate sees the same choice), ``DISTIFY_USE_CPU``, ``CUDA_VISIBLE_DEVICES`` and, for
``debug``, ``DISTIFY_DEBUG`` (the runtime's own checks) beside ``TORCH_DISTRIBUTED_DEBUG``.

The job runs in the foreground as an argument list, never through a shell.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from distify.errors import UserError
from distify.launch.config import LaunchConfig

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
    return env


def build_plan(cfg: LaunchConfig, script: str, script_args: Sequence[str] = (), *,
               python: str = sys.executable) -> LaunchPlan:
    """The torchrun job that runs ``script script_args...`` as ``cfg`` describes.

    Args:
        cfg: a validated launch config.
        script: path of the training script.
        script_args: passed to the script unchanged.
        python: the interpreter that runs torchrun (and so the workers).
    """
    argv = (python, *TORCHRUN, *torchrun_args(cfg), script, *script_args)
    return LaunchPlan(argv=argv, env=launch_env(cfg))


def render_plan(plan: LaunchPlan) -> str:
    """The plan as shell lines to read or paste (display only: the job never uses a shell)."""
    lines = [f"export {name}={shlex.quote(value)}" for name, value in plan.env.items()]
    return "\n".join([*lines, shlex.join(plan.argv)]) + "\n"


def run_plan(plan: LaunchPlan) -> int:
    """Run the job in the foreground and return its exit code (128 + N if killed by signal N).

    The job gets its own session, so a Ctrl-C in the terminal reaches torchrun exactly once:
    through this process, which forwards SIGINT, SIGTERM and SIGHUP to it and keeps waiting
    while torchrun shuts its workers down.
    """
    try:
        child = subprocess.Popen(plan.argv, env={**os.environ, **plan.env},
                                 start_new_session=True)
    except OSError as err:
        raise UserError(f"cannot start {plan.argv[0]}: {err.strerror}") from None

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {}
    try:
        for signum in _FORWARDED:
            previous[signum] = signal.signal(signum, forward)
    except ValueError:
        pass  # not the main thread: signals stay with whoever owns them
    try:
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return code if code >= 0 else 128 - code


def _main_process(cfg: LaunchConfig) -> tuple[str, int]:
    missing = [f"--{key}" for key in ("main_process_ip", "main_process_port")
               if getattr(cfg, key) is None]
    if missing:
        raise UserError(f"a job on {cfg.num_machines} machines needs {' and '.join(missing)} "
                        "(the address and port of the machine with machine_rank 0)")
    return cfg.main_process_ip, cfg.main_process_port
