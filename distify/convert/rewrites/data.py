"""Rewrites of where the data comes from without a DataLoader: shapes tied to the batch size,
token streams, random draws, environments."""

from __future__ import annotations

from distify.convert.rewrites import Example, Rewrite


class BatchShapes(Rewrite):
    """The configured batch size as a shape's leading dimension in a loop over a DataLoader
    (``x.view(batch_size, -1)``, ``torch.ones(batch_size, 1)``) → the batch's own size
    (``x.size(0)``), where that is the same value on one process; ``for i in
    range(batch_size)`` indexing the batch → ``range(len(labels))``."""

    NAME = "batch-shapes"
    KINDS = ("batch-size",)
    FACTS = ("imports", "builds_loaders")
    NODES = ("Call", "For")
    SKIPPED = ("the shape keeps the configured batch size, which a process's smaller last batch "
               "does not fit")
    EXAMPLES = (
        Example(before="""
            import torch
            from torch.utils.data import DataLoader
            batch_size = 64
            loader = DataLoader(dataset, batch_size=batch_size)
            for images, labels in loader:
                out = model(images.view(batch_size, -1))
            """, after="""
            import torch
            from torch.utils.data import DataLoader
            import distify.runtime as distify
            batch_size = 64
            loader = DataLoader(dataset, batch_size=batch_size)
            for images, labels in loader:
                out = model(images.view(images.size(0), -1))
            """),
    )


class ShardStream(Rewrite):
    """A token stream trained on by BPTT (``batchify(corpus.train, bsz)``) is split over the
    processes before it is laid out in columns (``rt.shard_stream``): each process trains on its
    own contiguous 1/N of it."""

    NAME = "shard-stream"
    KINDS = ("shard-stream",)
    FACTS = ("may_batchify",)
    NODES = ("Call",)
    SKIPPED = "every process trains on the whole stream, on the same batches"
    EXAMPLES = (
        Example(before="""
            import torch
            import torch.nn as nn


            def batchify(data, bsz):
                nbatch = data.size(0) // bsz
                return data[:nbatch * bsz].view(bsz, -1).t().contiguous()


            model = nn.Embedding(100, 100)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            train_data = batchify(corpus.train, 20)
            for i in range(0, train_data.size(0) - 1, 35):
                data, targets = train_data[i:i + 35], train_data[i + 1:i + 36]
                loss = nn.functional.cross_entropy(model(data).view(-1, 100), targets.reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """, after="""
            import torch
            import torch.nn as nn
            import distify.runtime as distify


            def batchify(data, bsz):
                nbatch = data.size(0) // bsz
                return data[:nbatch * bsz].view(bsz, -1).t().contiguous()


            model = nn.Embedding(100, 100)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            train_data = batchify(distify.shard_stream(corpus.train, 20), 20)
            for i in range(0, train_data.size(0) - 1, 35):
                data, targets = train_data[i:i + 35], train_data[i + 1:i + 36]
                loss = nn.functional.cross_entropy(model(data).view(-1, 100), targets.reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """),
    )


class RandomDraws(Rewrite):
    """Random draws that decide the data: an unseeded ``random_split`` draws from the main
    process's generator (every process makes the same split); batches a loop draws itself
    (``torch.randint`` indices, noise for a GAN) are drawn per process, so processes train on
    different data."""

    NAME = "random-draws"
    #: reduce: the mean of losses over batches each process drew itself
    KINDS = ("shared-random", "random-batches", "random-noise", "random-task", "reduce")
    FACTS = ("seeds", "may_draw_batches", "imports")
    NODES = ("Call",)
    SKIPPED = ("the draw stays as it is: unseeded, the processes may split the data differently;"
               " seeded alike, they draw the same batches")
    EXAMPLES = (
        Example(before="""
            import torch
            from torch.utils.data import random_split
            train, val = random_split(data, [50, 10])
            """, after="""
            import torch
            from torch.utils.data import random_split
            import distify.runtime as distify
            train, val = random_split(data, [50, 10], generator=distify.shared_generator())
            """),
    )


class EnvSeeds(Rewrite):
    """A reinforcement-learning environment seeded from the script's seed
    (``env.reset(seed=args.seed)``) is seeded per process (``args.seed + rt.rank()``): N
    processes play N different episodes, not N copies of one."""

    NAME = "env-seeds"
    KINDS = ("random-env",)
    FACTS = ()
    NODES = ("Call",)
    SKIPPED = "every process plays the same episodes"
    EXAMPLES = (
        Example(before="""
            import torch
            obs, info = env.reset(seed=args.seed)
            """, after="""
            import torch
            import distify.runtime as distify
            obs, info = env.reset(seed=args.seed + distify.rank())
            """),
    )
