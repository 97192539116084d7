"""`distify convert`: golden fixtures, no-ops, idempotence, the report, and the command line.

Fixtures live in tests/fixtures/convert/: ``NAME.in.py`` converts to ``NAME.out.py`` exactly;
``NAME.noop.py`` must come out byte-identical. To update a golden file after an intended change,
run ``DISTIFY_UPDATE_GOLDEN=1 pytest tests/test_convert.py`` and review the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from distify.cli import main
from distify.convert.engine import convert_source
from tests.helpers import FIXTURES

CONVERT = FIXTURES / "convert"
GOLDEN = sorted(CONVERT.glob("*.in.py"))
NOOPS = sorted(CONVERT.glob("*.noop.py"))


def _name(path: Path) -> str:
    return path.name.split(".")[0]


@pytest.mark.parametrize("source", GOLDEN, ids=_name)
def test_golden_output(source: Path) -> None:
    expected_path = source.with_name(source.name.replace(".in.py", ".out.py"))
    result = convert_source(source.read_bytes(), str(source))
    if os.environ.get("DISTIFY_UPDATE_GOLDEN"):
        expected_path.write_bytes(result.output)
    assert result.status == "converted"
    assert result.output.decode() == expected_path.read_text()


@pytest.mark.parametrize("source", GOLDEN, ids=_name)
def test_converting_twice_changes_nothing(source: Path) -> None:
    once = source.with_name(source.name.replace(".in.py", ".out.py")).read_bytes()
    again = convert_source(once, "converted.py")
    assert again.output == once
    assert again.status == "already-distributed"


@pytest.mark.parametrize("source", NOOPS, ids=_name)
def test_noop_fixtures_come_out_byte_identical(source: Path) -> None:
    result = convert_source(source.read_bytes(), str(source))
    assert result.output == source.read_bytes()
    assert not result.changes


@pytest.mark.parametrize("fixture, kinds", [
    ("no_dataloader", set()),  # get_batch() draws per process, the loss stop is decided alike
    ("custom_sampler", {"sampler"}),
], ids=["no-dataloader", "custom-sampler"])
def test_unsafe_shapes_are_reported_with_their_line(fixture: str, kinds: set[str]) -> None:
    result = convert_source((CONVERT / f"{fixture}.in.py").read_bytes())
    assert {note.kind for note in result.notes} == kinds
    out_lines = result.output.decode().splitlines()
    for note in result.notes:
        assert note.line >= 1
        line = out_lines[note.line - 1]
        expected = {"data": "backward", "divergence": "if ", "sampler": "sampler="}[note.kind]
        assert expected in line, (note, line)


@pytest.mark.parametrize("seed", ["", "np.random.seed(0)\n"], ids=["unseeded", "seeded"])
def test_draws_without_a_generator_are_reported_in_unseeded_files(seed: str) -> None:
    source = ("import numpy as np\nimport torch\nfrom sklearn.model_selection import "
              f"train_test_split\n{seed}order = np.random.permutation(100)\n"
              "a, b = train_test_split(order, random_state=0)\nc, d = train_test_split(order)\n"
              "for epoch in range(3):\n    np.random.shuffle(order)\n")
    result = convert_source(source.encode())
    notes = [(note.line, note.message.split("(")[0]) for note in result.notes
             if note.kind == "random-split"]
    if seed:
        assert notes == []
    else:
        assert notes == [(4, "permutation"), (6, "train_test_split")]


def test_report_lines_point_at_the_changed_code() -> None:
    result = convert_source((CONVERT / "mnist_style.in.py").read_bytes())
    lines = result.output.decode().splitlines()
    expected = {"backward": "distify.backward(", "print": "distify.print(",
                "reduce": "distify.reduce(", "device": "distify.device()",
                "prepare-dataloader": "distify.prepare(DataLoader", "save": "distify.save(",
                "prepare-model": "model, optimizer = distify.prepare(model, optimizer)",
                "prepare-scheduler": "distify.prepare(StepLR"}
    assert {c.kind for c in result.changes} == set(expected)
    for change in result.changes:
        assert expected[change.kind] in lines[change.line - 1], change


# ------------------------------------------------------------------ rewrites, one by one
def convert(src: str) -> str:
    return convert_source(src.encode()).output.decode()


@pytest.mark.parametrize("before, after", [
    pytest.param("import torch as t\nx = t.randn(2).cuda()\n",
                 "import torch as t\nimport distify.runtime as distify\n"
                 "x = t.randn(2).to(distify.device())\n", id="cuda-method"),
    pytest.param("import torch\nx = torch.zeros(1).to('cuda:0')\n",
                 "import torch\nimport distify.runtime as distify\n"
                 "x = torch.zeros(1).to(distify.device())\n", id="cuda-string"),
    pytest.param("import torch\nd = torch.accelerator.current_accelerator()\n",
                 "import torch\nimport distify.runtime as distify\nd = distify.device()\n",
                 id="current-accelerator"),
    pytest.param("import torch\nckpt = torch.load('m.pt')\n",
                 "import torch\nimport distify.runtime as distify\n"
                 "ckpt = distify.load('m.pt')\n", id="load"),
    pytest.param("from torch.utils.data import DataLoader as DL\nimport torch\n"
                 "def loaders(ds):\n    return DL(ds, batch_size=4)\n",
                 "from torch.utils.data import DataLoader as DL\nimport torch\n"
                 "import distify.runtime as distify\n"
                 "def loaders(ds):\n    return distify.prepare(DL(ds, batch_size=4))\n",
                 id="aliased-loader-in-return"),
    pytest.param("import torch\nfrom torch import nn\nnn.utils.clip_grad_norm_(ps, 1.0)\n",
                 "import torch\nfrom torch import nn\nimport distify.runtime as distify\n"
                 "distify.clip_grad_norm_(ps, 1.0)\n", id="clip-grad-norm"),
    pytest.param("import torch\ndistify = 1\nprint(distify)\n",
                 "import torch\nimport distify.runtime as distify_rt\ndistify = 1\n"
                 "distify_rt.print(distify)\n", id="runtime-name-collision"),
    pytest.param('"""Doc."""\nfrom __future__ import annotations\nimport torch\nprint(1)\n',
                 '"""Doc."""\nfrom __future__ import annotations\nimport torch\n'
                 "import distify.runtime as distify\ndistify.print(1)\n", id="after-future"),
    pytest.param("import torch\nprint(\"" + "a" * 70 + "\")\n",
                 "import torch\nimport distify.runtime as distify\ndistify.print(\n    \""
                 + "a" * 70 + "\")\n", id="long-line-hangs-its-arguments"),
    pytest.param("import torch\nprint(\"" + "a" * 70 + "\")\n# " + "b" * 85 + "\n",
                 "import torch\nimport distify.runtime as distify\ndistify.print(\"" + "a" * 70
                 + "\")\n# " + "b" * 85 + "\n", id="fits-the-files-own-line-length"),
    pytest.param("import torch\nx = 1; print(\"" + "a" * 70 + "\")\n",
                 "import torch\nimport distify.runtime as distify\nx = 1; distify.print(\""
                 + "a" * 70 + "\")\n", id="no-hanging-indent-between-semicolons"),
    pytest.param("from torch.utils.data import random_split\ntr, va = random_split(ds, [8, 2])\n",
                 "from torch.utils.data import random_split\nimport distify.runtime as distify\n"
                 "tr, va = random_split(ds, [8, 2], generator=distify.shared_generator())\n",
                 id="unseeded-random-split"),
    pytest.param("import torch\nperm = torch.randperm(len(ds))\n",
                 "import torch\nimport distify.runtime as distify\n"
                 "perm = torch.randperm(len(ds), generator=distify.shared_generator())\n",
                 id="randperm-of-the-data-set"),
    pytest.param("import torch\nperm = torch.randperm(data.num_nodes)\n",
                 "import torch\nimport distify.runtime as distify\n"
                 "perm = torch.randperm(data.num_nodes, generator=distify.shared_generator())\n",
                 id="randperm-of-the-nodes"),
])
def test_single_rewrites(before: str, after: str) -> None:
    assert convert(before) == after


@pytest.mark.parametrize("src", [
    pytest.param("import torch\nx = torch.device('cpu')\n", id="cpu-device"),
    pytest.param("import torch\nx = torch.zeros(2).to('cpu')\n", id="cpu-string"),
    pytest.param("import torch\nfrom mylib import print\nprint('x')\n", id="shadowed-print"),
    pytest.param("import torch\nout = torch.autograd.backward([])\n", id="autograd-backward"),
    pytest.param("import torch\nclass Net(torch.nn.Module):\n"
                 "    def configure(self):\n        return torch.optim.SGD(self.parameters(), 1)\n",
                 id="optimizer-inside-model-class"),
    pytest.param("print('no torch here')\n", id="no-torch"),
    pytest.param("import torch\nfrom torch.utils.data import random_split\n"
                 "a, b = random_split(ds, [8, 2], generator=g)\n"
                 "c, d = random_split(ds, [8, 2], g)\n", id="seeded-random-split"),
    pytest.param("import torch\nfor x in xs:\n    perm = torch.randperm(len(x))\n"
                 "def mixup(x):\n    return x[torch.randperm(x.size(0))]\n"
                 "idx = torch.randperm(len(ds), device=x.device)\n", id="per-batch-randperm"),
])
def test_no_op_neighbours(src: str) -> None:
    assert convert(src) == src


_NEXT_LOOP = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=8, shuffle=True)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = {source}
for step in range(20):
    try:
        x, y = next(batches)
    except StopIteration:
        batches = {source}
        x, y = next(batches)
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("source, fed", [
    ("iter(loader)", True),
    ("iter(make_batches())", False),
], ids=["iter-of-a-loader", "iter-of-something-else"])
def test_batches_drawn_with_next_from_a_loader_need_no_note(source: str, fed: bool) -> None:
    """`batches = iter(train_loader)` + `next(batches)` (with a restart on StopIteration) is
    fed by the prepared loader: its shard, reshuffled every epoch; not the data note."""
    result = convert_source(_NEXT_LOOP.format(source=source).encode())
    assert "distify.backward(loss)" in result.output.decode()
    notes = [note.kind for note in result.notes]
    assert ("data" not in notes) == fed, notes


def test_optimizer_built_in_a_helper_prepares_the_model_there() -> None:
    src = ("import torch\n\ndef build(model):\n"
           "    return torch.optim.SGD(model.fc.parameters(), lr=0.1)\n")
    out = convert(src)
    assert "    model = distify.prepare(model)\n" \
           "    return distify.prepare(torch.optim.SGD(model.fc.parameters(), lr=0.1))\n" in out


def test_eval_sums_are_reduced_only_in_evaluation_loops() -> None:
    src = ("import torch\n\ndef run(model, train_loader, test_loader):\n"
           "    running = 0.0\n"
           "    for x in train_loader:\n        running += model(x).item()\n"
           "    model.eval()\n    correct = 0\n"
           "    for x in test_loader:\n        correct += model(x).sum().item()\n"
           "    return running, correct\n")
    out = convert(src)
    assert "correct = distify.reduce(correct)" in out
    assert "running = distify.reduce" not in out


def test_predictions_collected_in_lists_are_gathered_and_per_batch_values_reported() -> None:
    src = ("import torch\n\ndef evaluate(model, loader):\n    preds, losses = [], []\n"
           "    with torch.no_grad():\n        for x, y in loader:\n"
           "            preds.append(model(x))\n"
           "            losses.append(torch.nn.functional.mse_loss(model(x), y).item())\n"
           "    return torch.cat(preds), sum(losses) / len(losses)\n")
    result = convert_source(src.encode())
    assert "preds.append(distify.gather_for_metrics(model(x)))" in result.output.decode()
    assert "gather" in [c.kind for c in result.changes]
    assert [(n.kind, n.message.split("`")[1]) for n in result.notes] == [("gather", "losses")]


# ------------------------------------------------------------------ encodings and layout
def test_crlf_bom_and_coding_cookie_are_preserved() -> None:
    src = ("# -*- coding: latin-1 -*-\r\n# caf\xe9\r\nimport torch\r\nprint('x')\r\n")
    data = src.encode("latin-1")
    out = convert_source(data).output
    assert out.startswith(b"# -*- coding: latin-1 -*-\r\n# caf\xe9\r\n")
    assert b"distify.print('x')\r\n" in out and b"\n" not in out.replace(b"\r\n", b"")
    bom = "\ufeffimport torch\nprint(1)\n".encode("utf-8")
    assert convert_source(bom).output.startswith(b"\xef\xbb\xbfimport torch\n")


def test_comments_and_untouched_lines_are_kept_byte_for_byte() -> None:
    source = (CONVERT / "mnist_style.in.py").read_text()
    output = (CONVERT / "mnist_style.out.py").read_text()
    kept = [line for line in source.splitlines() if line.strip().startswith("#")
            or '"""' in line]
    for line in kept:
        assert line in output.splitlines()


