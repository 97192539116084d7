"""What the README says of `accelerate launch --config_file` on distify's launch configs, checked
against the installed Accelerate: it starts GPU configs (MULTI_GPU) through torchrun with every
process, also on a machine without GPUs (test_launch_run.py trains through one), but a
multi-process CPU config (`use_cpu: true`, MULTI_CPU) as one process, since Accelerate starts
multi-CPU jobs only through mpirun. If Accelerate changes, this test and the README change."""

from __future__ import annotations

import subprocess
import sys

import pytest

from distify.launch.config import default_config, with_overrides, write_config
from tests.helpers import REPO, clean_env, free_port

pytest.importorskip("accelerate", reason="accelerate is a test dependency")

# One write per process: the two share the pipe, and `print` of several values writes them one
# at a time when the output is unbuffered (one CI run read "rankrank 1 of 2" from it).
PROBE = ("import os\nos.write(1, f\"rank {os.environ.get('RANK')} of "
         "{os.environ.get('WORLD_SIZE')}\\n\".encode())\n")


def ranks_started(tmp_path, **config) -> list[str]:
    cfg = with_overrides(default_config(num_processes=2), main_process_port=free_port(), **config)
    write_config(cfg, tmp_path / "job.yaml")
    (tmp_path / "probe.py").write_text(PROBE)
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                           "job.yaml", "probe.py"], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted(line for line in proc.stdout.splitlines() if line.startswith("rank"))


def test_accelerate_runs_a_cpu_config_as_one_process_as_the_readme_says(tmp_path):
    assert ranks_started(tmp_path, use_cpu=True) == ["rank None of None"]
    # and the config distify wrote says so at its top
    assert "runs a multi-CPU\n# config as one process" in (tmp_path / "job.yaml").read_text()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "only through `mpirun`" in readme


def test_accelerate_runs_every_process_of_a_gpu_config(tmp_path):
    assert ranks_started(tmp_path) == ["rank 0 of 2", "rank 1 of 2"]
