"""A job whose processes all train on the same data: said, once, at its first training forward.

A DataLoader built in a module that was not converted (or not passed to ``prepare``), batches
drawn with the script's seed on every process, an environment seeded alike: the job runs, the
replicas stay identical, and N processes do the work of one, with nothing to show for it. At the
first training forward through a prepared model the processes compare a fingerprint of its
tensor inputs (their sums, plain and position-weighted, in float64, on the device: one small
all-gather, once per job); when every process's is the same, the main process warns, naming the
likely causes. Full-batch training (every step over the whole data set, which ``distify
convert`` reports as such) is the one case where that is expected; ``DISTIFY_SAME_DATA=ok``
silences the warning there.
"""

from __future__ import annotations

import os
import warnings

import torch

from . import _state, _strategy
from ._tree import tensors_in

_MAX_TENSORS = 4
_MESSAGE = (
    "distify: the {n} processes' first training batches are identical, so every process trains "
    "on the same data and {n} processes do the work of one. A DataLoader built in a file that "
    "was not converted, or not passed to distify.prepare, does that (prepare it where it is "
    "built, or convert that file too), as do batches or environments drawn with the same seed "
    "on every process. Expected only for full-batch training (every step over the whole data "
    "set): set DISTIFY_SAME_DATA=ok to silence this there")


class _Checked:
    """The runtime's part (see ``_state.Runtime``): whether this job compared already."""

    def __init__(self) -> None:
        self.done = False


def check_first_batch(args: tuple, kwargs: dict) -> None:
    """At a training forward: the first time in this job, compare the inputs' fingerprints."""
    checked = _state.current().part(_Checked)
    if checked.done:
        return
    checked.done = True
    if _state.world_size() == 1 or os.environ.get("DISTIFY_SAME_DATA", "").lower() == "ok":
        return
    mine = _fingerprint(tensors_in((args, kwargs)))
    everyone = [torch.empty_like(mine) for _ in range(_state.world_size())]
    _strategy.current().all_gather(everyone, mine)
    if mine[0] > 0 and all(torch.equal(other, everyone[0]) for other in everyone[1:]) \
            and _state.is_main_process():
        warnings.warn(_MESSAGE.format(n=_state.world_size()), stacklevel=4)


def _fingerprint(tensors: list[torch.Tensor]) -> torch.Tensor:
    """[count, then per tensor (up to 4): numel, sum, position-weighted sum], float64."""
    device = _state.comm_device()
    out = torch.zeros(1 + 3 * _MAX_TENSORS, dtype=torch.float64, device=device)
    used = [t for t in tensors if t.layout == torch.strided and t.numel()  # sparse: no reshape
            and not t.is_complex()][:_MAX_TENSORS]
    out[0] = len(used)
    with torch.no_grad():
        for i, tensor in enumerate(used):
            flat = tensor.detach().reshape(-1).to(torch.float64)
            weights = torch.arange(flat.numel(), device=flat.device, dtype=torch.float64) \
                .remainder_(1009).add_(1)
            row = torch.stack([torch.tensor(float(flat.numel()), dtype=torch.float64,
                                            device=flat.device),
                               flat.sum(), (flat * weights).sum()])
            out[1 + 3 * i: 4 + 3 * i] = row.to(device)
    return out
