"""Streamed sharding (issue 12, items 3 and 4): samplers too large to materialise, and
IterableDatasets.

In process: the streamed plan equals the one-shot plan distify computed before (kept below as
the reference) for every small case, chunked or not; a 10**10-sample sampler is drawn only as
far as it is consumed. Under torchrun (2 processes, Gloo), ``tests/fixtures/streams/draw.py``
records the samples of every batch on each rank, and a plain ``python`` run of the same script
with batches twice as large is the single-process reference.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

import distify.runtime as distify
from distify.runtime import _data, _state
from tests.helpers import FIXTURES, clean_env, run_python, run_torchrun, simulated_rank

pytestmark = pytest.mark.pool

SCRIPT = FIXTURES / "streams" / "draw.py"


# --- the one-shot plan (distify before streaming), the reference for the streamed one ----------

def one_shot_plan(units, rank, world, batch, drop_last, train):
    """Every unit of the epoch at once: pad by repeating the start (TRAIN), stride, chunk into
    batches, split a short rank's last batch (EVAL). ``batch=None``: the units are batches."""
    size = batch or 1
    if drop_last:
        units = units[:len(units) - len(units) % (world * size)]
    count, repeated = len(units), [False] * len(units)
    if train and count % world:
        extra = world - count % world
        units = units + (units * math.ceil(extra / count))[:extra]
        repeated += [True] * extra
    own, flags = units[rank::world], repeated[rank::world]
    if batch is None:
        batches = [(list(u), len(u) if r else 0) for u, r in zip(own, flags)]
    else:
        batches = [(own[i:i + batch], sum(flags[i:i + batch])) for i in range(0, len(own), batch)]
    target = math.ceil(math.ceil(count / world) / size)
    if not train and len(batches) < target and batches and len(batches[-1][0]) > 1:
        last, _ = batches.pop()
        batches += [(last[:-1], 0), (last[-1:], 0)]
    return batches


@pytest.fixture
def sharding(monkeypatch):
    """Plans as rank r of a job would compute them, in this process (the order is this rank's
    own draw: the same seed on every rank stands in for the broadcast)."""
    monkeypatch.setattr(_state, "_RUNTIME", _state.Runtime())
    monkeypatch.setattr(_data, "_broadcast_from_main", lambda units: units)

    def plan(loader, rank, world, train, chunk):
        monkeypatch.setattr(_data, "CHUNK", chunk)
        monkeypatch.setattr(_data._model, "any_model_training", lambda: train)
        shard = _data._ShardSampler.for_loader(loader)
        shard.rank, shard.world_size = rank, world
        with torch.set_grad_enabled(train):
            batches = list(shard)
        return batches, shard.pads, len(shard)

    return plan


def _seeded(count):
    return RandomSampler(range(count), generator=torch.Generator().manual_seed(11))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("mode", ["eval", "train", "drop_last"])
@pytest.mark.parametrize("chunk", [1, 7, 1 << 16], ids=["chunk-1-batch", "chunk-7", "one-chunk"])
def test_streamed_plan_is_the_one_shot_plan(sharding, world, mode, chunk):
    for count in range(1, 45, 3 if chunk == 1 << 16 else 1):
        for batch in (1, 2, 5):
            order = list(_seeded(count))
            for rank in range(world):  # each rank its own loader, seeded alike
                loader = DataLoader(range(count), batch_size=batch, sampler=_seeded(count),
                                    drop_last=mode == "drop_last")
                got, pads, length = sharding(loader, rank, world, mode != "eval", chunk)
                want = one_shot_plan(order, rank, world, batch, mode == "drop_last",
                                     mode != "eval")
                assert list(zip(got, pads)) == want, (count, batch, rank)
                if mode != "eval":
                    assert length == len(got), (count, batch, rank)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_streamed_plan_of_a_batch_sampler_is_the_one_shot_plan(sharding, mode):
    for count in range(1, 60):
        order = list(BatchSampler(_seeded(count), batch_size=4, drop_last=False))
        for rank in range(3):
            sampler = BatchSampler(_seeded(count), batch_size=4, drop_last=False)
            loader = DataLoader(range(count), batch_sampler=sampler)
            got, pads, _ = sharding(loader, rank, 3, mode == "train", chunk=4)
            assert list(zip(got, pads)) == one_shot_plan(order, rank, 3, None, False,
                                                         mode == "train"), (count, rank)


