"""Hardening: `distify convert` (and `distify check`) on any valid Python and on bad input.

Three parts:

1. **Properties** (hypothesis): over programs generated from Python's grammar (hypothesmith) and
   over realistic training scripts composed from fragments (torch imported under aliases, model
   classes, DataLoader/optimizer/scheduler built at module level, in functions and in methods,
   training loops with ``loss.backward()``, evaluation loops under ``torch.no_grad()``, saves,
   side effects): conversion raises nothing but ``UserError``, its output parses and compiles,
   converting it again changes nothing, the report's lines exist, line endings/BOM/encoding and
   comments survive, and files without training code come out byte-identical.
2. **Regressions**: each bug the properties or a review found, as its minimal reproduction
   (a new one can be pinned with a ``strict`` xfail until it is fixed).
3. **Bad and unusual input through the CLI**: one line, non-zero exit, input untouched, nothing
   (not even a temporary file) left behind.

The properties run derandomized with few examples so the file stays fast and deterministic in CI.
For a real fuzzing session run, e.g.::

    DISTIFY_FUZZ_EXAMPLES=2000 pytest tests/test_hardening.py -k property -q
"""

from __future__ import annotations

import ast
import collections
import errno
import functools
import importlib
import importlib.util
import io
import os
import re
import stat
import subprocess
import sys
import tokenize
from pathlib import Path

import hypothesmith
import libcst
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from distify.cli import main
from distify.convert.engine import convert_source
from distify.errors import UserError
from tests.helpers import FIXTURES, REPO, clean_env

# ============================================================================ settings
#: generated nonsense like ``1()`` compiles with a SyntaxWarning; that is the program, not us
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

_FUZZ = int(os.environ.get("DISTIFY_FUZZ_EXAMPLES", "0"))


def _settings(examples: int) -> settings:
    """Few derandomized examples in CI; many random ones under DISTIFY_FUZZ_EXAMPLES."""
    return settings(max_examples=_FUZZ or examples, deadline=None, derandomize=not _FUZZ,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                           HealthCheck.data_too_large])


_TORCH_ROOTS = {"torch", "torchvision", "timm", "transformers"}


