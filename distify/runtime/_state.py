"""Process state: read the launcher's environment once, set up the device and the process group.

torchrun, ``distify launch``, ``accelerate launch`` and Ray Train all describe the job with the
same variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``). Without them the script is a single process and no process group is created,
so a plain ``python train.py`` behaves exactly like the original script.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ._errors import DistifyError

MIXED_PRECISION_VALUES = ("no", "fp16", "bf16")
_DEFAULT_TIMEOUT_S = 1800.0
_DEFAULT_DEBUG_EVERY = 10
_DEFAULT_WATCHDOG_S = 300.0
_EXIT_WAIT_S = 120.0
_TRUE = ("1", "true", "yes", "on")
_LAUNCH_HINT = ("launch with `distify launch` or torchrun, which set it, "
                "or unset it to run one process")


@dataclass(frozen=True)
class Settings:
    """What the launcher's environment says about this process; read once by :func:`init`."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    mixed_precision: str
    sync_batchnorm: bool
    #: how long a collective (or a wait on the main process) may take before failing
    timeout: datetime.timedelta = datetime.timedelta(seconds=_DEFAULT_TIMEOUT_S)
    #: ``DISTIFY_DEBUG`` with more than one process: check that the ranks make the same
    #: collectives and keep bit-identical weights (see ``_debug``)
    debug: bool = False
    #: ``DISTIFY_DEBUG_EVERY``: compare the weights every N backward calls in debug mode
    debug_every: int = _DEFAULT_DEBUG_EVERY
    #: ``DISTIFY_ALLOW_UNSYNCED``: warn (once per cause) instead of refusing to train
    #: parameters that DDP does not average (see ``_guard``)
    allow_unsynced: bool = False
    #: how models are distributed: a name registered in ``_strategy`` (``"ddp"``, ``"fsdp"``)
    strategy: str = "ddp"
    #: the strategy's own settings (``_fsdp.FsdpOptions`` for FSDP), read with the rest
    strategy_options: Any = None
    #: ``DISTIFY_WATCHDOG``: after this many seconds in one wait, say where every rank is
    #: (``_progress``); 0: never
    watchdog: float = _DEFAULT_WATCHDOG_S


class Runtime:
    """Everything the runtime holds for this process, in one object.

    ``settings`` and ``strategy`` are set by :func:`init`; every other module of the runtime
    keeps its bookkeeping (prepared models, the GradScaler, the saves made, ...) as a *part*:
    a small class of its own, created empty on first use by :meth:`part`. :func:`reset` replaces
    the whole object, so a test starts from nothing.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        #: None until :func:`init` reads them (tests may give them instead)
        self.settings = settings
        #: the ``_strategy.Strategy`` for ``settings.strategy``, made on first use
        self.strategy: Any = None
        #: the job's key-value store under a ``distify/`` prefix (see :func:`shared_store`)
        self.store: Any = None
        self._parts: dict[type, Any] = {}

    def part(self, kind: type[T]) -> T:
        """The runtime module's state of class ``kind`` (made with ``kind()`` on first use)."""
        found = self._parts.get(kind)
        if found is None:
            found = self._parts[kind] = kind()
        return found


T = TypeVar("T")
_RUNTIME = Runtime()


def _line_buffered_stdout() -> None:
    """Under ``distify launch`` a worker's stdout is a file in the launch's log folder, which
    Python buffers by 8 KiB: line-buffer it, as Python does a terminal, so the main process's
    prints reach the console as they come (``distify launch`` copies them from the file)."""
    if os.environ.get("DISTIFY_LOG_DIR") and not getattr(sys.stdout, "line_buffering", True):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            sys.stdout.reconfigure(line_buffering=True)


_line_buffered_stdout()
# Run before leaving the group at exit, to drop what holds it (the models' DDP objects).
# Code registered at import, not state: it survives :func:`reset`.
_before_leaving: list[Callable[[], None]] = []


