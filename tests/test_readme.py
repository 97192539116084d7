"""The README's two set-up commands stay true: the main job runs, and CI runs the test command."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, check_replicas, clean_env, replicas_env

README = (REPO / "README.md").read_text()


def _setup_commands() -> list[str]:
    section = README.split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\n(.+?)\n```", section)


def test_readme_has_exactly_two_setup_commands() -> None:
    commands = _setup_commands()
    assert len(commands) == 2
    assert all("\n" not in command for command in commands)


def test_ci_runs_both_readme_commands_verbatim() -> None:
    """.ci/run reads the two commands out of README.md: what it would run is what is written."""
    proc = subprocess.run(["bash", str(REPO / ".ci" / "run"), "--print-commands"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == _setup_commands()


def test_the_main_job_runs_as_written(tmp_path: Path) -> None:
    """Everything after the install step, in a copy of the repository's examples folder."""
    pytest.importorskip("torch")
    install, job = _setup_commands()[0].split(" && ", 1)
    assert install.startswith("pip install torch==2.13.0")
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    bin_dir = str(Path(sys.executable).parent)  # where `distify` is installed
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                    PYTHONPATH=str(REPO))
    replicas = tmp_path / "replicas"  # what each of the 2 ranks trained
    proc = subprocess.run(["bash", "-c", f"set -e; {job}"], cwd=tmp_path,
                          env=replicas_env(env, replicas), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_replicas(replicas, 2, distinct_data=True, output=proc.stderr)
    assert "+    model, optimizer = distify.prepare(model, optimizer)" in proc.stdout
    results = re.findall(r"^Test set: Average loss", proc.stdout, re.MULTILINE)
    assert len(results) == 1  # one epoch, printed by one of the two processes
    assert (tmp_path / "examples" / "train_dist.py").is_file()
    assert (tmp_path / "examples" / "train_dist.yaml").is_file()
