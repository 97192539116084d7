"""This process's random state, as one value to keep and put back (exact resume).

Python's ``random``, NumPy's global generator (only when the script imported NumPy), torch's CPU
generator, the current GPU's generator (when CUDA is in use), and optionally a DataLoader's own
``generator=``. Each rank has its own: ``save_state`` writes one file per rank.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch


def snapshot(generator: torch.Generator | None = None) -> dict[str, Any]:
    """The random state now (``generator``: a DataLoader's own, kept beside the rest)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    if generator is not None:
        state["generator"] = generator.get_state()
    return state


def restore(state: dict[str, Any], generator: torch.Generator | None = None) -> None:
    """Put back what :func:`snapshot` took (the parts it holds)."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if generator is not None and "generator" in state:
        generator.set_state(state["generator"])