def current() -> Runtime:
    """The runtime's state object (not initialised yet, maybe: see :func:`settings`)."""
    return _RUNTIME


def reset() -> None:
    """Forget every setting and everything prepared, as in a new process (for tests).

    A process group that exists is left as it is: the next :func:`init` finds and uses it.
    """
    global _RUNTIME
    _RUNTIME = Runtime()


def init(mixed_precision: str | None = None,
         timeout: float | datetime.timedelta | None = None,
         sync_batchnorm: bool | None = None, strategy: str | None = None,
         cpu: bool | None = None) -> None:
    """Initialise the runtime from the environment (optional: every other function calls it).

    Args:
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``; default: ``DISTIFY_MIXED_PRECISION``,
            then ``ACCELERATE_MIXED_PRECISION``, then ``"no"``.
        timeout: seconds (or a timedelta) a collective may wait for a lost peer before failing;
            default ``DISTIFY_TIMEOUT`` or 1800.
        sync_batchnorm: convert BatchNorm layers to SyncBatchNorm when the world size is > 1;
            default ``DISTIFY_SYNC_BATCHNORM``.
        strategy: how models are distributed: ``"ddp"`` (replicas, gradients averaged) or
            ``"fsdp"`` (parameters, gradients and optimizer state sharded); default
            ``DISTIFY_STRATEGY``, else ``"fsdp"`` when ``ACCELERATE_USE_FSDP`` is set (as
            ``accelerate launch`` and ``distify launch`` do for ``distributed_type: FSDP``),
            else ``"ddp"``. FSDP reads its options from the ``FSDP_*`` variables those
            launchers set.
        cpu: compute on the CPU even where there is an accelerator (a script that never used
            one: its own tensors stay on the CPU, so its model must too); default
            ``DISTIFY_USE_CPU``, then ``ACCELERATE_USE_CPU``.

    With more than one process it also reads ``DISTIFY_DEBUG`` (check every collective and,
    every ``DISTIFY_DEBUG_EVERY`` backward calls, default 10, that the weights are still
    bit-identical on all ranks) and ``DISTIFY_ALLOW_UNSYNCED`` (warn once instead of failing
    when gradients would not be averaged across processes).

    Raises:
        DistifyError: the launcher variables are inconsistent, or a setting is invalid.
    """
    from . import _strategy  # imports the strategies, which import this module

    runtime = _RUNTIME
    if runtime.settings is not None:
        _check_same_settings(runtime.settings, mixed_precision, sync_batchnorm, strategy)
        if cpu and runtime.settings.device.type != "cpu":
            raise DistifyError(f"distify.init(cpu=True) came after the runtime started on "
                               f"{runtime.settings.device}: call distify.init(...) before any "
                               "other distify call")
        return
    precision = _mixed_precision_setting(mixed_precision)
    timeout_delta = _timeout_setting(timeout)
    sync_bn = _flag("DISTIFY_SYNC_BATCHNORM") if sync_batchnorm is None else bool(sync_batchnorm)
    strategy_name, strategy_options = _strategy.from_environment(strategy)
    if dist.is_available() and dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()  # Ray Train made the group
    else:
        rank, world_size = _rank_and_world_size()
    local_rank, local_world_size = _local_rank_and_size(rank, world_size)
    device = _pick_device(local_rank, world_size, cpu)
    if world_size > 1 and not dist.is_initialized():
        _init_process_group(device, rank, world_size, timeout_delta)
    debug = world_size > 1 and _flag("DISTIFY_DEBUG")
    runtime.settings = Settings(
        rank, local_rank, world_size, local_world_size, device, precision, sync_bn,
        timeout_delta, debug=debug,
        debug_every=_debug_every_setting() if debug else _DEFAULT_DEBUG_EVERY,
        allow_unsynced=_flag("DISTIFY_ALLOW_UNSYNCED"), strategy=strategy_name,
        strategy_options=strategy_options, watchdog=_watchdog_setting())
    if world_size > 1 and rank != 0:
        from . import _audit

        _audit.install(rank)  # report files this process writes that only rank 0 should


