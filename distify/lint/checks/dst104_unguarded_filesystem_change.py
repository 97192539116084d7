"""DST104: a filesystem change made by every rank."""

from __future__ import annotations

from distify.lint.checks._side_effects import SideEffectRule
from distify.lint.rule import Invalid, Valid


class UnguardedFilesystemChange(SideEffectRule):
    """A file or folder is removed, moved, copied or created by every rank.

    ``os.remove``, ``shutil.rmtree``, ``shutil.copy``, ``os.rename``, ``os.mkdir`` and friends
    (``kind: fs`` in ``rules/side_effects.yaml``) race when every process runs them: the second
    ``os.remove`` of an old snapshot raises ``FileNotFoundError``, the second ``os.mkdir``
    ``FileExistsError``. Do them on the main process only. Calls that are safe to repeat are
    fine: ``os.makedirs(..., exist_ok=True)``, ``Path.mkdir(exist_ok=True)``,
    ``Path.unlink(missing_ok=True)``.
    """

    CODE = "DST104"
    KIND = "fs"
    MESSAGE = "`{name}` changes the filesystem on every rank; do it on the main process only"

    VALID = (
        Valid("""
            import os
            import torch.distributed as dist

            os.makedirs("checkpoints", exist_ok=True)
            if dist.get_rank() == 0:
                os.remove("checkpoints/old.pt")
        """),
        Valid("""
            import shutil
            from lightning.pytorch.utilities import rank_zero_only

            @rank_zero_only
            def clean(path):
                shutil.rmtree(path)
        """),
    )
    INVALID = (
        Invalid("""
            import glob
            import os
            import torch.distributed as dist

            for old in glob.glob("checkpoints/*.pt")[:-3]:
                os.remove(old)
        """, line=6, fixed="""
            import glob
            import os
            import torch.distributed as dist

            for old in glob.glob("checkpoints/*.pt")[:-3]:
                if dist.get_rank() == 0:
                    os.remove(old)
        """),
        Invalid("""
            import os
            import torch.distributed as dist

            os.makedirs("out")
        """, line=4),
    )
