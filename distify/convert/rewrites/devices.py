"""The device rewrite: every process uses its own device."""

from __future__ import annotations

from distify.convert.rewrites import Example, Rewrite


class Device(Rewrite):
    """Single-device selection becomes this process's device.

    ``torch.device("cuda")``, ``"cuda:0"``, ``.cuda()``, ``.to(0)`` and
    ``torch.accelerator.current_accelerator()`` → ``rt.device()``; a device *name* stays a name
    (``rt.device().type``); a GPU index kept in a setting → ``rt.device_index()``; a flag that
    chose the CPU still does (``rt.device_choice``); device pinning (``torch.cuda.set_device``)
    is removed."""

    NAME = "device"
    KINDS = ("device",)
    FACTS = ("imports", "bound")
    NODES = ("Call", "Assign", "AnnAssign", "DictElement", "Arg", "IfExp", "Expr")
    SKIPPED = ("every process uses the device written here (on a GPU machine, all of them the "
               "first GPU)")
    EXAMPLES = (
        Example(
            before="""
            import torch
            device = torch.device("cuda")
            model = Net().cuda()
            """,
            after="""
            import torch
            import distify.runtime as distify
            device = distify.device()
            model = Net().to(distify.device())
            """),
    )
