"""A launch on a Python without NumPy (the README's fresh install) does not print torch's
"Failed to initialize NumPy" warning, once per process, at every launch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import FIXTURES, clean_env

pytest.importorskip("torch", reason="real launches need torch")

NO_NUMPY = FIXTURES / "launch_numpy"
WARNING = "Failed to initialize NumPy"


def dry_run(cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distify", "launch", "--num_processes", "2",
                           "--cpu", "--dry-run", str(NO_NUMPY / "uses_torch.py")], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def test_without_numpy_the_launch_is_quiet_and_the_user_filters_stay(tmp_path):
    env = clean_env(PYTHONPATH=str(NO_NUMPY), PYTHONWARNINGS="default::DeprecationWarning")
    # The stand-in is faithful: plain torch warns without NumPy.
    plain = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert WARNING in plain.stderr, plain.stderr
    proc = subprocess.run([sys.executable, "-m", "distify", "launch", "--num_processes", "2",
                           "--cpu", str(NO_NUMPY / "uses_torch.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert WARNING not in proc.stdout + proc.stderr
    assert "sum 2.0" in proc.stdout
    dry = dry_run(tmp_path, env)
    assert ("export PYTHONWARNINGS='default::DeprecationWarning,"
            "ignore:Failed to initialize NumPy:UserWarning'") in dry.stdout, dry.stdout


def test_with_numpy_nothing_is_added(tmp_path):
    pytest.importorskip("numpy")
    dry = dry_run(tmp_path, clean_env())
    assert dry.returncode == 0, dry.stderr
    assert "PYTHONWARNINGS" not in dry.stdout
