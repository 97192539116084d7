"""The rules there are, and turning ``--select`` / ``--ignore`` into the set to run."""

from __future__ import annotations

from collections.abc import Iterable

import distify.lint.checks  # noqa: F401 - registers every rule
from distify.errors import UserError
from distify.lint.rule import REGISTRY, LintRule


def all_codes() -> tuple[str, ...]:
    return tuple(sorted(REGISTRY))


def rule(code: str) -> type[LintRule]:
    return REGISTRY[code]


def select_codes(select: Iterable[str] = (), ignore: Iterable[str] = (),
                 extend_select: Iterable[str] = ()) -> tuple[str, ...]:
    """The codes to run: ``select`` (default all) plus ``extend_select``, minus ``ignore``.

    Each item is a code (``DST101``) or a prefix of codes (``DST1``, ``DST``, ``ALL``).

    Raises:
        UserError: an item matches no rule.
    """
    chosen = _expand(select) if select else set(REGISTRY)
    chosen |= _expand(extend_select)
    chosen -= _expand(ignore)
    return tuple(sorted(chosen))


def _expand(items: Iterable[str]) -> set[str]:
    codes: set[str] = set()
    for item in items:
        prefix = item.strip().upper()
        if not prefix:
            continue
        matched = set(REGISTRY) if prefix == "ALL" else {
            code for code in REGISTRY if code.startswith(prefix)}
        if not matched:
            raise UserError(f"unknown rule code {item!r} (known: {', '.join(sorted(REGISTRY))})")
        codes |= matched
    return codes
