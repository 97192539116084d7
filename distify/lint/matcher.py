"""Cached look-ups in the rule packs: each qualified name is matched once per process."""

from __future__ import annotations

from typing import Any

from distify.rules import Entry, RuleSet

_MISSING: Any = object()


class Matcher:
    """``RuleSet.match`` with a cache; every rule of every file asks the same few questions."""

    def __init__(self, rules: RuleSet) -> None:
        self.rules = rules
        self._cache: dict[tuple[str, str], Entry | None] = {}

    def match(self, category: str, name: str | None) -> Entry | None:
        if not name:
            return None
        key = (category, name)
        hit = self._cache.get(key, _MISSING)
        if hit is _MISSING:
            hit = self._cache[key] = self.rules.match(category, name)
        return hit

    def __getstate__(self) -> dict:
        return {"rules": self.rules}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["rules"])
