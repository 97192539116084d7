"""Random draws each process makes for itself: the batches a script samples without a DataLoader
(nanoGPT's ``torch.randint`` indices in ``get_batch``) and the noise drawn in a training loop (a
GAN's latent vectors).

A script that seeds itself runs the same seed on every rank, so such draws come out equal on all
of them: N processes would train on the same batches, or the same noise. Converted scripts draw
them from these instead:

- ``torch.randint(..., generator=distify.data_generator(device))``;
- ``distify.numpy_random().randint(...)`` for ``np.random.randint(...)``;
- ``distify.python_random().sample(...)`` for ``random.sample(...)``.

In a single process they are the original draws, bit for bit: ``data_generator`` returns None
(torch then draws from its default generator, exactly as without ``generator=``),
``numpy_random`` the ``numpy.random`` module and ``python_random`` the ``random`` module. With
several processes each rank gets its own generator, seeded from the script's seed and the rank,
so the global generators (which the model's initialisation uses) are never touched: weights stay
equal on every rank, and DDP's first broadcast would make them so anyway.
"""

from __future__ import annotations

import random as _random
from typing import Any

import torch

from . import _state


class _Generators:
    """The runtime's part (see ``_state.Runtime``): this rank's generators."""

    def __init__(self) -> None:
        #: per device: (the torch seed it was derived from, the generator)
        self.torch: dict[torch.device, tuple[int, torch.Generator]] = {}
        self.numpy: Any = None
        self.python: _random.Random | None = None


def _generators() -> _Generators:
    return _state.current().part(_Generators)

#: a large odd constant (the golden ratio's 64 bits) to spread the ranks' seeds apart
_SPREAD = 0x9E3779B97F4A7C15


def data_generator(device: Any = None) -> torch.Generator | None:
    """The generator a random draw of this process's data passes as ``generator=``.

    Args:
        device: the draw's device (its ``device=``), None for the default device. A CUDA draw
            needs a CUDA generator: each device gets its own, created on it.

    Returns:
        None in a single process (the draw then uses torch's default generator: exactly the
        original draw). Otherwise a generator of this rank, seeded from ``torch.initial_seed()``
        (the script's ``torch.manual_seed``) and the rank; it is seeded anew when the script
        seeds torch with another seed (not when it seeds it again with the same one).
    """
    if _state.world_size() == 1:
        return None
    place = _place(device)
    seed = torch.initial_seed()
    generators = _generators().torch
    cached = generators.get(place)
    if cached is None or cached[0] != seed:
        generator = torch.Generator(device=place)
        generator.manual_seed(_rank_seed(seed))
        cached = generators[place] = (seed, generator)
    return cached[1]


def numpy_random() -> Any:
    """What a converted ``np.random.<draw>(...)`` draws from.

    Returns:
        The ``numpy.random`` module itself in a single process (the original draw); otherwise a
        ``numpy.random.RandomState`` of this rank, derived (once, on its first use) from the
        global NumPy state at that moment (equal on every rank when the script seeds NumPy) and
        the rank. NumPy is imported here, only by scripts that use it.
    """
    import numpy

    if _state.world_size() == 1:
        return numpy.random
    generators = _generators()
    if generators.numpy is None:
        key = numpy.random.get_state()[1]  # the legacy generator's key; reading draws nothing
        generators.numpy = numpy.random.RandomState([_state.rank() + 1, *(int(k) for k in key)])
    return generators.numpy


def python_random() -> Any:
    """What a converted ``random.<draw>(...)`` draws from.

    Returns:
        The ``random`` module itself in a single process (the original draw); otherwise a
        ``random.Random`` of this rank, derived (once, on its first use) from the global state
        at that moment and the rank.
    """
    if _state.world_size() == 1:
        return _random
    generators = _generators()
    if generators.python is None:
        # a tuple of ints hashes the same in every process (PYTHONHASHSEED changes str only)
        generators.python = _random.Random(hash((_random.getstate()[1], _state.rank())))
    return generators.python


def seed_workers(original: Any, rebuilt: Any) -> None:
    """Give the worker processes of ``rebuilt`` (a sharded copy of the DataLoader ``original``
    over a map-style dataset) seeds of this rank, before it is iterated.

    torch seeds each worker (``torch``, ``random`` and NumPy) from a base seed that the
    iterator draws from the loader's ``generator`` (else the global one). With the script's
    seed on every rank, the base seeds would be equal, and so would every random augmentation
    or pairing drawn in ``Dataset.__getitem__``: rank r's k-th sample augmented as rank 0's.
    Here the base seed is drawn from ``original``'s generator exactly as its iterator would
    (so this process's random numbers go on as in the original script), mixed with the rank,
    and put into ``rebuilt.generator`` (a generator of its own), from which torch then draws.
    A loader with persistent workers is seeded once, when its workers start, as torch does.
    Not for a single process (the loader is the original there), nor for an IterableDataset
    (every rank must read the same stream) or a loader prepared with ``shard=False``.
    """
    if rebuilt.persistent_workers and rebuilt.num_workers > 0 \
            and getattr(rebuilt, "_iterator", None) is not None:
        return
    base = torch.empty((), dtype=torch.int64).random_(generator=original.generator).item()
    rebuilt.generator.manual_seed(_rank_seed(base))


def snapshot() -> dict[str, Any]:
    """This rank's generators' states (for ``save_state``)."""
    generators = _generators()
    return {
        "torch": {str(place): (seed, generator.get_state())
                  for place, (seed, generator) in generators.torch.items()},
        "numpy": None if generators.numpy is None else generators.numpy.get_state(),
        "python": None if generators.python is None else generators.python.getstate()}


def restore(state: dict[str, Any]) -> None:
    """Put back what :func:`snapshot` took (``load_state``)."""
    generators = _generators()
    generators.torch = {}
    for place, (seed, generator_state) in state["torch"].items():
        generator = torch.Generator(device=place)
        generator.set_state(generator_state)
        generators.torch[torch.device(place)] = (seed, generator)
    if state["numpy"] is not None:
        import numpy

        generators.numpy = numpy.random.RandomState()
        generators.numpy.set_state(state["numpy"])
    if state["python"] is not None:
        generators.python = _random.Random()
        generators.python.setstate(state["python"])


def _rank_seed(seed: int) -> int:
    return (seed + _SPREAD * (_state.rank() + 1)) % 2 ** 64


def _place(device: Any) -> torch.device:
    if device is None:
        default = getattr(torch, "get_default_device", None)
        device = default() if default is not None else "cpu"
    place = torch.device(device)
    if place.type == "cuda" and place.index is None:
        place = torch.device("cuda", torch.cuda.current_device())
    return place