def settings() -> Settings:
    """This process's settings, initialising the runtime on first use."""
    found = _RUNTIME.settings
    if found is None:
        init()
        found = _RUNTIME.settings
        assert found is not None
    return found


def device() -> torch.device:
    """This process's device: ``cuda:LOCAL_RANK``, else MPS or another accelerator torch reports
    (``torch.accelerator``: XPU, a PrivateUse1 backend; single process only), else CPU."""
    return settings().device


def device_index() -> int | torch.device:
    """This process's device as a script that keeps a GPU *index* (``device = 0``,
    ``0 if torch.cuda.is_available() else "cpu"``) holds it: the index of its GPU, an int
    (``0`` prints as ``0``, as the script's did, and ``.to(1)`` is that GPU), else the device
    itself (``cpu`` prints as ``cpu``)."""
    current = device()
    return current.index if current.type == "cuda" and current.index is not None else current


def device_choice(chosen: bool) -> bool:
    """The script's own choice of the accelerator, made by a flag
    (``not args.no_cuda and torch.cuda.is_available()``): False keeps this process on the CPU,
    as the script did, so :func:`prepare` leaves the model with the tensors the script builds.

    Args:
        chosen: whether the script chose the accelerator.

    Returns:
        ``chosen``, so the script's own tests of it keep their meaning.

    Raises:
        DistifyError: False after the runtime started on an accelerator.
    """
    if not chosen:
        init(cpu=True)
    return chosen


def rank() -> int:
    """Global rank of this process (0 for a single process)."""
    return settings().rank


def world_size() -> int:
    """Number of processes in the job (1 without a launcher)."""
    return settings().world_size


def local_rank() -> int:
    """Rank of this process on its machine."""
    return settings().local_rank


def local_world_size() -> int:
    """Number of processes on this machine."""
    return settings().local_world_size


def is_main_process() -> bool:
    """True on global rank 0: the process that writes files and prints."""
    return settings().rank == 0


def is_local_main_process() -> bool:
    """True on local rank 0 of each machine (e.g. for per-machine caches)."""
    return settings().local_rank == 0


def mixed_precision() -> str:
    """The mixed precision in use: ``"no"``, ``"fp16"`` or ``"bf16"``."""
    return settings().mixed_precision


def comm_device() -> torch.device:
    """Where tensors for a collective go: this process's GPU under NCCL (which moves only GPU
    tensors), else the CPU (Gloo)."""
    return device() if dist.get_backend() == "nccl" else torch.device("cpu")


def _check_same_settings(current: Settings, mixed_precision: str | None,
                         sync_batchnorm: bool | None, strategy: str | None) -> None:
    if mixed_precision is not None and _mixed_precision_setting(mixed_precision) != \
            current.mixed_precision:
        raise DistifyError(
            f"distify.init(mixed_precision={mixed_precision!r}) came after the runtime started "
            f"with {current.mixed_precision!r}: call distify.init(...) before any other distify "
            "call")
    if sync_batchnorm is not None and bool(sync_batchnorm) != current.sync_batchnorm:
        raise DistifyError(
            f"distify.init(sync_batchnorm={sync_batchnorm!r}) came after the runtime started: "
            "call distify.init(...) before any other distify call")
    if strategy is not None and strategy.strip().lower() != current.strategy:
        raise DistifyError(
            f"distify.init(strategy={strategy!r}) came after the runtime started with "
            f"{current.strategy!r}: call distify.init(...) before any other distify call")


def _mixed_precision_setting(argument: str | None) -> str:
    source, value = "mixed_precision argument", argument
    for name in ("DISTIFY_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION"):
        if value is None and os.environ.get(name, "").strip():
            source, value = name, os.environ[name]
    value = "no" if value is None else str(value).strip().lower()
    if value not in MIXED_PRECISION_VALUES:
        raise DistifyError(f"unknown mixed precision {value!r} (from {source}): use one of "
                           f"{', '.join(MIXED_PRECISION_VALUES)}")
    return value


