"""The published hook, run by pre-commit itself, configured exactly as the README says.

The hook repository is a copy of this working tree committed into a fresh git repository (so
uncommitted work is what gets tested), then cloned the way a user's pre-commit clones it: a
fresh clone has no tags, which is why the README pins a commit. Each README snippet is taken
verbatim, with only its placeholders filled in. pre-commit builds the hook's environment from the
clone with pip. Skipped only where pre-commit is not installed (it is in the `test` extra).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO

pytest.importorskip("pre_commit")

_IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "*.egg-info", "build",
                                 "dist", ".pytest_cache", ".ruff_cache", ".hypothesis",
                                 ".work", ".mypy_cache")
UNGUARDED = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.save(model.state_dict(), "model.pt")
"""
GUARDED = UNGUARDED.replace('torch.save(', 'if dist.get_rank() == 0:\n    torch.save(')
_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **_GIT_ENV}, check=True,
                          capture_output=True, text=True).stdout.strip()


def _repo(path: Path, files: dict[str, str] | None = None, copy_of: Path | None = None) -> Path:
    if copy_of is not None:
        shutil.copytree(copy_of, path, symlinks=True, ignore=_IGNORE)
    else:
        path.mkdir()
    for name, text in (files or {}).items():
        (path / name).write_text(textwrap.dedent(text))
    _git("init", "-q", cwd=path)
    _git("add", "-A", cwd=path)
    _git("commit", "-q", "-m", "snapshot", cwd=path)
    return path


def readme_snippets() -> list[str]:
    """The YAML blocks of the README's pre-commit paragraph, in order."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## `distify check`", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```yaml\n(.+?)```", section, flags=re.S)


def run_hook(tmp_path: Path, config: str, name: str) -> subprocess.CompletedProcess:
    project = tmp_path / "project"
    if not project.exists():
        _repo(project, {"bad.py": UNGUARDED, "good.py": GUARDED})
    (project / ".pre-commit-config.yaml").write_text(config)
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           # `language: system` runs the distify installed beside this Python
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "pre_commit", "run", "--files", name,
                           "--color", "never"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=600, check=False)


def assert_hook_works(tmp_path: Path, config: str) -> None:
    bad = run_hook(tmp_path, config, "bad.py")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "bad.py:5:1: DST101 [*]" in bad.stdout
    good = run_hook(tmp_path, config, "good.py")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Passed" in good.stdout


def test_readme_has_a_pinned_and_a_local_snippet():
    pinned, local = readme_snippets()
    assert "rev: <a full commit SHA>" in pinned and "rev: v" not in pinned
    assert "repo: local" in local and "id: distify-check" in local


def test_readme_snippet_pinned_by_commit_works_against_a_fresh_clone(tmp_path):
    origin = _repo(tmp_path / "origin", copy_of=REPO)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True)
    assert _git("tag", cwd=clone) == ""  # what broke `rev: v0.1.0`: a clone has no tags
    sha = _git("rev-parse", "HEAD", cwd=clone)
    pinned = readme_snippets()[0]
    config = (pinned.replace("<distify's repository URL>", str(clone))
              .replace("<a full commit SHA>", sha))
    assert "<" not in config, config  # every placeholder filled
    assert_hook_works(tmp_path, config)


def test_readme_local_snippet_runs_the_installed_distify(tmp_path):
    assert_hook_works(tmp_path, readme_snippets()[1])
