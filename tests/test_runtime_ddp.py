"""The runtime under torchrun with 2 processes (Gloo): exact metrics over uneven shards, one
writer, the prepared model still behaving like the user's model. One launch, many checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import REPO, clean_env, run_torchrun

pytestmark = pytest.mark.pool

SCRIPT = REPO / "tests" / "runtime_scripts" / "ddp_checks.py"
SAMPLES = 251


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_checks")
    # the first training forward reads a sharded loader: each rank its own batch
    proc = run_torchrun(SCRIPT, str(out), nproc=2, cwd=out, replicas=True, distinct_data=True)
    results: dict[str, list[dict]] = {}
    for rank in (0, 1):
        for line in (out / f"results-rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            results.setdefault(record["check"], []).append(record)
    return proc, results


def _both(results, check):
    records = results[check]
    assert [r["rank"] for r in records] == [0, 1]
    return records


def test_eval_mode_counts_are_exact(run):
    _, results = run
    for record in _both(results, "eval"):
        assert record["correct"] == record["reference"]
        assert record["seen"] == SAMPLES  # no padding: 126 + 125 samples
        assert record["ids"] == list(range(SAMPLES))  # gather_for_metrics: each sample once
        assert record["batches"] == record["len"] == 6  # ranks stay in step


def test_shuffled_loader_evaluated_has_exact_shards(run):
    _, results = run
    for record in _both(results, "eval_shuffled"):
        assert record["seen"] == SAMPLES  # evaluation never repeats a sample, shuffled or not
        assert sorted(record["ids"]) == list(range(SAMPLES))
        assert record["batches"] == record["len"] == 6


def test_loader_with_worker_processes_is_sharded_exactly(run):
    _, results = run
    for record in _both(results, "eval_workers"):
        assert record["correct"] == record["reference"]
        assert record["seen"] == SAMPLES
        assert sorted(record["ids"]) == list(range(SAMPLES))
        assert record["batches"] == record["len"] == 6


def test_padded_train_mode_gather_for_metrics_is_exact(run):
    _, results = run
    for record in _both(results, "train_mode_training"):
        assert record["seen"] == SAMPLES + 1  # one sample repeated to even out the shards
        assert record["ids"] == list(range(SAMPLES))  # ... and dropped by gather_for_metrics
        assert record["batches"] == record["len"] == 6


def test_custom_batch_sampler_is_sharded_by_batches(run):
    _, results = run
    for record in _both(results, "batch_sampler"):
        assert record["seen"] == SAMPLES
        assert record["ids"] == list(range(SAMPLES))
        assert record["batches"] == record["len"] == 7  # 13 batches of 20 over 2 ranks


def test_ddp_averages_gradients_and_scheduler_steps_once(run):
    _, results = run
    for record in _both(results, "ddp"):
        assert record["weights_equal"]
        assert record["last_epoch"] == 3
        assert record["lr"] == 0.5 / 4
        assert record["step_was_skipped"] is False


def test_sync_gradients_controls_averaging(run):
    _, results = run
    for record in _both(results, "accumulation"):
        assert record["unsynced_differ"] and record["synced_equal"]


def test_prepared_model_is_still_the_users_model(run):
    _, results = run
    for record in _both(results, "model"):
        assert record["isinstance"] and record["type_name"] == "Net"
        assert record["fc_out"] == 3 and record["embed_shape"] == [2, 3]
        assert record["module_is_model"] and record["unwrap_is_model"]
        assert record["keys_unchanged"]
        assert record["pickled_class_is_original"] and record["pickled_equal"]
        assert record["pickled_private_state"] == []
        assert record["own_module_child"]
        assert record["prepare_twice"]


def test_collectives_on_numbers_and_uneven_tensors(run):
    _, results = run
    for record in _both(results, "collectives"):
        assert record["sum_int"] == 3 and record["sum_type"] == "int"
        assert record["max_int"] == 1 and record["mean_float"] == 0.5
        assert record["tensor_sum"] == [1, 2]
        assert record["uneven"] == [[0, 0]] * 2 + [[1, 1]] * 3
        assert record["objects"] == ["r0", "r1", "r1"]
        assert record["broadcast"] == "run-0"
    numbers = results.get("numpy numbers", [])
    assert len(numbers) in (0, 2)  # none where NumPy is not installed
    for record in numbers:
        assert (record["mean"], record["mean_type"]) == (0.5, "float32")
        assert (record["total"], record["total_type"]) == (3, "int64")


def test_only_the_main_process_writes_and_prints(run):
    proc, results = run
    assert proc.stdout.count("hello from rank") == 1
    assert "hello from rank 0" in proc.stdout
    rank0, rank1 = _both(results, "writer")
    assert rank0["files"] == rank1["files"] == ["from_rank0.pt"]
    assert rank0["world_size"] == 2
    # main_process_first: rank 0 ran the body (and created the marker) before rank 1.
    assert rank0["saw_marker"] is False and rank1["saw_marker"] is True


def test_load_after_save_waits_and_trackers_live_on_the_main_process(run):
    _, results = run
    rank0, rank1 = _both(results, "resume_and_trackers")
    assert rank0["step"] == rank1["step"] == 7
    assert rank0["weight_equal"] and rank1["weight_equal"]
    assert rank0["tracker_real"] and rank0["tracker_truthy"]
    assert not rank1["tracker_real"] and not rank1["tracker_truthy"]
    assert rank1["tracker_chain"] is True


def test_saving_on_the_main_process_only_never_waits_for_the_others(run):
    _, results = run
    for record in _both(results, "main_process_saves"):
        assert (record["guarded_step"], record["ranks_after_guarded"]) == (8, 2)
        assert record["eager_step"] == 9
    assert results["main_process_saves"][0]["rank0_waited_for_rank1"] is False


def test_shared_generator_draws_the_main_processs_split_on_every_rank(run):
    rank0, rank1 = _both(run[1], "shared_generator")
    assert (rank0["train"], rank0["val"]) == (rank1["train"], rank1["val"])
    assert sorted(rank0["train"] + rank0["val"]) == list(range(20))
    # the main process's draw and its generator afterwards are the original script's
    assert rank0["same_as_plain"] and rank0["same_state_after"]
    assert not rank1["same_as_plain"]  # left to its own generator, rank 1 splits differently
    # and after the draw every rank's generator goes on as the main process's
    assert rank0["state_after"] == rank1["state_after"]
    first0, first1 = _both(run[1], "shared_generator_first")
    assert first0["train"] == first1["train"]  # also inside main_process_first


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are listed from /proc")
def test_gloo_threads_are_gone_before_interpreter_shutdown(run):
    # Gloo's worker threads still running while Python shuts down can abort a finished rank
    # ("terminate called without an active exception"), which fails the whole job.
    for record in _both(run[1], "threads_at_exit"):
        assert not [name for name in record["names"] if "gloo" in name], record


def test_a_load_waiting_for_a_save_never_made_fails_after_the_timeout(tmp_path):
    # 10 s, not less: the timeout also bounds starting the group on a loaded machine
    script = REPO / "tests" / "runtime_scripts" / "save_never_written.py"
    proc = run_torchrun(script, cwd=tmp_path, env=clean_env(DISTIFY_TIMEOUT="10"), timeout=120)
    assert "caught: waited 10 s for the main process to finish saving never.pt" in proc.stdout