def _timeout_setting(argument: float | datetime.timedelta | None) -> datetime.timedelta:
    if isinstance(argument, datetime.timedelta):
        return argument
    if argument is not None:
        return datetime.timedelta(seconds=float(argument))
    raw = os.environ.get("DISTIFY_TIMEOUT", "").strip()
    try:
        seconds = float(raw) if raw else _DEFAULT_TIMEOUT_S
    except ValueError:
        raise DistifyError(f"DISTIFY_TIMEOUT={raw!r} is not a number of seconds: "
                           "set it to e.g. 1800 or unset it") from None
    if seconds <= 0:
        raise DistifyError(f"DISTIFY_TIMEOUT={raw!r} must be positive: set it to e.g. 1800")
    return datetime.timedelta(seconds=seconds)


def _watchdog_setting() -> float:
    raw = os.environ.get("DISTIFY_WATCHDOG", "").strip()
    if not raw:
        return _DEFAULT_WATCHDOG_S
    if raw.lower() in ("off", "no", "false"):
        return 0.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        raise DistifyError(f"DISTIFY_WATCHDOG={raw!r} must be a number of seconds (0 turns the "
                           f"watchdog off): set it to e.g. {_DEFAULT_WATCHDOG_S:g} or unset it")
    return seconds


def _debug_every_setting() -> int:
    return every_setting("DISTIFY_DEBUG_EVERY", _DEFAULT_DEBUG_EVERY, "backward calls")


