"""Every rule's VALID and INVALID examples (the examples in its class are its documentation)."""

from __future__ import annotations

import pytest

from distify.lint import lint_text
from distify.lint.fixer import apply_fixes
from distify.lint.registry import REGISTRY


def _cases(kind: str) -> list:
    return list(_iter_cases(kind))


def _iter_cases(kind: str):
    for code, cls in sorted(REGISTRY.items()):
        for index, example in enumerate(getattr(cls, kind)):
            yield pytest.param(code, example, id=f"{code}-{kind.lower()}-{index}")


def test_every_rule_is_documented_with_examples():
    for code, cls in REGISTRY.items():
        assert cls.__doc__ and cls.MESSAGE, code
        assert cls.VALID and cls.INVALID, f"{code} needs VALID and INVALID examples"


@pytest.mark.parametrize(("code", "example"), _cases("VALID"))
def test_valid_example_is_not_reported(code, example):
    assert [f for f in lint_text(example.code) if f.code == code] == []


@pytest.mark.parametrize(("code", "example"), _cases("INVALID"))
def test_invalid_example_is_reported(code, example):
    findings = [f for f in lint_text(example.code) if f.code == code]
    assert findings, f"{code} not reported in:\n{example.code}"
    if example.line is not None:
        assert example.line in {f.line for f in findings}
    if example.fixed is None:
        return
    fixes = [f.fix for f in findings if f.fix]
    assert fixes, f"{code} should be fixable here"
    fixed = apply_fixes(example.code, fixes)
    assert fixed == example.fixed
    assert [f for f in lint_text(fixed) if f.code == code] == [], "the fix must clear the finding"