# ============================================================================ checks
def _compiles(source: bytes) -> bool:
    try:
        compile(source, "<input>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _parses(source: bytes) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _convert(source: bytes):
    """Convert; a ``UserError`` is an accepted outcome (None), anything else fails the test."""
    try:
        return convert_source(source, "gen.py")
    except UserError as err:
        text = str(err)
        assert "\n" not in text, f"a UserError must be one line: {text!r}"
        assert text.startswith("gen.py"), f"a UserError names the file: {text!r}"
        return None


def _assert_sound(source: bytes, result) -> None:
    """The output is valid, stable under a second conversion, and the report points into it."""
    out = result.output
    assert isinstance(out, bytes)
    ast.parse(out)
    libcst.parse_module(out)
    if _compiles(source):
        assert _compiles(out), "the input compiles but the output does not:\n" + out.decode(
            "utf-8", "replace")
    assert result.changed == (out != source)
    if result.status != "converted":
        assert out == source, f"status {result.status!r} but the output differs"
    n_lines = len(out.splitlines()) or 1
    for item in (*result.changes, *result.notes):
        assert 1 <= item.line <= n_lines, (item, n_lines)
    again = convert_source(out, "gen_dist.py")
    assert again.output == out, "converting the output again changed it"
    assert not again.changes


def _imports_torch(source: bytes | str) -> bool:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        if any(name.split(".")[0] in _TORCH_ROOTS for name in names):
            return True
    return False


def _comments(source: bytes) -> list[str]:
    """Every comment token, in order (tokenize honours the coding cookie and BOM)."""
    return [tok.string for tok in tokenize.tokenize(io.BytesIO(source).readline)
            if tok.type == tokenize.COMMENT]


# ============================================================================ strategies
#: arbitrary programs from Python's grammar; most are nonsense, all must be handled
python_programs = hypothesmith.from_grammar() | hypothesmith.from_node()


def _lines(*items):
    """Fragments are lists of (depth, text); a bare string is depth 0."""
    return [item if isinstance(item, tuple) else (0, item) for item in items]


def _indent(lines, by: int = 1):
    return [(depth + by, text) for depth, text in lines]


def _aligned_call(prefix: str, args: list[str], depth: int = 0):
    """``prefix(a,\\n<aligned>b)``: continuation lines aligned with the opening parenthesis."""
    col = len(prefix)
    out = [(depth, prefix + args[0] + ("," if len(args) > 1 else ")"))]
    for i, arg in enumerate(args[1:], 1):
        out.append((depth, " " * col + arg + ("," if i < len(args) - 1 else ")")))
    return out


@st.composite
def _names(draw) -> dict:
    """How this script spells torch and friends, with the import lines that bind them."""
    imports: list[str] = []
    torch_alias = draw(st.sampled_from(["torch", "t", "th"]))
    imports.append("import torch" if torch_alias == "torch" else f"import torch as {torch_alias}")
    T = torch_alias
    nn = draw(st.sampled_from(["nn", "torch_nn", None]))
    if nn == "nn":
        imports.append(draw(st.sampled_from(["import torch.nn as nn", "from torch import nn"])))
    elif nn == "torch_nn":
        imports.append("import torch.nn as torch_nn")
    else:
        nn = f"{T}.nn"
    imports.append("import torch.nn.functional as F")
    opt_style = draw(st.integers(0, 3))
    if opt_style == 0:
        OPT = f"{T}.optim.SGD"
    elif opt_style == 1:
        imports.append(draw(st.sampled_from(["import torch.optim as optim",
                                             "from torch import optim"])))
        OPT = draw(st.sampled_from(["optim.Adam", "optim.SGD", "optim.AdamW"]))
    elif opt_style == 2:
        imports.append("from torch.optim import AdamW")
        OPT = "AdamW"
    else:
        imports.append("from torch.optim import SGD as Opt")
        OPT = "Opt"
    dl_style = draw(st.integers(0, 3))
    if dl_style == 0:
        imports.append("from torch.utils.data import DataLoader, TensorDataset")
        DL = "DataLoader"
    elif dl_style == 1:
        imports.append("from torch.utils.data import DataLoader as DL, TensorDataset")
        DL = "DL"
    elif dl_style == 2:
        imports.append("from torch.utils.data import TensorDataset")
        DL = f"{T}.utils.data.DataLoader"
    else:
        imports.append("from torch.utils import data")
        imports.append("from torch.utils.data import TensorDataset")
        DL = "data.DataLoader"
    if draw(st.booleans()):
        imports.append("from torch.optim.lr_scheduler import StepLR")
        SCHED = "StepLR"
    else:
        SCHED = f"{T}.optim.lr_scheduler.StepLR"
    return {"T": T, "nn": nn, "OPT": OPT, "DL": DL, "SCHED": SCHED, "imports": imports}


def _device(draw, n, p):
    T = n["T"]
    return draw(st.sampled_from([
        _lines(f'device = {T}.device("cuda" if {T}.cuda.is_available() else "cpu")'),
        _lines(f'device = "cuda:0" if {T}.cuda.is_available() else "cpu"'),
        _lines(f'device = {T}.device("cuda:0")'),
        _lines("device = 'cpu'"),
        _lines(f"if {T}.cuda.is_available():", (1, f"{T}.cuda.set_device(0)"),
               "device = 'cuda'"),
        _lines(f"{T}.cuda.set_device(0)", f"device = {T}.device('cuda')"),
    ]))


def _model(draw, n, p):
    nn = n["nn"]
    build = draw(st.sampled_from([
        "Net()", "Net().to(device)", "Net().cuda()", 'Net().to("cuda")',
        f"{nn}.Sequential({nn}.Linear(4, 8), {nn}.ReLU(), {nn}.Linear(8, 2))",
    ]))
    lines = _lines(f"{p}model = {build}")
    if draw(st.booleans()):
        lines += _lines(f"{p}model = {nn}.DataParallel({p}model)")
    return lines


def _loaders(draw, n, p):
    DL = n["DL"]
    style = draw(st.integers(0, 4))
    if style == 0:
        train = _lines(f"{p}train_loader = {DL}(make_data(64), batch_size=8, shuffle=True)")
    elif style == 1:
        train = _lines(f"{p}train_loader = {DL}(make_data(64), 8, True)")
    elif style == 2:
        train = _lines('train_kwargs = {"batch_size": 8, "shuffle": True}',
                       f"{p}train_loader = {DL}(make_data(64), **train_kwargs)")
    elif style == 3:
        train = _aligned_call(f"{p}train_loader = {DL}(",
                              ["make_data(64)", "batch_size=8,  # per process", "shuffle=True"])
    else:
        sampler = draw(st.sampled_from(["MySampler(64)",
                                        f"{n['T']}.utils.data.RandomSampler(ds)"]))
        train = _lines("ds = make_data(64)",
                       f"{p}train_loader = {DL}(ds, batch_size=8, sampler={sampler})")
    val = _lines(f"{p}val_loader = {DL}(make_data(37), batch_size=16)")
    return train + (val if draw(st.booleans()) else [])


def _optimizer(draw, n, p):
    OPT = n["OPT"]
    params = draw(st.sampled_from([
        f"{p}model.parameters()", f"list({p}model.parameters())",
        f'[{{"params": {p}model.parameters(), "lr": 0.1}}]',
        f"{p}model.parameters() if True else []",
    ]))
    if draw(st.booleans()):
        lines = _aligned_call(f"{p}optimizer = {OPT}(", [params, "lr=0.01"])
    else:
        lines = _lines(f"{p}optimizer = {OPT}({params}, lr=0.01)  # the optimizer")
    if draw(st.booleans()):
        lines += _lines(f"{p}scheduler = {n['SCHED']}({p}optimizer, step_size=1)")
    return lines


def _train_loop(draw, n, p):
    T = n["T"]
    style = draw(st.integers(0, 4))
    if style == 4:  # a one-line loop
        return _lines(f"for x, y in {p}train_loader: loss = F.mse_loss({p}model(x), y); "
                      f"loss.backward(); {p}optimizer.step()")
    header, has_i = draw(st.sampled_from([
        (f"for x, y in {p}train_loader:", False),
        (f"for i, (x, y) in enumerate({p}train_loader):", True),
        (f"for x, y in tqdm({p}train_loader):", False),
        ("for step in range(100):", False),  # not fed by a DataLoader
    ]))
    body = []
    if header.startswith("for step"):
        body += _lines(f"x, y = {T}.randn(8, 4), {T}.randn(8, 2)")
    elif draw(st.booleans()):
        body += _lines("x, y = x.to(device), y.to(device)")
    body += _lines(f"{p}optimizer.zero_grad()", f"loss = F.mse_loss({p}model(x), y)")
    backward = draw(st.sampled_from(["loss.backward()", "(loss / 2).backward()",
                                     "loss.backward(retain_graph=False)",
                                     "scaler.scale(loss).backward()"]))
    if backward.startswith("scaler"):
        body += _lines(backward, f"scaler.step({p}optimizer)", "scaler.update()")
    else:
        body += _lines(backward, f"{p}optimizer.step()")
    if has_i and draw(st.booleans()):
        body += _lines("if i % 10 == 0:", (1, 'print(f"step {i} loss {loss.item():.4f}")'))
    if style == 1:  # a data-dependent stop: decided on the mean, or whole
        body += _lines(draw(st.sampled_from(["if loss.item() < 1e-3:",
                                             "if loss.item() < 1e-3 and epoch > 0:"])),
                       (1, "break"))
    if style == 2 and has_i:
        body = [(d, t) for d, t in body if "zero_grad" not in t]
        body += _lines("if (i + 1) % 4 == 0:", (1, f"{p}optimizer.zero_grad()"))
    lines = _lines("for epoch in range(2):", (1, f"{p}model.train()"), (1, header))
    lines += _indent(body, 2)
    if draw(st.booleans()):
        lines += _lines((1, f"{p}scheduler.step()"))
    if draw(st.booleans()):
        lines += _lines((1, 'print("epoch", epoch, "loss", loss.item())'))
    if "scaler" in backward:
        lines = _lines(f"scaler = {T}.cuda.amp.GradScaler()") + lines
    return lines


def _eval_loop(draw, n, p):
    T = n["T"]
    ctx = draw(st.sampled_from([f"{T}.no_grad()", f"{T}.inference_mode()"]))
    init = draw(st.sampled_from([
        _lines("correct = 0", "total_loss = 0.0", "seen = 0"),
        _lines("correct, seen = 0, 0", "total_loss = 0.0"),
    ]))
    body = _lines(f"out = {p}model(x)", "correct += (out.argmax(1) == y).sum().item()",
                  'total_loss += F.mse_loss(out, y, reduction="sum").item()',
                  "seen += x.size(0)")
    if draw(st.booleans()):
        init += _lines("preds = []")
        body += _lines("preds.append(out)")
    lines = _lines(f"{p}model.eval()") + init + _lines(f"with {ctx}:",
                                                        (1, f"for x, y in {p}val_loader:"))
    lines += _indent(body, 2)
    lines += _lines('print(f"accuracy {correct / max(seen, 1):.3f}", total_loss)')
    return lines


def _side_effects(draw, n, p):
    T = n["T"]
    return draw(st.sampled_from([
        _lines(f'{T}.save({p}model.state_dict(), "model.pt")'),
        _lines(f'{T}.save({{"model": {p}model.state_dict(), "opt": {p}optimizer.state_dict()}},',
               '           "ckpt.pt")'),
        _lines(f'state = {T}.load("model.pt", map_location="cpu")',
               f"{p}model.load_state_dict(state)"),
        _lines('with open("metrics.json", "w") as fh:', (1, 'json.dump({"acc": 1.0}, fh)')),
        _lines('os.makedirs("runs")', 'writer = SummaryWriter("runs")',
               'writer.add_scalar("loss", 1.0, 0)'),
        _lines("logging.basicConfig(level=logging.INFO)", 'logging.info("started")'),
        _lines('run_name = time.strftime("%Y%m%d-%H%M%S")', 'print("run", run_name)'),
        _lines('train_set = torchvision.datasets.MNIST("data", train=True, download=True)'),
        _lines('print("done", flush=True)'),
    ]))


_FRAGMENTS = [_device, _model, _loaders, _optimizer, _train_loop, _eval_loop, _side_effects]


@st.composite
def training_scripts(draw) -> tuple[bytes, list[str]]:
    """A realistic single-GPU training script; returns its bytes and its marker comments."""
    n = draw(_names())
    # side-effect fragments use these; unused imports are harmless
    extra = ["import json", "import logging", "import os", "import time", "import torchvision",
             "from torch.utils.tensorboard import SummaryWriter", "from tqdm import tqdm"]
    imports = draw(st.permutations(n["imports"] + extra))
    head: list[tuple[int, str]] = []
    if draw(st.booleans()):
        head += _lines('"""Train a small model (one GPU)."""')
        if draw(st.booleans()):
            head += _lines("from __future__ import annotations")
    head += _lines(*imports, "")
    nn, T = n["nn"], n["T"]
    head += _lines("", f"class Net({nn}.Module):", (1, "def __init__(self):"),
                   (2, "super().__init__()"), (2, f"self.fc = {nn}.Linear(4, 2)"), (1, ""),
                   (1, "def forward(self, x):"), (2, "return self.fc(x)"), "", "",
                   "def make_data(k):",
                   (1, f"return TensorDataset({T}.randn(k, 4), {T}.randn(k, 2))"), "")
    markers: list[str] = []
    body: list[tuple[int, str]] = []
    groups = draw(st.lists(st.tuples(
        st.sampled_from(["module", "function", "method", "main"]),
        st.lists(st.sampled_from(_FRAGMENTS), min_size=1, max_size=5)), min_size=1, max_size=4))
    for k, (container, fragments) in enumerate(groups):
        p = "self." if container == "method" else ""
        inner: list[tuple[int, str]] = []
        for j, fragment in enumerate(fragments):
            lines = fragment(draw, n, p)
            if fragment is not _device and draw(st.booleans()):
                marker = f"# keep {k}.{j}: a comment distify must not touch"
                markers.append(marker)
                inner += _lines(marker)
            inner += lines
        if container == "function":
            body += _lines("", f"def run_{k}(model=None, train_loader=None, val_loader=None):")
            body += _indent(inner)
        elif container == "method":
            body += _lines("", f"class Trainer{k}:", (1, "def fit(self):"))
            body += _indent(inner, 2)
        elif container == "main":
            body += _lines("", 'if __name__ == "__main__":')
            body += _indent(inner)
        else:
            body += _lines("") + inner
    unit = draw(st.sampled_from(["    ", "  ", "\t"]))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    text = "".join((unit * depth + line if line else "") + "\n" for depth, line in head + body)
    text = text.replace("\n", eol)
    return text.encode("utf-8"), markers


@st.composite
def torch_utility_files(draw) -> bytes:
    """Files that import torch but hold no training code: models, tensor helpers, CPU devices,
    no-grad loops over plain lists. Nothing here is for distify to change."""
    n = draw(_names())
    T, nn = n["T"], n["nn"]
    pieces = draw(st.lists(st.sampled_from([
        [f"class Block({nn}.Module):", "    def __init__(self, width):",
         "        super().__init__()", f"        self.lin = {nn}.Linear(width, width)",
         "", "    def forward(self, x):", "        return F.gelu(self.lin(x)) + x"],
        ["def normalise(x, eps=1e-6):", "    # unit variance per row",
         "    return (x - x.mean(1, keepdim=True)) / (x.std(1, keepdim=True) + eps)"],
        [f"CPU = {T}.device('cpu')", f"x = {T}.zeros(3).to('cpu')",
         f"y = {T}.ones(3, dtype={T}.float64).to({T}.float32)"],
        # (a no-grad sum over a *parameter* is pinned by test_helper_sum_over_a_parameter...)
        [f"@{T}.no_grad()", "def total(n):", "    s = 0.0", "    for b in range(n):",
         "        s += b", "    return s"],
        ["def count_parameters(model):",
         "    return sum(p.numel() for p in model.parameters() if p.requires_grad)"],
        ["def init_weights(m):", f"    if isinstance(m, {nn}.Linear):",
         f"        {nn}.init.xavier_uniform_(m.weight)", "        m.bias.data.fill_(0.01)"],
        ["def collate(items):", (f"    return {T}.stack([i[0] for i in items]), "
                                 f"{T}.tensor([i[1] for i in items])")],
        ["# a comment only", "CONSTANT = 3  # trailing comment"],
        ["def grad_norm(params):", (f"    return {T}.norm({T}.stack([p.grad.norm() for p in "
                                    "params if p.grad is not None]))")],
    ]), min_size=1, max_size=6))
    imports = draw(st.permutations(n["imports"]))
    lines = ["'''Utilities.'''", *imports, ""]
    for piece in pieces:
        lines += ["", *piece, ""]
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    return eol.join(lines).encode() + eol.encode()


_DISTRIBUTED_MARKERS = [
    ("import torch.distributed as dist", "dist.init_process_group('nccl')"),
    ("from torch.nn.parallel import DistributedDataParallel as DDP", "model = DDP(model)"),
    ("from accelerate import Accelerator", "accelerator = Accelerator()"),
    ("import os", "local_rank = int(os.environ['LOCAL_RANK'])"),
    ("import distify.runtime as distify", "distify.print('already converted')"),
]


# ============================================================================ properties
@_settings(60)
@given(python_programs)
@example("from __future__ import annotations\nx = 1\n")
@example("")
def test_property_any_program_without_torch_is_left_byte_identical(src: str) -> None:
    data = src.encode("utf-8")
    assume(_parses(data) and not _imports_torch(data))
    result = _convert(data)
    assert result is not None, "valid Python without torch must not be rejected"
    assert result.output == data
    assert not result.changed and not result.changes


@_settings(60)
@given(python_programs, st.sampled_from(["import torch\n", "import torch as t\nprint(t)\n",
                                          "from torch.utils.data import DataLoader\n"]))
def test_property_any_program_with_torch_converts_or_says_why(src: str, prefix: str) -> None:
    """Arbitrary code behind a torch import goes down the full rewrite path."""
    data = (prefix + src).encode("utf-8")
    assume(_parses(data))
    result = _convert(data)
    if result is not None:
        _assert_sound(data, result)


@_settings(60)
@given(training_scripts())
def test_property_training_scripts_convert_soundly(script) -> None:
    data, markers = script
    result = convert_source(data, "gen.py")  # realistic, valid scripts: no error at all
    _assert_sound(data, result)
    assert result.status in ("converted", "unchanged")
    out = result.output
    if b"\r\n" in data:
        assert b"\n" not in out.replace(b"\r\n", b""), "CRLF file came out with bare LFs"
    out_comments = _comments(out)
    for marker in markers:  # comments are kept byte for byte, in order
        assert marker in out_comments
    assert [c for c in out_comments if c in markers] == markers
    head = data.split(b"\n", 1)[0]
    if head.startswith(b'"""'):
        assert out.startswith(head), "the module docstring must stay first"
    # the mechanical part is complete: no single-GPU idiom the generator uses survives
    rt = result.runtime_name
    previous = ""
    for line in out.decode("utf-8").splitlines():
        assert ".cuda()" not in line and "set_device(" not in line, line
        if re.search(rf"(?<!\b{rt})\.backward\(", line):
            assert "scaler.scale(" in line, line  # a script's own AMP is kept as written
        if re.search(r"\b(DataLoader|DL)\(", line):  # prepared, maybe broken after `prepare(`
            assert f"{rt}.prepare(" in line or previous.endswith(f"{rt}.prepare("), line
        previous = line


@_settings(30)
@given(training_scripts(), st.sampled_from(["bom", "latin-1"]))
def test_property_encoding_is_kept(script, encoding: str) -> None:
    data, _ = script
    if encoding == "bom":
        source = b"\xef\xbb\xbf" + data
    else:
        eol = b"\r\n" if b"\r\n" in data else b"\n"
        source = b"# -*- coding: latin-1 -*-" + eol + b"# caf\xe9 cr\xe8me" + eol + data
    result = convert_source(source, "gen.py")
    _assert_sound(source, result)
    out = result.output
    if encoding == "bom":
        assert out.startswith(b"\xef\xbb\xbf") and out.count(b"\xef\xbb\xbf") == 1
    else:
        assert out.startswith(source.split(b"import", 1)[0]), "cookie and Latin-1 comment kept"


@_settings(60)
@given(torch_utility_files())
def test_property_torch_files_without_training_code_are_byte_identical(data: bytes) -> None:
    result = convert_source(data, "utils.py")
    assert result.output == data, result.output.decode()
    assert not result.changes and result.status in ("unchanged", "no-torch")


@_settings(30)
@given(training_scripts(), st.sampled_from(_DISTRIBUTED_MARKERS))
def test_property_distributed_scripts_are_left_alone(script, marker) -> None:
    data, _ = script
    import_line, use_line = marker
    eol = "\r\n" if b"\r\n" in data else "\n"
    source = f"{import_line}{eol}".encode() + data + f"{use_line}{eol}".encode()
    result = convert_source(source, "dist.py")
    assert result.status == "already-distributed", result.reason
    assert result.output == source


# ---------------------------------------------------------------------------- distify check
def _lint_function():
    """The linter's entry point for a source string, when ``distify.lint`` provides one.

    ``distify check`` is written in parallel with these tests: until ``distify.lint`` exposes
    ``lint_text(text, path, check_all=...)`` the checker properties are skipped, not failed.
    """
    try:
        module = importlib.import_module("distify.lint")
    except ImportError:
        return None
    return getattr(module, "lint_text", None)


_LINT = _lint_function()
needs_lint = pytest.mark.skipif(_LINT is None, reason="distify.lint.lint_text not available yet")


def _assert_findings_sound(text: str, findings) -> None:
    n_lines = max(len(text.splitlines()), 1)
    for finding in findings:
        assert re.fullmatch(r"DST\d{3}", finding.code), finding
        assert 1 <= finding.line <= n_lines + 1, finding
        assert finding.col >= 1, finding
        assert "\n" not in finding.message, finding


@needs_lint
@_settings(40)
@given(python_programs, st.sampled_from(["", "import torch\nimport torch.distributed as dist\n"]))
def test_property_check_never_crashes_on_any_program(src: str, prefix: str) -> None:
    text = prefix + src
    assume(_parses(text.encode()))
    for check_all in (False, True):
        _assert_findings_sound(text, _LINT(text, "gen.py", check_all=check_all))


@needs_lint
@_settings(30)
@given(training_scripts())
def test_property_check_never_crashes_on_training_scripts_and_their_conversion(script) -> None:
    data, _ = script
    for source in (data, convert_source(data, "gen.py").output):
        text = source.decode("utf-8")
        _assert_findings_sound(text, _LINT(text, "gen.py", check_all=True))


@needs_lint
@pytest.mark.parametrize("text", ["import torch\ndef f(:\n", "import torch\nx = (\n"])
def test_check_reports_a_syntax_error_as_a_finding(text: str) -> None:
    findings = _LINT(text, "bad.py", check_all=True)
    assert [f.code for f in findings] == ["DST000"]


# ============================================================================ known bugs
# Each test states the expected behaviour for a bug that was found and fixed.
#: scripts run, original and converted, at world size 1 with no launcher (see ``ran``)
_RUN_CASES = {
    "model-and-optimizer-on-one-line":
        "import torch\nm = torch.nn.Linear(1, 1); opt = torch.optim.SGD(m.parameters(), lr=1)\n"
        "print('ok')\n",
    "except-as-distify":
        "import torch\ntry:\n    1 / 0\nexcept ZeroDivisionError as distify:\n    pass\n"
        "print('ok')\n",
    "case-distify": "import torch\nmatch 1:\n    case distify:\n        pass\nprint('ok')\n",
    "print-parameter":
        "import torch\ndef show(print):\n    print('via the parameter')\nshow(lambda *a: None)\n",
    "print-def": "import torch\ndef print(*args):\n    pass\nprint('never shown')\n",
}

_DRIVER = """\
import contextlib, io, json, runpy, sys
results = {}
for path in sys.argv[1:]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        error = None
    except BaseException as err:  # noqa: BLE001
        error = f"{type(err).__name__}: {err}"
    results[path] = [out.getvalue(), error]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, dict[str, list]]:
    """Every case in ``_RUN_CASES``, original and converted, run in one process (torch is
    imported once): ``{case: {"original": [stdout, error], "converted": [...]}}``."""
    import json

    folder = tmp_path_factory.mktemp("runs")
    paths = []
    for i, src in enumerate(_RUN_CASES.values()):
        for kind, data in (("original", src.encode()),
                           ("converted", convert_source(src.encode(), "c.py").output)):
            path = folder / f"case{i}_{kind}.py"
            path.write_bytes(data)
            paths.append(str(path))
    proc = subprocess.run([sys.executable, "-c", _DRIVER, *paths], cwd=folder, env=clean_env(),
                          capture_output=True, text=True, timeout=300, check=True)
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: {kind: results[str(folder / f"case{i}_{kind}.py")]
                   for kind in ("original", "converted")}
            for i, name in enumerate(_RUN_CASES)}


def _runs_like(ran, case: str) -> None:
    """The converted script prints what the original prints, and fails only where it does."""
    assert ran[case]["converted"] == ran[case]["original"], (_RUN_CASES[case], ran[case])


def test_future_import_on_the_same_line_stays_first() -> None:
    src = b"from __future__ import annotations; import torch; print(1)\n"
    out = convert_source(src).output
    assert _compiles(out), out.decode()


def test_model_and_optimizer_built_on_one_line(ran) -> None:
    _runs_like(ran, "model-and-optimizer-on-one-line")


def test_optimizer_in_a_one_line_if_prepares_its_model() -> None:
    src = ("import torch\nmodel = torch.nn.Linear(2, 2)\n"
           "if True: opt = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    result = convert_source(src.encode())
    out = result.output.decode()
    prepared = re.search(r"^\s*model(, opt)? = distify\.prepare\(model", out, re.MULTILINE)
    assert prepared or any(note.kind.startswith("prepare") for note in result.notes), out


def test_runtime_alias_avoids_names_bound_by_except(ran) -> None:
    _runs_like(ran, "except-as-distify")


def test_runtime_alias_avoids_names_bound_by_match(ran) -> None:
    _runs_like(ran, "case-distify")


@pytest.mark.parametrize("case", ["print-parameter", "print-def"])
def test_locally_bound_print_is_not_retargeted(ran, case: str) -> None:
    _runs_like(ran, case)


def test_helper_sum_over_a_parameter_is_not_reduced() -> None:
    src = (b"import torch\n\n@torch.no_grad()\ndef total(batches):\n    s = 0.0\n"
           b"    for b in batches:\n        s += b.sum().item()\n    return s\n")
    assert convert_source(src).output == src



@pytest.mark.parametrize("stmt", [
    pytest.param("open('metrics.txt', 'w').write('done')\n", id="open-write-chain"),
    pytest.param("if True: os.makedirs('out')\n", id="if-suite"),
    pytest.param("for f in old: os.remove(f)\n", id="for-suite"),
    pytest.param("os.makedirs('out'); x = 1\n", id="semicolons"),
])
def test_file_writes_are_guarded_or_reported(stmt: str) -> None:
    result = convert_source(f"import os\nimport torch\n{stmt}".encode())
    out = result.output.decode()
    guarded = "is_main_process()" in out or "distify.open(" in out  # one writer either way
    assert guarded or result.notes, out


def test_device_keyword_string_is_rewritten() -> None:
    src = b"import torch\nx = torch.zeros(3, device='cuda:0')\n"
    result = convert_source(src)
    assert b"'cuda:0'" not in result.output or result.notes, result.output.decode()


def test_timestamp_in_fstring_is_broadcast_once() -> None:
    src = b"import time\nimport torch\nname = f\"run-{time.strftime('%H%M')}\"\n"
    out = convert_source(src).output.decode()
    assert out.count("broadcast_object(") == 1, out



@pytest.mark.parametrize("call, broken", [
    pytest.param("torch.nn.DataParallel(*modules)", "modules", id="starred-wrapper"),
    pytest.param("data_parallel(module=net, inputs=x)", "net(inputs=x)",
                 id="keywords"),
    pytest.param("data_parallel(net, (a, b))", "net((a, b))", id="tuple-inputs"),
])
def test_data_parallel_removal_keeps_the_meaning(call: str, broken: str) -> None:
    src = f"import torch\nfrom torch.nn.parallel import data_parallel\nout = {call}\n"
    out = convert_source(src.encode()).output.decode()
    assert f"out = {broken}\n" not in out, out


def test_progress_bar_keyword_after_a_trailing_comma_is_spaced() -> None:
    src = b"import torch\nfrom tqdm import tqdm\nfor x in tqdm(range(3),):\n    pass\n"
    out = convert_source(src).output.decode()
    assert ",disable=" not in out, out


def test_invalid_utf8_in_a_comment_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"^bad\.py:2:"):
        convert_source(b"import torch\n# caf\xe9\nprint(1)\n", "bad.py")


@pytest.mark.parametrize("expr", ["1 + " * 1000 + "1", "a" + ".b" * 1000,
                                  "('x' " + "'x' " * 1000 + ")"],
                         ids=["binop", "attribute", "string-concat"])
def test_long_expression_chain_converts_or_is_a_user_error(expr: str) -> None:
    src = f"import torch\nx = {expr}\nprint(1)\n".encode()
    assert _compiles(src)
    try:
        result = convert_source(src, "long.py")
    except UserError:
        return
    assert b"distify.print(1)" in result.output


@pytest.mark.parametrize("src", [
    b"# coding: foobar\nimport torch\n",
    b"\xef\xbb\xbf# coding: latin-1\nimport torch\n",
], ids=["unknown-cookie", "bom-with-latin-1-cookie"])
def test_encoding_errors_carry_a_real_position(src: bytes) -> None:
    with pytest.raises(UserError) as err:
        convert_source(src, "enc.py")
    assert re.match(r"enc\.py:[1-9]\d*:[1-9]\d*: ", str(err.value)), str(err.value)


def test_syntax_error_column_counts_characters() -> None:
    src = "import torch\nnom = 'élève' +* 2\n"  # the `*` is character 16, byte 18
    with pytest.raises(UserError, match=r"^bad\.py:2:16: "):
        convert_source(src.encode("utf-8"), "bad.py")


# ============================================================================ command line
def _run(*args: str):
    return CliRunner().invoke(main, list(args))


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` (hidden ones too) with its bytes; None for folders/links."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink()
                                         else None)
            for p in sorted(folder.rglob("*"))}


def _assert_failed_cleanly(result, before: dict, folder: Path, *, message: str) -> None:
    """One line, exit 2, no traceback, and the folder exactly as it was (no temporary file)."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("distify: error: "), lines[0]
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert _tree(folder) == before, "the input was modified or something was left behind"


TRAIN = (FIXTURES / "convert" / "mnist_style.in.py").read_bytes()


@functools.cache
def _train_out() -> bytes:
    """What the library makes of TRAIN: the CLI must write exactly that."""
    return convert_source(TRAIN, "train.py").output


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_bytes(TRAIN)
    return tmp_path


@pytest.mark.parametrize("mode", [["-o", "out.py"], ["-i"], ["--diff"], ["--check"], []],
                         ids=["output", "in-place", "diff", "check", "default-output"])
@pytest.mark.parametrize("content, where", [
    (b"import torch\nx = (1,\n", "bad.py:2:5: syntax error: '(' was never closed"),
    (b"import torch\nif True:\nprint(1)\n", "bad.py:3:1: syntax error: expected an indented"),
    (b"import torch\n\nx = 1 +* 2\n", "bad.py:3:8: syntax error: invalid syntax"),
    (b"import torch\n  x = 1\n", "bad.py:2:2: syntax error: unexpected indent"),
], ids=["unclosed", "no-indent", "operator", "indent"])
def test_cli_syntax_error_writes_nothing_in_any_mode(workdir: Path, mode, content, where) -> None:
    (workdir / "bad.py").write_bytes(content)
    before = _tree(workdir)
    _assert_failed_cleanly(_run("convert", "bad.py", *mode), before, workdir, message=where)


@pytest.mark.parametrize("mode", [["-i"], ["--check"], ["--diff"]])
def test_cli_missing_input_in_every_mode(workdir: Path, mode) -> None:
    before = _tree(workdir)
    _assert_failed_cleanly(_run("convert", "gone.py", *mode), before, workdir,
                           message="gone.py: no such file")


def test_cli_dangling_symlink_input(workdir: Path) -> None:
    (workdir / "dangling.py").symlink_to(workdir / "nowhere.py")
    before = _tree(workdir)
    _assert_failed_cleanly(_run("convert", "dangling.py", "-o", "x.py"), before, workdir,
                           message="dangling.py: no such file")


def test_cli_unreadable_input_by_permissions(workdir: Path) -> None:
    path = workdir / "train.py"
    path.chmod(0)
    try:
        try:
            path.read_bytes()
        except PermissionError:
            pass
        else:
            pytest.skip("running as root: chmod 000 does not stop reading")
        before = _tree(workdir)
        _assert_failed_cleanly(_run("convert", "train.py", "-o", "out.py"), before, workdir,
                               message="train.py: cannot read: Permission denied")
    finally:
        path.chmod(0o644)


def test_cli_unreadable_input_simulated(workdir: Path, monkeypatch) -> None:
    """The same, whoever runs the tests: reading the input fails with EACCES."""
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "train.py":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self)

    before = _tree(workdir)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    result = _run("convert", "train.py", "-o", "out.py")
    monkeypatch.undo()
    _assert_failed_cleanly(result, before, workdir,
                           message="train.py: cannot read: Permission denied")


