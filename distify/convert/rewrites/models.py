"""Rewrites that prepare what training needs: the model with its optimizer, DataLoaders, LR
schedulers; and DataParallel, which DDP replaces."""

from __future__ import annotations

from distify.convert.rewrites import Example, Rewrite


class PrepareModel(Rewrite):
    """Every model an optimizer trains is prepared with it: moved to this process's device and
    wrapped in DDP (or sharded under FSDP).

    The models are found from the data flow (``model.parameters()`` in the optimizer's arguments,
    grouped parameters built above, ``model.configure_optimizers()``, a model handed to a helper
    that builds the optimizer); a model that only the loss reaches is prepared where it is built.
    On an ``if`` that builds the optimizer on some paths only, the model is prepared on every
    path, once."""

    NAME = "prepare-model"
    KINDS = ("prepare-model", "prepare-optimizer")
    FACTS = ("training", "imports", "model_classes")
    NODES = ("Call", "SimpleStatementLine", "If")
    SKIPPED = ("the model is not wrapped in DDP: every process trains its own copy, and the "
               "copies drift apart")
    EXAMPLES = (
        Example(
            before="""
            import torch
            model = torch.nn.Linear(4, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            """,
            after="""
            import torch
            import distify.runtime as distify
            model = torch.nn.Linear(4, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = distify.prepare(model, optimizer)
            """),
    )


class PrepareDataLoader(Rewrite):
    """Each DataLoader is prepared: every process reads its own shard of the data set, reshuffled
    every epoch, and its batches arrive on this process's device."""

    NAME = "prepare-dataloader"
    KINDS = ("prepare-dataloader",)
    FACTS = ("imports",)
    NODES = ("Call",)
    SKIPPED = "every process reads the whole data set, in the same order (N copies of one job)"
    EXAMPLES = (
        Example(
            before="""
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, batch_size=32, shuffle=True)
            """,
            after="""
            from torch.utils.data import DataLoader
            import distify.runtime as distify
            loader = distify.prepare(DataLoader(dataset, batch_size=32, shuffle=True))
            """),
    )


class PrepareScheduler(Rewrite):
    """Each LR scheduler is prepared: one step per call, and none after an optimizer step that
    mixed precision skipped."""

    NAME = "prepare-scheduler"
    KINDS = ("prepare-scheduler",)
    FACTS = ("imports",)
    NODES = ("Call",)
    SKIPPED = "the scheduler steps even when mixed precision skips an optimizer step"
    EXAMPLES = (
        Example(
            before="""
            from torch.optim.lr_scheduler import StepLR
            scheduler = StepLR(optimizer, step_size=10)
            """,
            after="""
            from torch.optim.lr_scheduler import StepLR
            import distify.runtime as distify
            scheduler = distify.prepare(StepLR(optimizer, step_size=10))
            """),
    )


class DataParallel(Rewrite):
    """``nn.DataParallel`` is kept (prepared, it drives one device per process under DDP);
    ``data_parallel(module, inputs)`` becomes a plain call of the module."""

    NAME = "data-parallel"
    KINDS = ("data-parallel",)
    FACTS = ("imports",)
    NODES = ("Call",)
    SKIPPED = "the DataParallel call stays (on several processes, each may drive every GPU)"
    EXAMPLES = (
        Example(
            before="""
            import torch.nn as nn
            from torch.nn.parallel import data_parallel
            out = data_parallel(model, (x, y))
            """,
            after="""
            import torch.nn as nn
            from torch.nn.parallel import data_parallel
            import distify.runtime as distify
            out = model(x, y)
            """),
    )