# ------------------------------------------------------------------ command line
@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_bytes((CONVERT / "mnist_style.in.py").read_bytes())
    return tmp_path


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_cli_writes_script_and_launch_config(workdir: Path) -> None:
    result = run("convert", "train.py", "-o", "train_dist.py", "--mixed-precision", "bf16")
    assert result.exit_code == 0, result.output
    assert (workdir / "train_dist.py").read_bytes() == (CONVERT / "mnist_style.out.py").read_bytes()
    config = (workdir / "train_dist.yaml").read_text()
    assert "mixed_precision: bf16" in config
    assert "train_dist.py:49: backward through the runtime" in result.output
    launch = next(line for line in result.output.splitlines() if line.startswith("Launch: "))
    assert launch.startswith("Launch: distify launch ") and "train_dist.py" in launch
    assert "global batch is N" in result.output
    assert (workdir / "train.py").read_bytes() == (CONVERT / "mnist_style.in.py").read_bytes()


def test_cli_json_report(workdir: Path) -> None:
    result = run("convert", "train.py", "--json", "--no-config")
    report = json.loads(result.output)
    (entry,) = report["files"]
    assert entry["output"] == "train_dist.py" and entry["status"] == "converted"
    assert {"line", "kind", "message"} <= set(entry["changes"][0])
    assert not (workdir / "train_dist.yaml").exists()


