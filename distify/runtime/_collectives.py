"""Collectives for metrics and synchronisation. Every rank must reach each call (no hangs):
they are no-ops, returning their input, in a single process. In debug mode (``DISTIFY_DEBUG=1``)
the ranks first check that they are all at the same call (see ``_debug``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from . import _data, _debug, _elementwise, _objects, _state, _strategy
from ._errors import DistifyError, DistifyTypeError
from ._tree import map_tensors, tensors_in

_OPS = ("sum", "mean", "max", "min")


def reduce(value: Any, op: str = "sum") -> Any:
    """Combine ``value`` over all ranks; every rank gets the result.

    Args:
        value: a tensor, a Python or NumPy int or float, a nested tuple/list/dict of
            tensors, or a NumPy array or a nested list/tuple/dict of numbers (per-class counts
            such as ``class_total = [0.] * 10``), combined elementwise: a dict's keys are the
            union of every rank's (a missing key counts as zero).
        op: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.

    Returns:
        The same kind of value: a new tensor on the input's device, an int for ints (a float for
        ``"mean"``), a float for floats (summed in float64), a NumPy number of the same type for
        a NumPy number; a new container of the same types for a container of numbers. In a
        single process, ``value`` itself.
    """
    if op not in _OPS:
        raise DistifyError(f"unknown reduce op {op!r}: use one of {', '.join(_OPS)}")
    number = isinstance(value, (bool, int, float)) or _is_numpy_scalar(value)
    numbers = not number and _elementwise.is_container_of_numbers(value)
    if not number and not numbers and not tensors_in(value):
        raise DistifyTypeError(f"distify.reduce takes tensors, Python numbers or containers of "
                               f"numbers, not "
                               f"{type(value).__name__}")
    if _state.world_size() == 1:
        return value
    if _state.settings().debug:
        _debug.check(f"reduce({op}, {_debug.describe(value)})")
    if number:
        return _reduce_number(value, op)
    if numbers:
        return _elementwise.reduce_elementwise(value, op)
    return map_tensors(value, lambda tensor: _reduce_tensor(tensor, op))


def gather(value: Any) -> Any:
    """Concatenate ``value`` from all ranks along dim 0, in rank order.

    Args:
        value: a tensor (first dimensions may differ between ranks; 0-d tensors count as one
            element), a nested tuple/list/dict of tensors, or a list of Python objects.

    Returns:
        The gathered value, on the input's device. In a single process, ``value`` itself.
    """
    return _gather(value, drop=0, name="gather")


def gather_for_metrics(value: Any) -> Any:
    """:func:`gather` for per-sample results of the current batch of a prepared DataLoader,
    minus the samples that a padded training-mode shard repeated: the result has exactly one
    entry per dataset sample over the whole loop.

    Args:
        value: per-sample predictions, labels, losses... of the current batch (dim 0 = samples).

    Returns:
        The gathered value without repeated samples. In a single process, ``value`` itself.
    """
    return _gather(value, drop=_data.current_padding(), name="gather_for_metrics")


def gather_list(items: list) -> list:
    """Every process's ``items``, concatenated rank by rank: for a list filled one item at a
    time (hypotheses and references for BLEU, per-sample labels) in an evaluation loop over a
    prepared loader, gathered once after the loop. Lists gathered this way keep their items
    paired; evaluation repeats no sample, so the result holds each once (in training, a padded
    shard's repeats stay in: use :func:`gather_for_metrics` per batch there).

    Args:
        items: a list of picklable items. Tensors among them travel through the CPU and come
            back on the device this process's tensors were on (the CPU when they were on
            several).

    Returns:
        A new list with every process's items. In a single process, ``items`` itself.

    Raises:
        DistifyTypeError: ``items`` is not a list.
    """
    if not isinstance(items, list):
        raise DistifyTypeError(f"distify.gather_list takes a list, not {type(items).__name__}")
    if _state.world_size() == 1:
        return items
    if _state.settings().debug:
        _debug.check("gather_list")
    devices = {tensor.device for tensor in tensors_in(items)}
    home = devices.pop() if len(devices) == 1 else torch.device("cpu")
    portable = map_tensors(items, lambda tensor: tensor.detach().cpu())
    everyone = _objects.all_gather_object(portable, _state.comm_device())
    joined = [item for rank_items in everyone for item in rank_items]
    return joined if home.type == "cpu" else map_tensors(joined, lambda t: t.to(home))


def reduce_meters(*meters: Any) -> None:
    """Sum running-average meters (``AverageMeter``-style objects with ``sum`` and ``count``)
    over all ranks, in place, and recompute their ``avg``: an average over every rank's
    samples, which equals the single-process one when every rank's ``update(value, n)`` was
    given per-sample means weighted by their sample counts. ``val`` (the last value) stays
    this rank's. One collective for all of them; in a single process, nothing changes.

    Raises:
        DistifyTypeError: a meter has no numeric ``sum`` and ``count``.
    """
    fields = []
    for meter in meters:
        for name in ("sum", "count"):
            value = getattr(meter, name, None)
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise DistifyTypeError(
                    f"distify.reduce_meters: {type(meter).__name__} has no numeric `.{name}` "
                    f"({type(value).__name__}): reduce its totals with distify.reduce instead")
            fields.append(value)
    if _state.world_size() == 1 or not meters:
        return
    if _state.settings().debug:
        _debug.check(f"reduce_meters({len(meters)})")
    totals = _reduce_tensor(torch.tensor(fields, dtype=torch.float64), "sum").tolist()
    for index, meter in enumerate(meters):
        total, count = totals[2 * index], totals[2 * index + 1]
        integral = isinstance(fields[2 * index + 1], int)
        _set_number(meter, "sum", total, like=meter.sum)
        _set_number(meter, "count", int(round(count)) if integral else count,
                    like=meter.count)
        if hasattr(meter, "avg") and count:
            _set_number(meter, "avg", total / count, like=meter.avg)


def _set_number(meter: Any, name: str, value: float, like: Any) -> None:
    if isinstance(like, torch.Tensor):
        value = torch.tensor(value, dtype=like.dtype, device=like.device).reshape(like.shape)
    setattr(meter, name, value)


def broadcast_object(obj: Any) -> Any:
    """The main process's ``obj`` on every rank (e.g. a run name made from its clock).

    Args:
        obj: any picklable object; only the main process's value is used.

    Returns:
        The main process's object. In a single process, ``obj`` itself.
    """
    if _state.world_size() == 1:
        return obj
    if _state.settings().debug:
        _debug.check("broadcast_object")
    return _objects.broadcast_object(obj, 0, _state.comm_device())


def shared_generator() -> torch.Generator:
    """A CPU random generator that draws the same numbers on every rank: the main process's.

    For draws every process must agree on, such as a ``random_split`` of the data set or a
    ``randperm`` of its indices: converted scripts pass it as ``generator=``. It is
    ``torch.default_generator`` itself, so the draw is exactly what the original script makes on
    the main process (and in a single process); on the other ranks it first takes the main
    process's state. So after the draw every rank's generator goes on as the main process's
    does: a script that seeds every rank alike keeps the same random numbers on every rank (its
    dropout masks, say, stay the single process's), as it had before the draw.

    Every rank must call it, the same number of times, but not at the same moment: the state
    goes through the job's key-value store, not a collective, so it also works inside
    :func:`main_process_first` (a dataset helper that downloads, then splits).

    Returns:
        The generator to pass as ``generator=``.
    """
    if _state.world_size() == 1:
        return torch.default_generator
    draws = _state.current().part(_SharedDraws)
    draws.count += 1
    store = _state.shared_store()
    main = _state.is_main_process()
    debug = _state.settings().debug
    key = f"generator/{draws.count}"
    if store is None:  # no store to go through: all ranks meet here instead
        state = broadcast_object(torch.default_generator.get_state())
    elif main:
        state = torch.default_generator.get_state()
        if debug:  # published first: the others read it once the state is there
            store.set(f"{key}/site", _debug.call_site().encode())
        store.set(key, bytes(state.tolist()))  # uint8 values: exact, and no numpy needed
    else:  # waits until the main process has published it (up to the job's timeout)
        raw = store.get(key)
        state = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if debug:
            _debug.check_same_draw(draws.count, store.get(f"{key}/site").decode())
    if not main:
        torch.default_generator.set_state(state)
    return torch.default_generator


class _SharedDraws:
    """The runtime's part (see ``_state.Runtime``): how many times this process called
    shared_generator (its draws are numbered alike on every rank)."""

    def __init__(self) -> None:
        self.count = 0


def shared_draws() -> int:
    """How many ``shared_generator`` draws this process made (for ``save_state``)."""
    return _state.current().part(_SharedDraws).count


def restore_shared_draws(count: int) -> None:
    """Number the next ``shared_generator`` draws on from ``count`` (``load_state``)."""
    _state.current().part(_SharedDraws).count = count


def wait_for_everyone() -> None:
    """Block until every rank arrives here (a barrier); nothing happens in a single process."""
    _barrier("wait_for_everyone")


def _barrier(name: str) -> None:
    if _state.world_size() == 1:
        return
    if _state.settings().debug:
        _debug.check(name)
    _strategy.current().barrier()


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """Run the body on the main process first, then on the others (e.g. a dataset download)."""
    with _first(_state.is_main_process(), "main_process_first"):
        yield


@contextlib.contextmanager
def local_main_process_first() -> Iterator[None]:
    """Run the body on each machine's local main process first, then on the other processes."""
    with _first(_state.is_local_main_process(), "local_main_process_first"):
        yield


@contextlib.contextmanager
def _first(leader: bool, name: str) -> Iterator[None]:
    if not leader:
        _barrier(name)
    try:
        yield
    finally:
        # Also on failure: the others must not wait for a barrier the leader never reaches.
        if leader:
            _barrier(name)


def _reduce_number(value: Any, op: str) -> Any:
    if _is_numpy_scalar(value):  # a NumPy number comes back as one of its own type
        kind = type(value)
        plain = value.item()
        result = _reduce_number(plain, op)
        return kind(result) if isinstance(plain, float) or op != "mean" else result
    dtype = torch.float64 if isinstance(value, float) else torch.int64
    result = _reduce_tensor(torch.tensor(value, dtype=dtype), op).item()
    return result if op == "mean" or isinstance(value, float) else int(result)


def _is_numpy_scalar(value: Any) -> bool:
    """A NumPy number (``np.float32(0.5)``, ``loss.mean()`` of an array); no NumPy import."""
    kind = type(value)
    return kind.__module__ == "numpy" and hasattr(value, "item") and \
        getattr(value, "shape", None) == () and isinstance(value.item(), (bool, int, float))


def _reduce_tensor(tensor: torch.Tensor, op: str) -> torch.Tensor:
    work = tensor.detach().to(_state.comm_device(), copy=True)
    _strategy.current().all_reduce(work, op={"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM,
                              "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    if op == "mean":
        work = work / _state.world_size()
    return work.to(tensor.device)


def _gather(value: Any, drop: int, name: str) -> Any:
    if _state.world_size() == 1:
        return value
    if _state.settings().debug:
        _debug.check(f"{name}({_debug.describe(value, any_length=True)})")
    if isinstance(value, list) and not tensors_in(value):
        return _gather_objects(value, drop)
    if _is_ndarray(value):  # NumPy arrays travel as tensors (no NumPy import needed here)
        return _gather_tensor(torch.from_numpy(value), drop).numpy()
    return map_tensors(value, lambda tensor: _gather_tensor(tensor, drop))


def _is_ndarray(value: Any) -> bool:
    kind = type(value)
    return kind.__name__ == "ndarray" and kind.__module__ == "numpy"


def _gather_tensor(tensor: torch.Tensor, drop: int) -> torch.Tensor:
    local = tensor.detach().to(_state.comm_device())
    if local.dim() == 0:
        local, drop = local.reshape(1), 0  # a scalar is not a per-sample value
    meta = torch.tensor([local.shape[0], min(drop, local.shape[0]), *local.shape[1:]],
                        device=local.device)
    metas = [torch.empty_like(meta) for _ in range(_state.world_size())]
    _strategy.current().all_gather(metas, meta)
    if any(not torch.equal(m[2:], meta[2:]) for m in metas):
        shapes = [tuple(m[[0, *range(2, len(m))]].tolist()) for m in metas]
        raise DistifyError(f"distify.gather: the ranks' tensors differ beyond dim 0 ({shapes}): "
                           "pad them to one shape first")
    longest = max(int(m[0]) for m in metas)
    if local.shape[0] < longest:
        filler = local.new_zeros((longest - local.shape[0], *local.shape[1:]))
        local = torch.cat([local, filler])
    parts = [torch.empty_like(local) for _ in metas]
    _strategy.current().all_gather(parts, local.contiguous())
    kept = [part[: int(m[0]) - int(m[1])] for part, m in zip(parts, metas)]
    return torch.cat(kept).to(tensor.device)


def _gather_objects(items: list, drop: int) -> list:
    everyone = _objects.all_gather_object((items, min(drop, len(items))), _state.comm_device())
    return [item for rank_items, dropped in everyone
            for item in rank_items[: len(rank_items) - dropped]]
