"""A stand-in for matplotlib: ``pyplot.savefig`` writes the file, everything else does nothing.
Importing it seeds like the torchvision stub does (``RW_SEED``), for scripts that import no
torchvision (yunjey's linear regression)."""

import _rw_seed  # noqa: F401


def use(*args, **kwargs):
    pass
