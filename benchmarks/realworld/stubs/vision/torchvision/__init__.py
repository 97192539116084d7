"""A stand-in for torchvision for judging real scripts on this machine (no torchvision wheel for
the CPU torch here, no network): tiny synthetic data sets of the right shapes, transforms as
callables on tensors, ``utils.save_image`` writing a file, and small ``models``. Deterministic:
sample ``i`` of a data set is the same tensor in every process, so sharding can be audited."""
from __future__ import annotations

import _rw_cuda_noop  # noqa: F401  (only acts with RW_CUDA_NOOP=1)
import _rw_seed  # noqa: F401  (only acts with RW_SEED set)

from . import datasets, models, transforms, utils  # noqa: F401

__version__ = "0.0-distify-stub"
