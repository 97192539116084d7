"""Debug mode (``DISTIFY_DEBUG=1``, more than one process): fail fast, naming the lines.

Two mistakes make a distributed job hang or silently go wrong, and debug mode turns both into
a :class:`DistifyError` on every rank:

- **mismatched collectives**: before each collective that goes through the runtime (``reduce``,
  ``gather``, ``gather_for_metrics``, ``broadcast_object``, the barriers, the shuffled order of
  a prepared DataLoader, building DDP, and ``backward`` with its gradient all-reduce), the ranks
  exchange a fingerprint of the call (a hash of what it is, with the dtypes and shapes that must
  agree) with one ``all_gather`` of three integers; only when they differ do the ranks exchange
  the calls and the script lines that made them (``all_gather_object``, slower). A rank at
  another call, or one that already reached the end of the script, is named with its line
  instead of a hang until the timeout. ``shared_generator`` goes through the store, not a
  collective: there the other ranks check the line of each draw against the main process's.
- **replicas drifting apart**: on the first ``backward`` and every ``DISTIFY_DEBUG_EVERY``
  (default 10) after, each prepared model's trainable parameters are checksummed bit for bit
  (their bytes read as integers, summed in int64: one number per parameter); a digest of those
  numbers travels with the backward's fingerprint, and when the digests differ the numbers
  themselves are exchanged to name the first parameter that differs from rank 0's.

The runtime's own per-forward and per-batch collectives are fingerprinted too: the broadcast
of the main process's buffers after each training forward (``_buffers``), and a prepared
loader's order chunks, iterable-stream digest and end-of-stream flag (``_data``, ``_stream``).

What it deliberately does not do: fingerprint the user's own ``torch.distributed`` calls;
compare buffers (the broadcast makes them equal between steps; a checksum of them would cost
another collective); or anything in a single process.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from . import _objects, _state, _strategy
from ._errors import DistifyError
from ._tree import tensors_in

# Frames in these packages are not the call site a user wants to see.
_SKIPPED = (__name__.rpartition(".")[0], "torch", "contextlib")
_EXIT_SITE = "(the script ended)"
_SAME_ORDER = ("every rank must reach the same distify calls in the same order: look for one "
               "under a rank-dependent `if`, or in loops of unequal length")
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}



class _Counts:
    """The runtime's part (see ``_state.Runtime``) about backward calls in debug mode."""

    def __init__(self) -> None:
        #: distify.backward calls made so far (the same count on every rank while calls match)
        self.backwards = 0
        #: the last backward call at which the weights were compared and equal
        self.last_equal = 0


def _counts() -> _Counts:
    return _state.current().part(_Counts)


def check(op: str) -> None:
    """Meet the other ranks and make sure they are about to make the same collective.

    Args:
        op: the call, with what must agree between the ranks (``"reduce(sum, float32[3])"``).

    Raises:
        DistifyError: some rank is at another call (or at the end of its script).
    """
    _exchange(op)


def before_backward(op: str, modules: list[Any]) -> None:
    """:func:`check` for a backward, comparing the weights on the first and every N-th call.

    Args:
        op: the backward's fingerprint (whether DDP averages its gradients).
        modules: the modules under DDP (``_model.synced_modules()``), in preparation order.

    Raises:
        DistifyError: the calls do not match, or a parameter differs from rank 0's.
    """
    counts = _counts()
    counts.backwards += 1
    compare = counts.backwards == 1 or counts.backwards % _state.settings().debug_every == 0
    sums = [_checksums(m) for m in modules] if compare else None
    differ = _exchange(op, sums=sums)
    if differ is not None:
        _compare_weights(differ, modules, call_site())
    if compare:
        counts.last_equal = counts.backwards


def check_same_draw(number: int, main_site: str) -> None:
    """Make sure this rank's ``number``-th shared_generator draw is the main process's.

    Args:
        number: the draw's number on this rank.
        main_site: where the main process made its draw of that number.

    Raises:
        DistifyError: this rank makes that draw at another line.
    """
    site = call_site()
    if site != main_site:
        raise DistifyError(
            f"distify debug: mismatched shared_generator draws: draw {number} is made at "
            f"{main_site} on rank 0 but at {site} on rank {_state.rank()}: every rank must "
            "call distify.shared_generator() at the same places, in the same order")


def exit_check() -> str | None:
    """At a normal exit: meet the other ranks once more and compare the weights a last time.

    Returns None when all is well; ``"mismatch"`` (after printing why) when a peer waits at a
    collective; ``"diverged"`` (after printing which parameter) when a prepared model's
    weights differ between the ranks: the backward calls since the last comparison changed
    them on some ranks only, which nothing else would report.
    """
    from . import _model  # imported here: _model imports this module

    modules = _model.synced_modules()
    sums = [_checksums(m) for m in modules] if modules else None
    try:
        differ = _exchange("exit", site=_EXIT_SITE, sums=sums)
        if differ is not None:
            _compare_weights(differ, modules, _EXIT_SITE, when="at the end of the script")
    except DistifyError as err:  # the peer raises it too, naming the line it waits at
        print(f"DistifyError: {err}", file=sys.stderr, flush=True)
        return "diverged" if "replicas diverged" in str(err) else "mismatch"
    except Exception:  # a peer that is gone: leave the usual way
        return None
    return None


