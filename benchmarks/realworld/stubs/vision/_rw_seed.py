"""With ``RW_SEED=N`` (run.py sets 0 unless the manifest says otherwise), seed torch, numpy and
random when the torchvision stub is imported, so a script that seeds nothing (yunjey's
tutorials, kuangliu's CIFAR, the DeepSpeed tutorial) draws the same initial weights and
shuffles in the original and in its conversion; without it verify's world-size-1 and
frozen-weights comparisons only measure the script's own run-to-run randomness."""
from __future__ import annotations

import os
import random

import numpy as np
import torch

if os.environ.get("RW_SEED", "") != "":
    _seed = int(os.environ["RW_SEED"])
    torch.manual_seed(_seed)
    np.random.seed(_seed)
    random.seed(_seed)
