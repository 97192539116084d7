"""Where each rank is, said when a wait lasts or times out (more than one process).

A rank that skips a collective (a per-process ``continue`` before ``backward``) leaves the
others waiting until the timeout, which then reads as a bare Gloo or NCCL error. So each rank
keeps, at no collective's cost, what it is waiting in: every collective of the runtime (the
strategy's ``all_reduce``, ``all_gather``, ``broadcast``, ``barrier``) and the gradient
all-reduce of ``distify.backward`` count themselves, per kind, and note the script line that
made them (as ``_debug.call_site`` finds it, formatted only when said): a counter, two clock
readings and a short frame walk, about 2 microseconds, next to a collective's tens or
hundreds.

- **The watchdog** (a daemon thread per process, started with the first collective) publishes
  this rank's position in the job's key-value store when it changed, every few seconds (one
  store write, off the training thread); when a wait has lasted ``DISTIFY_WATCHDOG`` seconds
  (default 300; ``0`` turns it off) it prints, once per wait, one line to stderr naming where
  every rank is, and the job keeps waiting.
- **On a timeout** (``DISTIFY_TIMEOUT``), or a peer lost mid-collective, the error is a
  :class:`DistifyError` naming where this rank waited and where the others were, with the
  backend's error as its cause.
- **At exit** a rank marks that it left the script, so the others' messages say so.

Positions travel through the store as small JSON records under ``progress/<rank>``; a rank
never waits for another to answer.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from typing import Any

import torch.distributed as dist

from . import _state
from ._errors import DistifyError

# Frames in these packages are not the call site a user wants to see (as in ``_debug``).
_SKIPPED = (__name__.rpartition(".")[0], "torch", "contextlib")
_SKIPPED_UNDER = tuple(f"{name}." for name in _SKIPPED)
_MAX_PERIOD_S = 5.0
_MIN_PERIOD_S = 0.2
_SAME_ORDER = ("every rank must reach the same distify calls in the same order: look for one "
               "under a rank-dependent `if` or `continue`, or in loops of unequal length "
               "(DISTIFY_DEBUG=1 names the first mismatch as it happens)")
_LOST_PEER = ("timed out", "timeout", "gloo", "nccl", "connection closed", "connection reset",
              "broken pipe")


class Progress:
    """The runtime's part (see ``_state.Runtime``): this process's position."""

    def __init__(self) -> None:
        #: per kind of wait, how many this process entered
        self.counts: dict[str, int] = {}
        self.depth = 0
        #: (what, (file, line), wall-clock start, monotonic start) of the wait in progress
        self.now: tuple[str, tuple[str, int], float, float] | None = None
        #: (what, (file, line), wall-clock end) of the last finished wait
        self.last: tuple[str, tuple[str, int], float] | None = None
        self.watchdog: threading.Thread | None = None
        #: set at exit: the watchdog publishes no more (the record says the rank left)
        self.left = False


def _part() -> Progress:
    return _state.current().part(Progress)


class waiting:  # used like a function: ``with _progress.waiting("barrier"):``
    """Mark the body as a wait for the other ranks (a collective), for the messages.

    Args:
        kind: what is waited in (``"all_reduce"``, ``"backward"``, ...), counted per kind.
        label: how to say it, with ``{n}`` for the count (default ``"<kind> #<n>"``).
    """

    __slots__ = ("kind", "label", "part")

    def __init__(self, kind: str, label: str | None = None) -> None:
        self.kind = kind
        self.label = label

    def __enter__(self) -> None:
        part = self.part = _part()
        part.depth += 1
        if part.depth > 1:  # inside another wait (a collective made by one of distify's)
            return
        number = part.counts[self.kind] = part.counts.get(self.kind, 0) + 1
        what = (self.label or "{kind} #{n}").format(kind=self.kind, n=number)
        part.now = (what, _caller(), time.time(), time.monotonic())
        if part.watchdog is None:
            _start_watchdog(part)

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        part = self.part
        part.depth -= 1
        if part.depth:
            return
        now = part.now
        part.now = None
        if now is not None:
            part.last = (now[0], now[1], time.time())
        if now is not None and error is not None and _lost_peer(error):
            raise DistifyError(_gave_up(now, error)) from error


def _caller() -> tuple[str, int]:
    """(file, line) of the innermost frame outside the runtime, torch and contextlib: what
    ``_debug.call_site`` names, unformatted (formatting it costs tens of microseconds)."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module not in _SKIPPED and not module.startswith(_SKIPPED_UNDER):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return "(unknown line)", 0


def _site(raw: tuple[str, int]) -> str:
    """``file:line`` as the runtime's messages name a line (``_debug._shown``)."""
    from ._debug import _shown  # imported here: _debug imports the strategies

    return f"{_shown(raw[0])}:{raw[1]}" if raw[1] else raw[0]


def _lost_peer(error: BaseException) -> bool:
    if isinstance(error, DistifyError) or not isinstance(error, RuntimeError):
        return False
    text = str(error).lower()
    return isinstance(error, dist.DistError) or any(word in text for word in _LOST_PEER)


