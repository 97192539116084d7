"""``distify check`` reads files with the stdlib ``ast``: LibCST (about half of a small run's
start-up) is imported only for a file that needs it (DST203 on a file that runs on the distify
runtime, or a fix to apply)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PLAIN = """\
import torch

model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(2)).sum()
    if loss.item() < 0.5:
        break
    loss.backward()
    opt.step()
torch.save(model.state_dict(), "m.pt")
"""
ON_RUNTIME = "import distify.runtime as distify\n" + PLAIN.replace(
    "    loss.backward()", "    distify.backward(loss)")

_CODE = """\
import sys
from distify.cli import main
try:
    main(["check", "--all", "-j", "1", sys.argv[1]])
except SystemExit as stop:
    print("exit", stop.code)
print("libcst", "libcst" in sys.modules)
"""


def _check(tmp_path: Path, source: str) -> list[str]:
    (tmp_path / "train.py").write_text(source)
    proc = subprocess.run([sys.executable, "-c", _CODE, "train.py"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    return proc.stdout.splitlines()


def test_check_of_a_plain_script_does_not_import_libcst(tmp_path: Path) -> None:
    lines = _check(tmp_path, PLAIN)
    assert lines[-2:] == ["exit 1", "libcst False"], lines  # DST101 found, with ast alone


def test_dst203_still_reads_a_file_on_the_runtime_with_libcst(tmp_path: Path) -> None:
    lines = _check(tmp_path, ON_RUNTIME)
    assert any("DST203" in line for line in lines), lines
    assert lines[-1] == "libcst True"
