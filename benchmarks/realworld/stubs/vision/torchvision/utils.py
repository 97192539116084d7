"""``save_image`` and ``make_grid`` that really write / build something."""
from __future__ import annotations

import torch


def make_grid(tensor, nrow=8, padding=2, normalize=False, **kwargs):
    if isinstance(tensor, (list, tuple)):
        tensor = torch.stack(list(tensor))
    if tensor.dim() == 4:
        return torch.cat(list(tensor), dim=-1)
    return tensor


def save_image(tensor, fp, nrow=8, padding=2, normalize=False, **kwargs):
    grid = make_grid(tensor.detach().cpu() if torch.is_tensor(tensor) else tensor)
    data = repr(grid.float().sum().item()).encode() + b"\n"
    if hasattr(fp, "write"):
        fp.write(data)
    else:
        with open(fp, "wb") as f:
            f.write(data)
