"""Exact resume: ``save_state(dir)`` and ``load_state(dir)``.

A job killed mid-epoch and restarted (``distify launch --max_restarts N``, or by hand) continues
with the same batches and ends with the same weights as a run that was never interrupted, when
the script saves its state with :func:`save_state` and starts with :func:`load_state`. The
folder holds, for everything the script prepared (in the order it prepared them, which is the
same in every run of the script):

- ``model_<i>.pt``, ``optimizer_<i>.pt``, ``scheduler_<i>.pt``: their ``state_dict()`` (under
  FSDP the full ones, written by the main process; with ``fsdp_state_dict_type:
  SHARDED_STATE_DICT`` the models and their optimizers are folders of torch.distributed.checkpoint
  shards, one per process, instead); ``scaler.pt``: the fp16 loss scaler's;
- ``random_<rank>.pt``: each process's random state (Python, NumPy, torch, the GPU's, distify's
  per-process generators) and, for each prepared DataLoader, the random state at the start of
  its epoch;
- ``distify_state.pt``: the number of processes, where each DataLoader stands (epochs, batches
  given in the current one), and the script's own values (``save_state(dir, epoch=e)``).

The folder appears whole or not at all: every process writes into a scratch folder beside it,
and the main process renames that over the old one once all have finished (a crash in between
leaves the previous state; :func:`load_state` also finds it when the crash fell between the two
renames, and takes the newest complete state by the generation recorded in it). The next
successful save removes what crashed saves left beside the folder (``<dir>.tmp-*``,
``<dir>.old-*``). All processes must see the folder (one machine, or a shared file system).

On :func:`load_state`, a DataLoader that was in the middle of an epoch continues it: its next
``iter()`` draws the epoch's order from the random state the epoch started with, reads past the
batches already trained on, and goes on from there. With another number of processes than the
saved one, the weights, optimizers and schedulers are restored but the data order and random
numbers start anew (a warning says so).
"""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from typing import Any

import torch
from torch import nn

from . import _collectives, _draws, _precision, _prepare, _random, _state, _strategy
from ._data import Position, PreparedDataLoader
from ._errors import DistifyError

_STATE_FILE = "distify_state.pt"
_FORMAT = 1


def save_state(directory: str | os.PathLike, **values: Any) -> None:
    """Save the training state of everything prepared, to resume exactly (see the module doc).

    Every process must call it, at the same point (it synchronises the processes).

    Args:
        directory: the folder to write (replaced whole, atomically, if it exists).
        **values: the script's own values to get back from :func:`load_state` (``epoch=...,
            step=..., best_loss=...``); picklable.
    """
    settings = _state.settings()
    main = settings.rank == 0
    target = os.path.normpath(os.fspath(directory))
    token = uuid.uuid4().hex[:12] if main else None
    if settings.world_size > 1:
        token = _collectives.broadcast_object(token)
    scratch = f"{target}.tmp-{token}"
    if main:
        os.makedirs(scratch)
    _collectives.wait_for_everyone()  # the scratch folder exists for everyone
    try:
        _write(scratch, settings, values)
    except BaseException:
        _collectives.wait_for_everyone()
        if main:
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    _collectives.wait_for_everyone()  # every process has written its part
    if main:
        _publish(scratch, target, token)
        _remove_debris(target)
    _collectives.wait_for_everyone()  # the folder is in place before anyone reads it


