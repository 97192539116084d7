"""With ``RW_CUDA_NOOP=1``, ``Tensor.cuda()`` and ``Module.cuda()`` return what they were given,
as if this CPU box had a GPU, so a script that calls ``.cuda()`` unconditionally (SupContrast)
runs its original here. Imported by the torchvision stub; nothing else changes."""
from __future__ import annotations

import os

import torch

if os.environ.get("RW_CUDA_NOOP") == "1":
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
