"""Synthetic MNIST / CelebA: the same seeded tensors in every process, sized for seconds-long runs."""
from __future__ import annotations

import torch
from torch.utils.data import Dataset


class _Synthetic(Dataset):
    shape = (1, 28, 28)
    sizes = {True: 256, False: 100}
    classes = 10

    def __init__(self, root=None, train=True, download=False, transform=None, split=None,
                 target_transform=None, **kwargs):
        train = train if split is None else split == "train"
        gen = torch.Generator().manual_seed(1 if train else 2)
        n = self.sizes[bool(train)]
        self.data = torch.rand((n, *self.shape), generator=gen)
        self.targets = torch.randint(0, self.classes, (n,), generator=gen)
        self.transform = transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        x = self.data[index]
        if self.transform is not None:
            x = self.transform(x)
        return x, int(self.targets[index])


class MNIST(_Synthetic):
    pass


class CelebA(_Synthetic):
    shape = (3, 64, 64)
    sizes = {True: 64, False: 32}