def test_cli_diff_writes_nothing(workdir: Path) -> None:
    result = run("convert", "train.py", "--diff")
    assert result.exit_code == 0
    assert "-        loss.backward()\n+        distify.backward(loss)\n" in result.output
    assert sorted(p.name for p in workdir.iterdir()) == ["train.py"]


def test_cli_check_exit_codes(workdir: Path) -> None:
    assert run("convert", "train.py", "--check").exit_code == 1
    (workdir / "done.py").write_bytes((CONVERT / "mnist_style.out.py").read_bytes())
    assert run("convert", "done.py", "--check").exit_code == 0
    assert sorted(p.name for p in workdir.iterdir()) == ["done.py", "train.py"]


def test_cli_in_place(workdir: Path) -> None:
    assert run("convert", "train.py", "-i").exit_code == 0
    assert (workdir / "train.py").read_bytes() == (CONVERT / "mnist_style.out.py").read_bytes()


def test_cli_project_folder(workdir: Path) -> None:
    src = workdir / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "train.py").write_bytes((CONVERT / "trainer_class.in.py").read_bytes())
    (src / "utils.py").write_bytes((CONVERT / "tensor_utils.noop.py").read_bytes())
    (src / "README.txt").write_text("notes\n")
    result = run("convert", "proj", "-o", "out")
    assert result.exit_code == 0, result.output
    out = workdir / "out"
    assert (out / "pkg" / "train.py").read_bytes() == \
        (CONVERT / "trainer_class.out.py").read_bytes()
    assert (out / "utils.py").read_bytes() == (src / "utils.py").read_bytes()
    assert (out / "README.txt").read_text() == "notes\n"
    assert "1 of 2 Python file(s) converted" in result.output


