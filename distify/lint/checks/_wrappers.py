"""Shared by DST301 and DST303: objects and modules that prepare models (``wrappers`` pack)."""

from __future__ import annotations

import ast

from distify.analysis.names import ast_dotted_name
from distify.lint.engine import FileContext
from distify.rules import Entry


class Wrappers:
    """Which names in a file hold an ``Accelerator`` (or the distify runtime module).

    Feed it every ``Assign`` (:meth:`learn`); then :meth:`entry` tells whether an expression is
    one: an instance assigned from a wrapper class in the file, a conventional instance name
    (``accelerator``, ``self.accelerator``), or a wrapper module (``distify``).
    """

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.instances: dict[str, Entry] = {}
        self.conventional: dict[str, Entry] = {}
        for entry in ctx.matcher.rules.entries.get("wrappers", ()):
            for name in entry.get("conventional_names") or ():
                self.conventional.setdefault(name, entry)

    def learn(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.value, ast.Call):
            entry = self.ctx.match("wrappers", self.ctx.callee(node.value))
            name = ast_dotted_name(node.targets[0])
            if entry is not None and name and not entry.get("module"):
                self.instances[name] = entry

    def entry(self, expr: ast.expr) -> Entry | None:
        name = ast_dotted_name(expr)
        if name is None:
            return None
        if name in self.instances:
            return self.instances[name]
        module = self.ctx.match("wrappers", self.ctx.imports.resolve(name))
        if module is not None and module.get("module"):
            return module
        return self.conventional.get(name.rpartition(".")[2])

    def prepare_receiver(self, call: ast.Call) -> tuple[ast.expr, Entry] | None:
        """``(accelerator, entry)`` for ``accelerator.prepare(...)``, else None."""
        func = call.func
        if isinstance(func, ast.Attribute):
            entry = self.entry(func.value)
            if entry is not None and func.attr == entry.get("prepare"):
                return func.value, entry
        return None
