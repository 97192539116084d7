"""BatchNorm statistics under distify's runtime: after training, every rank evaluates with the
main process's running statistics, the ones its checkpoint holds.

A single-GPU script with BatchNorm (tests/fixtures/batchnorm/train_bn.py) is converted with the
CLI and run on 2 processes under torchrun (Gloo), each rank recording the statistics of every
eval-mode BatchNorm forward (record_eval_bn.py). Scripts written against the runtime cover
the rest: an evaluation on the main process only, gradient accumulation, buffers of other
dtypes; and plain torch DDP shows the failure these tests catch.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import FIXTURES, REPO, clean_env, result_line, run_python, run_torchrun

pytestmark = pytest.mark.pool

BATCHNORM = FIXTURES / "batchnorm"
SCRIPT = BATCHNORM / "train_bn.py"
RECORDER = BATCHNORM / "record_eval_bn.py"
LAYERS = ("features.1", "head.2")  # train_bn.Net's BatchNorm layers, in forward order
EPOCHS = 3
EVAL_SAMPLES = 101
TIMEOUT_S = 240  # a hang (a collective only some ranks reach) fails instead of waiting


def _convert(tmp: Path) -> Path:
    out = tmp / "train_bn_dist.py"
    subprocess.run([sys.executable, "-m", "distify", "convert", str(SCRIPT), "-o", str(out),
                    "--no-config"], check=True, capture_output=True, cwd=tmp)
    return out


def _recorded_run(tmp: Path, script: Path, *args: str, env: dict | None = None,
                  **torchrun: object) -> tuple[subprocess.CompletedProcess, list]:
    """Run ``script`` on 2 processes under the recorder: the job and each rank's records."""
    records = tmp / "records"
    records.mkdir()
    proc = run_torchrun(RECORDER, str(records), str(script), *args, nproc=2, cwd=tmp,
                        env=env or clean_env(PYTHONPATH=str(REPO)), timeout=TIMEOUT_S,
                        **torchrun)
    return proc, [json.loads((records / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _checkpoint_digests(path: Path) -> list[str]:
    """The recorder's digest of each BatchNorm layer's statistics in a saved state_dict."""
    digest = runpy.run_path(str(RECORDER))["buffers_digest"]
    state = torch.load(path)
    return [digest(SimpleNamespace(**{name: state[f"{layer}.{name}"] for name in (
        "running_mean", "running_var", "num_batches_tracked")})) for layer in LAYERS]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    return _convert(tmp_path_factory.mktemp("batchnorm_convert"))


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, converted):
    tmp = tmp_path_factory.mktemp("batchnorm_2proc")
    proc, records = _recorded_run(tmp, converted, str(tmp), replicas=True, distinct_data=True)
    return tmp, result_line(proc.stdout), records


def test_every_rank_evaluates_with_the_main_process_statistics(two_processes):
    _, _, (rank0, rank1) = two_processes
    # one entry per layer and epoch: constant within an evaluation (the main process's
    # sample forward included), changed by each epoch's training
    assert [len(layer) for layer in rank0] == [EPOCHS] * len(LAYERS)
    assert rank1 == rank0


def test_checkpoint_holds_what_every_rank_evaluated_with(two_processes):
    tmp, _, records = two_processes
    saved = _checkpoint_digests(tmp / "model.pt")
    for rank_records in records:
        assert [layer[-1] for layer in rank_records] == saved


def test_metric_equals_one_process_evaluating_the_checkpoint(two_processes):
    tmp, result, _ = two_processes
    alone = result_line(run_python(SCRIPT, str(tmp), "--evaluate", str(tmp / "model.pt"),
                                   cwd=tmp).stdout)
    last = result["epochs"][-1]
    assert last["correct"] == alone["correct"]
    assert last["loss"] == pytest.approx(alone["loss"], rel=1e-5)


def test_sample_on_the_main_process_only_needs_no_collective(tmp_path):
    # an eval forward under ``if distify.is_main_process():`` between epochs: the job ends
    # (no hang before TIMEOUT_S) and the ranks still evaluate with the same statistics
    _, records = _recorded_run(tmp_path, BATCHNORM / "sample_on_main.py", str(tmp_path),
                               replicas=True)
    assert len((tmp_path / "samples.txt").read_text().splitlines()) == 2
    main, other = records
    assert [len(layer) for layer in main] == [2, 2]  # each epoch's sample; the last evaluation
    assert [len(layer) for layer in other] == [1, 1]  # the last evaluation
    assert [layer[-1] for layer in other] == [layer[-1] for layer in main]


def test_world_size_1_is_bit_identical_to_the_original(tmp_path, converted):
    outputs = {}
    for name, script in (("original", SCRIPT), ("converted", converted)):
        out = tmp_path / name
        out.mkdir()
        outputs[name] = (out, result_line(run_python(script, str(out), cwd=tmp_path).stdout))
    (original, want), (ours, got) = outputs["original"], outputs["converted"]
    assert got == want
    assert (ours / "samples.txt").read_text() == (original / "samples.txt").read_text()
    saved, expected = torch.load(ours / "model.pt"), torch.load(original / "model.pt")
    assert saved.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(saved[key], value), key


def test_debug_mode_fingerprints_the_buffer_broadcast(tmp_path, converted):
    env = clean_env(PYTHONPATH=str(REPO), DISTIFY_DEBUG="1", DISTIFY_DEBUG_EVERY="1")
    _, (rank0, rank1) = _recorded_run(tmp_path, converted, str(tmp_path), "--epochs", "1",
                                      env=env, replicas=True)
    assert rank1 == rank0


def test_accumulation_ending_on_a_micro_step_without_sync(tmp_path):
    _, records = _recorded_run(tmp_path, BATCHNORM / "accumulate.py", str(tmp_path),
                               replicas=True)
    assert records[1] == records[0]
    assert [layer[-1] for layer in records[0]] == _checkpoint_digests(tmp_path / "model.pt")


def test_plain_ddp_ranks_evaluate_with_their_own_statistics(tmp_path):
    """What the tests above catch: with DDP's own buffer sync (at the start of a training
    forward), each rank keeps the statistics of its last batch."""
    _, (rank0, rank1) = _recorded_run(tmp_path, BATCHNORM / "plain_ddp.py")
    assert [len(layer) for layer in rank0] == [len(layer) for layer in rank1] == [2, 2]
    assert all(a != b for a, b in zip(rank0, rank1))


def test_buffers_of_every_dtype_are_the_main_process_after_a_training_step(tmp_path):
    # float64, float16, int8, int32 and a non-persistent float buffer, changed by each rank's
    # forward differently; ``wide`` is saved for the backward, which the write must not break
    run_torchrun(BATCHNORM / "buffer_kinds.py", str(tmp_path), nproc=2, cwd=tmp_path,
                 env=clean_env(PYTHONPATH=str(REPO)), timeout=TIMEOUT_S, replicas=True)
    rank0, rank1 = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    assert rank1 == rank0
    assert rank0["counters.wide"] == [1.0] * 3  # rank 0's own forward: + 1
    assert rank0["counters.count"] == 1
    # a BatchNorm in eval mode inside a training model keeps its statistics
    assert rank0["frozen.running_mean"] == [0.0] * 3 and rank0["frozen.num_batches_tracked"] == 0