def every_setting(name: str, default: int, unit: str) -> int:
    """The whole number >= 1 in the environment variable ``name`` (``default`` when unset).

    Raises:
        DistifyError: it is set to something else (the message names ``unit``: what it counts).
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        every = int(raw)
    except ValueError:
        every = 0
    if every < 1:
        raise DistifyError(f"{name}={raw!r} must be a whole number of {unit} >= 1: set it to "
                           f"e.g. {default} or unset it")
    return every


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _int_env(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise DistifyError(f"environment variable {name}={raw!r} is not an integer: "
                           f"{_LAUNCH_HINT}") from None


def _rank_and_world_size() -> tuple[int, int]:
    world_size, rank = _int_env("WORLD_SIZE"), _int_env("RANK")
    if world_size is None:
        if rank not in (None, 0):
            raise DistifyError(f"RANK={rank} is set but WORLD_SIZE is not: {_LAUNCH_HINT}")
        return 0, 1
    if world_size < 1:
        raise DistifyError(f"WORLD_SIZE={world_size} must be at least 1: {_LAUNCH_HINT}")
    if rank is None:
        if world_size > 1:
            raise DistifyError(f"WORLD_SIZE={world_size} is set but RANK is not: {_LAUNCH_HINT}")
        rank = 0
    if not 0 <= rank < world_size:
        raise DistifyError(f"RANK={rank} must be in 0..{world_size - 1} for "
                           f"WORLD_SIZE={world_size}: {_LAUNCH_HINT}")
    if world_size > 1:
        _check_rendezvous()
    return rank, world_size


def _check_rendezvous() -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name, "").strip():
            raise DistifyError(f"WORLD_SIZE > 1 but {name} is not set: set {name} on every "
                               "process, or launch with `distify launch` or torchrun")
    port = _int_env("MASTER_PORT")
    assert port is not None
    if not 0 < port < 65536:
        raise DistifyError(f"MASTER_PORT={port} is not a valid port: use a free port in 1..65535")


def _local_rank_and_size(rank: int, world_size: int) -> tuple[int, int]:
    # Without LOCAL_* variables the job is assumed to run on one machine.
    local_rank = _int_env("LOCAL_RANK")
    local_size = _int_env("LOCAL_WORLD_SIZE")
    local_rank = rank if local_rank is None else local_rank
    local_size = world_size if local_size is None else local_size
    if not 1 <= local_size <= world_size:
        raise DistifyError(f"LOCAL_WORLD_SIZE={local_size} must be in 1..{world_size} "
                           f"(WORLD_SIZE): {_LAUNCH_HINT}")
    if not 0 <= local_rank < local_size:
        raise DistifyError(f"LOCAL_RANK={local_rank} must be in 0..{local_size - 1} "
                           f"(LOCAL_WORLD_SIZE={local_size}): {_LAUNCH_HINT}")
    return local_rank, local_size


def _pick_device(local_rank: int, world_size: int, cpu: bool | None = None) -> torch.device:
    force_cpu = bool(cpu) or _flag("DISTIFY_USE_CPU") or _flag("ACCELERATE_USE_CPU")
    if not force_cpu and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise DistifyError(f"LOCAL_RANK={local_rank} but only {count} GPU(s) are visible: "
                               "start at most one process per GPU, or set DISTIFY_USE_CPU=1")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    # MPS has no collective backend, so it is only used by a single process.
    mps = getattr(torch.backends, "mps", None)
    if not force_cpu and world_size == 1 and mps is not None and mps.is_available():
        return torch.device("mps")
    # Another accelerator torch knows (XPU, a PrivateUse1 backend): a single process uses it as
    # the script did; the collectives here are NCCL or Gloo, so a job of several stays on the CPU.
    other = _other_accelerator()
    if not force_cpu and world_size == 1 and other is not None:
        return torch.device(other, 0)
    return torch.device("cpu")


def _other_accelerator() -> str | None:
    """The type of the accelerator torch reports other than CUDA and MPS, if any."""
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is None or not accelerator.is_available():
        return None
    found = accelerator.current_accelerator()
    return None if found is None or found.type in ("cuda", "mps", "cpu") else found.type


def _init_process_group(device: torch.device, rank: int, world_size: int,
                        timeout: datetime.timedelta) -> None:
    if not dist.is_available():
        raise DistifyError("WORLD_SIZE > 1 but this PyTorch build has no torch.distributed: "
                           "install a PyTorch build with distributed support")
    backend = "nccl" if device.type == "cuda" else "gloo"
    _import_group_default_modules()
    if backend == "gloo":
        _avoid_detail_debug_crash()
    store = _restart_store(timeout, world_size)
    if store is None:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout)
    else:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
    atexit.register(_leave_process_group)


def _import_group_default_modules() -> None:
    """Import, before the group exists, the torch modules that take it as a default argument.

    ``torch.distributed.nn.functional`` writes ``group=group.WORLD`` in its signatures, and DDP
    imports it on first use (through ``torch._dynamo``). Imported after ``init_process_group``,
    those defaults hold the default group for the life of the interpreter, so
    ``destroy_process_group`` cannot free it: Gloo's worker threads then run on into interpreter
    shutdown, where one of them can abort the process ("terminate called without an active
    exception") after a successful run (seen with torch 2.13 on a loaded machine). Imported
    first, the defaults are ``None``, which means the same group at call time.
    """
    with contextlib.suppress(ImportError):
        import torch.distributed.nn.functional  # noqa: F401


def _avoid_detail_debug_crash() -> None:
    """Under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, build the Gloo group at the INFO level.

    DETAIL wraps the group in torch's collective checker, and building DDP on that wrapped Gloo
    group kills the process with a segmentation fault (torch 2.13, CPU). ``distify launch
    --debug`` sets DETAIL (as Accelerate does) together with ``DISTIFY_DEBUG=1``, whose
    fingerprints check the runtime's collectives instead; INFO keeps torch's other debug output.
    """
    if dist.get_debug_level() != dist.DebugLevel.DETAIL:
        return
    warnings.warn("TORCH_DISTRIBUTED_DEBUG=DETAIL is lowered to INFO for the Gloo backend: with "
                  "it, building DDP crashes the process (segmentation fault, torch 2.13); use "
                  "DISTIFY_DEBUG=1 to check the collectives", stacklevel=4)
    dist.set_debug_level(dist.DebugLevel.INFO)


def _restart_store(timeout: datetime.timedelta, world_size: int) -> Any:
    """Under torchrun's agent store, a key space of this rendezvous round's own.

    After ``--max-restarts`` restarts the workers, Gloo can read the peer addresses the
    previous round published in the same store and hang or fail connecting to dead ports
    (seen with torch 2.13), so each round's keys are kept apart. The round cannot be read from
    ``TORCHELASTIC_RESTART_COUNT``: on several machines only the agent whose worker failed
    counts a restart, while the others restart theirs for the new membership with their count
    unchanged, so the ranks would look in different key spaces and wait forever. Every process
    counts itself in instead, and the count's multiple of the world size is the round, the same
    on every rank. Without the agent store (plain env:// init) nothing changes.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout)
    joined = store.add("/distify/joined", 1)
    return dist.PrefixStore(f"/distify/round_{(joined - 1) // world_size}/", store)


def shared_store() -> Any:
    """The job's key-value store (the default group's), under a ``distify/`` prefix.

    For small handshakes that must not be collectives, such as waiting for the main process to
    finish a file. ``None`` in a single process, or when torch keeps its store out of reach.
    """
    runtime = _RUNTIME
    if runtime.store is None and settings().world_size > 1:
        try:
            default = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError):
            return None
        runtime.store = dist.PrefixStore("distify/", default)
    return runtime.store


def before_leaving(callback: Callable[[], None]) -> None:
    """Run ``callback`` at a normal exit, after the ranks meet and before the group goes."""
    _before_leaving.append(callback)


def _leave_process_group() -> None:
    """At a normal exit, leave the group together with the other ranks, and free it.

    A rank that closes its Gloo connections while a peer is still connected can make that peer
    abort ("terminate called without an active exception") after a successful run, so the ranks
    meet first. Then what holds the group lets go of it, so that destroying it joins Gloo's
    threads now rather than during interpreter shutdown, where they can abort the process too.
    After an uncaught exception nothing waits and the group is left as it is: destroying it
    could block on a collective the other ranks never join, while exiting lets the launcher
    stop the job at once. Gloo may then abort this process as Python shuts down, so what was
    printed is flushed first.

    In debug mode the ranks first exchange an "exit" fingerprint, with the weights' checksums:
    a peer still waiting at a collective then fails naming the line it waits at (and this rank
    prints the same error), instead of both hanging until the timeout; this rank then leaves as
    after an exception. Weights that differ between the ranks at the end (changed on some ranks
    only after the last comparison in a backward) are printed as an error naming the first
    differing parameter, and every rank exits with status 1.
    """
    if not dist.is_initialized():
        return
    from . import _progress  # loaded with the runtime; imported here to avoid an import cycle

    _progress.mark_left(failed=hasattr(sys, "last_value"))
    problem = None if hasattr(sys, "last_value") else _exit_check()
    if hasattr(sys, "last_value") or problem is not None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if problem == "diverged":  # an exit handler cannot raise: fail the process itself
            os._exit(1)
        return
    # A peer that is gone or still busy makes this fail: then exit without the handshake.
    with contextlib.suppress(Exception):
        if dist.get_backend() == "gloo":
            # Bounded: a peer that failed or is still working does not hold this exit for long.
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=_EXIT_WAIT_S))
        for callback in _before_leaving:
            callback()
        dist.destroy_process_group()
        gc.collect()


def _exit_check() -> str | None:
    """In debug mode, what the last check at exit found (``_debug.exit_check``), else None."""
    if _RUNTIME.settings is None or not _RUNTIME.settings.debug:
        return None
    from . import _debug  # loaded with the runtime; imported here to avoid an import cycle

    return _debug.exit_check()
