"""Conversion noise (issue 21 items 24, 25, and item 7's loops over the batch): no collective on
a value every process has by construction, no clutter, no false notes.

- item 24: a setting read in a helper the loop calls with the loss (``smoke_check(config,
  step, loss)``), a trainer's ``self.iter_num`` beside its per-process ``self.loss``: tests
  left as written, with their per-process neighbours still decided alike;
- item 25: a helper that builds a data set with ``download=...`` waits once, not inside a
  second ``main_process_first``; a sum nothing reads is not all-reduced; a loop over
  ``dataloaders[phase]`` is a loop over a prepared loader (no "every process trains on the same
  batches" note, its sums reduced); a model file's ``test()`` smoke test is left alone;
- item 7: ``for i in range(batch_size): labels[i]`` over a DataLoader's batch (see also
  tests/test_convert_batch_shapes.py);
- golden files ``tests/fixtures/noise/NAME.in.py`` → ``NAME.out.py`` (``DISTIFY_UPDATE_GOLDEN=1``
  rewrites them; review the diff), converting again changes nothing, ``*.noop.py`` converts to
  nothing;
- end to end, in one batch: the original, the conversion on 1 process (its exact output) and on
  2 processes (torchrun, Gloo: identical replicas, distinct data, only rank 0 printed, the
  evaluation before training equal to one process's), and the indexed-batch script with the
  batch size left in the range, which stops at the first short batch.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from tests.fixture_runs import Plan, check_golden, fixture_name, run_side_by_side
from tests.helpers import FIXTURES, REPO, clean_env, run_torchrun

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

NOISE = FIXTURES / "noise"
GOLDEN = sorted(NOISE.glob("*.in.py"))
NO_OPS = sorted(NOISE.glob("*.noop.py"))


def _convert(source: str):
    result = convert_source(textwrap.dedent(source).encode())
    return result, result.output.decode()


# ------------------------------------------------------------------ item 24

LOOP = """\
import sys
import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=8, shuffle=True)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


@pytest.mark.parametrize("source", [
    pytest.param(LOOP + """\
def check(args, step, loss):
    if args.dry_run and step > 2:
        sys.exit(0)


for step, (x, y) in enumerate(loader):
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    check(args, step, loss)
""", id="setting-in-a-helper-called-with-the-loss"),
    pytest.param(LOOP + """\
def check(loss, *, limit=None, args=None):
    if args.dry_run:
        sys.exit(0)


for x, y in loader:
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    check(loss, args=args)
""", id="keyword-argument"),
    pytest.param(LOOP + """\
class Trainer:
    def run(self, config):
        self.iter_num = 0
        while True:
            for x, y in loader:
                self.loss = model(x).sum()
                self.loss.backward()
                optimizer.step()
                self.losses.append(self.loss.item())
                self.iter_num += 1
                if self.iter_num >= config.max_iters:
                    return
""", id="counter-on-self-beside-the-loss"),
])
def test_tests_on_settings_and_counters_stay_as_written(source: str) -> None:
    result, output = _convert(source)
    assert "any_process" not in output and "distify.reduce(" not in output, output
    assert not [c for c in result.changes if c.kind == "stop"]


@pytest.mark.parametrize("source, decided", [
    pytest.param(LOOP + """\
def check(args, step, loss):
    if loss.item() > args.limit:
        sys.exit(1)


for step, (x, y) in enumerate(loader):
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    check(args, step, loss)
""", "if distify.any_process(loss.item() > args.limit):", id="the-loss-in-the-helper"),
    pytest.param(LOOP + """\
class Trainer:
    def run(self, config):
        for x, y in loader:
            self.loss = model(x).sum()
            self.loss.backward()
            optimizer.step()
            if self.loss.item() < config.goal:
                break
""", 'if distify.reduce(self.loss.item(), op="mean") < config.goal:', id="the-loss-on-self"),
])
def test_per_process_neighbours_are_still_decided_alike(source: str, decided: str) -> None:
    _, output = _convert(source)
    assert decided in [line.strip() for line in output.splitlines()], output


# ------------------------------------------------------------------ item 25


def test_a_helper_that_downloads_waits_once() -> None:
    _, output = _convert("""\
        import torch
        import torchvision

        def get_dataset(root, download=False):
            return torchvision.datasets.MNIST(root, download=download)

        def get_loaders(root):
            return torch.utils.data.DataLoader(get_dataset(root, download=True), batch_size=4)

        train = get_dataset("data", download=True)
        """)
    assert output.count("main_process_first") == 1, output
    assert "    with distify.main_process_first():\n        return torchvision" in output


def test_a_call_of_an_unknown_function_with_download_still_waits() -> None:
    _, output = _convert("""\
        import torch
        from datasets_lib import fetch_set

        train = fetch_set("data", download=True)
        loader = torch.utils.data.DataLoader(train, batch_size=4)
        """)
    assert "with distify.main_process_first():\n    train = fetch_set" in output


