"""Exact resume (issue 14 item 3): ``distify.save_state`` / ``distify.load_state``.

``tests/fixtures/resume/resumable.py`` shuffles its data, draws an augmentation per sample,
uses dropout, AdamW and a StepLR, and saves its state every 3 steps; asked to, its last rank dies
(``os._exit``) after step 8, mid-epoch, once. Killed and restarted, the job must end with the
weights of a run that was never interrupted: bit for bit under DDP (one process and two,
restarted by ``distify launch --max_restarts 1``), and under FSDP (full and sharded state).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.pool

torch = pytest.importorskip("torch")

from distify.runtime import _checkpoint  # noqa: E402
from tests.helpers import (  # noqa: E402
    FIXTURES,
    REPO,
    check_replicas,
    clean_env,
    compare_state,
    flatten,
    replicas_env,
    result_line,
    run_python,
)

SCRIPT = FIXTURES / "resume" / "resumable.py"
KILL_AT = "8"  # mid-epoch (14 batches an epoch on 1 process, 7 on 2), 2 steps after a save


def _env(**extra: str) -> dict:
    return clean_env(PYTHONPATH=str(REPO), **extra)


def _launch(out, *options: str, kill: bool, env: dict | None = None):
    args = [sys.executable, "-m", "distify", "launch", "--cpu", "--num_processes", "2",
            *options, str(SCRIPT), str(out), *([KILL_AT] if kill else [])]
    proc = subprocess.run(args, cwd=out, env=env or _env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc


def _weights(folder) -> dict:
    return flatten(torch.load(folder / "final.pt", weights_only=True))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The weights of runs that were never killed: one process, and two under DDP."""
    one = tmp_path_factory.mktemp("one")
    run_python(SCRIPT, str(one), cwd=one, env=_env())
    two = tmp_path_factory.mktemp("two")
    replicas = two / "replicas"
    proc = _launch(two, kill=False, env=replicas_env(_env(), replicas))
    check_replicas(replicas, 2, distinct_data=True, output=proc.stderr)
    return {"one": _weights(one), "two": _weights(two),
            "two_steps": result_line(proc.stdout)["step"]}


def test_one_process_killed_and_run_again_ends_bit_identical(tmp_path, uninterrupted) -> None:
    killed = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), KILL_AT], cwd=tmp_path,
                            env=_env(), capture_output=True, text=True, timeout=300)
    assert killed.returncode == 1 and (tmp_path / "killed").exists()
    again = run_python(SCRIPT, str(tmp_path), KILL_AT, cwd=tmp_path, env=_env())
    assert "resumed at epoch 0, step 6" in again.stdout
    assert result_line(again.stdout)["ran"][0] == 7  # steps 7 and 8 are trained again
    compare_state(_weights(tmp_path), uninterrupted["one"], exact=True)


def test_two_processes_restarted_by_the_launcher_end_bit_identical(tmp_path,
                                                                   uninterrupted) -> None:
    proc = _launch(tmp_path, "--max_restarts", "1", kill=True)
    assert (tmp_path / "killed").exists()  # it really died, and the launcher restarted it
    assert "resumed at epoch 0, step 6" in proc.stdout
    assert result_line(proc.stdout)["step"] == uninterrupted["two_steps"]
    compare_state(_weights(tmp_path), uninterrupted["two"], exact=True)


@pytest.mark.parametrize("state_dict_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_fsdp_restarted_matches_the_uninterrupted_run(tmp_path, uninterrupted,
                                                      state_dict_type) -> None:
    proc = _launch(tmp_path, "--max_restarts", "1", "--use_fsdp", "--fsdp_state_dict_type",
                   state_dict_type, kill=True)
    assert (tmp_path / "killed").exists() and "resumed at epoch 0, step 6" in proc.stdout
    compare_state(_weights(tmp_path), uninterrupted["two"], exact=False, rtol=1e-5, atol=1e-6)
    state = tmp_path / "state"
    if state_dict_type == "SHARDED_STATE_DICT":
        # one shard per process (torch.distributed.checkpoint), turned into a plain file by
        # torch's own command, which loads into the plain model
        assert (state / "model_0").is_dir() and not (state / "model_0.pt").exists()
        subprocess.run([sys.executable, "-m", "torch.distributed.checkpoint.format_utils",
                        "dcp_to_torch", str(state / "model_0"), str(tmp_path / "model.pt")],
                       check=True, capture_output=True, timeout=120)
        plain = torch.load(tmp_path / "model.pt", weights_only=True)["model"]
    else:
        plain = torch.load(state / "model_0.pt", weights_only=True)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(16, 1))
    model.load_state_dict(plain)  # strict: the plain model's keys and shapes


