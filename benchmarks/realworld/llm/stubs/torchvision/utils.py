"""save_image writes the tensor with torch.save (a file is written, as by the real one)."""
from __future__ import annotations


def make_grid(tensor, *args, **kwargs):
    return tensor


def save_image(tensor, fp, *args, **kwargs):
    import torch

    torch.save(tensor.detach().cpu(), fp)
