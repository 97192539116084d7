"""Tiny synthetic data sets with the shapes and attributes of torchvision's. Sample ``i`` is a
function of (class name, train flag, i) only. Sizes are odd on purpose (uneven shards).
``RW_TRAIN_SIZE`` / ``RW_TEST_SIZE`` override them."""
from __future__ import annotations

import os
import zlib

import torch
from torch.utils.data import Dataset

TRAIN = int(os.environ.get("RW_TRAIN_SIZE", "301"))
TEST = int(os.environ.get("RW_TEST_SIZE", "101"))


class _Synthetic(Dataset):
    shape = (1, 28, 28)
    num_classes = 10
    pil_mode = "L"

    def __init__(self, root=".", train=True, transform=None, target_transform=None,
                 download=False, split=None, **kwargs):
        self.root, self.train = root, train if split is None else split == "train"
        self.transform, self.target_transform = transform, target_transform
        self.n = TRAIN if self.train else TEST
        self.classes = [str(c) for c in range(self.num_classes)]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        g = torch.Generator().manual_seed(zlib.crc32(f'{type(self).__name__}{self.train}'.encode()))
        self.targets = torch.randint(0, self.num_classes, (self.n,), generator=g).tolist()
        self.samples = [(f"{root}/{t}/{i}.png", t) for i, t in enumerate(self.targets)]
        self.imgs = self.samples
        # the raw images as torchvision keeps them (uint8; MNIST (N, H, W), CIFAR (N, H, W, C))
        images = (torch.stack([self._image(i) for i in range(self.n)]) * 255).to(torch.uint8)
        self.data = images[:, 0] if self.shape[0] == 1 else images.permute(0, 2, 3, 1).numpy()

    def __len__(self):
        return self.n

    def _image(self, i):
        g = torch.Generator().manual_seed(i * 7919 + (0 if self.train else 1))
        x = torch.rand(self.shape, generator=g)
        x[:, :4, :4] = self.targets[i] / self.num_classes
        return x

    def __getitem__(self, i):
        from PIL import Image
        img = Image.Image(self._image(i), self.pil_mode)
        img = self.transform(img) if self.transform is not None else img
        t = int(self.targets[i])
        t = self.target_transform(t) if self.target_transform is not None else t
        return img, t


class MNIST(_Synthetic):
    """``targets`` is a tensor here, as in torchvision (CIFAR10's is a list)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.targets = torch.tensor(self.targets)


class FashionMNIST(MNIST):
    pass


class KMNIST(MNIST):
    pass


class EMNIST(MNIST):
    pass


class CIFAR10(_Synthetic):
    shape = (3, 32, 32)
    pil_mode = "RGB"


class CIFAR100(CIFAR10):
    num_classes = 100


class SVHN(CIFAR10):
    pass


class STL10(CIFAR10):
    shape = (3, 96, 96)


class ImageFolder(_Synthetic):
    shape = (3, 64, 64)
    num_classes = 4
    pil_mode = "RGB"

    def __init__(self, root, transform=None, target_transform=None, **kwargs):
        super().__init__(root, train="val" not in str(root), transform=transform,
                         target_transform=target_transform)


class LSUN(ImageFolder):
    def __init__(self, root, classes=None, transform=None, **kwargs):
        super().__init__(root, transform=transform)


class CelebA(ImageFolder):
    pass


class FakeData(_Synthetic):
    pil_mode = "RGB"

    def __init__(self, size=1000, image_size=(3, 224, 224), num_classes=10, transform=None,
                 **kwargs):
        self.shape, self.num_classes = tuple(image_size), num_classes
        super().__init__(".", train=size > 100, transform=transform)
        self.n = min(size, TRAIN if size > 100 else TEST)
        self.targets = self.targets[: self.n]