def _gave_up(now: tuple[str, tuple[str, int], float, float], error: BaseException) -> str:
    """The timeout's message: where this rank waited, where the others were."""
    rank = _state.rank()
    waited = time.monotonic() - now[3]
    _publish(_state.shared_store(), rank, _record(_part()))
    others = _others(_state.shared_store(), rank)
    timeout = _state.settings().timeout.total_seconds()
    return (f"distify: rank {rank} gave up after {waited:.0f} s in {now[0]} at {_site(now[1])} "
            f"(DISTIFY_TIMEOUT={timeout:g}; {type(error).__name__}: "
            f"{_first_line(error)}): {others}: {_SAME_ORDER}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else ""


# ------------------------------------------------------------------------------- records


def _record(part: Progress) -> dict[str, Any]:
    now, last = part.now, part.last
    if now is not None:
        return {"in": now[0], "site": _site(now[1]), "since": now[2]}
    if last is not None:
        return {"last": last[0], "site": _site(last[1]), "at": last[2]}
    return {"start": True}


def _describe(rank: int, record: dict[str, Any] | None) -> str:
    clock = time.time()
    if record is None:
        return f"rank {rank} has not reported (no distify collective yet, or gone)"
    if "left" in record:
        after = f", after {record['last']} at {record['site']}" if record.get("last") else ""
        how = "failed and left" if record["left"] == "error" else "had left"
        return f"rank {rank} {how} the script{after}"
    if "in" in record:
        return (f"rank {rank} is waiting in {record['in']} at {record['site']} (for "
                f"{max(0.0, clock - record['since']):.0f} s)")
    if "last" in record:
        return (f"rank {rank} was last in {record['last']} at {record['site']} "
                f"({max(0.0, clock - record['at']):.0f} s ago)")
    return f"rank {rank} has made no distify collective yet"


def _publish(store: Any, rank: int, record: dict[str, Any]) -> None:
    if store is None:
        return
    with contextlib.suppress(Exception):  # the store is gone (the job ends): nothing to tell
        store.set(f"progress/{rank}", json.dumps(record).encode())


def _read(store: Any, rank: int) -> dict[str, Any] | None:
    key = f"progress/{rank}"
    try:
        if not store.check([key]):
            return None
        return json.loads(store.get(key).decode())
    except Exception:
        return None


def _others(store: Any, rank: int) -> str:
    if store is None:
        return "where the other ranks are is unknown (no key-value store)"
    return "; ".join(_describe(other, _read(store, other))
                     for other in range(_state.world_size()) if other != rank)


def mark_left(failed: bool) -> None:
    """At exit: tell the other ranks this one left the script (see ``_state``)."""
    runtime = _state.current()
    if runtime.settings is None or runtime.settings.world_size == 1:
        return
    part = runtime.part(Progress)
    part.left = True
    last = part.last
    record: dict[str, Any] = {"left": "error" if failed else "end"}
    if last is not None:
        record.update(last=last[0], site=_site(last[1]))
    _publish(_state.shared_store(), runtime.settings.rank, record)


def has_left(store: Any, rank: int) -> bool:
    """Whether ``rank`` left the script (or the store, and with it the job, is gone)."""
    try:
        store.check([f"progress/{rank}"])
    except Exception:
        return True
    record = _read(store, rank)
    return record is not None and "left" in record


# ------------------------------------------------------------------------------- watchdog


def _start_watchdog(part: Progress) -> None:
    settings = _state.settings()
    store = _state.shared_store()
    if settings.world_size == 1 or store is None or settings.watchdog <= 0:
        part.watchdog = threading.current_thread()  # nothing to start, ever
        return
    with contextlib.suppress(Exception):  # a store of its own: the training thread has one
        store = store.clone()
    span = min(settings.watchdog, settings.timeout.total_seconds())
    period = min(_MAX_PERIOD_S, max(_MIN_PERIOD_S, span / 10))
    part.watchdog = threading.Thread(
        target=_watch, args=(part, store, settings.rank, settings.watchdog, period),
        name="distify-watchdog", daemon=True)
    part.watchdog.start()


def _watch(part: Progress, store: Any, rank: int, after: float, period: float) -> None:
    """Publish this rank's position when it changed; say once per long wait where all are."""
    published: Any = None
    reported: Any = None
    while True:
        time.sleep(period)
        now, last = part.now, part.last
        position = (now or last or (None,))[:2]
        if part.left:
            return
        if position != published:
            _publish(store, rank, _record(part))
            published = position
        if now is not None and now is not reported and time.monotonic() - now[3] >= after:
            reported = now
            time.sleep(period)  # the others publish within a period: read them after it
            if part.now is not now:
                continue
            waited = time.monotonic() - now[3]
            print(f"distify: rank {rank} has waited {waited:.0f} s in {now[0]} at "
                  f"{_site(now[1])}; "
                  f"{_others(store, rank)} (the job keeps waiting, up to DISTIFY_TIMEOUT)",
                  file=sys.stderr, flush=True)
