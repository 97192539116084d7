"""Devices agree with the script: every converted fixture, at world size 1, on an accelerator.

There is no GPU here, so the runs use the test-only stand-in of ``tests/device_standin``: a
PrivateUse1 backend named ``standin`` whose tensors compute on the CPU and which raises torch's
"Expected all tensors to be on the same device" when an op mixes them with CPU tensors.
``distify.device()`` is ``standin:0`` under it, so a converted script whose prepared model and
own tensors end up on two devices fails as it would on a GPU machine.

Every ``tests/fixtures/*/*.out.py`` and ``*.noop.py`` runs, one after another in one
subprocess (torch imported once). A fixture must run to its end with its prepared models on the
stand-in, unless it is listed in ``KNOWN`` with the error it stops with and why (a listed one
that now passes fails the test too, so the list stays the truth). A CPU-only script (its
conversion holds ``distify.init(cpu=True)``: the script never names an accelerator) must run to
its end with its models on the CPU, where its own tensors are.
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

#: CPU-only scripts that stopped with the device error before the converter kept them on the
#: CPU (prepare put the model on the stand-in, torch.from_numpy(state) / torch.zeros(n) / random
#: batches stayed on the CPU): each must now be converted CPU-only and run to its end
WERE_MIXED = {"batch_shapes/gan.out", "convert/no_dataloader.out", "long_tail/gan_n_critic.out",
              "random_batches/char_gpt.out", "rl/reinforce_env.out", "stops/eval_when_close.out",
              "stops/poly_regression.out", "stops/reinforce_corridor.out",
              "rank_random/regression_task.out"}
CPU_LINE = re.compile(r"^\w+\.init\(cpu=True\)$", re.MULTILINE)


def _cpu_only(script: Path) -> bool:
    """The conversion keeps the script on the CPU: it never named an accelerator."""
    return bool(CPU_LINE.search(script.read_text(encoding="utf-8")))


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
    # a flag written as a conditional (`device = "cpu" if args.cpu else "cuda"`), set
    cpu_flag = tmp_path / "cpu_flag"
    cpu_flag.mkdir()
    shutil.copy(FIXTURES / "devices" / "cpu_flag.out.py", cpu_flag / "train.py")
    (cpu_flag / "args.txt").write_text("--cpu")
    results = _run_under_standin(tmp_path, [*folders.values(), no_accel, cpu_flag])
    flag_set, flag_unset = results[str(cpu_flag)], results[str(folders["devices/cpu_flag.out"])]
    assert flag_set["ok"] and flag_set["models"] == ["cpu"], flag_set
    assert "device: cpu" in flag_set["output"]
    assert flag_unset["ok"] and flag_unset["models"] == ["standin"], flag_unset
    assert "device: standin" in flag_unset["output"]
    flagged, accel = results[str(no_accel)], results[str(folders["devices/mnist_accel.out"])]
    assert flagged["ok"] and flagged["models"] == ["cpu"], flagged
    assert "device: cpu" in flagged["output"]
    assert accel["ok"] and "device: standin" in accel["output"], accel
    # the stand-in computes on the CPU: the same losses and accuracies either way
    assert flagged["output"].split("\n", 1)[1] == accel["output"].split("\n", 1)[1]
    wrong = []
    for name, folder in folders.items():
        result = results[str(folder)]
        if name in WERE_MIXED and not _cpu_only(scripts_by_name[name]):
            wrong.append(f"{name}: a CPU-only script, not converted to stay on the CPU")
        if name in KNOWN:
            expected, why = KNOWN[name]
            if result["ok"] or expected not in result["error"]:
                wrong.append(f"{name}: listed as stopping with {expected!r} ({why}), but "
                             f"{'it ran to its end' if result['ok'] else result['error']}")
        elif not result["ok"] and any(cause in result["error"] for cause in CANNOT_RUN_HERE):
            print(f"{name} cannot run here: {result['error'].splitlines()[-1]}")
        elif not result["ok"]:
            wrong.append(f"{name}: {result['error']}")
        elif _cpu_only(scripts_by_name[name]) and result["models"] not in ([], ["cpu"]):
            wrong.append(f"{name}: converted to stay on the CPU, models on {result['models']}")
        elif name in CHOSE_CPU and result["models"] != ["cpu"]:
            wrong.append(f"{name}: its flag chose the CPU, its models are on {result['models']}")
        elif name not in CHOSE_CPU and not _cpu_only(scripts_by_name[name]) and \
                result["models"] not in ([], ["standin"]):
            wrong.append(f"{name}: prepared models on {result['models']}, not the stand-in")
    assert not wrong, "\n".join(wrong)
    on_standin = [name for name in folders if "standin" in results[str(folders[name])]["models"]]
    assert len(on_standin) >= 10, on_standin  # the runtime really chose the stand-in
    on_cpu = [name for name in folders if _cpu_only(scripts_by_name[name])
              and results[str(folders[name])]["models"] == ["cpu"]]
    assert set(on_cpu) >= WERE_MIXED, sorted(WERE_MIXED - set(on_cpu))


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
    pytest.param('device = "cpu" if args.no_cuda else "cuda"',
                 'device = "cpu" if not distify.device_choice(not args.no_cuda) else '
                 'distify.device().type', id="conditional-cpu-flag"),
    pytest.param('device = torch.device("cuda:0" if args.accel else "cpu")',
                 'device = torch.device(distify.device().type if '
                 'distify.device_choice(args.accel) else "cpu")', id="conditional-accel-flag"),
    pytest.param('device = torch.device("cuda") if not args.no_cuda else torch.device("cpu")',
                 'device = distify.device() if distify.device_choice(not args.no_cuda) else '
                 'torch.device("cpu")', id="conditional-torch-devices"),
    pytest.param('cpu = args.no_cuda\ndevice = torch.device("cpu" if cpu else "cuda")',
                 'device = torch.device("cpu" if not distify.device_choice(not cpu) else '
                 'distify.device().type)', id="flag-held-in-a-bare-name"),
    pytest.param('use_gpu = not args.no_cuda\ndevice = "cuda" if use_gpu else "cpu"',
                 'device = distify.device().type if distify.device_choice(use_gpu) else "cpu"',
                 id="negated-flag-held-in-a-bare-name"),
    pytest.param("use_cuda = torch.cuda.is_available()", None, id="no-flag-noop"),
    pytest.param("use_wandb = args.accel and wandb.is_available()", None, id="not-torch-noop"),
])
def test_a_flag_that_chooses_the_device_still_chooses_it(line: str, expected: str | None) -> None:
    source = f"{_FLAG_HEAD}{line}\n"
    result = convert_source(source.encode(), "train.py")
    if expected is None:
        assert line in result.output.decode() and b"device_choice" not in result.output
    elif "\n" in line:  # the flag's own assignment stays as it was
        assert line.split("\n")[0] in result.output.decode()
        assert expected in result.output.decode()
        assert result.output.count(b"device_choice") == 1
    if expected is not None:
        assert expected in result.output.decode()
        assert any("a flag chooses the device" in c.message for c in result.changes)


@pytest.mark.parametrize(("source", "cpu_only"), [
    pytest.param("x = torch.zeros(3)\n# trains on cuda one day\n", True, id="comment-not-counted"),
    pytest.param("device = 'cpu'\nx = x.to(device)\n", True, id="cpu-device"),
    pytest.param("def f(m, device='cpu'):\n    m.to(device)\n", True, id="cpu-default"),
    pytest.param("x = x.to(torch.float16)\n", True, id="dtype-move"),
    pytest.param("x = torch.zeros(3).cuda()\n", False, id="cuda-method"),
    pytest.param("d = torch.device('cuda' if ok else 'cpu')\n", False, id="cuda-string"),
    pytest.param("device = args.device\nx = x.to(device)\n", False, id="device-setting"),
    pytest.param("x = x.to(args.device)\n", False, id="device-attribute"),
    pytest.param("def f(m, device):\n    m.to(device)\n", False, id="device-parameter-only"),
    pytest.param("use_gpu = False\n", False, id="gpu-name"),
    pytest.param("import torch_xla\n", False, id="xla-import"),
    pytest.param("x = torch.ones(2, device=pick())\n", False, id="device-from-call"),
    pytest.param("p.add_argument('--no-mps')\n", False, id="mps-flag"),
    pytest.param("d = torch.accelerator.current_accelerator()\n", False, id="torch-accelerator"),
    pytest.param("x = x.to(f'cuda:{i}')\n", False, id="f-string"),
])
def test_a_script_that_never_names_an_accelerator_stays_on_the_cpu(source: str,
                                                                    cpu_only: bool) -> None:
    script = ("import torch\nfrom torch.utils.data import DataLoader\n"
              f"{source}model = torch.nn.Linear(4, 2)\n"
              "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              "for x, y in DataLoader(data):\n"
              "    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n")
    result = convert_source(script.encode(), "train.py")
    assert result.status == "converted"
    code = result.output.decode()
    assert ("distify.init(cpu=True)" in code) is cpu_only, code
    assert any("never uses an accelerator" in c.message for c in result.changes) is cpu_only
    if cpu_only:  # on the line after the runtime's import, not before it
        assert "import distify.runtime as distify\ndistify.init(cpu=True)\n" in code


_FORWARD = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.register_buffer("scale", torch.ones(2))

    def forward(self, x):
        h = torch.zeros(x.size(0), 2)
        m = torch.ones(2{device})
        k = torch.arange(2){move}.to(x.dtype)
        d = torch.eye(2).to(x.dtype)  # a dtype, not a device: still on the CPU
        return self.fc(x) * self.scale + h + m + k + d.sum()


def helper(n):
    return torch.zeros(n)


model = Net(){move}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(data):
    opt.zero_grad()
    model(x{move}).sum().backward()
    opt.step()
"""


