"""Data preparation recipes the manifest names (``prep:``), run in a script's working copy
before anything else: synthetic files where a script reads a data folder it cannot download
here. Never touches the scripts themselves.

Usage: python prep.py RECIPE [ARGS...]   (cwd: the working copy)
"""
from __future__ import annotations

import os
import random
import sys

WORDS = ["the", "model", "trains", "on", "every", "rank", "and", "the", "loss", "goes", "down", "while", "each", "process", "reads", "its", "own", "shard", "of", "the", "data", "set", "<unk>", "of", "a", "in", "to", "is"]


def text(folder: str, *names: str) -> None:
    """Write small synthetic text corpora (``train.txt`` ...) into ``folder``."""
    os.makedirs(folder, exist_ok=True)
    for k, name in enumerate(names or ("train.txt", "valid.txt", "test.txt")):
        rng = random.Random(k)
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15)))
                 for _ in range(200 if k == 0 else 60)]
        with open(os.path.join(folder, name), "w", encoding="utf8") as f:
            f.write("\n".join(lines) + "\n")


def images(folder: str, count: str) -> None:
    """Create ``count`` empty .jpg files in ``folder`` (the PIL stub makes an image from the
    path)."""
    os.makedirs(folder, exist_ok=True)
    for i in range(int(count)):
        open(os.path.join(folder, f"{i:04d}.jpg"), "wb").close()


def supcon_ckpt(path: str) -> None:
    """A SupConResNet checkpoint for SupContrast's main_linear.py (``--ckpt``)."""
    sys.path.insert(0, os.getcwd())
    import torch
    from networks.resnet_big import SupConResNet

    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"model": SupConResNet(name="resnet18").state_dict()}, path)


def mkdir(*folders: str) -> None:
    """Folders a script expects to exist (its repository keeps them out of git)."""
    for folder in folders:
        os.makedirs(folder, exist_ok=True)


RECIPES = {"mkdir": mkdir, "text": text, "images": images, "supcon_ckpt": supcon_ckpt}

if __name__ == "__main__":
    RECIPES[sys.argv[1]](*sys.argv[2:])
