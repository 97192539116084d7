"""`distify verify` end to end: real runs (plain python and torchrun, Gloo on CPU).

Each verify makes 5 runs (two of them 2 processes), so the cases are batched: one correct
conversion, one conversion sabotaged four times (a print and a save on every rank, the training
loader unprepared, a metric reduction removed), one with the model unprepared and the runtime's
refusal turned off, one script that fails on its own, and usage errors, which start no run. The
hooks' loop caps and frozen weights are tested on plain ``python`` runs (no verify).
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

from tests.helpers import REPO, clean_env

EXAMPLE = REPO / "examples" / "train.py"
ARGS = ["--cpu", "--steps", "2", "--timeout", "240", "--json", "--", "--epochs", "1",
        "--save-model"]


def _verify(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distify", "verify", *args], cwd=cwd,
                          env=clean_env(), capture_output=True, text=True, timeout=900)


def _checks(proc: subprocess.CompletedProcess) -> dict[int, dict]:
    return {check["number"]: check for check in json.loads(proc.stdout)["checks"]}


def test_a_correct_conversion_passes_and_nothing_is_written_beside_it(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "train.py")
    proc = _verify("train.py", *ARGS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = _checks(proc)
    assert sorted(checks) == [1, 2, 3, 4, 5, 6, 7]
    assert all(check["ok"] for check in checks.values()), checks
    assert "synthetic_cnn.pt" in checks[1]["evidence"]  # the saved file was compared
    assert "8 parameters bit-identical on 2 ranks" in checks[2]["evidence"]
    # the "Test set: Average loss, Accuracy n/251" line: the test loop stays whole (--steps 2)
    assert checks[5]["evidence"] == ("1 line(s) printed after 1 evaluation loop(s), 3 number(s) "
                                     "equal within rtol 0.0001"), checks[5]
    # --steps 2: two optimizer steps in each run, one interval measured
    assert re.fullmatch(r"median time between optimizer steps: \d+\.\d ms \(the original, 1 "
                        r"process, \d+ threads?\), \d+\.\d ms \(rank 0 of the conversion, 2 "
                        r"processes, \d+ threads? each\)", checks[7]["evidence"]), checks[7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_sabotaged_conversion_fails_naming_the_checks_and_lines(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "train.py")
    subprocess.run([sys.executable, "-m", "distify", "convert", "train.py", "-o",
                    "train_dist.py", "--no-config"], cwd=tmp_path, env=clean_env(),
                   capture_output=True, timeout=120, check=True)
    source = (tmp_path / "train_dist.py").read_text()
    loader = "train_loader = distify.prepare(DataLoader("
    reduction = "        correct = distify.reduce(correct)\n"
    assert "distify.print(f\"Train Epoch" in source and "distify.save(" in source
    assert loader in source and reduction in source
    # four sabotages at once: a print guard removed, a save on every rank, the training
    # loader left unprepared (every rank then trains on the same batches), the reduction of
    # the test accuracy removed (rank 0 then counts its own shard only)
    sabotaged = source.replace("distify.print(f\"Train Epoch", "print(f\"Train Epoch") \
                      .replace("distify.save(", "torch.save(") \
                      .replace(loader, "train_loader = (DataLoader(") \
                      .replace(reduction, "")
    (tmp_path / "train_dist.py").write_text(sabotaged)
    save_line = 1 + sabotaged.splitlines().index(
        next(line for line in sabotaged.splitlines() if "torch.save(" in line))
    proc = _verify("train.py", "train_dist.py", *ARGS, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = _checks(proc)
    assert checks[1]["ok"] and checks[2]["ok"] and checks[6]["ok"], checks
    assert not checks[3]["ok"] and not checks[4]["ok"] and not checks[5]["ok"]
    evidence = checks[5]["evidence"]  # stdout: a Train Epoch line, a blank line, Test set
    assert evidence.startswith("stdout line 3 (after evaluation) differs: 'Test set: Average "
                               "loss:"), evidence
    assert "Accuracy: " in evidence and "/251' (rank 0 of the conversion on 2 processes, " \
        "frozen weights)" in evidence, evidence
    assert checks[3]["evidence"].startswith("ranks 0 and 1 fed Net the same batch"), checks[3]
    evidence = checks[4]["evidence"]
    assert "rank 1 printed" in evidence and "Train Epoch" in evidence, evidence
    assert f"rank 1 wrote synthetic_cnn.pt (train_dist.py:{save_line})" in evidence, evidence


def test_a_script_that_fails_on_its_own_is_nothing_to_verify(tmp_path):
    # a script that needs data it cannot find: its own error, then one line
    (tmp_path / "broken.py").write_text(
        "import torch\n\nmodel = torch.nn.Linear(2, 1)\nstate = torch.load('data/weights.pt')\n")
    proc = _verify("broken.py", "--cpu", cwd=tmp_path)
    assert proc.returncode == 1
    assert "FileNotFoundError" in proc.stderr and "data/weights.pt" in proc.stderr
    assert proc.stderr.rstrip().endswith("nothing to verify"), proc.stderr
    assert "✓" not in proc.stdout and "✗" not in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["missing.py"], "missing.py: script not found"),
    (["train.py", "--num_processes", "1"], "--num_processes"),
    (["train.py", "--epochs", "1"], "No such option '--epochs'"),
    (["train.py", "--steps", "0"], "--steps"),
], ids=["missing-script", "one-process", "script-option-before-dashes", "zero-steps"])
def test_usage_errors_exit_2(tmp_path, args, message):
    shutil.copy(EXAMPLE, tmp_path / "train.py")
    proc = _verify(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_a_hang_is_stopped_showing_where_each_rank_waited_and_a_changed_print_fails_check_1(
        tmp_path):
    # at world size 1 no torch is imported (the runs start fast) and the conversion prints
    # another number; on 2 processes rank 1 never reaches the all-reduce rank 0 waits in
    (tmp_path / "job.py").write_text("print('done', 0.5)\n")
    (tmp_path / "job_dist.py").write_text(textwrap.dedent("""\
        import os
        import time

        if os.environ.get("RANK") is not None:
            import torch
            import torch.distributed as dist
            dist.init_process_group("gloo")
            if dist.get_rank() == 1:
                time.sleep(3600)
            dist.all_reduce(torch.ones(1))
        if os.environ.get("RANK", "0") == "0":
            print("done", 0.25)
    """))
    proc = _verify("job.py", "job_dist.py", "--cpu", "--timeout", "60", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    output = json.loads(proc.stdout)
    assert [run["timed_out"] for run in output["runs"]] == [False, False, True]
    checks = _checks(proc)
    assert not checks[6]["ok"]
    evidence = checks[6]["evidence"]
    assert evidence.startswith("the conversion on 2 processes was still running after 60 s "
                               "and was stopped; rank 0 at job_dist.py:10, waiting in "), evidence
    # the collective rank 0 waited in, in torch, and the line rank 1 was at
    assert re.search(r"rank 0 at job_dist.py:10, waiting in \w+ \(torch/distributed/\S+\.py:"
                     r"\d+\); rank 1 at job_dist.py:9$", evidence), evidence
    assert checks[2]["evidence"] == "not checked: the conversion on 2 processes timed out"
    assert checks[5]["evidence"] == checks[2]["evidence"]  # no frozen pair after a hang
    assert checks[1]["evidence"] == ("stdout line 1 differs: 'done 0.5' (original) vs "
                                     "'done 0.25' (conversion)")


def test_a_run_writing_through_a_linked_big_file_writes_a_copy_never_the_users_file(tmp_path):
    """verify links files of 16 MiB or more into its copies; a run that writes one (open,
    torch.save) must get a copy of its own in the link's place."""
    from distify.verify import runs

    home, run = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    (home / "big.bin").write_bytes(b"user data")
    (home / "ckpt.pt").write_bytes(b"user checkpoint")
    (home / "train.py").write_text(textwrap.dedent("""\
        import torch
        with open("big.bin", "wb") as f:
            f.write(b"run output")
        torch.save({"w": torch.ones(2)}, "ckpt.pt")
        print(open("big.bin", "rb").read().decode(), torch.load("ckpt.pt")["w"].tolist())
    """))
    real_threshold = runs._LINK_FROM
    runs._LINK_FROM = 1  # link every file, as verify links big ones
    try:
        runs.copy_folder(home, run)
    finally:
        runs._LINK_FROM = real_threshold
    assert (run / "big.bin").is_symlink() and (run / "ckpt.pt").is_symlink()
    records = tmp_path / "records"
    records.mkdir()
    env = {**os.environ, "PYTHONPATH": str(runs.HOOKS), "DISTIFY_VERIFY_DIR": str(records),
           "DISTIFY_VERIFY_SCRIPT": str(run / "train.py")}
    proc = subprocess.run([sys.executable, "train.py"], cwd=run, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "run output [1.0, 1.0]"
    assert (home / "big.bin").read_bytes() == b"user data"
    assert (home / "ckpt.pt").read_bytes() == b"user checkpoint"
    assert not (run / "big.bin").is_symlink() and not (run / "ckpt.pt").is_symlink()


def test_a_model_left_unprepared_with_the_refusal_turned_off_fails_check_2(tmp_path):
    shutil.copy(EXAMPLE, tmp_path / "train.py")
    subprocess.run([sys.executable, "-m", "distify", "convert", "train.py", "-o",
                    "train_dist.py", "--no-config"], cwd=tmp_path, env=clean_env(),
                   capture_output=True, timeout=120, check=True)
    source = (tmp_path / "train_dist.py").read_text()
    prepare = "    model, optimizer = distify.prepare(model, optimizer)\n"
    assert prepare in source
    source = source.replace(prepare, "")
    (tmp_path / "train_dist.py").write_text(source)
    env = {**clean_env(), "DISTIFY_ALLOW_UNSYNCED": "1"}  # distify/runtime/_guard.py's refusal
    proc = subprocess.run([sys.executable, "-m", "distify", "verify", "train.py",
                           "train_dist.py", *ARGS], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = _checks(proc)
    assert not checks[2]["ok"], checks
    # the first epoch end where the replicas differ, the loop's line and the first parameter
    loop = 1 + source.splitlines().index(
        "    for batch_idx, (data, target) in enumerate(train_loader):")
    assert checks[2]["evidence"].startswith(
        "rank 1 differs from rank 0 at the end of training epoch 1 (the loop over the "
        f"DataLoader at train_dist.py:{loop}): first Net."), checks[2]
    assert checks[1]["ok"] and checks[3]["ok"] and checks[6]["ok"], checks


def test_the_hooks_cap_training_loops_keep_evaluation_whole_and_freeze_weights(tmp_path):
    """--steps caps training loops only, --eval-steps evaluation loops; a frozen run undoes
    optimizer steps, keeps BatchNorm statistics and records the lines printed after evaluation."""
    from distify.verify import runs

    (tmp_path / "job.py").write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader

        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        before = [p.clone() for p in model.parameters()], model[1].running_mean.clone()
        opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", enabled=True)
        loader = DataLoader(torch.randn(40, 2), batch_size=4)
        model.train()
        trained = 0
        for x in loader:
            trained += 1
            opt.zero_grad()
            scaler.scale(model(x).square().mean()).backward()
            scaler.step(opt)
            scaler.update()
        print("trained", trained)
        model.eval()
        with torch.no_grad():
            evaluated = sum(1 for x in loader)
        print("evaluated", evaluated)
        evaluated = sum(1 for x in loader)  # eval mode, gradients on: evaluation too
        same = all(torch.equal(a, b) for a, b in zip(before[0], model.parameters()))
        print("unchanged", same, torch.equal(before[1], model[1].running_mean), evaluated)
        print("draw", torch.rand(1).item())  # unseeded: the hooks seed every run alike
    """))
    outputs = {}
    for name, extra in [("capped", {"DISTIFY_VERIFY_STEPS": "2"}),
                        ("frozen", {"DISTIFY_VERIFY_STEPS": "3", "DISTIFY_VERIFY_EVAL_STEPS": "4",
                                    "DISTIFY_VERIFY_FROZEN": "1"})]:
        records = tmp_path / name
        records.mkdir()
        env = {**clean_env(), "PYTHONPATH": str(runs.HOOKS), "DISTIFY_VERIFY_DIR": str(records),
               "DISTIFY_VERIFY_SCRIPT": str(tmp_path / "job.py"), **extra}
        proc = subprocess.run([sys.executable, "job.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outputs[name] = proc.stdout, json.loads((records / "rank0.json").read_text())
    draws = {name: output[0].splitlines()[-1] for name, output in outputs.items()}
    assert draws["capped"] == draws["frozen"], draws
    stdout, record = outputs["capped"]
    stdout = stdout.removesuffix(draws["capped"] + "\n")
    assert stdout == "trained 2\nevaluated 10\nunchanged False False 10\n"
    assert "after_eval" in record and record["after_eval"] == []  # recorded in frozen runs only
    stdout, record = outputs["frozen"]
    stdout = stdout.removesuffix(draws["frozen"] + "\n")
    assert stdout == "trained 3\nevaluated 4\nunchanged True True 4\n"
    assert record["evaluations"] == 2
    # stdout lines from index 0: "evaluated 4" (1) was printed after the first evaluation
    # loop, up to the second's start; "unchanged ..." (2) after the second, to the end
    assert record["after_eval"] == [[1, 2], [2, None]], record


def test_a_notebooks_lines_are_named_by_cell():
    """verify's evidence names a line of a notebook's conversion as its cell and line there
    (the conversion keeps the cell markers); other lines and names are left as they are."""
    from distify.notebook import parse_notebook, to_script
    from distify.verify.checks import Check
    from distify.verify.session import _in_cells

    cells = [{"cell_type": "code", "metadata": {}, "source": ["import torch\n"], "outputs": [],
              "execution_count": None},
             {"cell_type": "markdown", "metadata": {}, "source": ["# Train"]},
             {"cell_type": "code", "metadata": {}, "source": ["x = 1\n", "open('o.txt', 'w')\n"],
              "outputs": [], "execution_count": None}]
    raw = json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells})
    text = to_script(parse_notebook(raw.encode(), "nb.ipynb")).text
    line = 1 + text.splitlines().index("open('o.txt', 'w')")
    check = Check(4, "only the main process printed and wrote files", False,
                  f"rank 1 wrote o.txt (nb_dist.py:{line}); train.py:{line} is not it")
    mapped = _in_cells(check, "nb_dist.py", text, "nb.ipynb", converted_here=True)
    assert mapped.evidence == ("rank 1 wrote o.txt (nb.ipynb cell 3, line 2 of its "
                               f"conversion); train.py:{line} is not it")
    given = _in_cells(check, "nb_dist.py", text, "nb_dist.ipynb", converted_here=False)
    assert given.evidence.startswith("rank 1 wrote o.txt (nb_dist.ipynb cell 3, line 2);")
