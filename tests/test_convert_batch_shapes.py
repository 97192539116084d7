"""Batch-size-coupled shapes (issue 11, item 4): ``images.reshape(batch_size, -1)``,
``torch.ones(batch_size, 1)`` labels, ``torch.randn(batch_size, nz)`` noise in a loop over a
DataLoader become the batch's own size where that provably is the same on one process, and are
reported where it is not.

- single rewrites, their no-op neighbours, and the reports, on small scripts;
- golden files: ``tests/fixtures/batch_shapes/NAME.in.py`` converts to ``NAME.out.py`` exactly
  (``DISTIFY_UPDATE_GOLDEN=1`` rewrites them; review the diff), and converting that again
  changes nothing;
- end to end, both fixtures (an MNIST MLP in the pytorch-tutorial style, a tiny GAN): converted
  here and run; at world size 1 exactly the original, on 2 processes (torchrun, Gloo) the job
  ends with bit-identical replicas and the same evaluation as one process over the same
  weights, where the script with the configured batch size left in stops with a shape error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from tests.helpers import (
    FIXTURES,
    REPO,
    clean_env,
    compare_state,
    flatten,
    result_line,
    run_python,
    run_torchrun,
)

pytestmark = pytest.mark.pool

SHAPES = FIXTURES / "batch_shapes"
GOLDEN = sorted(SHAPES.glob("*.in.py"))

HEADER = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
model = torch.nn.Linear(64, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def _convert(body: str, header: str = HEADER):
    result = convert_source((header + body).encode())
    return result, result.output.decode()


def _batch_notes(result) -> list:
    return [note for note in result.notes if note.kind == "batch-size"]


# ------------------------------------------------------------------ rewrites


@pytest.mark.parametrize("body, line", [
    pytest.param("for images, labels in loader:\n"
                 "    images = images.reshape(batch_size, -1)\n",
                 "    images = images.reshape(images.size(0), -1)", id="reshape-tutorial"),
    pytest.param("for i, (x, y) in enumerate(loader):\n"
                 "    x = x.float()\n"
                 "    real = torch.ones(batch_size, 1)\n",
                 "    real = torch.ones(x.size(0), 1)", id="gan-labels-enumerate"),
    pytest.param("for i, (x, y) in enumerate(loader, 0):\n"
                 "    x = x.float()\n"
                 "    label = torch.full((batch_size,), 1.0, dtype=torch.float)\n",
                 "    label = torch.full((x.size(0),), 1.0, dtype=torch.float)", id="full-tuple"),
    pytest.param("for x, _ in loader:\n"
                 "    flat = x.view(batch_size, -1)\n"
                 "    z = torch.randn(batch_size, 8, 1, 1)\n",
                 "    z = torch.randn(x.size(0), 8, 1, 1)", id="view-then-noise"),
    pytest.param("for x, _ in loader:\n"
                 "    x = x.cpu()\n"
                 "    z = torch.randn(size=(batch_size, 8))\n",
                 "    z = torch.randn(size=(x.size(0), 8))", id="size-keyword"),
    pytest.param("for x, y in loader:\n"
                 "    x = x.float()\n"
                 "    hidden = model.init_hidden(batch_size)\n",
                 "    hidden = model.init_hidden(x.size(0))", id="init-hidden"),
    pytest.param("for data in loader:\n"
                 "    inputs, labels = data\n"
                 "    inputs = inputs.float()\n"
                 "    zeros = torch.zeros(batch_size, 3)\n",
                 "    zeros = torch.zeros(inputs.size(0), 3)", id="unpacked-batch"),
    pytest.param("for i, data in enumerate(loader):\n"
                 "    real = data[0].float()\n"
                 "    label = torch.ones(batch_size)\n",
                 "    label = torch.ones(real.size(0))", id="indexed-batch"),
    pytest.param("for batch in loader:\n"
                 "    image = batch['image'].float()\n"
                 "    noise = torch.rand(batch_size, 4)\n",
                 "    noise = torch.rand(image.size(0), 4)", id="dict-batch"),
    pytest.param("from tqdm import tqdm\nfor x, y in tqdm(loader):\n"
                 "    x = x.view(batch_size, 1, 8, 8)\n",
                 "    x = x.view(x.size(0), 1, 8, 8)", id="tqdm"),
    pytest.param("from torch.autograd import Variable\n"
                 "for imgs, _ in loader:\n"
                 "    real = Variable(imgs.float())\n"
                 "    valid = torch.ones(batch_size, 1)\n",
                 "    valid = torch.ones(imgs.size(0), 1)", id="variable"),
    pytest.param("for images, _ in loader:\n"
                 "    images = images.reshape(batch_size, -1).float()\n"
                 "    labels = torch.ones(batch_size, 1)\n",
                 "    labels = torch.ones(images.size(0), 1)", id="still-the-batch-after-reshape"),
    pytest.param("def train():\n"
                 "    for x, y in loader:\n"
                 "        x = x.view(batch_size, -1)\n",
                 "        x = x.view(x.size(0), -1)", id="global-loader-in-a-function"),
])
def test_rewrites(body: str, line: str) -> None:
    result, output = _convert(body)
    assert line in output.splitlines(), output
    assert "batch_size" not in output[output.index(body.splitlines()[0]):], output
    assert [c for c in result.changes if c.kind == "batch-size"]
    assert not _batch_notes(result)


@pytest.mark.parametrize("header, body, line", [
    pytest.param("import torch\nfrom torch.utils.data import DataLoader\n\n\n"
                 "def main(args):\n"
                 "    loader = DataLoader(ds, batch_size=args.batch_size)\n"
                 "    for x, y in loader:\n",
                 "        x = x.view(args.batch_size, -1)\n",
                 "        x = x.view(x.size(0), -1)", id="args-attribute"),
    pytest.param("import torch\nimport torch.utils.data as data\nBATCH_SIZE = 64\n"
                 "for x, y in data.DataLoader(ds, BATCH_SIZE):\n",
                 "    x = x.view(BATCH_SIZE, 1, 28, 28)\n",
                 "    x = x.view(x.size(0), 1, 28, 28)", id="positional-constant"),
    pytest.param("import numpy as np\nimport torch\nfrom torch.utils.data import DataLoader\n"
                 "class Trainer:\n    def fit(self):\n"
                 "        self.loader = DataLoader(ds, batch_size=self.batch_size)\n"
                 "        for x, y in self.loader:\n            x = x.cpu()\n",
                 "            z = np.random.normal(0, 1, (self.batch_size, 8))\n",
                 "            z = np.random.normal(0, 1, (x.size(0), 8))", id="numpy-noise"),
    pytest.param("import torch\nfrom torch.utils.data import DataLoader\n"
                 "class Trainer:\n    def __init__(self, ds, batch_size):\n"
                 "        self.batch_size = batch_size\n"
                 "        self.loader = DataLoader(ds, batch_size=self.batch_size)\n\n"
                 "    def fit(self):\n        for x, y in self.loader:\n",
                 "            x = x.view(self.batch_size, -1)\n",
                 "            x = x.view(x.size(0), -1)", id="trainer-class"),
])
def test_rewrites_with_other_loaders(header: str, body: str, line: str) -> None:
    result, output = _convert(body, header)
    assert line in output.splitlines(), output
    assert not _batch_notes(result)


@pytest.mark.parametrize("body, line", [
    pytest.param("for x, labels in loader:\n"
                 "    out = model(x)\n"
                 "    for i in range(batch_size):\n"
                 "        print(out[i].argmax().item(), labels[i].item())\n",
                 "    for i in range(len(labels)):", id="per-sample-loop"),
    pytest.param("for x, y in loader:\n"
                 "    loss = 0\n"
                 "    for j in range(batch_size):\n"
                 "        loss = loss + model(x[j:j + 1]).sum()\n",
                 "    for j in range(len(x)):", id="slice-from-the-index"),
])
def test_a_loop_over_the_batch_uses_its_length(body: str, line: str) -> None:
    result, output = _convert(body)
    assert line in output.splitlines(), output
    [change] = [c for c in result.changes if c.kind == "batch-size"]
    assert "this loop indexes the batch" in change.message
    assert not _batch_notes(result)


@pytest.mark.parametrize("body", [
    pytest.param("for x, labels in loader:\n"
                 "    for i in range(batch_size):\n"
                 "        kept.append(i)\n", id="the-index-never-indexes-the-batch"),
    pytest.param("for x, labels in loader:\n"
                 "    for i in range(4):\n"
                 "        kept.append(labels[i])\n", id="a-literal-that-is-not-the-batch-size"),
    pytest.param("for x, labels in loader:\n"
                 "    for i in range(batch_size):\n"
                 "        labels = labels.flip(0)\n"
                 "        kept.append(labels[i])\n", id="the-batch-rebound-in-the-loop"),
])
def test_loops_not_tied_to_the_batch_are_left_alone(body: str) -> None:
    result, output = _convert(body)
    assert body in output
    assert not [c for c in result.changes if c.kind == "batch-size"]
    assert not _batch_notes(result)


def test_a_literal_batch_size_in_a_loop_over_the_batch_is_the_loaders() -> None:
    header = HEADER.replace("batch_size=batch_size", "batch_size=4")
    result, output = _convert("for x, labels in loader:\n    for i in range(4):\n"
                              "        kept.append(labels[i])\n", header)
    assert "    for i in range(len(labels)):" in output.splitlines()


def test_an_unprovable_loop_over_the_batch_is_reported() -> None:
    result, output = _convert("def train(loader):\n    for x, labels in loader:\n"
                              "        for i in range(batch_size):\n"
                              "            kept.append(labels[i])\n")
    assert "range(batch_size)" in output
    [note] = _batch_notes(result)
    assert "use `range(len(labels))`" in note.message
    assert "cannot tell which DataLoader" in note.message
    assert "range(batch_size)" in output.splitlines()[note.line - 1]


@pytest.mark.parametrize("size", ["batch_size", "args.batch_size", "self.batch_size"])
def test_a_parameter_sized_by_the_batch_size_is_reported(size: str) -> None:
    result, output = _convert("class Net(torch.nn.Module):\n"
                              "    def __init__(self, d=8):\n"
                              "        super().__init__()\n"
                              "        self.token = torch.nn.Parameter("
                              f"torch.randn({size}, 1, d))\n"
                              "\n    def forward(self, x):\n"
                              "        return torch.cat([self.token, x], dim=1)\n")
    [note] = _batch_notes(result)
    assert note.message.startswith(f"`{size}` sizes this parameter: a parameter cannot follow "
                                   "the batch")
    assert "drop_last=True" in note.message
    assert "nn.Parameter(" in output.splitlines()[note.line - 1]


@pytest.mark.parametrize("call", ["torch.nn.Parameter(torch.randn(1, 1, d))",
                                  "torch.nn.Parameter(torch.zeros(d, batch_size))",
                                  "torch.nn.Parameter(torch.randn(64, 1, d))"])
def test_parameters_not_led_by_the_batch_size_are_not_reported(call: str) -> None:
    result, _ = _convert(f"d = 8\ntoken = {call}\n")
    assert not _batch_notes(result)


def test_rewrite_is_reported_with_its_line() -> None:
    result, output = _convert("for images, labels in loader:\n"
                              "    images = images.reshape(batch_size, -1)\n")
    [change] = [c for c in result.changes if c.kind == "batch-size"]
    assert "images.size(0)" in output.splitlines()[change.line - 1]
    assert change.message.startswith("`batch_size` → `images.size(0)`: the last batch")


# ------------------------------------------------------------------ left alone


@pytest.mark.parametrize("body", [
    pytest.param("hidden = model.init_hidden(batch_size)\n"
                 "buffer = torch.zeros(batch_size, 10)\n", id="outside-any-loop"),
    pytest.param("for epoch in range(3):\n    noise = torch.randn(batch_size, 8)\n"
                 "    for x, y in loader:\n        pass\n", id="loop-not-over-a-loader"),
    pytest.param("for x, y in loader:\n    x = x.float()\n    loss = model(x).sum() / batch_size\n"
                 "    seen = list(range(batch_size))\n", id="not-a-shape"),
    pytest.param("for x, y in loader:\n    real = torch.ones(x.size(0), 1)\n"
                 "    x = x.view(len(x), -1)\n", id="already-the-batch-size"),
    pytest.param("for x, y in loader:\n    batch_size = x.size(0)\n"
                 "    real = torch.ones(batch_size, 1)\n", id="batch-size-rebound-in-the-loop"),
    pytest.param("for x, y in loader:\n    x = x.float()\n    z = torch.randn(64, 8)\n",
                 id="a-literal"),
    pytest.param("for x, y in loader:\n    x = x.float()\n"
                 "    noise = lambda: torch.randn(batch_size, 8)\n"
                 "    def sample():\n        return torch.randn(batch_size, 8)\n",
                 id="run-later"),
])
def test_no_op_neighbours(body: str) -> None:
    result, output = _convert(body)
    assert body in output
    assert not [c for c in result.changes if c.kind == "batch-size"]
    assert not _batch_notes(result)


# ------------------------------------------------------------------ reported


@pytest.mark.parametrize("header, body, why", [
    pytest.param(HEADER, "def train(model, train_loader):\n"
                 "    for x, y in train_loader:\n        x = x.view(batch_size, -1)\n",
                 "cannot tell which DataLoader", id="loader-parameter"),
    pytest.param(HEADER, "for x, y in loader:\n    x = x.view(batch_size * 2, -1)\n",
                 "computed from it", id="arithmetic"),
    pytest.param(HEADER, "for x, y in loader:\n    x = x.view(-1, batch_size, 4)\n",
                 "not the leading dimension", id="another-dimension"),
    pytest.param(HEADER, "for x, y in loader:\n    x = x.repeat(batch_size, 1)\n",
                 "not the leading dimension", id="repeat-count"),
    pytest.param(HEADER, "for batch in loader:\n    z = torch.randn(batch_size, 8)\n",
                 "which tensor in this loop is the batch", id="no-batch-tensor"),
    pytest.param(HEADER, "for x, y in loader:\n    x = x.reshape(-1, 64)\n"
                 "    real = torch.ones(batch_size, 1)\n",
                 "which tensor in this loop is the batch", id="batch-tensor-rebound"),
    pytest.param("import torch\nfrom torch.utils.data import DataLoader\n"
                 "loader = DataLoader(ds, batch_size=batch_size, collate_fn=pad)\n",
                 "for x, y in loader:\n    x = x.view(batch_size, -1)\n",
                 "collate_fn", id="custom-collate"),
    pytest.param(HEADER, "for (x, y), (u, v) in zip(loader, loader):\n"
                 "    x = x.view(batch_size, -1)\n", "cannot tell which DataLoader", id="zip"),
    pytest.param(HEADER, "def train(batch_size):\n    for x, y in loader:\n"
                 "        x = x.view(batch_size, -1)\n",
                 "`batch_size` here may not be", id="shadowing-parameter"),
    pytest.param("import torch\nfrom torch.utils.data import DataLoader\n"
                 "class Trainer:\n    def __init__(self, ds, batch_size):\n"
                 "        self.loader = DataLoader(ds, batch_size=batch_size)\n\n"
                 "    def fit(self):\n",
                 "        for x, y in self.loader:\n            x = x.view(batch_size, -1)\n",
                 "`batch_size` here may not be", id="another-methods-parameter"),
    pytest.param(HEADER, "for x, y in loader:\n    x = x.float()\n"
                 "    z = torch.randn(args.batch_size, 8)\n",
                 "DataLoader has batch_size=batch_size", id="another-batch-size"),
])
def test_unprovable_shapes_are_reported(header: str, body: str, why: str) -> None:
    result, output = _convert(body, header)
    assert body in output  # left as written
    [note] = _batch_notes(result)
    assert "the last batch on a process can be smaller" in note.message
    assert why in note.message
    assert "batch_size" in output.splitlines()[note.line - 1]


# ------------------------------------------------------------------ golden files


def _name(path: Path) -> str:
    return path.name.split(".")[0]


@pytest.mark.parametrize("source", GOLDEN, ids=_name)
def test_golden_output(source: Path) -> None:
    expected = source.with_name(source.name.replace(".in.py", ".out.py"))
    result = convert_source(source.read_bytes(), str(source))
    if os.environ.get("DISTIFY_UPDATE_GOLDEN"):
        expected.write_bytes(result.output)
    assert result.status == "converted"
    assert result.output.decode() == expected.read_text()
    assert not _batch_notes(result)


@pytest.mark.parametrize("source", GOLDEN, ids=_name)
def test_converting_twice_changes_nothing(source: Path) -> None:
    once = source.with_name(source.name.replace(".in.py", ".out.py")).read_bytes()
    again = convert_source(once, "converted.py")
    assert again.output == once


# ------------------------------------------------------------------ end to end

# fixture → checkpoints it writes
RUNS = {"mnist_mlp": ("model.ckpt",), "gan": ("G.ckpt", "D.ckpt")}


def _env() -> dict:
    return clean_env(PYTHONPATH=str(REPO))


def _folder(tmp: Path, variant: str, code: bytes) -> Path:
    folder = tmp / variant
    folder.mkdir()
    (folder / "train.py").write_bytes(code)
    return folder


def _checkpoints(folder: Path, name: str) -> dict:
    torch = pytest.importorskip("torch")
    return {ckpt: flatten(torch.load(folder / ckpt)) for ckpt in RUNS[name]}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_converted_runs_alike_on_one_and_two_processes(name: str, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    source = (SHAPES / f"{name}.in.py").read_bytes()
    converted = convert_source(source).output
    assert b".size(0)" in converted

    original = _folder(tmp_path, "original", source)
    want = run_python(original / "train.py", cwd=original, env=_env())
    one = _folder(tmp_path, "one", converted)
    got = run_python(one / "train.py", cwd=one, env=_env())
    assert got.stdout == want.stdout  # world size 1: exactly the original
    for ckpt, state in _checkpoints(original, name).items():
        compare_state(_checkpoints(one, name)[ckpt], state, exact=True)

    two = _folder(tmp_path, "two", converted)
    proc = run_torchrun(two / "train.py", nproc=2, cwd=two, env=_env(), replicas=True,
                        distinct_data=True)
    single, double = result_line(want.stdout), result_line(proc.stdout)
    # evaluated before training, over the same weights: the single-process metric
    total = {"mnist_mlp": "total", "gan": "seen"}[name]
    metric = {"mnist_mlp": "loss", "gan": "D(x)"}[name]
    assert double["before"][total] == single["before"][total] == double["after"][total]
    assert double["before"].get("correct") == single["before"].get("correct")
    assert double["before"][metric] == pytest.approx(single["before"][metric], rel=1e-6)


def test_the_configured_batch_size_left_in_breaks_two_processes(tmp_path: Path) -> None:
    """What the rewrite is for: the same conversion with ``batch_size`` left in the shapes
    stops on 2 processes, at the first short batch."""
    pytest.importorskip("torch")
    converted = convert_source((SHAPES / "mnist_mlp.in.py").read_bytes()).output
    unfixed = converted.replace(b"images.size(0)", b"batch_size")
    folder = _folder(tmp_path, "unfixed", unfixed)
    proc = run_torchrun(folder / "train.py", nproc=2, cwd=folder, env=_env(), check=False,
                        replicas=False)
    assert proc.returncode != 0
    assert "shapes cannot be multiplied" in proc.stderr
