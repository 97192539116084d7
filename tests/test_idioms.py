"""The idioms of real training scripts (issue 6): golden conversions and end-to-end runs.

Fixtures:

- ``tests/fixtures/idioms/NAME.in.py``: one script per idiom, each in the style of a well-known
  public example (named in its docstring); it converts to ``NAME.out.py`` exactly. Every one but
  ``downloads_trackers`` (torchvision, TensorBoard and wandb are not test dependencies) also runs.
- ``tests/fixtures/project/``: a multi-file project (model, data, engine, a Trainer in train.py);
  ``distify convert project -o out`` writes exactly ``tests/fixtures/project_expected/``.

End to end, every runnable fixture and its conversion run once (concurrently, see ``runs``):

- world size 1, plain ``python``: the conversion prints exactly what the original prints and
  writes the same files with the same values;
- world size 2 under ``torchrun`` (Gloo, CPU) with half the per-process batch: the same global
  batches, so results match within float tolerance, evaluation counts exactly, and every file and
  log line is written once; the ranks train on different batches and end with bit-identical
  parameters (``run_torchrun(replicas=True, distinct_data=True)``).

To update the golden files after an intended converter change, run
``DISTIFY_UPDATE_GOLDEN=1 pytest tests/test_idioms.py -k golden`` and review the diff.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from tests.helpers import (
    FIXTURES,
    REPO,
    clean_env,
    compare_state,
    convert_project,
    flatten,
    result_line,
    run_python,
    run_torchrun,
    tree,
)

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

IDIOMS = FIXTURES / "idioms"
PROJECT = FIXTURES / "project"
PROJECT_EXPECTED = FIXTURES / "project_expected"
GOLDEN = sorted(IDIOMS.glob("*.in.py"))
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))


def _name(path: Path) -> str:
    return path.name.split(".")[0]


def _out(source: Path) -> Path:
    return source.with_name(source.name.replace(".in.py", ".out.py"))


# ------------------------------------------------------------------------------------ golden


@pytest.mark.parametrize("source", GOLDEN, ids=_name)
def test_golden_output(source: Path) -> None:
    result = convert_source(source.read_bytes(), str(source))
    if UPDATE:
        _out(source).write_bytes(result.output)
    assert result.status == "converted"
    assert result.output.decode() == _out(source).read_text()


@pytest.mark.parametrize("source", GOLDEN, ids=_name)
def test_converting_twice_changes_nothing(source: Path) -> None:
    once = _out(source).read_bytes()
    again = convert_source(once, "converted.py")
    assert again.output == once
    assert again.status == "already-distributed"


# what the report must say for each idiom: change kinds it includes, and the notes (places that
# need a human look) it makes, exactly
REPORTS = {
    "dataparallel": ({"data-parallel", "prepare-model", "device", "reduce", "guard"}, set()),
    "amp_accumulation": ({"accumulation", "prepare-model", "reduce"}, {"mixed-precision"}),
    "wrapper_calls": ({"prepare-model", "backward", "reduce"}, set()),
    "checkpoint_resume": ({"prepare-model", "prepare-scheduler", "save", "load", "guard"},
                          set()),
    "logging_progress": ({"progress", "logging", "timestamp", "write", "reduce"}, set()),
    "data_kwargs": ({"prepare-dataloader", "prepare-scheduler", "reduce"}, set()),
    "downloads_trackers": ({"download", "guard", "reduce"}, set()),
    "compiled": ({"prepare-model", "prepare-dataloader", "reduce", "save"}, set()),
}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_report_names_each_idiom(name: str) -> None:
    result = convert_source((IDIOMS / f"{name}.in.py").read_bytes())
    kinds, notes = REPORTS[name]
    assert kinds <= {change.kind for change in result.changes}
    assert {note.kind for note in result.notes} == notes


def _convert_project(out: Path) -> None:
    convert_project(PROJECT, out)


def test_project_golden_output(tmp_path) -> None:
    out = tmp_path / "out"
    _convert_project(out)
    if UPDATE:
        shutil.rmtree(PROJECT_EXPECTED, ignore_errors=True)
        shutil.copytree(out, PROJECT_EXPECTED)
    assert tree(out) == tree(PROJECT_EXPECTED)
    # the model module has nothing to convert: it is copied as it is
    assert (out / "model.py").read_bytes() == (PROJECT / "model.py").read_bytes()


def test_converting_the_converted_project_changes_nothing(tmp_path) -> None:
    out = tmp_path / "again"
    convert_project(PROJECT_EXPECTED, out)
    assert tree(out) == tree(PROJECT_EXPECTED)


# ------------------------------------------------------------------------------- end to end


def _have(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def _requirements(name: str) -> None:
    pytest.importorskip("torch")
    if name == "logging_progress":
        pytest.importorskip("tqdm")


@dataclass(frozen=True)
class Case:
    """A runnable fixture: its arguments (``{bs}``-style placeholders for the batch sizes), the
    batch sizes of one process, and whether it has a second, ``--resume`` run."""

    args: tuple[str, ...]
    batches: dict[str, int]
    resume: bool = False


CASES = {
    "dataparallel": Case(("-b", "{bs}"), {"bs": 32}),
    "amp_accumulation": Case(("--batch-size", "{bs}"), {"bs": 16}),
    "wrapper_calls": Case(("--batch_size", "{bs}"), {"bs": 20}),
    "checkpoint_resume": Case(("--batch-size", "{bs}"), {"bs": 32}, resume=True),
    "logging_progress": Case(("-b", "{bs}"), {"bs": 32}),
    "data_kwargs": Case(("--batch-size", "{bs}", "--finetune-batch-size", "{fbs}"),
                        {"bs": 32, "fbs": 16}),
    "project": Case(("--batch-size", "{bs}"), {"bs": 32}),
    "compiled": Case(("--batch-size", "{bs}"), {"bs": 32}),
}
VARIANTS = ("original", "converted", "two")  # plain python, plain python, torchrun × 2


def _args(case: Case, halve: bool) -> list[str]:
    sizes = {k: v // 2 if halve else v for k, v in case.batches.items()}
    return [a.format(**sizes) for a in case.args]


@dataclass
class Run:
    folder: Path
    procs: list = field(default_factory=list)  # CompletedProcess per invocation
    error: BaseException | None = None

    @property
    def stdout(self) -> str:
        return self.procs[0].stdout

    @property
    def stderr(self) -> str:
        return self.procs[0].stderr

    def check(self) -> Run:
        if self.error is not None:
            raise self.error
        return self


def _setup(root: Path, name: str, variant: str) -> Path:
    folder = root / name / variant
    if name == "project":
        if variant == "original":
            shutil.copytree(PROJECT, folder, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            _convert_project(folder)
    else:
        folder.mkdir(parents=True)
        suffix = "in" if variant == "original" else "out"
        shutil.copy(IDIOMS / f"{name}.{suffix}.py", folder / "train.py")
    return folder


def _execute(name: str, variant: str, folder: Path) -> Run:
    case = CASES[name]
    run = Run(folder)
    env = clean_env(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    try:
        for extra in ([], ["--resume"]) if case.resume else ([],):
            if variant == "two":
                # every fixture trains on a sharded loader: each rank its own batches, and
                # bit-identical parameters on both ranks at the end
                proc = run_torchrun(folder / "train.py", *_args(case, True), *extra, nproc=2,
                                    cwd=folder, env=env, replicas=True, distinct_data=True)
            else:
                proc = run_python(folder / "train.py", *_args(case, False), *extra, cwd=folder,
                                  env=env)
            run.procs.append(proc)
    except (AssertionError, OSError, subprocess.SubprocessError) as err:
        # reported by the tests that use this run
        run.error = err
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], Run]:
    """Every runnable fixture × (original, converted at world size 1, converted at 2), run once.

    The runs are independent processes that spend much of their time starting up and meeting
    each other, so they run a few at a time.
    """
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("idioms")
    names = [name for name in CASES if name != "logging_progress" or _have("tqdm")]
    jobs = [(name, variant, _setup(root, name, variant)) for name in names for variant in VARIANTS]
    # the torchrun jobs first: they take longest
    jobs.sort(key=lambda job: job[1] != "two")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {(n, v): pool.submit(_execute, n, v, f) for n, v, f in jobs}
    return {key: future.result() for key, future in futures.items()}


def _state(path: Path) -> dict:
    import torch

    return flatten(torch.load(path))


def _files(folder: Path) -> dict[str, Path]:
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()
            and "__pycache__" not in p.parts}


# files each fixture writes (relative to its folder; run folders named by the clock are globbed)
CHECKPOINTS = {
    "dataparallel": ["checkpoint.pth.tar", "model_best.pth.tar", "weights.pth"],
    "amp_accumulation": ["amp_checkpoint.pt"],
    "wrapper_calls": ["lstm.pt"],
    "checkpoint_resume": ["checkpoint/ckpt.pth"],
    "logging_progress": ["model_best.pth"],
    "data_kwargs": ["data_kwargs.pt"],
    "project": ["checkpoint.pth"],
    "compiled": ["compiled.pt", "weights.pt"],
}


def _checkpoint(folder: Path, name: str, relative: str) -> Path:
    if name == "logging_progress":
        return _run_folder(folder) / relative
    return folder / relative


def _run_folder(folder: Path) -> Path:
    found = sorted((folder / "output" / "train").iterdir())
    assert len(found) == 1, found  # one run folder: every process agreed on its name
    assert found[0].name.endswith("-mlp")
    return found[0]


def _written(run: Run) -> list[str]:
    """The files a run left behind, with the clock-named run folder replaced by ``RUN``."""
    names = []
    for relative in _files(run.folder):
        parts = relative.split(os.sep)
        if parts[:2] == ["output", "train"]:
            parts[2] = "RUN"
        names.append("/".join(parts))
    return sorted(names)


@pytest.mark.parametrize("name", sorted(CASES))
def test_world_size_one_is_exactly_the_original(name, runs) -> None:
    _requirements(name)
    original = runs[name, "original"].check()
    converted = runs[name, "converted"].check()
    for want, got in zip(original.procs, converted.procs):
        assert got.stdout == want.stdout
    assert _written(converted) == _written(original)
    for relative in CHECKPOINTS[name]:
        # DataParallel's `module.` keys included
        compare_state(_state(_checkpoint(converted.folder, name, relative)),
                      _state(_checkpoint(original.folder, name, relative)), exact=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_processes_match_the_original(name, runs) -> None:
    _requirements(name)
    original = runs[name, "original"].check()
    two = runs[name, "two"].check()
    # one writer: every line printed once, the same files, no stray temporary files
    for want, got in zip(original.procs, two.procs):
        assert len(got.stdout.splitlines()) == len(want.stdout.splitlines())
    assert _written(two) == _written(original)
    for relative in CHECKPOINTS[name]:
        compare_state(_state(_checkpoint(two.folder, name, relative)),
                      _state(_checkpoint(original.folder, name, relative)), exact=False)
    got, want = result_line(two.procs[-1].stdout), result_line(original.procs[-1].stdout)
    METRICS[name](got, want, two, original)


# -------------------------------------------------------------- per-fixture metric checks


def _lines(text: str, marker: str) -> list[str]:
    return [line for line in text.splitlines() if marker in line]


def _dataparallel(got, want, two, original) -> None:
    assert [h["correct"] for h in got["history"]] == [h["correct"] for h in want["history"]]
    assert got["best_acc1"] == want["best_acc1"]
    assert got["weight_norm"] == pytest.approx(want["weight_norm"], rel=1e-4)
    # the evaluation lines (counts over the whole validation set) are exactly the original's
    assert _lines(two.stdout, "Acc@1") == _lines(original.stdout, "Acc@1")
    assert _lines(two.stdout, "classifier:") == _lines(original.stdout, "classifier:")


def _amp_accumulation(got, want, two, original) -> None:
    assert got["steps"] == want["steps"] == 22  # 2 epochs × 44 micro-batches / 4
    assert got["val"]["count"] == want["val"]["count"] == 157
    assert got["val"]["mse"] == pytest.approx(want["val"]["mse"], rel=1e-3)
    norms, want_norms = _lines(two.stdout, "grad norm"), _lines(original.stdout, "grad norm")
    assert len(norms) == len(want_norms) == 4
    for g, w in zip(norms, want_norms):
        # gradients are averaged over the processes before clipping: the same norm
        assert float(g.rsplit(" ", 1)[1]) == pytest.approx(float(w.rsplit(" ", 1)[1]), rel=1e-3)


def _wrapper_calls(got, want, two, original) -> None:
    assert got["val_tokens"] == want["val_tokens"] == 1320
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-3)
    assert got["sample"] == want["sample"]  # model.generate(...) through the prepared model
    assert got["lrs"] == want["lrs"]  # the encoder's own parameter group kept its rate
    assert got["embedding_norm"] == pytest.approx(want["embedding_norm"], rel=1e-3)


def _checkpoint_resume(got, want, two, original) -> None:
    first, resumed = two.procs
    first_want, resumed_want = original.procs
    for got_run, want_run in ((first, first_want), (resumed, resumed_want)):
        # every evaluation, the last one of the best checkpoint reloaded from disk
        counts = [line.split("(")[1] for line in _lines(got_run.stdout, "test loss")]
        assert counts == [line.split("(")[1] for line in _lines(want_run.stdout, "test loss")]
    # the resumed run evaluates right after loading: the counts prove every rank loaded
    assert _lines(resumed.stdout, "resumed at") == _lines(resumed_want.stdout, "resumed at")
    assert _lines(resumed.stdout, "whole-model pickle") == \
        _lines(resumed_want.stdout, "whole-model pickle")
    resumed_loss = float(_lines(resumed.stdout, "test loss")[0].split()[2])
    assert resumed_loss == pytest.approx(
        float(_lines(resumed_want.stdout, "test loss")[0].split()[2]), abs=2e-4)
    assert got["best_epoch"] == want["best_epoch"]
    assert got["final_correct"] == want["final_correct"]
    assert got["lr"] == pytest.approx(want["lr"])


def _logging_progress(got, want, two, original) -> None:
    assert got["eval"]["seen"] == want["eval"]["seen"] == 130
    assert got["eval"]["correct"] == want["eval"]["correct"]
    assert got["eval"]["loss"] == pytest.approx(want["eval"]["loss"], rel=1e-3)
    assert got["best_metric"] == want["best_metric"]
    _logs_written_once(two, original)


def _logs_written_once(two: Run, original: Run) -> None:
    folder, want_folder = _run_folder(two.folder), _run_folder(original.folder)
    csv_lines = (folder / "summary.csv").read_text().splitlines()
    want_csv = (want_folder / "summary.csv").read_text().splitlines()
    assert len(csv_lines) == len(want_csv) == 4  # a header and one row per epoch
    assert csv_lines[0] == want_csv[0]
    json_lines = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    want_json = [json.loads(line)
                 for line in (want_folder / "log.jsonl").read_text().splitlines()]
    assert len(json_lines) == len(want_json) == 3
    assert [(r["epoch"], r["correct"], r["seen"]) for r in json_lines] == \
        [(r["epoch"], r["correct"], r["seen"]) for r in want_json]
    # the other process logs warnings only, and shows no progress bar
    assert _lines(two.stderr, "INFO train:") == _lines(original.stderr, "INFO train:")
    assert len(_lines(original.stderr, "INFO train:")) == 4
    for epoch in range(3):  # a bar prints its 0% line once when it starts
        assert two.stderr.count(f"train {epoch}:   0%") == 1


def _data_kwargs(got, want, two, original) -> None:
    # len(train_loader) on a process is the original's number of steps: OneCycleLR's length fits
    assert two.stdout.splitlines()[0] == original.stdout.splitlines()[0]
    assert got["steps_per_epoch"] == want["steps_per_epoch"] == 32
    assert got["scheduler_steps"] == want["scheduler_steps"] == 64
    assert got["total"] == want["total"] == 233
    assert got["correct"] == want["correct"]
    assert got["eval_loss"] == pytest.approx(want["eval_loss"], rel=1e-3)
    counts = [line.split("accuracy ")[1].split(",")[0]
              for line in _lines(two.stdout, "eval loss")]
    assert len(counts) == 3
    assert counts == [line.split("accuracy ")[1].split(",")[0]
                      for line in _lines(original.stdout, "eval loss")]


def _project(got, want, two, original) -> None:
    assert got["test_seen"] == want["test_seen"] == 221
    assert got["test_correct"] == want["test_correct"]
    assert got["train_steps"] == want["train_steps"] == 25
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-3)
    assert got["lr"] == pytest.approx(want["lr"])
    assert _lines(two.stdout, "Accuracy of") == _lines(original.stdout, "Accuracy of")
    assert _lines(two.stdout, "number of params") == _lines(original.stdout, "number of params")


def _compiled(got, want, two, original) -> None:
    # the compiled module trained under DDP: the same evaluation, and `_orig_mod.` keys kept
    assert got["correct"] == want["correct"]
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-3)
    assert got["keys"] == want["keys"] and all(k.startswith("_orig_mod.") for k in got["keys"])
    assert _lines(two.stdout, "epoch") == _lines(original.stdout, "epoch")


METRICS = {"dataparallel": _dataparallel, "amp_accumulation": _amp_accumulation,
           "wrapper_calls": _wrapper_calls, "checkpoint_resume": _checkpoint_resume,
           "logging_progress": _logging_progress, "data_kwargs": _data_kwargs,
           "project": _project, "compiled": _compiled}


def test_world_size_one_logs_like_the_original(runs) -> None:
    _requirements("logging_progress")
    original = runs["logging_progress", "original"].check()
    converted = runs["logging_progress", "converted"].check()
    assert _lines(converted.stderr, "INFO train:") == _lines(original.stderr, "INFO train:")
    folder, want = _run_folder(converted.folder), _run_folder(original.folder)
    assert (folder / "summary.csv").read_text() == (want / "summary.csv").read_text()
    assert (folder / "log.jsonl").read_text() == (want / "log.jsonl").read_text()
    for epoch in range(3):
        assert converted.stderr.count(f"train {epoch}:   0%") == 1


def test_reloading_a_checkpoint_just_saved_reads_the_new_one_on_every_process(runs) -> None:
    """``torch.load`` of the file the main process just saved: every process reads the new one
    (the other process must not race ahead and read the previous checkpoint)."""
    _requirements("checkpoint_resume")
    original = runs["checkpoint_resume", "original"].check()
    two = runs["checkpoint_resume", "two"].check()
    for got, want in zip(two.procs, original.procs):
        # the last evaluation is of the best checkpoint, reloaded from disk by every process
        got_loss = float(_lines(got.stdout, "test loss")[-1].split()[2])
        want_loss = float(_lines(want.stdout, "test loss")[-1].split()[2])
        assert got_loss == pytest.approx(want_loss, abs=2e-4)


def test_project_decides_the_exit_on_a_non_finite_loss_alike_on_every_process() -> None:
    result = convert_source((PROJECT / "engine.py").read_bytes(), "engine.py")
    lines = result.output.decode().splitlines()
    assert not [note for note in result.notes if note.kind == "divergence"]
    assert [lines[change.line - 1].strip() for change in result.changes
            if change.kind == "stop"] == ["if distify.any_process(not math.isfinite(loss_value)):"]


MODULE_BEFORE_PREPARE = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Linear(4, 4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.features(x)))


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.DataParallel(Net()).to(device)
for p in model.module.features.parameters():  # freeze the backbone, as fine-tuning scripts do
    p.requires_grad = False
optimizer = torch.optim.SGD(filter(lambda p: p.requires_grad, model.parameters()), lr=0.1)
print(sum(p.numel() for g in optimizer.param_groups for p in g["params"]))
'''


def test_model_module_works_before_the_model_is_prepared(tmp_path) -> None:
    pytest.importorskip("torch")
    source = tmp_path / "train.py"
    source.write_bytes(convert_source(MODULE_BEFORE_PREPARE.encode()).output)
    proc = run_python(source, cwd=tmp_path, env=clean_env(PYTHONPATH=str(REPO)))
    assert proc.stdout == "10\n"
