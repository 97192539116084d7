"""Shared test helpers: run scripts as real processes (plain python or torchrun on CPU/Gloo)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without any launcher variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"}
           and not k.startswith(("DISTIFY_", "ACCELERATE_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": ""})
    env.update(extra)
    return env


def run_python(script: Path | str, *args: str, cwd: Path | str, env: dict | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``python script args`` (no launcher); fail the test with its output on error."""
    proc = subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_torchrun(script: Path | str, *args: str, nproc: int = 2, cwd: Path | str,
                 env: dict | None = None, timeout: float = 300,
                 check: bool = True) -> subprocess.CompletedProcess:
    """Run ``script`` on ``nproc`` local processes with torchrun (Gloo on CPU)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(script), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env or clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    if check:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def result_line(stdout: str, required: bool = True) -> dict | None:
    """The JSON of the last ``RESULT {...}`` line a fixture script printed (None if it printed
    none and ``required`` is false)."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines or not required, stdout
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


def flatten(obj, prefix: str = "") -> dict:
    """A nested checkpoint (dicts, lists, tuples) as ``{"a.0.b": leaf}``, to compare key by key."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {prefix.rstrip("."): obj}
    out: dict = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}{key}."))
    return out
