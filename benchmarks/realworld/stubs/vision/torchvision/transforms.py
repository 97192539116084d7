"""Transforms as callables on a (C, H, W) float tensor or the PIL stub's Image."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _t(img):
    return img.tensor if hasattr(img, "tensor") else img


def _size(size):
    return (size, size) if isinstance(size, int) else tuple(size)


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class ToTensor:
    def __call__(self, img):
        x = _t(img)
        if not isinstance(x, torch.Tensor):
            x = torch.as_tensor(x, dtype=torch.float32)
            if x.dim() == 3:
                x = x.permute(2, 0, 1) / 255.0
        return x.float()


class PILToTensor(ToTensor):
    pass


class ToPILImage:
    def __call__(self, img):
        from PIL import Image
        return Image.Image(_t(img))


class Normalize:
    def __init__(self, mean, std, inplace=False):
        self.mean, self.std = torch.tensor(mean), torch.tensor(std)

    def __call__(self, x):
        x = _t(x)
        c = x.shape[0]
        m = self.mean.reshape(-1, 1, 1)[:c] if self.mean.numel() > 1 else self.mean
        s = self.std.reshape(-1, 1, 1)[:c] if self.std.numel() > 1 else self.std
        return (x - m) / s


class Resize:
    def __init__(self, size, *args, **kwargs):
        self.size = size

    def __call__(self, img):
        x = _t(img)
        if isinstance(self.size, int):
            h, w = x.shape[-2:]
            s = self.size
            out = (s, max(1, round(w * s / h))) if h <= w else (max(1, round(h * s / w)), s)
        else:
            out = _size(self.size)
        y = F.interpolate(x.unsqueeze(0), size=out, mode="bilinear", align_corners=False)[0]
        return _wrap(img, y)


Scale = Resize


class CenterCrop:
    def __init__(self, size):
        self.size = _size(size)

    def __call__(self, img):
        x = _t(img)
        h, w = x.shape[-2:]
        th, tw = self.size
        if th > h or tw > w:
            x = F.interpolate(x.unsqueeze(0), size=(max(th, h), max(tw, w)))[0]
            h, w = x.shape[-2:]
        i, j = (h - th) // 2, (w - tw) // 2
        return _wrap(img, x[..., i:i + th, j:j + tw])


class RandomCrop(CenterCrop):
    def __init__(self, size, padding=None, **kwargs):
        super().__init__(size)
        self.padding = padding

    def __call__(self, img):
        x = _t(img)
        if self.padding:
            x = F.pad(x, [self.padding] * 4)
        return super().__call__(_wrap(img, x))


class RandomResizedCrop(Resize):
    def __init__(self, size, scale=None, ratio=None, **kwargs):
        super().__init__(_size(size))


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, img):
        return _wrap(img, _t(img).flip(-1)) if torch.rand(1).item() < self.p else img


class Pad:
    def __init__(self, padding, fill=0, **kwargs):
        self.padding = padding

    def __call__(self, img):
        return _wrap(img, F.pad(_t(img), [self.padding] * 4))


class Lambda:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, img):
        return self.fn(img)


class _Identity:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, img):
        return img


class ColorJitter(_Identity):
    pass


class RandomGrayscale(_Identity):
    pass


class RandomApply(_Identity):
    pass


class RandomRotation(_Identity):
    pass


def _wrap(orig, x):
    if hasattr(orig, "tensor"):
        from PIL import Image
        return Image.Image(x, getattr(orig, "mode", "RGB"))
    return x
