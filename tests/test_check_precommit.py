"""The published hook, run by pre-commit itself (`pre-commit try-repo`).

The hook repository is a copy of this working tree committed into a fresh git repository (so
uncommitted work is what gets tested); pre-commit builds its environment from it with pip.
Skipped only where pre-commit is not installed (it is in the `test` extra).
"""

from __future__ import annotations

import os
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


def _git(*args: str, cwd: Path) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


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


def test_hook_fails_on_unguarded_save_and_passes_guarded(tmp_path):
    hook_repo = _repo(tmp_path / "hook", copy_of=REPO)
    project = _repo(tmp_path / "project", {"bad.py": UNGUARDED, "good.py": GUARDED})
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    def try_repo(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), "distify-check",
             "--files", name, "--color", "never"],
            cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False)

    bad = try_repo("bad.py")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "bad.py:5:1: DST101 [*]" in bad.stdout
    good = try_repo("good.py")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Passed" in good.stdout