class Counted(Sampler):
    """A sampler that counts what was drawn from it."""

    def __init__(self, sampler):
        self.sampler, self.drawn = sampler, 0

    def __len__(self):
        return len(self.sampler)

    def __iter__(self):
        for index in self.sampler:
            self.drawn += 1
            yield index


def test_a_huge_sampler_is_drawn_only_as_far_as_it_is_consumed(sharding):
    sampler = Counted(RandomSampler(range(1000), replacement=True, num_samples=10**10,
                                    generator=torch.Generator().manual_seed(3)))
    loader = DataLoader(range(1000), batch_size=64, sampler=sampler)
    shard = _data._ShardSampler.for_loader(loader)
    shard.rank, shard.world_size = 1, 2
    assert len(shard) == 10**10 // 128  # without drawing anything
    assert sampler.drawn == 0
    batches = iter(shard)
    first = [next(batches) for _ in range(3)]
    assert sampler.drawn == _data.CHUNK  # one chunk of the order, not the epoch
    reference = list(RandomSampler(range(1000), replacement=True, num_samples=3 * 128,
                                   generator=torch.Generator().manual_seed(3)))
    assert first == [reference[k * 128 + 1:(k + 1) * 128:2] for k in range(3)]


class Numbers(IterableDataset):
    def __init__(self, count):
        self.count = count

    def __iter__(self):
        return iter(range(self.count))


class Sized(Numbers):
    def __len__(self):
        return self.count


def test_an_iterable_loader_has_a_length_only_when_its_dataset_has_one(monkeypatch):
    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(1))
    with pytest.raises(TypeError):
        len(distify.prepare(DataLoader(Numbers(10), batch_size=2)))
    assert len(distify.prepare(DataLoader(Sized(11), batch_size=2))) == 3  # 6 samples on rank 0
    assert len(distify.prepare(DataLoader(Sized(11), batch_size=2, drop_last=True))) == 2
    prepared = distify.prepare(DataLoader(Sized(11), batch_size=2))
    assert prepared.dataset.count == 11 and len(prepared.dataset) == 11  # the user's dataset


def test_the_sharded_stream_reads_and_sets_the_users_dataset(monkeypatch):
    """A worker_init_fn configures ``get_worker_info().dataset``: the sharded stream's."""
    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(1))
    dataset = Numbers(10)
    stream = distify.prepare(DataLoader(dataset, batch_size=2))._loader.dataset
    assert stream.count == 10
    stream.count = 6
    assert dataset.count == 6
    assert [(batch.tolist(), pad) for batch, pad, _ in stream] == [([1, 3], 0), ([5], 0)]


# --- two processes ------------------------------------------------------------------------------

