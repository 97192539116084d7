"""Replica checks: with more than one process, the ranks compare their models, always.

Under DDP every rank must hold bit-identical weights after every optimizer step. A script can
break that without any error (a step skipped on a loss spike by one rank, a model moved after
``prepare``, an optimizer stepped on some ranks only, an in-place edit on one rank), and the
job would train on for days with replicas drifting apart. So the runtime compares them:

- at the end of the first epoch of a prepared DataLoader during which a prepared model
  trained (every rank reaches it: the training shards have equal lengths), and of each later
  one that ends at least :data:`EPOCH_GAP` backwards after the last check (so that epochs of a
  few batches do not pay for a check each);
- and every ``K`` backwards through ``distify.backward`` since the last check (``K`` =
  ``DISTIFY_REPLICA_CHECK_EVERY``, default :data:`DEFAULT_EVERY`), for loops without epochs.
  Backwards are counted, not optimizer steps and not forwards: every rank makes the same number
  of them (DDP's gradient all-reduce pairs them up), while the optimizer steps are what may
  differ, and the forwards may too (a policy run once per environment step, over episodes of
  each rank's own length, with one backward per episode). The check runs right after the
  backward; the synced buffers are the ones broadcast at the forward before it.

A check is one checksum per tensor (its bytes read as integers and summed with wrap-around,
so the sum is exact and independent of the order of summation; no copy of the tensor is made),
plus this rank's number of optimizer steps, and one ``all_reduce(MAX)`` of ``[values,
-values]``: a value differs somewhere exactly when its maximum and minimum over the ranks
differ, and every rank learns which one is first. Only then are the ranks' values and step
counts gathered, to name the ranks in the error.

What is compared: the parameters of models under DDP (every rank holds all of them) and the
number of optimizer steps each rank made; at the periodic check, which runs right after the
main process's buffers were broadcast, the buffers the runtime keeps in sync too (those of
modules in training mode, see ``_buffers``). Not at an epoch's end: a train-mode forward under
``torch.no_grad()`` after the last training forward legitimately leaves each rank its own
BatchNorm statistics until the next one. Under FSDP each rank holds its own shard of the
parameters, whose checksums are not comparable: there the step counts (and the synced buffers)
are what is compared, which catches a step skipped or made on some ranks only, not an in-place
edit of one rank's shard.

``DISTIFY_REPLICA_CHECK=0`` turns the checks off. Debug mode (``DISTIFY_DEBUG=1``) keeps its own
comparison before every N-th backward on top. What it deliberately does not do: detect two
elements of one tensor swapped (a sum is blind to order), or check in a single process.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from . import _debug, _model, _objects, _state, _strategy
from ._errors import DistifyError
from ._subclass import private_state

#: backwards between two checks; see benchmarks/results/runtime.md for how it was chosen
DEFAULT_EVERY = 200
#: after the first, an epoch's end is checked only this many backwards after the last
#: check (epochs shorter than that are covered by the periodic check): bounds the cost
EPOCH_GAP = DEFAULT_EVERY // 4
_FALSE = ("0", "false", "no", "off")
_TRUE = ("", "1", "true", "yes", "on")
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CAUSES = ("something changed the weights on some ranks only: a per-process decision before "
           "optimizer.step() (a step skipped on a loss spike or a non-finite loss: decide it "
           "together, e.g. with distify.any_process(...)), a model moved after distify.prepare "
           "(.cpu(), .half(), .to(...) and back), an optimizer stepped on some ranks only, or "
           "an in-place edit of the weights on some ranks (DISTIFY_REPLICA_CHECK=0 turns this "
           "check off)")


class _Checks:
    """The runtime's part (see ``_state.Runtime``) about replica checks."""

    def __init__(self) -> None:
        settings = _state.settings()
        self.enabled = settings.world_size > 1 and _enabled()
        self.every = _state.every_setting("DISTIFY_REPLICA_CHECK_EVERY", DEFAULT_EVERY,
                                           "backwards") if self.enabled else DEFAULT_EVERY
        #: backwards through distify.backward (the same count on every rank)
        self.backwards = 0
        self.since = 0  # backwards since the last check
        self.epoch_checked = False  # an epoch's end was checked already
        #: this rank's steps of prepared optimizers (they may differ between ranks)
        self.steps = 0
        self.last_equal = ""


def _part() -> _Checks:
    return _state.current().part(_Checks)


def backwards() -> int:
    """The backwards through ``distify.backward`` so far (the same on every rank)."""
    return _part().backwards


def after_backward() -> None:
    """Count a backward; every ``K`` of them, compare the replicas.

    Raises:
        DistifyError: a prepared model's weights (or synced buffers) differ between ranks.
    """
    part = _part()
    part.backwards += 1
    if part.enabled:
        part.since += 1
        if part.since >= part.every:
            check(f"backward {part.backwards}", buffers=True)


