"""``distify convert`` of a script imports what converting it needs and nothing more: every run
of the CLI pays for its imports, which were most of a small script's conversion
(``benchmarks/results/convert.md``). PyYAML is imported for a user's rule pack or an existing
launch config only (the bundled packs are read from their JSON copy, a new config is written
without it), the notebook modules for a notebook only, and torch never."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """\
import torch

model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2)
for batch in loader:
    loss = model(torch.ones(2)).sum()
    loss.backward()
    opt.step()
print("done")
"""

_CODE = """\
import sys
from distify.cli import main
try:
    main(["convert", *sys.argv[1:]])
except SystemExit as stop:
    print("exit", stop.code)
for name in ("yaml", "torch", "distify.notebook", "distify.convert.notebook",
             "distify.lint.model"):
    print(name, name in sys.modules)
"""


def _convert(tmp_path: Path, *args: str) -> dict[str, str]:
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-c", _CODE, *args], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    lines = proc.stdout.splitlines()
    assert any(line.startswith("exit") for line in lines) or "converted" in proc.stdout + \
        proc.stderr, proc.stdout + proc.stderr
    return dict(line.split(" ", 1) for line in lines[-5:])


def test_converting_a_script_imports_neither_yaml_nor_notebooks_nor_torch(tmp_path) -> None:
    imported = _convert(tmp_path, "train.py", "-o", "out.py")
    assert (tmp_path / "out.py").read_text().count("distify") > 1
    assert "mixed_precision: 'no'" in (tmp_path / "out.yaml").read_text()
    assert imported == {"yaml": "False", "torch": "False", "distify.notebook": "False",
                        "distify.convert.notebook": "False", "distify.lint.model": "False"}


def test_an_existing_launch_config_is_still_read_with_yaml(tmp_path) -> None:
    _convert(tmp_path, "train.py", "-o", "out.py")
    imported = _convert(tmp_path, "train.py", "-o", "out.py", "--mixed-precision", "bf16")
    assert "mixed_precision: bf16" in (tmp_path / "out.yaml").read_text()
    assert imported["yaml"] == "True" and imported["torch"] == "False"


def test_the_gpus_are_counted_once_for_the_config_and_the_launch_line(tmp_path) -> None:
    """``nvidia-smi`` (a process of its own, which a conversion waits for) runs once, not once
    for the launch config and again for the launch command."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "smi.log"
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\necho run >> {log}\necho 'GPU 0: H100 (UUID: GPU-0)'\n"
                    "echo 'GPU 1: H100 (UUID: GPU-1)'\n")
    tool.chmod(0o755)
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run([sys.executable, "-m", "distify", "convert", "train.py", "-o",
                           "out.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "num_processes: 2" in (tmp_path / "out.yaml").read_text()
    assert "no GPU here" not in proc.stdout + proc.stderr
    assert log.read_text().splitlines() == ["run"]