def _records(directory: Path) -> dict[str, list[list[dict]]]:
    """case -> that case's records, one list per rank, in the order they were written."""
    by_case: dict[str, list[list[dict]]] = {}
    for path in sorted(directory.glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        for line in path.read_text().splitlines():
            record = json.loads(line)
            per_rank = by_case.setdefault(record["case"], [])
            while len(per_rank) <= rank:
                per_rank.append([])
            per_rank[rank].append(record)
    return by_case


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    single, job = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("job")
    run_python(SCRIPT, str(single), "--scale", "2", "--chunk", "24", cwd=single)
    proc = run_torchrun(SCRIPT, str(job), "--chunk", "24", nproc=2, cwd=job, timeout=240)
    return _records(single), _records(job), proc


def _cases(runs, case):
    single, job, _ = runs
    (reference,), (rank0, rank1) = single[case], job[case]
    return list(zip(reference, rank0, rank1))


def test_huge_sampler_ranks_draw_the_single_process_batches(runs):
    for reference, rank0, rank1 in _cases(runs, "huge"):
        assert rank0["len"] == rank1["len"] == reference["len"] == 10**10 // 8
        assert len(rank0["batches"]) == len(rank1["batches"]) == 7
        for step, (a, b) in enumerate(zip(rank0["batches"], rank1["batches"])):
            assert sorted(a + b) == sorted(reference["batches"][step]), step


def test_streamed_ordinary_loaders_keep_the_single_process_batches(runs):
    for reference, rank0, rank1 in _cases(runs, "ordinary"):
        case = {key: rank0[key] for key in ("shuffle", "drop_last", "mode")}
        assert reference["epochs"][0] != reference["epochs"][1] or not case["shuffle"], case
        for (want, _), (got0, pads0), (got1, pads1) in zip(
                reference["epochs"], rank0["epochs"], rank1["epochs"]):
            assert len(got0) == len(got1) == rank0["len"], case  # ranks in step, len right
            order = [i for batch in want for i in batch]
            if case["mode"] == "train":  # global batch k is the single-process batch k
                padded = (order + order[:1])[:len(got0) * 8] if not case["drop_last"] else order
                for step, (a, b) in enumerate(zip(got0, got1)):
                    assert sorted(a + b) == sorted(padded[step * 8:step * 8 + 8]), (case, step)
                repeated = sum(pads0) + sum(pads1)
                assert repeated == (0 if case["drop_last"] else 1), case
            else:  # every sample exactly once, in the single-process batches but the last two
                assert sorted(i for batch in got0 + got1 for i in batch) == sorted(order), case
                for step in range(len(got0) - 2):
                    assert sorted(got0[step] + got1[step]) == sorted(want[step]), (case, step)
                assert not any(pads0 + pads1), case


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset_is_sharded_without_duplicates(runs, workers):
    for reference, rank0, rank1 in _cases(runs, "iterable"):
        if rank0["workers"] != workers:
            continue
        stream = sorted(i for batch in reference["batches"] for i in batch)
        assert stream == list(range(23))
        assert len(rank0["batches"]) == len(rank1["batches"])  # the ranks end together
        drawn = [(b, p) for r in (rank0, rank1) for b, p in zip(r["batches"], r["pads"])]
        kept = sorted(i for batch, pad in drawn for i in batch[:len(batch) - pad])
        assert kept == stream, rank0["mode"]  # padding aside, every sample exactly once
        if rank0["mode"] == "eval":
            assert not any(pad for _, pad in drawn)
        assert sorted(rank0["gathered"]) == sorted(rank1["gathered"]) == stream


def test_iterable_evaluation_sum_reduced_equals_the_single_process_sum(runs):
    for reference, rank0, rank1 in _cases(runs, "iterable_sum"):
        assert rank0["total"] == rank1["total"] == reference["total"] == sum(
            i * i for i in range(1001))
        assert rank0["seen"] == rank1["seen"] == 1001


def test_streams_of_unequal_length_end_together_with_a_warning(runs):
    _, job, proc = runs
    rank0, rank1 = (records[0] for records in job["uneven"])
    assert len(rank0["batches"]) == len(rank1["batches"]) == 3  # rank 0's 10 samples, batch 4
    assert "ran out first" in proc.stderr and "shard=False" in proc.stderr


def test_a_dataset_that_shards_itself_is_warned_about_and_kept_whole_with_shard_false(runs):
    _, job, proc = runs
    rank0, rank1 = (records[0] for records in job["self_sharded"])
    assert "starts with different samples on different ranks" in proc.stderr
    kept = sorted(i for r in (rank0, rank1) for batch in r["kept"] for i in batch)
    assert kept == list(range(30))


def test_the_job_runs_under_debug_mode(tmp_path):
    """Every collective of the streamed order and of the iterable loaders is fingerprinted."""
    run_torchrun(SCRIPT, str(tmp_path), "--chunk", "24", "--cases", "huge,iterable,uneven",
                 nproc=2, cwd=tmp_path, env=clean_env(DISTIFY_DEBUG="1"), timeout=240)
    rank0, rank1 = _records(tmp_path)["huge"]
    assert rank0[1]["batches"] and rank0[1]["batches"] != rank1[1]["batches"]