def test_convert_says_how_to_resume_exactly_where_a_script_saves_its_training_state() -> None:
    from distify.convert.engine import convert_source

    source = FIXTURES / "idioms" / "checkpoint_resume.in.py"
    result = convert_source(source.read_bytes(), str(source))
    hints = [change for change in result.changes if "save_state" in change.message]
    # the dict with the optimizer's state, not the whole-model pickle saved beside it
    lines = result.output.decode().splitlines()
    assert [lines[change.line - 1].strip() for change in hints] == \
        ['distify.save(state, "./checkpoint/ckpt.pth")']
    assert "distify.load_state(folder)` after prepare" in hints[0].message
    assert b"save_state" not in result.output  # the script's own checkpoint stays


# ------------------------------------------------------------------ the folder, in one process


def _script(tmp_path, body: str):
    script = tmp_path / "job.py"
    script.write_text(
        "import json, sys, warnings\nimport torch\nimport distify.runtime as distify\n"
        "torch.manual_seed(0)\n"
        "model = distify.prepare(torch.nn.Linear(3, 2))\n" + body)
    return run_python(script, cwd=tmp_path, env=_env())


def test_no_folder_means_a_first_run_and_a_mismatch_is_one_line(tmp_path) -> None:
    out = _script(tmp_path, "print(distify.load_state('nothing-here'))\n"
                            "distify.save_state('st', epoch=3)\n"
                            "print(json.dumps(distify.load_state('st')))\n")
    assert out.stdout.splitlines() == ["None", '{"epoch": 3}']
    assert sorted(os.listdir(tmp_path / "st")) == ["distify_state.pt", "model_0.pt",
                                                   "random_0.pt"]
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p or ".old-" in p]
    mismatch = subprocess.run(
        [sys.executable, "-c", "import torch, distify.runtime as distify\n"
         "a, b = distify.prepare(torch.nn.Linear(3, 2), torch.nn.Linear(3, 2))\n"
         "distify.load_state('st')\n"], cwd=tmp_path, env=_env(), capture_output=True,
        text=True, timeout=120)
    assert mismatch.returncode == 1
    last = mismatch.stderr.strip().splitlines()[-1]
    assert last.endswith("does not match this run: 1 models saved, 2 prepared"), last


def test_a_crash_between_the_renames_leaves_the_previous_state_found(tmp_path) -> None:
    _script(tmp_path, "distify.save_state('st', step=1)\n")
    os.replace(tmp_path / "st", tmp_path / "st.old-abc")  # the new folder never arrived
    assert _checkpoint._existing(str(tmp_path / "st")) == str(tmp_path / "st.old-abc")
    out = _script(tmp_path, "print(json.dumps(distify.load_state('st')))\n")
    assert out.stdout.strip() == '{"step": 1}'


def test_another_number_of_processes_restores_the_weights_and_says_what_not(tmp_path) -> None:
    _script(tmp_path, "distify.save_state('st', step=5)\n")
    saved = torch.load(tmp_path / "st" / "distify_state.pt", weights_only=False)
    saved["world_size"] = 4  # as if saved by a job of 4
    torch.save(saved, tmp_path / "st" / "distify_state.pt")
    out = _script(tmp_path, "torch.nn.init.zeros_(model.weight)\n"
                            "with warnings.catch_warnings(record=True) as caught:\n"
                            "    warnings.simplefilter('always')\n"
                            "    print(json.dumps(distify.load_state('st')))\n"
                            "print(float(model.weight.abs().sum()) > 0)\n"
                            "print(caught[0].message)\n")
    lines = out.stdout.splitlines()
    assert lines[:2] == ['{"step": 5}', "True"]
    assert "saved by 4 process(es), this job has 1" in lines[2]
    assert "the data order and random numbers start anew" in lines[2]
