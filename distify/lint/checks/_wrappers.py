"""Shared by DST301 and DST303: objects and modules that prepare models (``wrappers`` pack)."""

from __future__ import annotations

from distify.analysis import wrapping
from distify.lint.engine import FileContext


class Wrappers(wrapping.Wrappers):
    """:class:`distify.analysis.wrapping.Wrappers` over a file being checked."""

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx.imports, ctx.match, ctx.matcher.rules)
        self.ctx = ctx
