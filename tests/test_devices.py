"""Devices agree with the script: every converted fixture, at world size 1, on an accelerator.

There is no GPU here, so the runs use the test-only stand-in of ``tests/device_standin``: a
PrivateUse1 backend named ``standin`` whose tensors compute on the CPU and which raises torch's
"Expected all tensors to be on the same device" when an op mixes them with CPU tensors.
``distify.device()`` is ``standin:0`` under it, so a converted script whose prepared model and
own tensors end up on two devices fails as it would on a GPU machine.

Every ``tests/fixtures/*/*.out.py`` and ``*.noop.py`` runs, one after another in one
subprocess (torch imported once). A fixture must run to its end with its prepared models on the
stand-in, unless it is listed in ``KNOWN`` with the error it stops with and why (a listed one
that now passes fails the test too, so the list stays the truth), or it is a CPU-only script
that stops with the device error: the conversion's open gap, printed by name on every run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from tests.helpers import FIXTURES, REPO, clean_env

STANDIN = REPO / "tests" / "device_standin"
MIXED = "Expected all tensors to be on the same device"
_FUSED = ("the stand-in's limit: GRU/LSTM cells on a non-CPU tensor call fused kernels that "
          "torch has for CUDA only, and the stand-in computes on the CPU")

#: errors of fixtures that cannot run on this machine at all (a package that is not installed,
#: the network): not a device question
CANNOT_RUN_HERE = ("ModuleNotFoundError: No module named", "URLError: <urlopen error")

#: fixtures that do not run to their end under the stand-in: the error they stop with, and why
KNOWN = {
    "bptt/word_lm.out": ("_thnn_fused_", _FUSED),
    "idioms/wrapper_calls.out": ("_thnn_fused_", _FUSED),
    "models/manual_sgd.out": ("_thnn_fused_", _FUSED),
    "idioms/dataparallel.out": ("IndexError", "the stand-in's limit: DataParallel sees an "
                                "accelerator but torch.cuda.device_count() is 0"),
    "convert/ddp_by_hand.noop": ("RANK expected", "hand-written DDP: needs a launcher"),
}

#: fixtures whose own flag chooses the CPU under the stand-in (``torch.cuda.is_available()`` is
#: False there), so their models must stay on the CPU with their data
CHOSE_CPU = {"full_batch/gcn.out"}  # args.cuda = not args.no_cuda and torch.cuda.is_available()

#: a word that shows a script uses, or may use, an accelerator (in a comment too)
_ACCELERATOR = re.compile(r"(?<![A-Za-z])(cuda|mps|xpu|gpus?|accelerators?|nccl|device_ids)"
                          r"(?![A-Za-z])", re.IGNORECASE)
#: where a script sets or makes a device, and a CPU value there
_DEVICE_SET = re.compile(r"(?<![A-Za-z])device\s*(=(?!=)\s*|\(\s*)")
_CPU_VALUE = re.compile(r"""(torch\.device\(\s*)?["']cpu["']""")


def _cpu_only(script: Path) -> bool:
    """The original script (``NAME.in.py``) never names an accelerator and sets no device but
    ``"cpu"``: its own tensors stay on the CPU, and today's conversion still prepares its model
    onto ``distify.device()`` (the converter's open gap; ``distify.init(cpu=True)`` by hand
    keeps it on the CPU)."""
    original = script.with_name(script.name.replace(".out.py", ".in.py"))
    if not original.exists():
        return False
    source = original.read_text(encoding="utf-8")
    return not _ACCELERATOR.search(source) and all(
        _CPU_VALUE.match(source, found.end()) for found in _DEVICE_SET.finditer(source))


def _run_under_standin(root: Path, folders: list[Path]) -> dict[str, dict]:
    results = root / "results.json"
    env = clean_env(PYTHONPATH=f"{STANDIN}:{REPO}")
    proc = subprocess.run([sys.executable, str(STANDIN / "run_fixtures.py"), str(results),
                           *map(str, folders)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(results.read_text())


def test_every_converted_fixture_meets_its_data_on_one_device(tmp_path: Path) -> None:
    scripts = sorted([*FIXTURES.glob("*/*.out.py"), *FIXTURES.glob("*/*.noop.py")])
    folders, scripts_by_name = {}, {}
    for script in scripts:
        name = f"{script.parent.name}/{script.name[:-len('.py')]}"
        folder = tmp_path / name.replace("/", "__")
        folder.mkdir()
        shutil.copy(script, folder / "train.py")
        folders[name], scripts_by_name[name] = folder, script
    # the same script with its flag set: the CPU, model and data
    no_accel = tmp_path / "no_accel"
    no_accel.mkdir()
    shutil.copy(FIXTURES / "devices" / "mnist_accel.out.py", no_accel / "train.py")
    (no_accel / "args.txt").write_text("--no-accel")
    results = _run_under_standin(tmp_path, [*folders.values(), no_accel])
    flagged, accel = results[str(no_accel)], results[str(folders["devices/mnist_accel.out"])]
    assert flagged["ok"] and flagged["models"] == ["cpu"], flagged
    assert "device: cpu" in flagged["output"]
    assert accel["ok"] and "device: standin" in accel["output"], accel
    # the stand-in computes on the CPU: the same losses and accuracies either way
    assert flagged["output"].split("\n", 1)[1] == accel["output"].split("\n", 1)[1]
    wrong = []
    for name, folder in folders.items():
        result = results[str(folder)]
        if _cpu_only(scripts_by_name[name]) and not result["ok"] and MIXED in result["error"]:
            print(f"{name}: a CPU-only script, its model prepared onto the stand-in: {MIXED}")
        elif name in KNOWN:
            expected, why = KNOWN[name]
            if result["ok"] or expected not in result["error"]:
                wrong.append(f"{name}: listed as stopping with {expected!r} ({why}), but "
                             f"{'it ran to its end' if result['ok'] else result['error']}")
        elif not result["ok"] and any(cause in result["error"] for cause in CANNOT_RUN_HERE):
            print(f"{name} cannot run here: {result['error'].splitlines()[-1]}")
        elif not result["ok"]:
            wrong.append(f"{name}: {result['error']}")
        elif name in CHOSE_CPU and result["models"] != ["cpu"]:
            wrong.append(f"{name}: its flag chose the CPU, its models are on {result['models']}")
        elif name not in CHOSE_CPU and result["models"] not in ([], ["standin"]):
            wrong.append(f"{name}: prepared models on {result['models']}, not the stand-in")
    assert not wrong, "\n".join(wrong)
    on_standin = [name for name in folders if results[str(folders[name])]["models"]]
    assert len(on_standin) >= 30, on_standin  # the runtime really chose the stand-in


OLD_STYLE = textwrap.dedent("""\
    import numpy as np
    import torch
    import distify.runtime as distify
    {init}
    torch.manual_seed(0)
    model = distify.prepare(torch.nn.Linear(4, 2))
    print("model on", next(model.parameters()).device)
    state = np.ones((3, 4), dtype=np.float32)
    x = torch.from_numpy(state){move}
    print("output", model(x).sum().item())
    """)


def test_the_standin_fails_a_conversion_that_mixes_devices(tmp_path: Path) -> None:
    """The negative case, through the ``sitecustomize`` start-up hook: a model prepared onto the
    device and an input the script built on the CPU stop with torch's device error; the same
    script runs with the input moved, or with the runtime kept on the CPU by the script's choice
    (``distify.device_choice(False)``: prepare leaves the model where the script's tensors are)."""
    env = clean_env(PYTHONPATH=f"{STANDIN}:{REPO}", DISTIFY_TEST_STANDIN="1")
    runs = {}
    for name, init, move in (("mixed", "", ""), ("moved", "", ".to(distify.device())"),
                             ("cpu", "distify.device_choice(False)", "")):
        (tmp_path / f"{name}.py").write_text(OLD_STYLE.format(init=init, move=move))
        runs[name] = subprocess.run([sys.executable, f"{name}.py"], cwd=tmp_path, env=env,
                                    capture_output=True, text=True, timeout=120)
    assert runs["mixed"].returncode == 1, runs["mixed"].stdout + runs["mixed"].stderr
    assert "model on standin:0" in runs["mixed"].stdout
    assert MIXED in runs["mixed"].stderr
    assert runs["moved"].returncode == 0, runs["moved"].stderr
    assert "model on standin:0" in runs["moved"].stdout and "output" in runs["moved"].stdout
    assert runs["cpu"].returncode == 0, runs["cpu"].stderr
    assert "model on cpu" in runs["cpu"].stdout and "output" in runs["cpu"].stdout


DEVICES = FIXTURES / "devices"


@pytest.mark.parametrize("source", sorted(DEVICES.glob("*.in.py")), ids=lambda p: p.name)
def test_golden_output_and_converting_twice_changes_nothing(source: Path) -> None:
    expected = source.with_name(source.name.replace(".in.py", ".out.py"))
    result = convert_source(source.read_bytes(), "train.py")
    if os.environ.get("DISTIFY_UPDATE_GOLDEN"):
        expected.write_bytes(result.output)
    assert result.output.decode() == expected.read_text()
    assert convert_source(result.output, "train.py").output == result.output


_FLAG_HEAD = """\
import argparse
import torch
import wandb

parser = argparse.ArgumentParser()
parser.add_argument("--no-cuda", action="store_true")
parser.add_argument("--accel", action="store_true")
args = parser.parse_args()
"""


@pytest.mark.parametrize(("line", "expected"), [
    pytest.param("use_cuda = not args.no_cuda and torch.cuda.is_available()",
                 "use_cuda = distify.device_choice(not args.no_cuda and "
                 "torch.cuda.is_available())", id="no-cuda-flag"),
    pytest.param("use_accel = args.accel and torch.accelerator.is_available()",
                 "use_accel = distify.device_choice(args.accel and "
                 "torch.accelerator.is_available())", id="opt-in-accel-flag"),
    pytest.param("use_cuda = torch.cuda.is_available()", None, id="no-flag-noop"),
    pytest.param("use_wandb = args.accel and wandb.is_available()", None, id="not-torch-noop"),
])
def test_a_flag_that_chooses_the_device_still_chooses_it(line: str, expected: str | None) -> None:
    source = f"{_FLAG_HEAD}{line}\n"
    result = convert_source(source.encode(), "train.py")
    if expected is None:
        assert line in result.output.decode() and b"device_choice" not in result.output
    else:
        assert expected in result.output.decode()
        assert any("a flag chooses the device" in c.message for c in result.changes)
