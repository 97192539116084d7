"""The job that `distify test` runs on N processes: four checks of the distributed set-up.

`distify test` copies this file into a temporary folder and launches it through torchrun, the
way `distify launch` runs a script; it can also be run by hand
(``torchrun --nproc-per-node 2 selftest_job.py``). It imports only torch, the standard library
and ``distify.runtime``, and writes nothing outside its own folder (one checkpoint).

Every check runs on every rank. The main process prints ``<check>: ok`` for each; a rank where
a check fails prints ``<check>: FAILED on rank R: <error>`` and exits 1 (torchrun then stops
the others). Before the checks, the main process prints
``start-up: ok (N processes, <backend>, <device type>)``.

What it deliberately does not check: mixed precision, several machines, or speed.
"""

from __future__ import annotations

import builtins
import copy
import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

import distify.runtime as distify
from distify.runtime import _objects

CHECKS = ("all-reduce", "DDP step", "save/load", "gather_for_metrics")
_BATCH = 2


class CheckFailed(Exception):
    """A check saw a wrong result (not a crash)."""


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def _everyone(value: Any) -> list[Any]:
    """``value`` from every rank, gathered with plain torch.distributed collectives (not the
    runtime's gather under test; no NumPy needed, unlike ``dist.all_gather_object``)."""
    if distify.world_size() == 1:
        return [value]
    device = distify.device() if dist.get_backend() == "nccl" else torch.device("cpu")
    return _objects.all_gather_object(value, device)


def start_up() -> str:
    distify.init()
    backend = dist.get_backend() if dist.is_initialized() else "no process group"
    count = distify.world_size()
    return f"{count} process{'es' if count > 1 else ''}, {backend}, {distify.device().type}"


def all_reduce() -> None:
    world = distify.world_size()
    mine = torch.arange(4, dtype=torch.float64, device=distify.device()) + distify.rank()
    total = distify.reduce(mine)
    expected = torch.arange(4, dtype=torch.float64) * world + world * (world - 1) / 2
    _expect(torch.equal(total.cpu(), expected),
            f"the sum over {world} ranks is {total.tolist()}, expected {expected.tolist()}")


def ddp_step() -> torch.nn.Module:
    """One SGD step of a prepared model on different data per rank: the gradient must be the
    ranks' average and the weights bit-identical everywhere afterwards."""
    distify.set_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    model = distify.prepare(model)
    optimizer = distify.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    data = torch.randn(8, 4, generator=torch.Generator().manual_seed(1000 + distify.rank()))
    _expect(len(set(_everyone(_digest([data])))) == distify.world_size(),
            "the ranks drew the same data, so the step proves nothing")
    distify.backward(model(data.to(distify.device())).square().mean())
    # The average of the gradients each rank computes alone, on a plain copy of the model.
    local = torch.autograd.grad(reference(data).square().mean(), list(reference.parameters()))
    for (name, param), grad in zip(model.named_parameters(), local):
        expected = distify.reduce(grad, "mean")
        _expect(torch.allclose(param.grad.cpu(), expected, rtol=1e-5, atol=1e-7),
                f"the gradient of {name} is not the average of the ranks' gradients")
    optimizer.step()
    digests = _everyone(_digest(model.parameters()))
    _expect(len(set(digests)) == 1, "after one step the ranks' parameters differ (checksums "
                                    f"{', '.join(d[:12] for d in digests)})")
    return model


def save_load(model: torch.nn.Module) -> None:
    """The main process saves the state dict; every rank loads it and gets the same values."""
    path = Path(__file__).resolve().parent / "checkpoint.pt"
    state = model.state_dict()
    distify.save(state, path)  # only the main process writes; the others' loads wait for it
    loaded = distify.load(path)
    _expect(sorted(loaded) == sorted(state),
            f"the checkpoint's keys are {sorted(loaded)}, expected {sorted(state)}")
    for key, value in state.items():
        _expect(torch.equal(loaded[key].cpu(), value.cpu()),
                f"{key} loaded on rank {distify.rank()} differs from the saved value")


def gather_for_metrics(model: torch.nn.Module) -> None:
    """Uneven shards (the dataset length is not a multiple of world size x batch): the
    gathered per-sample values, training-mode padded or not, are exactly the dataset."""
    size = distify.world_size() * _BATCH + 1
    for training in (True, False):
        loader = distify.prepare(DataLoader(TensorDataset(torch.arange(size)),
                                            batch_size=_BATCH, shuffle=True))
        model.train(training)
        seen: list[int] = []
        with torch.set_grad_enabled(training):
            for (indices,) in loader:
                seen += distify.gather_for_metrics(indices).tolist()
        mode = "training" if training else "evaluation"
        _expect(sorted(seen) == list(range(size)),
                f"{mode}: gathered {sorted(seen)} from a dataset of {size} samples")


def _digest(tensors: Any) -> str:
    sha = hashlib.sha256()
    for tensor in tensors:
        # the raw bytes, so equal checksums mean bit-identical values (no numpy needed)
        sha.update(bytes(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).tolist()))
    return sha.hexdigest()


def _run(name: str, check: Callable[..., Any], *args: Any) -> Any:
    """Run one check; on failure say so, from the rank where it failed, and exit 1."""
    try:
        result = check(*args)
    except Exception as err:
        message = (str(err).strip().splitlines() or [""])[0]
        if not isinstance(err, CheckFailed):
            message = f"{type(err).__name__}: {message}"
        rank = os.environ.get("RANK", "0")  # the runtime may be what failed to start
        builtins.print(f"{name}: FAILED on rank {rank}: {message}", flush=True)
        sys.exit(1)
    detail = f" ({result})" if isinstance(result, str) else ""
    distify.print(f"{name}: ok{detail}", flush=True)
    return result


def main() -> None:
    _run("start-up", start_up)
    _run("all-reduce", all_reduce)
    model = _run("DDP step", ddp_step)
    _run("save/load", save_load, model)
    _run("gather_for_metrics", gather_for_metrics, model)


if __name__ == "__main__":
    main()
