"""DST301: ``loss.backward()`` in a file that prepares through Accelerate or the runtime."""

from __future__ import annotations

import ast

from distify.lint.checks._wrappers import Wrappers
from distify.lint.engine import Site
from distify.lint.model import Fix
from distify.lint.rule import Invalid, LintRule, Valid


class PlainBackward(LintRule):
    """``loss.backward()`` is called where the model was prepared by a wrapper that owns it.

    A file that prepares its model with ``accelerator.prepare(...)`` or the distify runtime's
    ``distify.prepare(...)`` must call ``accelerator.backward(loss)`` / ``distify.backward(loss)``:
    they scale the loss for mixed precision and handle gradient accumulation and DeepSpeed. A
    plain ``loss.backward()`` silently skips that.

    Not reported: ``scaler.scale(loss).backward()``, a script that scales its own loss with a
    ``GradScaler`` (the wrapper's mixed precision must then stay off, which is what
    ``distify convert`` does for such scripts). The fix rewrites ``loss.backward(...)`` to
    ``accelerator.backward(loss, ...)`` (the object the file prepares with) when that object is
    in scope.
    """

    CODE = "DST301"
    MESSAGE = "`{name}` bypasses `{wrapper}.backward`; call `{wrapper}.backward({loss})` instead"

    VALID = (
        Valid("""
            from accelerate import Accelerator

            accelerator = Accelerator()
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                loss = model(batch).loss
                accelerator.backward(loss)
        """),
        Valid("""
            import torch
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model)
            loss.backward()
        """),
        Valid("""
            import distify.runtime as distify

            model, optimizer = distify.prepare(model, optimizer)
            scaler.scale(loss).backward()
        """),
    )
    INVALID = (
        Invalid("""
            from accelerate import Accelerator

            accelerator = Accelerator()
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                loss = model(batch).loss
                loss.backward()
        """, line=7, fixed="""
            from accelerate import Accelerator

            accelerator = Accelerator()
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                loss = model(batch).loss
                accelerator.backward(loss)
        """),
        Invalid("""
            import distify.runtime as distify

            model, optimizer = distify.prepare(model, optimizer)
            (loss / accumulation_steps).backward()
        """, line=4, fixed="""
            import distify.runtime as distify

            model, optimizer = distify.prepare(model, optimizer)
            distify.backward(loss / accumulation_steps)
        """),
        Invalid("""
            from accelerate import Accelerator

            def train(accelerator, model, gan_loss):
                model = accelerator.prepare(model)
                gan_loss.backward(retain_graph=True)
        """, line=5, fixed="""
            from accelerate import Accelerator

            def train(accelerator, model, gan_loss):
                model = accelerator.prepare(model)
                accelerator.backward(gan_loss, retain_graph=True)
        """),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.wrappers = Wrappers(ctx)
        self.prepares: list[tuple[ast.expr, ast.AST | None]] = []
        self.backwards: list[tuple[ast.Call, Site]] = []

    def visit_Assign(self, node: ast.Assign) -> None:
        self.wrappers.learn(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "backward":
            if self.wrappers.entry(func.value) is None and not _own_scaler(func.value):
                self.backwards.append((node, self.ctx.site()))
            return
        prepared = self.wrappers.prepare_receiver(node)
        if prepared is not None:
            self.prepares.append((prepared[0], self.ctx.function))

    def finish(self) -> None:
        if not self.prepares:
            return
        for node, site in self.backwards:
            receiver = self._receiver(site)
            wrapper = self.ctx.segment(receiver) if receiver is not None else \
                self.ctx.segment(self.prepares[0][0])
            loss = node.func.value
            message = self.MESSAGE.format(name=self.ctx.segment(node.func) + "()",
                                          wrapper=wrapper, loss=self.ctx.segment(loss))
            fix = None
            if receiver is not None and not node.args:
                fix = Fix("backward", node.lineno, self.ctx.char_col(node.lineno, node.col_offset),
                          receiver=wrapper)
            self.report(node, message, site=site, fix=fix)

    def _receiver(self, site: Site) -> ast.expr | None:
        """The prepare receiver usable at ``site``: from the same function, else module-level."""
        for receiver, function in self.prepares:
            if function is site.function:
                return receiver
        for receiver, _ in self.prepares:
            root = receiver
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in self.ctx.module_names:
                return receiver
        return None


def _own_scaler(receiver: ast.expr) -> bool:
    """``scaler.scale(loss)``: the script does its own mixed precision."""
    return (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute)
            and receiver.func.attr == "scale")