@pytest.mark.parametrize(("move", "device", "reported"), [
    (".cuda()", ", device=x.device", True), ("", "", False)],
    ids=["gpu-script", "cpu-only-script"])
def test_a_tensor_made_in_forward_without_device_is_reported(move: str, device: str,
                                                             reported: bool) -> None:
    """On the accelerator, torch.zeros(n) in a prepared module's forward is on the CPU: one note
    on its line (not for device=, a move where it is made, __init__, or a function outside a
    module; a move to a dtype is no move to a device); a CPU-only script
    keeps its model on the CPU, so nothing to report."""
    result = convert_source(_FORWARD.format(move=move, device=device).encode(), "train.py")
    notes = [n for n in result.notes if "forward has no device=" in n.message]
    if reported:
        assert [(n.line, n.message.split(" ", 1)[0]) for n in notes] == [
            (14, "`torch.zeros(...)`"), (17, "`torch.eye(...)`")]
        assert "distify.init(cpu=True)" not in result.output.decode()
    else:
        assert notes == [] and "distify.init(cpu=True)" in result.output.decode()


_FRESH = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = Net().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(data)
for x, y in loader:
    opt.zero_grad()
    model(x.to(device)).sum().backward()
    opt.step()
torch.save(model.state_dict(), "m.pt")
best = Net()
best.load_state_dict(torch.load("m.pt"))
{after}
for x, y in loader:
    print(best(x).sum())
