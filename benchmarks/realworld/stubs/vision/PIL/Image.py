from __future__ import annotations

import hashlib

import torch

BICUBIC = BILINEAR = NEAREST = LANCZOS = ANTIALIAS = 0


class Image:
    def __init__(self, tensor, mode="RGB"):
        self.tensor, self.mode = tensor, mode

    @property
    def size(self):
        return (self.tensor.shape[-1], self.tensor.shape[-2])

    def convert(self, mode):
        c = self.tensor.shape[0]
        want = 1 if mode == "L" else 3
        t = self.tensor[:1] if want == 1 else (self.tensor.expand(3, -1, -1) if c == 1 else self.tensor)
        return Image(t.clone(), mode)

    def copy(self):
        return Image(self.tensor.clone(), self.mode)

    def split(self):
        return tuple(Image(self.tensor[i:i + 1].clone(), "L") for i in range(self.tensor.shape[0]))

    def resize(self, size, *args, **kwargs):
        w, h = size
        t = torch.nn.functional.interpolate(self.tensor.unsqueeze(0), size=(h, w))[0]
        return Image(t, self.mode)

    def save(self, fp, *args, **kwargs):
        with open(fp, "wb") as f:
            f.write(repr(self.tensor.sum().item()).encode())

    def __array__(self, dtype=None):
        return (self.tensor.permute(1, 2, 0) * 255).numpy()


def open(fp, *args, **kwargs):
    seed = int(hashlib.sha1(str(fp).encode()).hexdigest()[:8], 16)
    g = torch.Generator().manual_seed(seed)
    return Image(torch.rand(3, 64, 64, generator=g), "RGB")


def new(mode, size, color=0):
    return Image(torch.zeros(3 if mode != "L" else 1, size[1], size[0]), mode)


def fromarray(arr, mode=None):
    t = torch.as_tensor(arr, dtype=torch.float32)
    t = t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)
    return Image(t / 255.0, mode or "RGB")


def merge(mode, bands):
    return Image(torch.cat([b.tensor for b in bands]), mode)
