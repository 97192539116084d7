"""`distify check --fix` guards in the file's own vocabulary and never adds a dependency.

A plain `torch.distributed` script gets `dist.get_rank() == 0` (or the rank variable or flag it
already has), an Accelerate script `accelerator.is_main_process`, Fabric `fabric.is_global_zero`,
Lightning `self.trainer.is_global_zero`; only a file that imports the distify runtime gets
`distify.is_main_process()`. One file never gets two guard styles, and a fix that cannot be
written in the file's vocabulary is not made (the finding stays, without the fixable mark).
"""

from __future__ import annotations

import ast
import difflib
import shutil
import subprocess
import sys
import textwrap

import pytest

from distify.lint import lint_text
from distify.lint.fixer import apply_fixes
from tests.helpers import FIXTURES, REPO, clean_env

FIX = FIXTURES / "check" / "fix"

#: fixture pair → the guards its fixes add (each added `if` line is `if <one of them>:`)
VOCABULARIES = [
    pytest.param("ddp_tutorial", {"torch.distributed.get_rank() == 0"},
                 id="ddp-tutorial-spawn"),
    pytest.param("ddp_tutorial_torchrun", {"self.gpu_id == 0"}, id="ddp-tutorial-own-guard"),
    pytest.param("rank_guard", {"rank == 0"}, id="ddp-rank-variable"),
    pytest.param("nanogpt", {"master_process"}, id="nanogpt-master-process"),
    pytest.param("optional_ddp", {"not dist.is_initialized() or dist.get_rank() == 0"},
                 id="ddp-or-single-process"),
    pytest.param("accelerate_no_trainer", {"accelerator.is_main_process"}, id="accelerate"),
    pytest.param("fabric", {"fabric.is_global_zero"}, id="fabric"),
    pytest.param("lightning_module", {"self.trainer.is_global_zero", "trainer.is_global_zero"},
                 id="lightning"),
    pytest.param("runtime_import", {"torch.distributed.get_rank() == 0"},
                 id="ddp-without-distify"),
    pytest.param("runtime_alias", {"distify.is_main_process()"}, id="distify-runtime"),
]
PLAIN_DDP = ["ddp_tutorial", "ddp_tutorial_torchrun", "nanogpt", "optional_ddp", "runtime_import"]