"""


@pytest.mark.parametrize(("after", "reported"), [
    ("best.eval()", True), ("best.to(device)", False), ("best = distify_me(best)", True),
], ids=["fresh-on-cpu", "moved", "other-call"])
def test_a_fresh_model_evaluated_on_prepared_batches_is_reported(after: str,
                                                                 reported: bool) -> None:
    """`best = Net()` loaded from a checkpoint and called on a prepared loader's batches (on the
    device) while its weights stay on the CPU: one note at the line that makes it."""
    result = convert_source(_FRESH.format(after=after).encode(), "train.py")
    notes = [n for n in result.notes if "is a fresh Net" in n.message]
    if reported:
        assert [n.line for n in notes] == [26], result.notes
        assert result.output.decode().splitlines()[25] == "best = Net()"
        assert "`best.to(distify.device())`" in notes[0].message
    else:
        assert notes == []


def test_a_prepared_model_made_again_under_its_own_name_is_fresh() -> None:
    """The CIFAR-10 tutorial's way: `net` is trained (prepared), saved, then `net = Net()` and
    `net.load_state_dict(...)` evaluate the checkpoint on the prepared test loader. From that
    line `net` is a fresh model on the CPU, whatever the name held before."""
    source = _FRESH.format(after="").replace("best", "model")
    result = convert_source(source.encode(), "train.py")
    notes = [n for n in result.notes if "is a fresh Net" in n.message]
    assert [n.line for n in notes] == [26], result.notes
    assert result.output.decode().splitlines()[25] == "model = Net()"


def test_what_the_device_notes_report_fails_on_the_standin_and_their_fix_runs(
        tmp_path: Path) -> None:
    """The two notes above are true: under the stand-in, the converted scripts they report stop
    with the device error; with the change each note asks for, they run to their end."""
    data = "DataLoader([(torch.ones(4), torch.ones(2))] * 4, batch_size=2)"
    converted = {name: convert_source(source.replace("DataLoader(data)", data).encode(),
                                      "train.py").output.decode()
                 for name, source in (("forward", _FORWARD.format(
                     move=".cuda()", device=", device=x.device")),
                     ("fresh", _FRESH.format(after="best.eval()")))}
    # the converted scripts changed as the notes say
    converted["forward_fixed"] = converted["forward"].replace(
        "torch.zeros(x.size(0), 2)", "torch.zeros(x.size(0), 2, device=x.device)").replace(
        "torch.eye(2).to(x.dtype)", "torch.eye(2, device=x.device).to(x.dtype)")
    converted["fresh_fixed"] = converted["fresh"].replace(
        "best.eval()", "best.eval()\nbest.to(distify.device())")
    folders = []
    for name, output in converted.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(output)
        folders.append(tmp_path / name)
    results = _run_under_standin(tmp_path, folders)
    for name in ("forward", "fresh"):
        result = results[str(tmp_path / name)]
        assert not result["ok"] and MIXED in result["error"], result
        fixed = results[str(tmp_path / f"{name}_fixed")]
        assert fixed["ok"] and fixed["models"] == ["standin"], fixed


@pytest.mark.parametrize("assigned, noted", [
    ('"cpu" if args.cpu else "cuda"', False),  # a flag's choice: this process's own device
    ('"cuda"', False),                            # becomes rt.device().type
    ("args.device", True),                        # a setting: every process would share it
])
def test_torch_device_of_a_name_is_noted_only_when_the_name_may_not_be_per_process(
        assigned: str, noted: bool) -> None:
    """`torch.device(device)` inside a re-aligned `print(...)` (the report keeps changes made
    there): no note where `device` already holds this process's own device."""
    source = textwrap.dedent(f"""\
        import argparse
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        args = argparse.ArgumentParser().parse_args()
        device = {assigned}
        print(f"device: {{torch.device(device).type}}",
              "ok")
        model = torch.nn.Linear(2, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1))):
            loss = ((model(x.to(device)) - y.to(device)) ** 2).mean()
            loss.backward()
            optimizer.step()
        """)
    result = convert_source(source.encode(), "train.py")
    said = [n.line for n in result.notes if "the device comes from a setting" in n.message]
    line = next(number for number, text in enumerate(result.output.decode().splitlines(), 1)
                if "torch.device(device)" in text)
    assert said == ([line] if noted else []), [(n.line, n.message) for n in result.notes]