def epoch_ended(backwards_at_start: int) -> None:
    """At the end of an epoch of a prepared DataLoader: compare the replicas if a prepared
    model trained during it.

    Args:
        backwards_at_start: :func:`backwards` when the epoch started.
    """
    part = _part()
    if part.enabled and part.backwards > backwards_at_start and (
            not part.epoch_checked or part.since >= EPOCH_GAP):
        part.epoch_checked = True
        check(f"the end of an epoch of a prepared DataLoader (backward {part.backwards})")


def watch_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Count the steps of a prepared optimizer (with more than one process): the ranks
    compare their counts at each check."""
    part = _part()
    if part.enabled:
        optimizer.register_step_post_hook(_count_step)


def _count_step(*_: Any) -> None:
    _part().steps += 1


def check(when: str, buffers: bool = False) -> None:
    """Compare the ranks' optimizer steps and every prepared model's replicated tensors: one
    all-reduce.

    Args:
        when: where the job is, for the error (``"backward 200"``).
        buffers: compare the buffers the runtime syncs too (right after they were synced).

    Raises:
        DistifyError: a tensor, or the number of optimizer steps, differs between the ranks.
    """
    part = _part()
    part.since = 0
    tensors = _compared(buffers)
    if _state.settings().debug:
        _debug.check(f"replica check ({len(tensors)} tensors)")
    comm = _state.comm_device()
    with torch.no_grad():
        sums = torch.stack([torch.tensor(part.steps, dtype=torch.int64, device=comm)] +
                           [_checksum(t).to(comm) for _, t in tensors])
        both = torch.cat([sums, -sums])
        _strategy.current().all_reduce(both, op=dist.ReduceOp.MAX)
        count = len(tensors) + 1
        differ = torch.nonzero(both[:count] != -both[count:])[:, 0]
        # a tensor names the place best; else the steps (index 0) differ, or nothing does
        first = int(differ[differ > 0][0].item()) if bool((differ > 0).any()) else \
            -1 if differ.numel() == 0 else 0
    if first < 0:
        part.last_equal = when
        return
    everyone = _objects.all_gather_object((int(sums[first].item()), part.steps), comm)
    name = tensors[first - 1][0] if first else None
    raise DistifyError(_diverged(name, everyone, when, part.last_equal))


def _compared(buffers: bool) -> list[tuple[str, torch.Tensor]]:
    """The tensors every rank holds identically, in the same order on every rank."""
    tensors: list[tuple[str, torch.Tensor]] = []
    for key, module in _model.synced_models():
        if module.replicated:
            tensors += [(f"{module.class_name}.{name}", param)
                        for name, param in module.parameters]
        sync = getattr(private_state(key), "buffers", None) if buffers else None
        if sync is None:
            continue
        for owner, name in sync.places:
            buffer = owner._buffers.get(name) if owner.training else None
            if buffer is not None:
                tensors.append((f"{module.class_name} buffer {name}", buffer))
    return [(name, t) for name, t in tensors
            if t.layout is torch.strided and t.device.type != "meta"]


def _checksum(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers, summed with wrap-around in their own width (int64)."""
    bits = tensor.detach()
    if bits.is_complex():
        bits = torch.view_as_real(bits)
    if bits.dtype is torch.bool:
        bits = bits.view(torch.uint8)
    kind = _BITS[bits.element_size()]
    return bits.view(kind).sum(dtype=kind).to(torch.int64)


def _diverged(name: str | None, everyone: list[tuple[int, int]], when: str,
              last_equal: str) -> str:
    steps = {steps for _, steps in everyone}
    made = ("optimizer steps per rank: " + ", ".join(
        f"rank {rank} {steps}" for rank, (_, steps) in enumerate(everyone))
        if len(steps) > 1 else f"{everyone[0][1]} optimizer steps on every rank")
    since = f"; they were equal at {last_equal}" if last_equal else ""
    if name is None:
        what = "the processes made different numbers of optimizer steps"
    else:
        reference = everyone[0][0]
        ranks = [rank for rank, (value, _) in enumerate(everyone) if value != reference]
        what = (f"{name} differs from rank 0's on rank{'s' if len(ranks) > 1 else ''} "
                f"{', '.join(map(str, ranks))}")
    return f"distify: replicas diverged: {what}, found at {when} ({made}{since}): {_CAUSES}"


def _enabled() -> bool:
    raw = os.environ.get("DISTIFY_REPLICA_CHECK", "").strip().lower()
    if raw in _FALSE:
        return False
    if raw in _TRUE:
        return True
    raise DistifyError(f"DISTIFY_REPLICA_CHECK={raw!r} must be 1 (compare the replicas, the "
                       "default) or 0 (do not)")
