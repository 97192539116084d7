"""The converter's rewrites, registered by name (the layout of :mod:`distify.lint.checks`).

Each rewrite is a class in a module of this package. It declares:

- ``NAME``: what ``--skip``, ``--explain`` and ``[tool.distify.convert] skip`` call it;
- ``KINDS``: the kinds of the report's change lines it makes (``--json``'s ``kind``); one
  kind, ``reduce``, is made by three (metrics, the accumulated loss, losses over drawn batches);
- ``FACTS``: the whole-file analysis facts it reads (:class:`~distify.analysis.facts.FileFacts`
  fields);
- ``NODES``: the LibCST node types it handles;
- ``SKIPPED``: what a skipped site keeps doing, said on its report line;
- ``EXAMPLES``: ``before`` → ``after`` (the whole output when it runs alone, every other rewrite
  skipped) or ``before`` → ``note`` (a report line it writes instead of a change); the test suite
  converts each one alone and in the full set;
- its documentation, in the class docstring (the first paragraph is its summary).

The transformer asks :meth:`~distify.convert.base.TransformerBase._skipped` at each place a
rewrite would change the code; a skipped rewrite leaves that place as written and the report says
so on its line.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from distify.errors import UserError

#: name → rewrite class, in the order the modules define them (the ``--list-rewrites`` order)
REGISTRY: dict[str, type[Rewrite]] = {}


@dataclass(frozen=True)
class Example:
    """``before`` converts to ``after`` when the rewrite runs alone (every other one skipped), or
    writes a report line containing ``note`` (on ``line`` of the output, when given)."""

    before: str
    after: str | None = None
    note: str | None = None
    line: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "before", textwrap.dedent(self.before).lstrip("\n"))
        if self.after is not None:
            object.__setattr__(self, "after", textwrap.dedent(self.after).lstrip("\n"))
        if (self.after is None) == (self.note is None):
            raise ValueError("an example has an `after` or a `note`, not both")


class Rewrite:
    """Base class: subclasses set the class attributes below and are registered by name."""

    NAME: ClassVar[str] = ""
    KINDS: ClassVar[tuple[str, ...]] = ()
    FACTS: ClassVar[tuple[str, ...]] = ()
    NODES: ClassVar[tuple[str, ...]] = ()
    SKIPPED: ClassVar[str] = ""
    EXAMPLES: ClassVar[tuple[Example, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.NAME:
            if cls.NAME in REGISTRY:
                raise TypeError(f"two rewrites are named {cls.NAME!r}")
            REGISTRY[cls.NAME] = cls

    @classmethod
    def summary(cls) -> str:
        """The first paragraph of the rewrite's documentation, on one line."""
        first = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0]
        return " ".join(first.split()).replace("``", "`")

    @classmethod
    def headline(cls) -> str:
        """The summary's first sentence (``--list-rewrites``)."""
        summary = cls.summary()
        end = summary.find(". ")
        return summary if end < 0 else summary[:end + 1]


#: the modules that define rewrites, in the order ``--list-rewrites`` shows them
_MODULES = ("models", "devices", "training", "metrics", "side_effects", "data")


def _load() -> None:
    for module in _MODULES:  # each registers its classes on import
        importlib.import_module(f"{__name__}.{module}")


_load()


def all_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def select_skips(names: Iterable[str], *, source: str = "--skip") -> frozenset[str]:
    """The rewrites named in ``names`` (``--skip``, a config's ``skip``), checked.

    Raises:
        UserError: a name matches no rewrite (the message lists the known ones).
    """
    chosen = set()
    for name in names:
        key = name.strip().lower()
        if key not in REGISTRY:
            raise UserError(f"{source}: unknown rewrite {name!r} "
                            f"(known: {', '.join(REGISTRY)}; see --list-rewrites)")
        chosen.add(key)
    return frozenset(chosen)


def rewrite_table() -> str:
    """One line per rewrite: its name and summary (``--list-rewrites``)."""
    width = max(len(name) for name in REGISTRY)
    return "\n".join(f"{name:<{width}}  {cls.headline()}" for name, cls in REGISTRY.items())


def explain_rewrite(name: str) -> str:
    """A rewrite's documentation (``--explain``): docstring, what skipping it leaves, examples.

    Raises:
        UserError: no rewrite has that name.
    """
    cls = REGISTRY.get(name.strip().lower())
    if cls is None:
        raise UserError(f"unknown rewrite {name!r} (known: {', '.join(REGISTRY)})")
    _, _, body = inspect.cleandoc(cls.__doc__ or "").partition("\n\n")
    parts = [f"{cls.NAME}: {cls.summary()}"]
    if body:
        parts.append(body)
    parts.append(f"Report kinds: {', '.join(cls.KINDS)}")
    parts.append(f"Skipped (--skip {cls.NAME}): {cls.SKIPPED}")
    for example in cls.EXAMPLES:
        parts.append("BEFORE:\n" + _indented(example.before))
        if example.after is not None:
            parts.append("AFTER (this rewrite alone):\n" + _indented(example.after))
        else:
            where = f" on line {example.line}" if example.line else ""
            parts.append(f"REPORTED{where}:\n    {example.note}")
    return "\n\n".join(parts) + "\n"


def _indented(code: str) -> str:
    return textwrap.indent(code.rstrip("\n"), "    ")
