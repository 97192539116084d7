"""Rewrites of what a script does to the world: prints, files, checkpoints, trackers, logs,
progress bars, downloads, run names."""

from __future__ import annotations

from distify.convert.rewrites import Example, Rewrite


class Print(Rewrite):
    """``print(...)`` → ``rt.print(...)``: printed by the main process only."""

    NAME = "print"
    KINDS = ("print",)
    FACTS = ("bound",)
    NODES = ("Call",)
    SKIPPED = "every process prints it"
    EXAMPLES = (
        Example(before="""
            import torch
            print("epoch", 1)
            """, after="""
            import torch
            import distify.runtime as distify
            distify.print("epoch", 1)
            """),
    )


class SaveLoad(Rewrite):
    """``torch.save`` / ``torch.load`` → ``rt.save`` / ``rt.load``: saved by the main process
    only, atomically; loaded onto this process's device once the save is complete. A checkpoint
    through a file object becomes one by path."""

    NAME = "save-load"
    KINDS = ("save", "load", "checkpoint")
    FACTS = ("imports", "training")
    NODES = ("Call", "With")
    SKIPPED = "every process writes (or reads) the file at once"
    EXAMPLES = (
        Example(before="""
            import torch
            torch.save(model.state_dict(), "model.pt")
            """, after="""
            import torch
            import distify.runtime as distify
            distify.save(model.state_dict(), "model.pt")
            """),
    )


class FileWrites(Rewrite):
    """Files the script writes are written by the main process only: ``open(p, "w")`` →
    ``rt.open(p, "w")`` (atomic, the other processes write into nothing; a later ``open(p)`` of
    that path waits for it), and a ``with`` block that writes through another opener is
    guarded."""

    NAME = "file-writes"
    KINDS = ("write",)
    FACTS = ("written_paths", "imports")
    NODES = ("Call", "With")
    SKIPPED = "every process writes the file at once"
    EXAMPLES = (
        Example(before="""
            import torch
            with open("results.txt", "w") as f:
                f.write("done")
            """, after="""
            import torch
            import distify.runtime as distify
            with distify.open("results.txt", "w") as f:
                f.write("done")
            """),
    )


class GuardSideEffects(Rewrite):
    """Statements with side effects outside the process (``os.makedirs``, ``shutil.rmtree``,
    tracker calls such as ``wandb.log``) run on the main process only; a tracker object is built
    there only (``rt.on_main_process(SummaryWriter)(...)``)."""

    NAME = "guard-side-effects"
    KINDS = ("guard",)
    FACTS = ("imports",)
    NODES = ("SimpleStatementLine", "Call")
    SKIPPED = "every process runs it"
    EXAMPLES = (
        Example(before="""
            import shutil
            import torch
            shutil.rmtree("runs/old")
            """, after="""
            import shutil
            import torch
            import distify.runtime as distify
            if distify.is_main_process():
                shutil.rmtree("runs/old")
            """),
    )


class ProgressBars(Rewrite):
    """Progress bars (``tqdm``) are shown on the main process only (``disable=not
    rt.is_main_process()``)."""

    NAME = "progress-bars"
    KINDS = ("progress",)
    FACTS = ("imports",)
    NODES = ("Call",)
    SKIPPED = "every process draws its own bar"
    EXAMPLES = (
        Example(before="""
            import torch
            from tqdm import tqdm
            for batch in tqdm(loader):
                pass
            """, after="""
            import torch
            from tqdm import tqdm
            import distify.runtime as distify
            for batch in tqdm(loader, disable=not distify.is_main_process()):
                pass
            """),
    )


class Logging(Rewrite):
    """``logging.basicConfig(level=...)``: other processes log warnings and errors only."""

    NAME = "logging"
    KINDS = ("logging",)
    FACTS = ("imports",)
    NODES = ("Call",)
    SKIPPED = "every process logs at the script's level"
    EXAMPLES = (
        Example(before="""
            import logging
            import torch
            logging.basicConfig(level=20)
            """, after="""
            import logging
            import torch
            import distify.runtime as distify
            logging.basicConfig(level=20 if distify.is_main_process() else logging.WARNING)
            """),
    )


class Timestamps(Rewrite):
    """A run named by the clock (``datetime.now().strftime(...)``) takes the main process's
    reading, so that every process agrees on the name."""

    NAME = "timestamps"
    KINDS = ("timestamp",)
    FACTS = ("imports",)
    NODES = ("Call",)
    SKIPPED = "each process reads its own clock, and the processes may name the run differently"
    EXAMPLES = (
        Example(before="""
            import torch
            from datetime import datetime
            run = datetime.now().strftime("%Y%m%d-%H%M%S")
            """, after="""
            import torch
            from datetime import datetime
            import distify.runtime as distify
            run = distify.broadcast_object(datetime.now().strftime("%Y%m%d-%H%M%S"))
            """),
    )


class Downloads(Rewrite):
    """Dataset downloads run on the main process first (``with rt.main_process_first():``); the
    others wait, then read its copy. A hand-written download (fetch, write, extract, remove) runs
    as one unit on the main process."""

    NAME = "downloads"
    KINDS = ("download",)
    FACTS = ("imports",)
    NODES = ("SimpleStatementLine", "IndentedBlock")
    SKIPPED = "every process downloads and writes the same files at once"
    EXAMPLES = (
        Example(before="""
            import torch
            from torchvision import datasets
            train = datasets.MNIST("data", train=True, download=True)
            """, after="""
            import torch
            from torchvision import datasets
            import distify.runtime as distify
            with distify.main_process_first():
                train = datasets.MNIST("data", train=True, download=True)
            """),
    )


class GradClipping(Rewrite):
    """``clip_grad_norm_`` → ``rt.clip_grad_norm_``: under fp16 the gradients are unscaled before
    clipping."""

    NAME = "grad-clipping"
    KINDS = ("clip",)
    FACTS = ("imports",)
    NODES = ("Call",)
    SKIPPED = ("torch's own clipping runs: right without fp16 (under fp16 it clips the scaled "
               "gradients)")
    EXAMPLES = (
        Example(before="""
            import torch
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            """, after="""
            import torch
            import distify.runtime as distify
            distify.clip_grad_norm_(model.parameters(), 1.0)
            """),
    )