def test_cli_output_folder_is_a_file(workdir: Path) -> None:
    before = _tree(workdir)
    _assert_failed_cleanly(_run("convert", "train.py", "-o", "train.py/out.py"), before,
                           workdir, message="output folder does not exist")


def test_cli_output_into_an_existing_folder(workdir: Path) -> None:
    (workdir / "dist").mkdir()
    result = _run("convert", "train.py", "-o", "dist")
    assert result.exit_code == 0, result.output
    assert (workdir / "dist" / "train.py").read_bytes() == _train_out()
    assert (workdir / "train.py").read_bytes() == TRAIN


def test_cli_output_path_is_an_existing_directory(workdir: Path) -> None:
    (workdir / "dist" / "train.py").mkdir(parents=True)  # -o dist → dist/train.py: a folder
    before = _tree(workdir)
    _assert_failed_cleanly(_run("convert", "train.py", "-o", "dist"), before, workdir,
                           message="dist/train.py: not a regular file")


def test_cli_output_in_a_read_only_folder(workdir: Path) -> None:
    folder = workdir / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: a read-only folder is still writable")
        before = _tree(workdir)
        _assert_failed_cleanly(_run("convert", "train.py", "-o", "ro/out.py"), before, workdir,
                               message="ro/out.py: cannot write")
    finally:
        folder.chmod(0o755)


