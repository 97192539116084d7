"""``distify check``: a linter for the pitfalls of distributed PyTorch training scripts.

Layout: :mod:`.engine` walks a file once (stdlib ``ast``) and runs every rule in
:mod:`.checks` (one module per rule); main-process guards, side effects, callee names and whether
a file is distributed come from :mod:`distify.analysis`, shared with ``convert``;
:mod:`.suppression` reads ``# noqa``; :mod:`.fixer` applies ``--fix`` with LibCST;
:mod:`.discovery` finds files and skips those without torch unread; :mod:`.config` reads
``[tool.distify.check]``; :mod:`.runner` checks many files in parallel; :mod:`.output` renders
findings as concise text, JSON, GitHub annotations or SARIF.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distify.lint.model import FileResult, Finding, Fix

__all__ = ["FileResult", "Finding", "Fix", "lint_text"]


def __getattr__(name: str):
    """``FileResult``, ``Finding``, ``Fix``: imported on first use, so that reading the project's
    settings (:mod:`.config`, which ``convert`` does too) does not load the findings' model."""
    if name in ("FileResult", "Finding", "Fix"):
        from distify.lint import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def lint_text(text: str, path: str = "<string>", *, codes=None, check_all: bool = False,
              rules=None) -> list[Finding]:
    """Check one source string; the findings sorted by position (a convenience for tests/tools).

    Args:
        text: Python source.
        path: the name findings carry.
        codes: rule codes to run (default: all).
        check_all: check it even if it is not a distributed script.
        rules: a :class:`distify.rules.RuleSet` (default: the bundled packs).
    """
    from distify.lint.engine import LintOptions, lint_source
    from distify.lint.matcher import Matcher
    from distify.lint.model import Finding
    from distify.lint.registry import all_codes
    from distify.rules import default_rules

    options = LintOptions(Matcher(rules or default_rules()), tuple(codes or all_codes()),
                          check_all)
    result = lint_source(text.encode("utf-8"), path, options)
    return sorted(result.findings, key=Finding.sort_key)