def test_a_sum_nothing_reads_is_not_reduced() -> None:
    result, output = _convert("""\
        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(ds, batch_size=8)
        model = torch.nn.Linear(4, 2)
        model.eval()
        total_loss, seen, unused = 0.0, 0, 0
        with torch.no_grad():
            for x, y in loader:
                total_loss += model(x).sum().item()
                seen += x.size(0)
                unused += x.size(0)
        print(total_loss / seen)
        """)
    assert "total_loss = distify.reduce(total_loss)" in output
    assert "seen = distify.reduce(seen)" in output
    assert "unused = distify.reduce" not in output
    assert not [c for c in result.changes if "`unused`" in c.message]


def test_a_loop_over_a_dict_of_prepared_loaders_is_sharded() -> None:
    result, output = _convert((NOISE / "phase_loop.in.py").read_text())
    assert not [n for n in result.notes if "trains on the same batches" in n.message]
    assert "running_corrects = distify.reduce(running_corrects)" in output
    assert "samples_seen = distify.reduce" not in output  # never read


def test_a_model_files_smoke_test_is_left_alone() -> None:
    source = (NOISE / "model_file.noop.py").read_bytes()
    result = convert_source(source, "models/tinynet.py")
    assert result.output == source and not result.changes


@pytest.mark.parametrize("source", [
    pytest.param("""\
        import torch

        def report(model):
            print(model)

        def test():
            print(torch.randn(2))

        if __name__ == "__main__":
            test()
            report(torch.nn.Linear(2, 2))
        report(None)
        """, id="a-function-also-called-elsewhere"),
    pytest.param("""\
        import torch

        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def test():
            print(model(torch.randn(2, 2)))

        if __name__ == "__main__":
            test()
        """, id="a-file-that-trains"),
])
def test_prints_outside_a_smoke_test_are_still_guarded(source: str) -> None:
    _, output = _convert(source)
    assert "distify.print(" in output


# ------------------------------------------------------------------ golden files


@pytest.mark.parametrize("source", GOLDEN, ids=fixture_name)
def test_golden_output_and_converting_twice_changes_nothing(source: Path) -> None:
    check_golden(source, again=None)


@pytest.mark.parametrize("source", NO_OPS, ids=fixture_name)
def test_no_op_files_convert_to_nothing(source: Path) -> None:
    result = convert_source(source.read_bytes(), str(source))
    assert result.output == source.read_bytes() and not result.changes


def test_the_reports_say_what_changed_and_why() -> None:
    result = convert_source((NOISE / "indexed_batch.in.py").read_bytes())
    ranges = [c for c in result.changes if c.kind == "batch-size"]
    assert len(ranges) == 2
    assert all(c.message.startswith("`args.batch_size` → `len(labels)`: this loop indexes the "
                                    "batch") for c in ranges)
    settings = convert_source((NOISE / "settings_stops.in.py").read_bytes())
    assert not [c for c in settings.changes if c.kind == "stop"]


# ------------------------------------------------------------------ end to end

PLANS = {"indexed_batch": Plan(), "settings_stops": Plan(), "phase_loop": Plan()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("noise")
    unfixed = root / "unfixed"
    unfixed.mkdir()
    converted = (NOISE / "indexed_batch.out.py").read_bytes()
    (unfixed / "train.py").write_bytes(
        converted.replace(b"range(len(labels))", b"range(args.batch_size)"))

    def the_batch_size_left_in():
        return run_torchrun(unfixed / "train.py", nproc=2, cwd=unfixed,
                            env=clean_env(PYTHONPATH=str(REPO)), check=False, replicas=False,
                            timeout=300)

    return run_side_by_side(root, NOISE, PLANS, also=the_batch_size_left_in)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_one_process_prints_what_the_original_prints(runs, name: str) -> None:
    assert runs[name, "one"].stdout == runs[name, "original"].stdout


def test_two_processes_run_together_and_print_once(runs) -> None:
    original, two = runs["settings_stops", "original"], runs["settings_stops", "two"]
    assert two.stdout == original.stdout  # the same stop, at the same iteration, printed once
    assert "stopped at iter 12" in two.stdout
    for name in ("indexed_batch", "phase_loop"):
        original, two = runs[name, "original"], runs[name, "two"]
        lines = two.stdout.splitlines()
        assert len(lines) == len(original.stdout.splitlines())
        # evaluated before training, over the same weights: the single-process value
        assert lines[0] == original.stdout.splitlines()[0], (name, lines[0])


def test_the_batch_size_left_in_the_range_stops_at_a_short_batch(runs) -> None:
    proc = runs["also", ""]
    assert proc.returncode != 0
    assert "IndexError" in proc.stderr or "out of bounds" in proc.stderr, proc.stderr[-2000:]