def test_cli_output_in_an_unwritable_place(workdir: Path) -> None:
    """/proc refuses new files even to root."""
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    before = _tree(workdir)
    _assert_failed_cleanly(_run("convert", "train.py", "-o", "/proc/out.py"), before, workdir,
                           message="/proc/out.py: cannot write")


@pytest.mark.parametrize("fail_in", ["mkstemp", "write", "fsync", "replace"])
def test_cli_failed_write_keeps_the_previous_output(workdir: Path, monkeypatch,
                                                    fail_in: str) -> None:
    """A full disk (or any OSError) mid-write: exit 2, the old output and the input intact,
    no temporary file left."""
    from distify import fsutil

    (workdir / "out.py").write_bytes(b"# the previous output\n")

    def fail(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    class _FullDisk(io.FileIO):
        def write(self, data):
            fail()

    def fdopen(fd, mode="r", *args, **kwargs):
        return _FullDisk(fd, "wb")

    target = {"mkstemp": (fsutil.tempfile, "mkstemp", fail),
              "write": (fsutil.os, "fdopen", fdopen),
              "fsync": (fsutil.os, "fsync", fail),
              "replace": (fsutil.os, "replace", fail)}[fail_in]
    before = _tree(workdir)
    monkeypatch.setattr(*target)
    result = _run("convert", "train.py", "-o", "out.py", "--force")
    monkeypatch.undo()
    _assert_failed_cleanly(result, before, workdir, message="out.py: cannot write")


def test_cli_interrupted_write_leaves_nothing_behind(workdir: Path, monkeypatch) -> None:
    """Ctrl-C in the middle of writing: exit 130, one line, old output intact, no temp file."""
    from distify import fsutil

    (workdir / "out.py").write_bytes(b"# the previous output\n")

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    before = _tree(workdir)
    monkeypatch.setattr(fsutil.os, "fsync", interrupt)
    result = _run("convert", "train.py", "-o", "out.py", "--force")
    monkeypatch.undo()
    assert result.exit_code == 130, result.output
    assert result.output.strip() == "distify: interrupted"
    assert _tree(workdir) == before


@pytest.mark.parametrize("spelling", ["./train.py", "{abs}", "sub/../train.py", "link.py", "."],
                         ids=["dot-slash", "absolute", "dot-dot", "symlink", "its-folder"])
def test_cli_output_equal_to_input_without_in_place(workdir: Path, spelling: str) -> None:
    (workdir / "sub").mkdir()
    (workdir / "link.py").symlink_to(workdir / "train.py")
    before = _tree(workdir)
    output = spelling.replace("{abs}", str(workdir / "train.py"))
    _assert_failed_cleanly(_run("convert", "train.py", "-o", output), before, workdir,
                           message="the output is the input; use -i")


def test_cli_hard_link_output_leaves_the_input_alone(workdir: Path) -> None:
    """-o onto a hard link of the input: the atomic rename makes a new file; the input keeps
    its bytes."""
    os.link(workdir / "train.py", workdir / "hard.py")
    result = _run("convert", "train.py", "-o", "hard.py")
    assert result.exit_code == 0, result.output
    assert (workdir / "train.py").read_bytes() == TRAIN
    assert (workdir / "hard.py").read_bytes() == _train_out()


def test_cli_new_outputs_honour_the_umask(workdir: Path) -> None:
    result = _run("convert", "train.py", "-o", "out.py")
    assert result.exit_code == 0, result.output
    umask = os.umask(0)
    os.umask(umask)
    for name in ("out.py", "out.yaml"):
        assert (workdir / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_cli_in_place_through_a_symlink_converts_the_target(workdir: Path) -> None:
    (workdir / "link.py").symlink_to(workdir / "train.py")
    result = _run("convert", "link.py", "-i", "--no-config")
    assert result.exit_code == 0, result.output
    assert (workdir / "link.py").is_symlink()
    assert (workdir / "train.py").read_bytes() == _train_out()


def _special_output(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
        return
    try:  # a private /dev/null: writing to it is harmless
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (OSError, AttributeError):
        pytest.skip("cannot create a character device here")


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_cli_output_onto_a_special_file_keeps_it(workdir: Path, kind: str) -> None:
    """``-o /dev/null`` (or a named pipe): write into it or refuse, never replace it."""
    target = workdir / "special"
    _special_output(kind, target)
    reader = os.open(target, os.O_RDONLY | os.O_NONBLOCK) if kind == "fifo" else None
    try:
        result = _run("convert", "train.py", "-o", "special", "--no-config")
        mode = os.lstat(target).st_mode
        assert result.exit_code in (0, 2), result.output
        assert (stat.S_ISFIFO if kind == "fifo" else stat.S_ISCHR)(mode), \
            f"the {kind} was replaced by a regular file"
    finally:
        if reader is not None:
            os.close(reader)


@pytest.mark.parametrize("mode", [["-o", "empty_dist.py"], ["-i"], ["--check"], ["--diff"]],
                         ids=["output", "in-place", "check", "diff"])
def test_cli_empty_file(workdir: Path, mode) -> None:
    (workdir / "empty.py").write_bytes(b"")
    result = _run("convert", "empty.py", *mode)
    assert result.exit_code == 0, result.output
    assert (workdir / "empty.py").read_bytes() == b""
    assert not (workdir / "empty_dist.yaml").exists()
    if mode[0] == "-o":
        assert (workdir / "empty_dist.py").read_bytes() == b""


def _convert_file(workdir: Path, data: bytes) -> bytes:
    (workdir / "in.py").write_bytes(data)
    result = _run("convert", "in.py", "-o", "in_dist.py")
    assert result.exit_code == 0, result.output
    assert (workdir / "in.py").read_bytes() == data
    return (workdir / "in_dist.py").read_bytes()


def test_cli_crlf_line_endings(workdir: Path) -> None:
    out = _convert_file(workdir, TRAIN.replace(b"\n", b"\r\n"))
    assert out == _train_out().replace(b"\n", b"\r\n")


def test_cli_utf8_bom(workdir: Path) -> None:
    out = _convert_file(workdir, b"\xef\xbb\xbf" + TRAIN)
    assert out == b"\xef\xbb\xbf" + _train_out()


def test_cli_tab_indentation(workdir: Path) -> None:
    def tabs(text: bytes) -> bytes:
        lines = []
        for line in text.split(b"\n"):
            body = line.lstrip(b" ")
            lines.append(b"\t" * ((len(line) - len(body)) // 4) + body if body else line)
        return b"\n".join(lines)

    src = (b"import torch\nfrom torch.utils.data import DataLoader\n\n"
           b"def train(model, ds):\n    loader = DataLoader(ds, batch_size=4)\n"
           b"    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
           b"    for x, y in loader:\n        loss = (model(x) - y).pow(2).mean()\n"
           b"        if loss.item() > 1:\n            print('big')\n"
           b"        loss.backward()\n        opt.step()\n")
    out = _convert_file(workdir, tabs(src))
    assert out == tabs(convert_source(src).output)
    assert b"\n\t\tdistify.backward(loss)\n" in out
    assert b"    " not in out


def test_cli_coding_cookie_keeps_latin1_bytes(workdir: Path) -> None:
    src = ("# -*- coding: latin-1 -*-\n# Modèle entraîné sur un GPU (données synthétiques)\n"
           "import torch\nprint('précision:', 0.5)  # résultat\nx = 'garçon'\n")
    out = _convert_file(workdir, src.encode("latin-1"))
    expected = src.replace("print(", "distify.print(").replace(
        "import torch\n", "import torch\nimport distify.runtime as distify\n")
    assert out == expected.encode("latin-1")


@pytest.mark.parametrize("data, message", [
    (bytes(range(256)) * 4, "cannot read as Python source"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10", "cannot read as Python source"),
    (importlib.util.MAGIC_NUMBER + b"\x00" * 12 + b"\xe3\x00\x00", "cannot read as Python source"),
    ("import torch\nprint(1)\n".encode("utf-16"), "in.py:1:1"),
], ids=["all-bytes", "png", "pyc", "utf-16"])
@pytest.mark.parametrize("mode", [["-o", "out.py"], ["-i"]], ids=["output", "in-place"])
def test_cli_binary_or_foreign_encoding_input(workdir: Path, data: bytes, message: str,
                                              mode) -> None:
    (workdir / "in.py").write_bytes(data)
    before = _tree(workdir)
    _assert_failed_cleanly(_run("convert", "in.py", *mode), before, workdir, message=message)


def test_cli_project_with_one_bad_file_writes_nothing(workdir: Path) -> None:
    project = workdir / "proj"
    (project / "pkg").mkdir(parents=True)
    (project / "train.py").write_bytes(TRAIN)
    (project / "pkg" / "broken.py").write_bytes(b"import torch\ndef f(:\n")
    (project / "README.md").write_text("notes\n")
    before = _tree(workdir)
    _assert_failed_cleanly(_run("convert", "proj", "-o", "out"), before, workdir,
                           message="proj/pkg/broken.py:2:7: syntax error")
    _assert_failed_cleanly(_run("convert", "proj", "-i"), before, workdir,
                           message="proj/pkg/broken.py:2:7: syntax error")


@pytest.mark.parametrize("rules, message", [
    (b"optimizers: [\n", "bad.yaml:2:1: rule pack is not valid YAML"),
    (None, "bad.yaml: cannot read rule pack"),
], ids=["malformed", "missing"])
def test_cli_bad_rule_pack(workdir: Path, rules, message: str) -> None:
    if rules is not None:
        (workdir / "bad.yaml").write_bytes(rules)
    before = _tree(workdir)
    _assert_failed_cleanly(_run("convert", "train.py", "--rules", "bad.yaml"), before, workdir,
                           message=message)


@pytest.mark.parametrize("data", [
    b"import torch\ndef f(:\n",
    b"\x00\x01\x02",
    b"import torch\n# caf\xe9\nprint(1)\n",  # passes ast.parse, not LibCST's decoder
    b"import torch\nx = " + b"1 + " * 50_000 + b"1\nprint(1)\n",  # beyond any parser's depth
], ids=["syntax", "binary", "latin-1-in-utf-8", "very-long-expression"])
def test_no_traceback_reaches_the_user(tmp_path: Path, data: bytes) -> None:
    """A real process: exit 2, one line on stderr, nothing on stdout, nothing written."""
    (tmp_path / "in.py").write_bytes(data)
    before = _tree(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "distify", "convert", "in.py", "-o", "o.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=clean_env(PYTHONPATH=str(REPO)), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("distify: ")
    assert proc.stdout == ""
    assert _tree(tmp_path) == before


# ---------------------------------------------------------------------------- a very large file
_BIG_HEAD = '''\
"""A very large single-file project: model zoo, utilities and training loops."""
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader
'''

_BIG_TRAIN = '''

def train_{i}(model, dataset, val_loader, epochs=2):
    """Training entry point {i}."""
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # plain SGD
    scheduler = StepLR(optimizer, step_size=1)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        scheduler.step()
        print(f"[{i}] epoch {{epoch}} loss {{loss.item():.4f}}")
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in val_loader:
            correct += (model(x).argmax(1) == y).sum().item()
    torch.save(model.state_dict(), "model_{i}.pt")
    return correct
'''

_BIG_UTIL = '''

def helper_{i}(x, scale={i}):
    """Helper {i}: a few tensor operations."""
    # normalise, then scale and clamp
    y = (x - x.mean()) / (x.std() + 1e-6)
    return torch.clamp(y * scale, -{i}, {i})
'''


def test_cli_very_large_file(workdir: Path) -> None:
    """~20,000 lines: completes, every training block converted, every other line kept."""
    n_train, n_util = 20, 2800
    every = n_util // n_train
    parts = [_BIG_HEAD]
    for i in range(n_util):
        if i % every == 0:
            parts.append(_BIG_TRAIN.format(i=i // every))
        parts.append(_BIG_UTIL.format(i=i))
    data = "".join(parts).encode()
    assert data.count(b"\n") >= 20_000
    (workdir / "big.py").write_bytes(data)
    result = _run("convert", "big.py", "-o", "big_dist.py", "--no-config")
    assert result.exit_code == 0, result.output
    out = (workdir / "big_dist.py").read_bytes()
    assert (workdir / "big.py").read_bytes() == data
    assert _compiles(out)
    text = out.decode()
    assert text.count("import distify.runtime as distify") == 1
    assert text.count("distify.backward(loss)") == n_train and "loss.backward()" not in text
    assert text.count("distify.prepare(DataLoader(") == n_train
    assert text.count("model, optimizer = distify.prepare(model, optimizer)") == n_train
    assert text.count("distify.prepare(StepLR(") == n_train
    assert text.count("correct = distify.reduce(correct)") == n_train
    assert text.count("distify.save(model.state_dict()") == n_train
    assert text.count("distify.print(") == n_train
    lines = collections.Counter(text.splitlines())
    for i in range(n_util):  # every helper line kept byte for byte
        for line in _BIG_UTIL.format(i=i).splitlines():
            assert lines[line] >= 1, line
    assert convert_source(out, "big_dist.py").output == out