@pytest.mark.parametrize("args, message", [
    (["convert", "missing.py"], "missing.py: no such file"),
    (["convert", "train.py", "-o", "train.py"], "the output is the input"),
    (["convert", "train.py", "-o", "no/such/dir/x.py"], "output folder does not exist"),
    (["convert", "train.py", "--diff", "--check"], "choose one of"),
], ids=["missing", "output-is-input", "no-output-dir", "two-modes"])
def test_cli_bad_input_one_line_exit_2(workdir: Path, args, message) -> None:
    before = sorted(p.name for p in workdir.iterdir())
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in workdir.iterdir()) == before


@pytest.mark.parametrize("content, where", [
    (b"import torch\ndef f(:\n    pass\n", "bad.py:2:7: syntax error"),
    (b"import torch\n\x00\x01binary", "bad.py:2:1: cannot read as Python source"),
    (b"import torch\nx = '\xff\xfe'\n", "bad.py:2"),
], ids=["syntax", "binary", "bad-encoding"])
def test_cli_unparsable_input_writes_nothing(workdir: Path, content: bytes, where: str) -> None:
    (workdir / "bad.py").write_bytes(content)
    result = run("convert", "bad.py", "-o", "bad_dist.py")
    assert result.exit_code == 2
    assert where in result.output, result.output
    assert not (workdir / "bad_dist.py").exists()
    assert (workdir / "bad.py").read_bytes() == content


def test_cli_never_imports_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from distify.cli import main\n"
            "main(['convert', sys.argv[1], '--diff'])\n")
    proc = subprocess.run([sys.executable, "-c", code, str(CONVERT / "mnist_style.in.py")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "distify.backward(loss)" in proc.stdout


def test_cli_standalone_copies_the_runtime_beside_the_output(workdir: Path) -> None:
    pytest.importorskip("torch")
    result = run("convert", "train.py", "-o", "out.py", "--standalone")
    assert result.exit_code == 0, result.output
    assert "import distify_runtime as distify\n" in (workdir / "out.py").read_text()
    assert (workdir / "distify_runtime" / "__init__.py").is_file()
    assert not list(workdir.glob(".distify_runtime*"))
    # the copy is what runs: the script works with distify itself hidden
    code = ("import sys, runpy; sys.modules['distify'] = None; "
            "sys.argv = ['out.py', '--epochs', '1']; runpy.run_path('out.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=workdir, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Test set: Average loss" in proc.stdout