def _check(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distify", "check", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env=clean_env(PYTHONPATH=str(REPO)))


def _fixed_copy(name: str, tmp_path):
    path = tmp_path / f"{name}.py"
    shutil.copyfile(FIX / f"{name}.in.py", path)
    return path, _check("--fix", path.name, cwd=tmp_path)


def _imports(text: str) -> list[str]:
    return sorted(ast.dump(node) for node in ast.walk(ast.parse(text))
                  if isinstance(node, (ast.Import, ast.ImportFrom)))


@pytest.mark.parametrize("name, guards", VOCABULARIES)
def test_fix_uses_the_files_vocabulary(name: str, guards: set[str], tmp_path) -> None:
    path, result = _fixed_copy(name, tmp_path)
    before = (FIX / f"{name}.in.py").read_text(encoding="utf-8")
    after = path.read_text(encoding="utf-8")
    expected = (FIX / f"{name}.out.py").read_text(encoding="utf-8")
    assert result.returncode == (1 if "# expect:" in expected else 0), result.stderr
    assert after == expected
    added = {line.removeprefix("+ ").strip().removeprefix("if ").removesuffix(":")
             for line in difflib.ndiff(before.splitlines(), after.splitlines())
             if line.startswith("+ ") and line[2:].lstrip().startswith("if ")}
    assert added == guards
    assert _imports(after) == _imports(before)  # no dependency added


@pytest.mark.parametrize("name", PLAIN_DDP)
def test_fixed_plain_ddp_script_needs_no_distify(name: str, tmp_path) -> None:
    path, _ = _fixed_copy(name, tmp_path)
    text = path.read_text(encoding="utf-8")
    assert "distify" not in text
    compile(text, str(path), "exec")
    again = _check(path.name, "--select", "DST101,DST102", cwd=tmp_path)
    assert again.stdout == ""
    assert again.returncode == 0, again.stderr


ACCELERATE_HELPERS = '''\
"""Post-processing helpers of an Accelerate script: there is no Accelerator in this file."""
import json
import os

from accelerate.logging import get_logger

logger = get_logger(__name__)


def save_predictions(predictions, output_dir):
    path = os.path.join(output_dir, "predictions.json")
    logger.info(f"Saving predictions to {path}.")
    with open(path, "w") as writer:
        json.dump(predictions, writer, indent=4)
'''


def test_no_fix_outside_the_files_vocabulary_is_reported_unfixable(tmp_path) -> None:
    path = tmp_path / "utils_qa.py"
    path.write_text(ACCELERATE_HELPERS, encoding="utf-8")
    report = _check(path.name, cwd=tmp_path)
    assert report.returncode == 1
    assert report.stdout.startswith("utils_qa.py:13:10: DST102 `open` ")
    assert "[*]" not in report.stdout and "fixable" not in report.stderr
    fixed = _check("--fix", path.name, cwd=tmp_path)
    assert fixed.returncode == 1
    assert "fixed 0 findings, 1 remaining" in fixed.stderr
    assert path.read_text(encoding="utf-8") == ACCELERATE_HELPERS


# --- how the guard is chosen, case by case (library calls, fast) ---------------------------

def _fix(source: str) -> str | None:
    """The source after ``--fix`` (None when no finding had a fix)."""
    source = textwrap.dedent(source)
    fixes = [finding.fix for finding in lint_text(source) if finding.fix]
    return apply_fixes(source, fixes) if fixes else None


def _guards(source: str) -> list[str] | None:
    fixed = _fix(source)
    if fixed is None:
        return None
    before = set(textwrap.dedent(source).splitlines())
    return [line.strip()[3:-1] for line in fixed.splitlines()
            if line not in before and line.lstrip().startswith("if ")]


@pytest.mark.parametrize("source, guards", [
    pytest.param("""
        import torch
        import torch.distributed as dist

        def save(model):
            torch.save(model.state_dict(), "model.pt")
    """, ["dist.get_rank() == 0"], id="import-as-dist"),
    pytest.param("""
        import torch
        from torch import distributed as td

        def save(model):
            torch.save(model.state_dict(), "model.pt")
    """, ["td.get_rank() == 0"], id="from-torch-import-distributed"),
    pytest.param("""
        import torch
        import torch.distributed

        def save(model):
            torch.save(model.state_dict(), "model.pt")
    """, ["torch.distributed.get_rank() == 0"], id="import-torch-distributed"),
    pytest.param("""
        import torch
        import torch.distributed as dist

        def main():
            dist.init_process_group("nccl")
            global_rank = dist.get_rank()
            train()
            torch.save(model.state_dict(), "model.pt")
    """, ["global_rank == 0"], id="rank-variable-in-scope"),
    pytest.param("""
        import torch
        import torch.distributed as dist

        def main_worker(rank, world_size):
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            torch.save(model.state_dict(), "model.pt")
    """, ["rank == 0"], id="spawned-rank-parameter"),
    pytest.param("""
        import torch
        import torch.distributed as dist

        def setup():
            dist.init_process_group("nccl")
            is_master = dist.get_rank() == 0
            rank = dist.get_rank()
            return rank

        def save(model):
            torch.save(model.state_dict(), "model.pt")
    """, ["dist.get_rank() == 0"], id="variables-of-another-function-are-not-used"),
    pytest.param("""
        import os
        import torch
        import torch.distributed as dist

        def main():
            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl")
            torch.save(model.state_dict(), "model.pt")
    """, ["dist.get_rank() == 0"], id="a-local-rank-is-not-the-main-process"),
    pytest.param("""
        import os
        import torch
        import torch.distributed as dist

        ddp = int(os.environ.get("RANK", -1)) != -1
        if ddp:
            dist.init_process_group("nccl")
        torch.save(model.state_dict(), "model.pt")
    """, ["not ddp or dist.get_rank() == 0"], id="ddp-flag"),
    pytest.param("""
        import torch
        from accelerate import Accelerator

        def evaluate(accelerator, model):
            torch.save(model.state_dict(), "eval.pt")
    """, ["accelerator.is_main_process"], id="accelerator-parameter"),
    pytest.param("""
        import torch
        from accelerate import Accelerator

        class Trainer:
            def __init__(self, model):
                self.accelerator = Accelerator()
                self.model = self.accelerator.prepare(model)

            def save(self):
                torch.save(self.model.state_dict(), "model.pt")
    """, ["self.accelerator.is_main_process"], id="accelerator-attribute"),
    pytest.param("""
        import torch
        import torch.distributed as dist
        from accelerate import Accelerator

        def main():
            accelerator = Accelerator()
            if dist.get_rank() == 0:
                print("start")
            torch.save(model.state_dict(), "model.pt")

        def export(accelerator, model):
            torch.save(model.state_dict(), "export.pt")
    """, ["accelerator.is_main_process", "accelerator.is_main_process"],
        id="one-style-per-file"),
    pytest.param("""
        import torch
        import lightning as L

        def save(fabric, model):
            torch.save(model.state_dict(), "model.pt")
    """, ["fabric.is_global_zero"], id="fabric-parameter"),
    pytest.param("""
        import torch
        from distify import runtime as rt

        model = rt.prepare(model)
        torch.save(rt.unwrap(model).state_dict(), "model.pt")
    """, ["rt.is_main_process()"], id="runtime-alias"),
    pytest.param("""
        import json
        import lightning.pytorch as pl
        from lightning.pytorch.utilities import rank_zero_only

        @rank_zero_only
        def log_hparams(hparams):
            print(hparams)

        class Model(pl.LightningModule):
            def on_train_end(self):
                with open("done.json", "w") as f:
                    json.dump({"epoch": self.current_epoch}, f)
    """, ["rank_zero_only.rank == 0"], id="rank-zero-only"),
])
def test_guard_choice(source: str, guards: list[str]) -> None:
    assert _guards(source) == guards


@pytest.mark.parametrize("source", [
    pytest.param("""
        import os
        import torch.distributed as dist

        def main():
            os.makedirs("out")
            dist.init_process_group("nccl")
    """, id="before-init-process-group"),
    pytest.param("""
        import torch
        import horovod.torch as hvd
        from torch.utils.data.distributed import DistributedSampler

        hvd.init()
        torch.save(model.state_dict(), "model.pt")
    """, id="horovod-has-no-torch-distributed-group"),
    pytest.param("""
        import torch
        import lightning as L

        def export(model):
            torch.save(model.state_dict(), "model.pt")
    """, id="lightning-without-trainer-in-scope"),
])
def test_no_fix_when_the_vocabulary_has_no_guard_here(source: str) -> None:
    findings = lint_text(textwrap.dedent(source))
    assert findings and not any(finding.fix for finding in findings)
