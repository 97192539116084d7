"""What a newcomer sees in their first hour (issue 13): launch configs that `convert` writes,
keeps or updates, hyper-parameter YAML files it never adopts, project conversions that are ready
to launch, the report on stderr with --diff, no clutter for unchanged files, summarised reports,
progress on a terminal, and `distify check --explain`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from distify.cli import main
from distify.lint.registry import REGISTRY
from tests.helpers import FIXTURES, REPO, clean_env

CONVERT = FIXTURES / "convert"


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def distify(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m distify ARGS`` as a real process (stdout and stderr apart)."""
    return subprocess.run([sys.executable, "-m", "distify", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=clean_env(PYTHONPATH=str(REPO)))


# ------------------------------------------------------------------ distify check --explain
def test_explain_prints_the_rules_documentation_and_examples(tmp_path: Path) -> None:
    proc = distify("check", "--explain", "DST101", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rule = REGISTRY["DST101"]
    assert proc.stdout.startswith("DST101: A checkpoint is saved by every rank.\n")
    assert "It does not touch a save\nwhose result is assigned" in proc.stdout  # the whole doc
    assert proc.stdout.count("VALID (not reported):") == len(rule.VALID)
    assert proc.stdout.count("INVALID (reported") == len(rule.INVALID)
    assert "INVALID (reported at line 9):" in proc.stdout
    assert "        torch.save(model.state_dict(), \"model.pt\")" in proc.stdout
    assert "after --fix:" in proc.stdout


def test_explain_accepts_any_case() -> None:
    result = run("check", "--explain", "dst305")
    assert result.exit_code == 0
    assert result.output.startswith("DST305: ")


def test_explain_an_unknown_code_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = distify("check", "--explain", "DST999", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"distify: error: unknown rule code 'DST999' (known: {', '.join(sorted(REGISTRY))})"]
