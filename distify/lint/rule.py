"""The base class of a lint rule, and the registry every rule module joins by subclassing.

A rule is a class in its own module under :mod:`distify.lint.checks` (Fixit's layout): the class
docstring is its documentation, ``CODE`` and ``MESSAGE`` say what it reports, and ``VALID`` /
``INVALID`` hold example sources that the test suite runs. Rules define ``visit_<AstNode>`` /
``leave_<AstNode>`` methods; the engine walks each file once and calls every rule's methods on
the way, then calls :meth:`LintRule.finish`, where rules that need the whole file (who calls a
function, whether ``set_epoch`` is called anywhere) report.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from distify.lint.engine import FileContext, Site
    from distify.lint.model import Fix

#: code → rule class, filled in as rule modules are imported.
REGISTRY: dict[str, type[LintRule]] = {}


@dataclass(frozen=True)
class Valid:
    """An example the rule must not report."""

    code: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", textwrap.dedent(self.code).lstrip("\n"))


@dataclass(frozen=True)
class Invalid:
    """An example the rule must report: at ``line`` when given; ``fixed`` is what ``--fix`` gives
    (``None``: no fix expected)."""

    code: str
    line: int | None = None
    fixed: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", textwrap.dedent(self.code).lstrip("\n"))
        if self.fixed is not None:
            object.__setattr__(self, "fixed", textwrap.dedent(self.fixed).lstrip("\n"))


class LintRule:
    """Base class: subclasses set ``CODE``, ``MESSAGE``, ``VALID``, ``INVALID`` and visit nodes."""

    CODE: ClassVar[str] = ""
    MESSAGE: ClassVar[str] = ""
    VALID: ClassVar[tuple[Valid, ...]] = ()
    INVALID: ClassVar[tuple[Invalid, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.CODE:
            REGISTRY[cls.CODE] = cls

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx

    @classmethod
    def summary(cls) -> str:
        """The first paragraph of the rule's documentation, on one line."""
        first = (cls.__doc__ or cls.MESSAGE).strip().split("\n\n")[0]
        return " ".join(first.split()).replace("``", "`")

    def finish(self) -> None:
        """Called once after the traversal; report here what needs the whole file."""

    def report(self, node: ast.AST, message: str | None = None, *, site: Site | None = None,
               fix: Fix | None = None) -> None:
        """Report ``node`` with ``message`` (default ``MESSAGE``); ``site`` places the noqa."""
        self.ctx.report(self.CODE, node, message or self.MESSAGE, site=site, fix=fix)
