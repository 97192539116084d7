"""DST103: an experiment tracker used by every rank."""

from __future__ import annotations

from distify.lint.checks._side_effects import SideEffectRule
from distify.lint.rule import Invalid, Valid


class UnguardedTracker(SideEffectRule):
    """An experiment tracker is created or logged to by every rank.

    TensorBoard's ``SummaryWriter``, ``wandb.init`` / ``wandb.log``, ``mlflow.log_*`` and other
    trackers (``kind: tracker`` in ``rules/side_effects.yaml``) called on every process create N
    runs, N event files, or N copies of every point. Create and log on the main process only
    (and keep the writer ``None`` elsewhere).

    The fix wraps a logging call that is a statement of its own; creating a writer that is
    assigned (``writer = SummaryWriter()``) is reported without a fix, because the other ranks
    still need the name.
    """

    CODE = "DST103"
    KIND = "tracker"
    MESSAGE = "`{name}` logs to an experiment tracker from every rank; log on the main process only"

    VALID = (
        Valid("""
            import wandb
            from accelerate import Accelerator

            accelerator = Accelerator()
            if accelerator.is_main_process:
                wandb.init(project="demo")
            for step, batch in enumerate(loader):
                if accelerator.is_main_process:
                    wandb.log({"loss": loss.item()})
        """),
        Valid("""
            import torch.distributed as dist
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter() if dist.get_rank() == 0 else None
        """),
    )
    INVALID = (
        Invalid("""
            import torch.distributed as dist
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter("runs/exp")
        """, line=4),
        Invalid("""
            import wandb
            import torch.distributed as dist

            is_master = dist.get_rank() == 0
            if is_master:
                wandb.init(project="demo")
            for step in range(100):
                wandb.log({"step": step})
        """, line=8, fixed="""
            import wandb
            import torch.distributed as dist

            is_master = dist.get_rank() == 0
            if is_master:
                wandb.init(project="demo")
            for step in range(100):
                if is_master:
                    wandb.log({"step": step})
        """),
        Invalid("""
            import mlflow
            import torch.distributed as dist

            mlflow.log_metric("loss", 0.1)
        """, line=4),
    )