def describe(value: Any, any_length: bool = False) -> str:
    """The dtypes and shapes of the tensors in ``value`` (``"float32[3]"``), else its type.

    Args:
        value: what a collective is given.
        any_length: write dim 0 as ``*`` (gathers accept first dimensions that differ).
    """
    tensors = tensors_in(value)
    if not tensors:
        return f"{type(value).__name__} of objects" if isinstance(value, list) else \
            type(value).__name__
    return ", ".join(_describe_tensor(t, any_length) for t in tensors)


def call_site() -> str:
    """``file:line`` of the innermost frame outside the runtime, torch and contextlib."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not any(module == name or module.startswith(name + ".") for name in _SKIPPED):
            return f"{_shown(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return "(unknown line)"


def _exchange(op: str, site: str | None = None,
              sums: list[list[int]] | None = None) -> list[Any] | None:
    """Compare ``op`` (and the weight checksums ``sums``) with the other ranks.

    Returns every rank's ``sums`` when they differ somewhere (else None). Every rank sees the
    same gathered numbers, so all of them take the same (slower) path when something differs.
    ``site`` defaults to the caller's line, found only then.
    """
    flat = [value for module in sums for value in module] if sums is not None else None
    mine = torch.tensor([_digest(op.encode()), -1 if flat is None else len(flat),
                         0 if flat is None else _digest(repr(sums).encode())],
                        dtype=torch.int64, device=_state.comm_device())
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    _strategy.current().all_gather(gathered, mine)
    rows = torch.stack(gathered).tolist()
    if any(row[0] != rows[0][0] for row in rows):
        everyone = _objects.all_gather_object((op, site or call_site()),
                                              _state.comm_device())
        raise DistifyError(_mismatch(everyone))
    if all(row == rows[0] for row in rows):
        return None
    return _objects.all_gather_object(sums, _state.comm_device())


def _digest(data: bytes) -> int:
    """A hash that is the same in every process (``hash()`` of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=7).digest(), "little")


def _mismatch(everyone: list[Any]) -> str:
    places: dict[tuple[str, str], list[int]] = {}
    for rank, (op, site) in enumerate(everyone):
        places.setdefault((op, site), []).append(rank)
    where = ", ".join(
        f"rank {ranks[0]} is at {op} {site}" if len(ranks) == 1 else
        f"ranks {', '.join(map(str, ranks))} are at {op} {site}"
        for (op, site), ranks in places.items())
    return f"distify debug: mismatched collectives: {where}: {_SAME_ORDER}"


def _describe_tensor(tensor: torch.Tensor, any_length: bool) -> str:
    dims = [str(size) for size in tensor.shape]
    if any_length:
        dims = ["*", *dims[1:]]
    return f"{str(tensor.dtype).removeprefix('torch.')}[{','.join(dims)}]"


def _shown(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if relative.startswith(os.pardir) else relative


def _checksums(module: Any) -> list[int]:
    """One int64 per parameter: the sum of its bytes read as integers (bit-exact); nothing for
    a module whose ranks hold different shards (FSDP)."""
    if not module.parameters or not module.replicated:
        return []
    with torch.no_grad():
        sums = [_bits(param).sum(dtype=torch.int64) for _, param in module.parameters]
        return torch.stack(sums).tolist()


def _bits(param: torch.Tensor) -> torch.Tensor:
    tensor = param.detach()
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    return tensor.view(_BITS[tensor.element_size()])


def _compare_weights(per_rank: list[Any], modules: list[Any], site: str,
                     when: str | None = None) -> None:
    reference = per_rank[0]
    if any(sums is None for sums in per_rank) or any(
            len(sums) != len(reference) or [len(m) for m in sums] != [len(m) for m in reference]
            for sums in per_rank):
        counts = ", ".join(f"rank {rank}: {'?' if sums is None else len(sums)}"
                           for rank, sums in enumerate(per_rank))
        raise DistifyError(f"distify debug: the ranks prepared different models ({counts} "
                           f"under DDP, at {site}): prepare the same models on every rank")
    for index, module in enumerate(modules):
        for position, (name, _) in enumerate(module.parameters):
            differ = [rank for rank, sums in enumerate(per_rank)
                      if sums[index][position] != reference[index][position]]
            if differ:
                raise DistifyError(_diverged(module.class_name, name, differ, site, when))


def _diverged(class_name: str, name: str, ranks: list[int], site: str,
              when: str | None = None) -> str:
    shown = ", ".join(map(str, ranks))
    counts = _counts()
    since = (f"equal at backward call {counts.last_equal}, " if counts.last_equal else "")
    when = when or f"before backward call {counts.backwards} at {site}"
    if when.startswith("at the end"):
        when += f", after {counts.backwards} backward call{'s' if counts.backwards != 1 else ''}"
    return (f"distify debug: replicas diverged: {class_name}.{name} differs from rank 0's on "
            f"rank{'s' if len(ranks) > 1 else ''} {shown} ({since}compared {when}): "
            "something changed the weights on some ranks only "
            "(an in-place edit, a rank-dependent learning rate or step, a parameter outside "
            "DDP); set DISTIFY_DEBUG_EVERY=1 to find the first step where they differ")
