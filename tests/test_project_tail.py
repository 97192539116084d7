"""Project mode on real-style multi-file projects (issue 21 items 21-23).

Each case under ``tests/fixtures/project_tail/<case>/`` converts to ``<case>_expected/`` exactly
(regenerate with DISTIFY_UPDATE_GOLDEN=1 and review the diff):

- ``classifier/``: ``models/`` (a model file with a ``__main__`` shape check), ``utils.py``,
  ``prepare_data.py`` (writes the data set), ``train.py`` (the training loop) and ``predict.py``
  (writes a CSV of predictions). Only ``train.py`` is launched; the data-prep and predict
  scripts reach no backward pass and are copied byte for byte, each with its one-line reason.
- ``two_trainers/``: ``pretrain.py`` and ``finetune.py``, two training scripts: one ``Launch:``
  line and one launch config each.
- ``shared_ddp/``: ``utils.py`` (the training step) imported by ``train.py`` (one GPU) and by
  ``train_ddp.py`` (DDP by hand). ``utils.py`` is left as written, every rewrite it misses is
  reported on its line, and both entries run on 2 processes after conversion.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from distify.analysis.project import BackwardReach
from distify.cli import main
from distify.convert.engine import convert_source
from distify.convert.project import launch_entries, plan_project
from distify.rules import default_rules
from tests.helpers import (
    FIXTURES,
    REPO,
    clean_env,
    convert_project,
    run_python,
    run_torchrun,
    tree,
)

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

TAIL = FIXTURES / "project_tail"
CASES = ("classifier", "shared_ddp", "two_trainers")
UPDATE = os.environ.get("DISTIFY_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("case", CASES)
def test_golden_output_and_converting_again_changes_nothing(case: str, tmp_path) -> None:
    out, again = tmp_path / "out", tmp_path / "again"
    convert_project(TAIL / case, out)
    expected = TAIL / f"{case}_expected"
    if UPDATE:
        shutil.rmtree(expected, ignore_errors=True)
        shutil.copytree(out, expected, ignore=shutil.ignore_patterns("__pycache__"))
    assert tree(out) == tree(expected)
    convert_project(out, again)
    assert tree(again) == tree(out)


def _convert(case: str, out: Path, *extra: str) -> str:
    outcome = CliRunner().invoke(main, ["convert", str(TAIL / case), "-o", str(out), *extra])
    assert outcome.exit_code == 0, outcome.output
    return outcome.output


def _launch_lines(report: str) -> list[str]:
    return [line for line in report.splitlines() if line.startswith(("Launch:", "Not ready"))]


def test_the_launch_line_names_the_training_script_and_inference_scripts_stay(tmp_path) -> None:
    out = tmp_path / "out"
    report = _convert("classifier", out)
    launch = _launch_lines(report)
    assert len(launch) == 1 and launch[0].startswith("Launch: distify launch ")
    assert f"{out / 'train.py'}" in launch[0] and "SCRIPT" not in launch[0]
    assert (out / "train.yaml").is_file() and not (out / "launch.yaml").exists()
    for script in ("predict.py", "prepare_data.py"):
        assert (out / script).read_bytes() == (TAIL / "classifier" / script).read_bytes()
        line = next(x for x in report.splitlines() if x.startswith(str(TAIL / "classifier" /
                                                                        script)))
        assert line.endswith(
            ": unchanged (no backward pass in it or in the project code it calls: not a "
            "training script (inference, prediction, sampling or data preparation); it runs "
            f"on one process as before (`python {script}`) and is not launched on N processes,"
            " so its prints and file writes already happen once)"), line
        assert f"{out / script}:" not in report  # no notes about it
    assert "3 of 6 Python file(s) converted" in report


def test_several_training_scripts_get_a_launch_line_and_config_each(tmp_path) -> None:
    out = tmp_path / "out"
    report = _convert("two_trainers", out)
    assert "2 training scripts: one launch command each" in report
    launch = _launch_lines(report)
    assert len(launch) == 2 and all(line.startswith("Launch: ") for line in launch)
    assert f" {out / 'finetune.py'}" in launch[0] and f" {out / 'pretrain.py'}" in launch[1]
    assert (out / "finetune.yaml").is_file() and (out / "pretrain.yaml").is_file()
    assert not (out / "model.yaml").exists() and not (out / "launch.yaml").exists()


def test_a_helper_shared_with_a_ddp_script_is_left_as_written_and_reported(tmp_path) -> None:
    out = tmp_path / "out"
    report = _convert("shared_ddp", out)
    source = TAIL / "shared_ddp"
    for name in ("utils.py", "train_ddp.py", "model.py"):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    assert (out / "train.py").read_bytes() != (source / "train.py").read_bytes()
    assert (f"{source / 'utils.py'}: unchanged (imported by train_ddp.py, which is already "
            "distributed (line 22 uses torch.distributed.init_process_group), and by train.py, "
            "which is converted: it runs in both jobs, and converted it would stop "
            "train_ddp.py's own DDP job") in report
    lines = (source / "utils.py").read_text().splitlines()
    notes = {}
    for line in report.splitlines():
        if line.startswith(f"  {out / 'utils.py'}:"):
            number, message = line.split(":", 2)[1:]
            notes.setdefault(lines[int(number) - 1].strip(), []).append(message.strip())
    assert notes["loss.backward()"] == [
        "`.backward()` stays as written: DDP still averages the gradients of a model that "
        "train.py prepares, but there is no loss scaling: under fp16 the runtime stops the job "
        "at this backward (keep mixed precision 'no' or 'bf16')"]
    assert notes["correct += (model(x).argmax(1) == y).sum().item()"] == [
        "`correct`: not summed over processes: under train.py on N processes it covers one "
        "process's shard (rank 0's value where rank 0 prints it), not the whole data set as in "
        "one process"]
    assert [m.split(":")[0] for m in notes["return total_loss / len(loader)"]] == [
        "`total_loss`", "`len(loader)`"]
    assert "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)" in notes
    assert "distify" not in report.split("Needs a human look:")[1].split("Launch:")[0]
    assert _launch_lines(report) == [line for line in report.splitlines()
                                     if line.startswith("Launch:")]
    assert f"{out / 'train.py'}" in _launch_lines(report)[0]


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_a_script_calling_a_helper_that_trains_is_a_training_script(tmp_path) -> None:
    """No-op case: a script without a backward of its own that calls a project function with
    one (through a second function of that module) trains, and is converted and launched."""
    root = _project(tmp_path, {
        "engine.py": """
            def _step(model, x, opt):
                model(x).sum().backward()
                opt.step()

            def fit(model, loader, opt):
                for x in loader:
                    _step(model, x, opt)

            def predict(model, x):
                return model(x).argmax(1)
            """,
        "run.py": """
            import torch
            from engine import fit

            model = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)
            fit(model, loader, opt)
            """,
        "infer.py": """
            import torch
            from engine import predict
            from postprocess import write_predictions

            if __name__ == "__main__":
                model = torch.nn.Linear(2, 2)
                write_predictions(predict(model, torch.randn(3, 2)), "preds.pt")
            """,
        "postprocess.py": """
            import torch

            def write_predictions(preds, path):
                torch.save(preds, path)
                print("wrote", path)
            """,
    })
    _project(tmp_path, {
        "hf.py": """
            from transformers import Trainer
            import torch

            if __name__ == "__main__":
                Trainer(model=torch.nn.Linear(2, 2)).train()
            """,
        "meta.py": """
            import torch

            w = torch.zeros(2, requires_grad=True)
            for step in range(3):
                (g,) = torch.autograd.grad((w - 1).pow(2).sum(), [w])
                w = w - 0.1 * g
            """,
    })
    reach = BackwardReach({p: p.read_bytes() for p in root.glob("*.py")}, root)
    assert reach.reaches_backward(root / "run.py")
    assert not reach.reaches_backward(root / "infer.py")
    # a library's train() may run a backward; so does autograd.grad
    assert reach.reaches_backward(root / "hf.py") and reach.reaches_backward(root / "meta.py")
    (root / "hf.py").unlink()
    (root / "meta.py").unlink()
    planned = plan_project(root, None, default_rules(), "distify.runtime")
    status = {p.source.name: p.result.status for p in planned}
    assert status["run.py"] == "converted" and status["infer.py"] == "unchanged"
    # a module only the inference script imports stays with it; one a training script
    # imports too is converted with that script
    left = next(p.result for p in planned if p.source.name == "postprocess.py")
    assert (left.status, left.reason) == ("unchanged", "imported only by infer.py (no backward "
                                          "pass: run on one process, not launched on N), left "
                                          "unchanged with it")
    assert convert_source((root / "postprocess.py").read_bytes()).status == "converted"
    assert [p.source.name for p in launch_entries(planned, root)] == ["run.py"]


# ---------------------------------------------------------------- real runs on 2 processes


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The shared_ddp project converted: its DDP script and the converted train.py, each on 2
    processes, and train.py at world size 1 beside the original; the classifier converted:
    prepare_data.py, then train.py on 2 processes (its launch entry), then predict.py."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("project_tail")
    shared, classifier = root / "shared_ddp", root / "classifier"
    convert_project(TAIL / "shared_ddp", shared)
    convert_project(TAIL / "classifier", classifier)
    env = clean_env(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    original = root / "shared_original"
    shutil.copytree(TAIL / "shared_ddp", original)

    def classifier_job():
        run_python(classifier / "prepare_data.py", cwd=classifier, env=env, timeout=120)
        two = run_torchrun(classifier / "train.py", cwd=classifier, env=env, replicas=True,
                           distinct_data=True, timeout=300)
        predicted = run_python(classifier / "predict.py", cwd=classifier, env=env, timeout=120)
        return two, predicted

    jobs = {
        "ddp": lambda: run_torchrun(shared / "train_ddp.py", cwd=shared, env=env,
                                    replicas=True, distinct_data=True, timeout=300),
        "two": lambda: run_torchrun(shared / "train.py", cwd=shared, env=env, replicas=True,
                                    distinct_data=True, timeout=300),
        "classifier": classifier_job,
        "one": lambda: run_python(shared / "train.py", cwd=shared, env=env, timeout=120),
        # the shared helper's plain backward under fp16: the runtime stops at it, loudly
        "fp16": lambda: subprocess.run(
            [sys.executable, str(shared / "train.py"), "--epochs", "1"], cwd=shared,
            env={**env, "DISTIFY_MIXED_PRECISION": "fp16"}, capture_output=True, text=True,
            timeout=120),
        "original": lambda: run_python(original / "train.py", cwd=original, env=env,
                                       timeout=120),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
    done = {name: future.result() for name, future in futures.items()}
    done["folders"] = {"shared": shared, "classifier": classifier, "original": original}
    return done


def test_the_ddp_script_still_runs_after_conversion(runs) -> None:
    ddp = runs["ddp"]  # exit 0, and both ranks ended with bit-identical weights
    assert ddp.stdout.count("val correct") == 2  # rank 0 prints, both epochs ran
    assert (runs["folders"]["shared"] / "model_ddp.pt").is_file()


def test_the_converted_entry_trains_on_2_processes_and_is_unchanged_on_1(runs) -> None:
    one, original, two = runs["one"], runs["original"], runs["two"]
    assert one.stdout == original.stdout and original.stdout.count("val correct") == 2
    assert two.stdout.count("val correct") == 2  # printed by the main process only
    # the shared evaluate() is not reduced: rank 0's shard (50 of the 100), as the report says
    assert all(line.endswith("/100") for line in two.stdout.splitlines())
    counts = [int(line.split("val correct ")[1].split("/")[0]) for line in two.stdout.splitlines()]
    assert all(count <= 50 for count in counts), two.stdout


def test_under_fp16_the_shared_helpers_plain_backward_stops_the_job(runs) -> None:
    fp16 = runs["fp16"]
    assert fp16.returncode != 0
    assert "loss.backward() was called on the output of a prepared model under fp16" in \
        fp16.stderr.splitlines()[-1]
    assert fp16.stdout == ""  # stopped at the first backward, before any epoch ended


def test_the_launch_entry_trains_and_predict_runs_as_before(runs) -> None:
    two, predicted = runs["classifier"]
    assert two.stdout.count("val accuracy") == 2
    folder = runs["folders"]["classifier"]
    assert predicted.stdout == "wrote 75 predictions to predictions.csv\n"
    with open(folder / "predictions.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["index", "prediction"] and len(rows) == 76
