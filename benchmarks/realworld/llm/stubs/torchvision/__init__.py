"""Offline stand-in for the few torchvision names the judged Fabric examples use (PyPI's
torchvision wheel does not import beside this machine's CPU torch): synthetic data sets of
fixed, seeded tensors; transforms that are identities or plain tensor ops; save_image writing
the tensor with torch.save."""
from . import datasets, transforms, utils  # noqa: F401

__version__ = "0.0-stub"
