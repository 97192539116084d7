"""DST101: a checkpoint saved by every rank."""

from __future__ import annotations

import ast

from distify.analysis.effects import MEMORY_FILES, ast_shape, saves_into_memory
from distify.analysis.names import ast_dotted_name
from distify.lint.checks._side_effects import SideEffectRule
from distify.lint.rule import Invalid, Valid
from distify.rules import Entry


class UnguardedSave(SideEffectRule):
    """A checkpoint is saved by every rank.

    ``torch.save``, ``save_pretrained``, ``safetensors`` and friends (``kind: save`` in
    ``rules/side_effects.yaml``) run once per process in a distributed job: N processes write the
    same file at once, and a reader can see it half written. Save on the main process only.
    Saves through an API that already writes once are fine: ``accelerator.save``, the distify
    runtime's ``distify.save``, ``save_pretrained(..., is_main_process=...)``; so are saves into
    memory (``torch.save(state, buffer)`` with ``buffer = io.BytesIO()``).

    The fix wraps the call in a guard in the file's own vocabulary (``if rank == 0:``,
    ``if master_process:``, ``if dist.get_rank() == 0:``, ``if accelerator.is_main_process:``,
    ...); it never adds an import. It does not touch a save whose result is assigned, one
    sharing a line with other code, or one no guard of the file's can be written for.
    """

    CODE = "DST101"
    KIND = "save"
    MESSAGE = "`{name}` saves a checkpoint on every rank; save on the main process only"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.buffers: set[str] = set()

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call) and \
                self.ctx.imports.ast_qualname(node.value.func) in MEMORY_FILES:
            self.buffers.update(filter(None, map(ast_dotted_name, node.targets)))

    def keep(self, node: ast.Call, entry: Entry) -> bool:
        return not saves_into_memory(ast_shape(node, self.ctx.imports), self.buffers)

    VALID = (
        Valid("""
            import torch
            import torch.distributed as dist

            if dist.get_rank() == 0:
                torch.save(model.state_dict(), "model.pt")
        """),
        Valid("""
            import io
            import torch
            import torch.distributed as dist

            buffer = io.BytesIO()
            torch.save(model.state_dict(), buffer)
        """),
        Valid("""
            import torch
            from accelerate import Accelerator

            accelerator = Accelerator()
            accelerator.save(model.state_dict(), "model.pt")
            model.save_pretrained("out", is_main_process=accelerator.is_main_process)
        """),
        Valid("""
            import torch
            import torch.distributed as dist

            def save_checkpoint(state, path):
                torch.save(state, path)

            if dist.get_rank() == 0:
                save_checkpoint(model.state_dict(), "ckpt.pt")
        """),
        Valid("""
            import torch
            import distify.runtime as distify

            distify.save(model.state_dict(), "model.pt")
        """),
    )
    INVALID = (
        Invalid("""
            import torch
            import torch.distributed as dist

            rank = dist.get_rank()
            for epoch in range(10):
                train(epoch)
                if rank == 0:
                    print(epoch)
                torch.save(model.state_dict(), "model.pt")
        """, line=9, fixed="""
            import torch
            import torch.distributed as dist

            rank = dist.get_rank()
            for epoch in range(10):
                train(epoch)
                if rank == 0:
                    print(epoch)
                if rank == 0:
                    torch.save(model.state_dict(), "model.pt")
        """),
        Invalid("""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def main():
                model = DDP(build())
                torch.save(model.module.state_dict(), "model.pt")
        """, line=6, fixed="""
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            def main():
                model = DDP(build())
                if torch.distributed.get_rank() == 0:
                    torch.save(model.module.state_dict(), "model.pt")
        """),
        Invalid("""
            from accelerate import Accelerator

            accelerator = Accelerator()
            if accelerator.is_main_process:
                print("saving")
            model.save_pretrained("out")
            tokenizer.save_pretrained("out")
        """, line=6, fixed="""
            from accelerate import Accelerator

            accelerator = Accelerator()
            if accelerator.is_main_process:
                print("saving")
            if accelerator.is_main_process:
                model.save_pretrained("out")
                tokenizer.save_pretrained("out")
        """),
        Invalid("""
            import torch
            import torch.distributed as dist

            ckpt = torch.save(state, "a.pt") if dist.get_rank() == 0 else None
            size = torch.save(state, "b.pt")
        """, line=5),
    )