def load_state(directory: str | os.PathLike) -> dict[str, Any] | None:
    """Restore what :func:`save_state` wrote into the objects this run prepared.

    Call it after ``distify.prepare(...)``, on every process. A DataLoader saved in the middle
    of an epoch continues that epoch at its next ``iter()`` (see the module docstring).

    Args:
        directory: the folder :func:`save_state` wrote.

    Returns:
        The values given to :func:`save_state` (a dict), or None when there is no such folder
        (a first run: start from scratch).

    Raises:
        DistifyError: the folder does not match what this run prepared.
    """
    settings = _state.settings()
    found = _existing(os.path.normpath(os.fspath(directory))) if settings.rank == 0 else None
    if settings.world_size > 1:
        found = _collectives.broadcast_object(found)
    if found is None:
        return None
    saved = torch.load(os.path.join(found, _STATE_FILE), weights_only=False)
    if saved.get("format") != _FORMAT:
        raise DistifyError(f"{found}: not a state written by distify.save_state (format "
                           f"{saved.get('format')!r})")
    _state.current().part(_Generation).number = saved.get("generation", 0)
    prepared = _prepare.prepared()
    _check_counts(found, saved["counts"], prepared)
    sharded = saved.get("sharded", False)
    for index, model in enumerate(prepared.live("models")):
        _load_model(found, index, model, sharded)
    for index, optimizer in enumerate(prepared.live("optimizers")):
        _load_optimizer(found, index, optimizer, sharded)
    for index, scheduler in enumerate(prepared.live("schedulers")):
        scheduler.load_state_dict(_read(found, f"scheduler_{index}.pt"))
    scaler = _precision.loss_scaler()
    if scaler is not None and os.path.exists(os.path.join(found, "scaler.pt")):
        scaler.load_state_dict(_read(found, "scaler.pt"))
    if saved["world_size"] != settings.world_size:
        warnings.warn(f"distify.load_state: {found} was saved by {saved['world_size']} "
                      f"process(es), this job has {settings.world_size}: the weights, optimizers "
                      "and schedulers are restored, the data order and random numbers start "
                      "anew", stacklevel=2)
        return dict(saved["values"])
    randomness = _read(found, f"random_{settings.rank}.pt")
    _random.restore(randomness["global"])
    _draws.restore(randomness["distify"])
    for loader, (epochs, done, finished), start in zip(
            prepared.live("loaders"), saved["loaders"], randomness["loaders"]):
        loader.resume_from(Position(epochs, done, finished, start))
    _collectives.restore_shared_draws(saved["shared_draws"])
    return dict(saved["values"])


def _write(scratch: str, settings: _state.Settings, values: dict[str, Any]) -> None:
    main = settings.rank == 0
    prepared = _prepare.prepared()
    sharded = _sharded(settings)
    for index, model in enumerate(prepared.live("models")):
        if sharded:
            _dcp_save({"model": nn.Module.state_dict(model)}, scratch, f"model_{index}")
        else:
            state = model.state_dict()  # every process: under FSDP a collective
            if main:
                torch.save(state, os.path.join(scratch, f"model_{index}.pt"))
    for index, optimizer in enumerate(prepared.live("optimizers")):
        if sharded:
            _dcp_save({"optimizer": _sharded_optimizer_state(optimizer)}, scratch,
                      f"optimizer_{index}")
        else:
            state = optimizer.state_dict()
            if main:
                torch.save(state, os.path.join(scratch, f"optimizer_{index}.pt"))
    loaders: list[PreparedDataLoader] = prepared.live("loaders")
    if main:
        for index, scheduler in enumerate(prepared.live("schedulers")):
            torch.save(scheduler.state_dict(), os.path.join(scratch, f"scheduler_{index}.pt"))
        scaler = _precision.loss_scaler()
        if scaler is not None:
            torch.save(scaler.state_dict(), os.path.join(scratch, "scaler.pt"))
        positions = [loader.position() for loader in loaders]
        generation = _state.current().part(_Generation)
        generation.number += 1
        torch.save({
            "format": _FORMAT, "generation": generation.number,
            "world_size": settings.world_size,
            "strategy": settings.strategy, "sharded": sharded,
            "counts": {kind: len(prepared.live(kind)) for kind in prepared.KINDS},
            "loaders": [(p.epochs, p.done, p.finished) for p in positions],
            "shared_draws": _collectives.shared_draws(), "values": values,
        }, os.path.join(scratch, _STATE_FILE))
    torch.save({"global": _random.snapshot(), "distify": _draws.snapshot(),
                "loaders": [loader.position().epoch_random for loader in loaders]},
               os.path.join(scratch, f"random_{settings.rank}.pt"))


def _publish(scratch: str, target: str, token: str) -> None:
    """Rename ``scratch`` over ``target``: the old state goes aside first, then away."""
    old = f"{target}.old-{token}"
    if os.path.exists(target):
        os.replace(target, old)
    os.replace(scratch, target)
    shutil.rmtree(old, ignore_errors=True)


