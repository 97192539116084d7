"""A stand-in for matplotlib: ``pyplot.savefig`` writes the file, everything else does nothing."""


def use(*args, **kwargs):
    pass
