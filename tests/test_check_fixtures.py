"""Fixture files announce their findings with `# expect:` comments (see fixtures/check/README)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distify.lint import lint_text
from distify.lint.fixer import apply_fixes
from tests.helpers import FIXTURES

CHECK = FIXTURES / "check"
_EXPECT = re.compile(r"#\s*expect(-all)?:\s*([A-Z0-9, ]+)")


def _expected(text: str, *, check_all: bool) -> list[tuple[int, str]]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _EXPECT.finditer(line):
            if match.group(1) and not check_all:
                continue
            found.extend((number, code.strip()) for code in match.group(2).split(",")
                         if code.strip())
    return sorted(found)


def _actual(text: str, path: Path, *, check_all: bool) -> list[tuple[int, str]]:
    return sorted((f.line, f.code) for f in lint_text(text, str(path), check_all=check_all))


@pytest.mark.parametrize("path", sorted(CHECK.glob("*.py")), ids=lambda path: path.stem)
@pytest.mark.parametrize("check_all", [False, True], ids=["default", "all"])
def test_fixture_findings(path, check_all):
    text = path.read_text(encoding="utf-8")
    assert _actual(text, path, check_all=check_all) == _expected(text, check_all=check_all)


def test_clean_fixtures_exist_for_each_framework():
    names = {path.stem for path in CHECK.glob("clean_*.py")}
    assert {"clean_ddp_train", "clean_raw_ddp_guards", "clean_accelerate",
            "clean_lightning"} <= names


@pytest.mark.parametrize("source", sorted((CHECK / "fix").glob("*.in.py")),
                         ids=lambda path: path.name.removesuffix(".in.py"))
def test_fix_pairs(source):
    target = source.with_name(source.name.replace(".in.py", ".out.py"))
    text = source.read_text(encoding="utf-8")
    fixes = [f.fix for f in lint_text(text, str(source)) if f.fix]
    assert fixes, "an .in.py fixture needs fixable findings"
    fixed = apply_fixes(text, fixes)
    assert fixed == target.read_text(encoding="utf-8")
    assert _actual(fixed, target, check_all=False) == _expected(fixed, check_all=False)
    assert apply_fixes(fixed, [f.fix for f in lint_text(fixed) if f.fix]) == fixed


def test_findings_do_not_depend_on_the_hash_seed():
    """The same files give the same messages under two hash seeds (a pre-commit hook whose
    wording changes run to run: DST303 once named whichever tainted name a set yielded first)."""
    import subprocess
    import sys

    from tests.helpers import REPO, clean_env

    files = sorted(str(path) for path in CHECK.glob("*.py"))
    outputs = [subprocess.run([sys.executable, "-m", "distify", "check", "--all", *files],
                              cwd=REPO, env=clean_env(PYTHONHASHSEED=seed), capture_output=True,
                              text=True, timeout=120).stdout
               for seed in ("0", "1", "2")]
    assert "DST303" in outputs[0]
    assert outputs[0] == outputs[1] == outputs[2]