class _Generation:
    """The runtime's part (see ``_state.Runtime``): the number of the last state saved or
    loaded; each save writes the next, so the newest state is known whatever its folder."""

    def __init__(self) -> None:
        self.number = 0


def _existing(target: str) -> str | None:
    """The newest complete state: ``target``, or one a crash left aside (``<target>.old-*``,
    between the two renames of a save), by the generation recorded inside (a state saved
    from a resumed one counts on from it), then by when it was written. A scratch folder
    (``.tmp-*``) is never resumed from: a crash may have cut it short."""
    candidates = [target] + _siblings(target, ".old-")
    complete = [path for path in candidates if os.path.isfile(os.path.join(path, _STATE_FILE))]
    return max(complete, key=_age, default=None)


def _age(path: str) -> tuple[int, float]:
    state_file = os.path.join(path, _STATE_FILE)
    try:
        generation = torch.load(state_file, weights_only=False).get("generation", 0)
    except Exception:  # unreadable: the oldest
        return (-1, 0.0)
    return (generation if isinstance(generation, int) else 0, os.path.getmtime(state_file))


def _siblings(target: str, infix: str) -> list[str]:
    """``<target><infix>*`` folders beside ``target``."""
    folder, name = os.path.split(target)
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return []
    return sorted(os.path.join(folder, entry) for entry in entries
                  if entry.startswith(f"{name}{infix}"))


def _remove_debris(target: str) -> None:
    """After a save: what crashed saves left (scratch folders, states set aside) goes."""
    for path in _siblings(target, ".tmp-") + _siblings(target, ".old-"):
        shutil.rmtree(path, ignore_errors=True)


def _check_counts(found: str, counts: dict[str, int], prepared: _prepare.Prepared) -> None:
    differ = [f"{counts[kind]} {kind} saved, {len(prepared.live(kind))} prepared"
              for kind in prepared.KINDS if counts.get(kind, 0) != len(prepared.live(kind))]
    if differ:
        hint = (" (call distify.load_state after distify.prepare)"
                if not any(prepared.live(kind) for kind in prepared.KINDS) else "")
        raise DistifyError(f"distify.load_state: {found} does not match this run: "
                           f"{'; '.join(differ)}{hint}")


def _read(found: str, name: str) -> Any:
    # distify's own files (random states hold NumPy arrays and tuples): not weights_only
    return torch.load(os.path.join(found, name), map_location="cpu", weights_only=False)


def _load_model(found: str, index: int, model: nn.Module, sharded: bool) -> None:
    if sharded:
        state = {"model": nn.Module.state_dict(model)}
        _dcp_load(state, found, f"model_{index}")
        nn.Module.load_state_dict(model, state["model"])
        return
    main = _state.is_main_process()
    # Under FSDP only the main process's dict is read: the others need not load the file.
    needed = main or _state.world_size() == 1 or not _strategy.current().model_state_from_main()
    model.load_state_dict(_read(found, f"model_{index}.pt") if needed else {})


def _load_optimizer(found: str, index: int, optimizer: torch.optim.Optimizer,
                    sharded: bool) -> None:
    if sharded:
        _load_sharded_optimizer(found, index, optimizer)
        return
    optimizer.load_state_dict(_read(found, f"optimizer_{index}.pt"))


def _sharded(settings: _state.Settings) -> bool:
    return settings.world_size > 1 and _strategy.current().sharded_checkpoints()


def _dcp_save(state: dict, scratch: str, name: str) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, checkpoint_id=os.path.join(scratch, name))


def _dcp_load(state: dict, found: str, name: str) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.load(state, checkpoint_id=os.path.join(found, name))


def _sharded_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    from . import _fsdp

    return _fsdp.sharded_optimizer_state(optimizer)


def _load_sharded_optimizer(found: str, index: int, optimizer: torch.optim.Optimizer) -> None:
    from . import _fsdp

    state = {"optimizer": _fsdp.sharded_optimizer_state(optimizer)}
    _dcp_load(state, found, f"optimizer_{index}")
    _fsdp.load_sharded_optimizer_state(optimizer, state["optimizer"])
