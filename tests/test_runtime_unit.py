"""In-process checks of the runtime in a single process: configuration errors, atomic saves, the
sharding plan, and what ``prepare`` returns. Multi-process behaviour is in test_runtime_ddp.py."""

from __future__ import annotations

import collections
import copy
import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, TensorDataset

import distify.runtime as distify
from distify.runtime import _data, _state, _tree
from tests.helpers import REPO, clean_env, simulated_rank

LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT")


@pytest.fixture
def fresh(monkeypatch):
    """A runtime that has not been initialised yet, in an environment without a launcher."""
    for name in list(os.environ):
        if name in LAUNCHER_VARIABLES or name.startswith(("DISTIFY_", "ACCELERATE_")):
            monkeypatch.delenv(name)
    monkeypatch.setattr(_state, "_RUNTIME", _state.Runtime())
    return monkeypatch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


# --- configuration errors: one line, naming the variable and the fix ------------------------------

@pytest.mark.parametrize("env, expected", [
    pytest.param({"RANK": "3", "WORLD_SIZE": "2"}, ["RANK=3", "0..1", "torchrun"],
                 id="rank-too-big"),
    pytest.param({"RANK": "abc", "WORLD_SIZE": "2"}, ["RANK='abc'", "not an integer"],
                 id="rank-not-int"),
    pytest.param({"WORLD_SIZE": "2"}, ["RANK is not"], id="rank-missing"),
    pytest.param({"RANK": "1", "WORLD_SIZE": "2"}, ["MASTER_ADDR"], id="no-master-addr"),
    pytest.param({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1",
                  "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, ["LOCAL_RANK=2"],
                 id="local-rank-too-big"),
    pytest.param({"DISTIFY_MIXED_PRECISION": "fp8"}, ["'fp8'", "DISTIFY_MIXED_PRECISION",
                                                      "no, fp16, bf16"], id="unknown-precision"),
    pytest.param({"ACCELERATE_MIXED_PRECISION": "FP32"}, ["'fp32'", "ACCELERATE_MIXED_PRECISION"],
                 id="unknown-accelerate-precision"),
    pytest.param({"DISTIFY_TIMEOUT": "soon"}, ["DISTIFY_TIMEOUT='soon'"], id="bad-timeout"),
])
def test_bad_environment_is_one_line_error(fresh, env, expected):
    for name, value in env.items():
        fresh.setenv(name, value)
    with pytest.raises(distify.DistifyError) as caught:
        distify.init()
    message = str(caught.value)
    assert isinstance(caught.value, RuntimeError)
    assert "\n" not in message
    for part in expected:
        assert part in message


def test_reset_forgets_the_settings_and_everything_prepared(fresh):
    from distify.runtime import _prepare, _strategy

    fresh.setenv("DISTIFY_MIXED_PRECISION", "bf16")
    model, optimizer = distify.prepare(Net(), torch.optim.SGD(Net().parameters(), lr=0.1))
    assert distify.mixed_precision() == "bf16" and _strategy.current().name == "ddp"
    assert _prepare.prepared().live("models") == [model]
    _state.reset()
    fresh.setenv("DISTIFY_MIXED_PRECISION", "no")
    fresh.setenv("DISTIFY_STRATEGY", "fsdp")
    assert _state.current().settings is None  # read again on first use
    assert distify.mixed_precision() == "no" and _strategy.current().name == "fsdp"
    assert _prepare.prepared().live("models") == []
    fresh.setenv("DISTIFY_STRATEGY", "zero3")
    _state.reset()
    with pytest.raises(distify.DistifyError, match=r"unknown strategy 'zero3' \(from "
                                                   r"DISTIFY_STRATEGY\): use one of ddp, fsdp"):
        distify.init()


def test_mixed_precision_precedence(fresh):
    fresh.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    fresh.setenv("DISTIFY_MIXED_PRECISION", "bf16")
    assert distify.mixed_precision() == "bf16"
    fresh.setattr(_state, "_RUNTIME", _state.Runtime())
    distify.init(mixed_precision="no")
    assert distify.mixed_precision() == "no"
    with pytest.raises(distify.DistifyError, match="before any other distify call"):
        distify.init(mixed_precision="fp16")
    with pytest.raises(distify.DistifyError, match="use one of no, fp16, bf16"):
        _state._mixed_precision_setting("half")


def test_single_process_without_launcher(fresh):
    assert (distify.rank(), distify.world_size(), distify.local_rank()) == (0, 1, 0)
    assert distify.is_main_process() and distify.is_local_main_process()
    assert distify.device() == torch.device("cpu")
    assert not torch.distributed.is_initialized()


def test_import_without_torch_says_how_to_install_it():
    code = "import sys; sys.modules['torch'] = None; import distify.runtime"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ")
    assert "pip install torch" in last and 'pip install "distify[torch]"' in last


# --- save / load ----------------------------------------------------------------------------------

class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_failed_save_keeps_the_old_file_and_leaves_nothing_behind(fresh, tmp_path):
    target = tmp_path / "checkpoint.pt"
    distify.save({"step": torch.tensor(1)}, target)
    before = target.read_bytes()
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        distify.save({"step": torch.tensor(2), "bad": Unpicklable()}, target)
    assert target.read_bytes() == before
    assert os.listdir(tmp_path) == ["checkpoint.pt"]
    assert distify.load(target)["step"].item() == 1


def test_save_to_a_path_matches_torch_save_and_keeps_the_mode(fresh, tmp_path):
    state = {"w": torch.arange(6.0).reshape(2, 3)}
    torch.save(state, tmp_path / "reference.pt")
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "reference.pt"
    target.write_bytes(b"old")
    target.chmod(0o640)
    distify.save(state, str(target))
    assert target.read_bytes() == (tmp_path / "reference.pt").read_bytes()
    assert target.stat().st_mode & 0o777 == 0o640
    with open(tmp_path / "handle.pt", "wb") as handle:  # a file object: plain torch.save
        distify.save(state, handle)
    loaded = distify.load(tmp_path / "handle.pt", weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["w"].device.type == "cpu"


# --- prepare in one process -----------------------------------------------------------------------

def test_prepared_model_keeps_class_attributes_and_pickles_as_original(fresh):
    net = Net()
    model = distify.prepare(net)
    assert model is net and isinstance(model, Net) and model.__class__ is Net
    assert model.module is model and distify.unwrap(model) is model
    assert list(model.state_dict()) == ["fc.weight", "fc.bias"]
    clone = copy.deepcopy(model)
    assert type(clone) is Net and not any(k.startswith("_distify") for k in vars(clone))
    assert distify.prepare(model) is model
    assert distify.unwrap(nn.DataParallel(clone)) is clone


def test_prepare_returns_objects_in_order_and_rejects_others(fresh):
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    got = distify.prepare(model, optimizer, scheduler)
    assert got == (model, optimizer, scheduler)
    assert optimizer.step_was_skipped is False
    assert type(scheduler) is torch.optim.lr_scheduler.ReduceLROnPlateau  # untouched without fp16
    with pytest.raises(TypeError, match="cannot prepare a str"):
        distify.prepare("model.pt")


def test_single_process_loader_is_the_original(fresh):
    dataset = TensorDataset(torch.arange(10.0), torch.arange(10))
    original = DataLoader(dataset, batch_size=4, shuffle=True)
    loader = distify.prepare(original)
    assert len(loader) == 3 and loader.batch_size == 4 and loader.dataset is dataset
    torch.manual_seed(1)
    got = [batch[1].tolist() for batch in loader]
    torch.manual_seed(1)
    assert got == [batch[1].tolist() for batch in original]
    assert distify.prepare(loader) is loader


def test_collectives_are_identity_in_one_process(fresh):
    value = torch.tensor([1.0, 2.0])
    assert distify.reduce(value) is value and distify.reduce(3) == 3
    np = pytest.importorskip("numpy")
    loss = np.float32(0.25)  # what a converted stop test may get: `np.mean(losses) < 1e-3`
    assert distify.reduce(loss, op="mean") is loss
    assert distify.gather(value) is value and distify.gather_for_metrics(value) is value
    with pytest.raises(distify.DistifyError, match="unknown reduce op"):
        distify.reduce(value, op="avg")
    with pytest.raises(TypeError):
        distify.reduce("3")


def test_an_iterable_dataset_is_sharded_by_stream_position(fresh):
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    fresh.setattr(_state, "_RUNTIME", simulated_rank(1))
    prepared = distify.prepare(DataLoader(Stream(), batch_size=None))
    assert isinstance(prepared, _data.PreparedDataLoader)
    assert isinstance(prepared._loader.dataset, _data._RankStream)
    # what each rank draws is tested on two real processes (tests/test_runtime_data_stream.py)
    kept = distify.prepare(DataLoader(Stream()), shard=False)
    assert isinstance(kept, _data.PreparedDataLoader) and kept._loader.dataset.__class__ is Stream


def test_sharded_loader_keeps_the_loader_settings(fresh):
    fresh.setattr(_state, "_RUNTIME", simulated_rank(1))
    dataset = TensorDataset(torch.arange(50))
    original = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, drop_last=True,
                          collate_fn=list, worker_init_fn=print, timeout=5, prefetch_factor=3,
                          persistent_workers=True, generator=torch.Generator())
    prepared = distify.prepare(original)
    inner = prepared._loader
    assert inner is not original and inner.dataset is dataset
    for name in ("num_workers", "collate_fn", "worker_init_fn", "timeout", "prefetch_factor",
                 "persistent_workers", "pin_memory"):
        assert getattr(inner, name) == getattr(original, name), name
    # its own generator, for its workers' per-rank seeds (issue 20 item 5a); the order of the
    # data is still the original sampler's, drawn from the original generator
    assert inner.generator is not original.generator
    assert isinstance(inner.batch_sampler, _data._ShardSampler)
    assert len(prepared) == 50 // 8  # drop_last: what one process with batches of 8 runs
    assert prepared.batch_size == 4 and prepared.sampler is original.sampler


# --- the sharding plan ----------------------------------------------------------------------------

def _plans(fresh, count, batch, world, shuffle, drop_last=False, training=False):
    """Every rank's (batches, pads) for one epoch, as the ranks of a job would compute them.

    ``training``: a prepared model is training with gradients on (TRAIN mode); otherwise the
    epoch is an evaluation (EVAL mode), shuffled or not."""
    fresh.setattr(_data, "_broadcast_from_main", lambda units: units)  # same seed on every rank
    fresh.setattr(_data._model, "any_model_training", lambda: training)
    dataset = TensorDataset(torch.arange(count))
    plans = []
    for rank in range(world):
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(7)) \
            if shuffle else None
        loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=drop_last)
        shard = _data._ShardSampler.for_loader(loader)
        shard.rank, shard.world_size = rank, world
        with torch.set_grad_enabled(training):
            plans.append((list(shard), shard.pads, len(shard)))
    return plans


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("shuffle", [False, True], ids=["sequential", "shuffled"])
def test_eval_plan_is_exact_and_ranks_stay_in_step(fresh, world, shuffle):
    for count in range(1, 40):
        for batch in (1, 2, 5):
            plans = _plans(fresh, count, batch, world, shuffle=shuffle)
            samples = sorted(i for batches, _, _ in plans for b in batches for i in b)
            assert samples == list(range(count)), (count, batch)  # each sample exactly once
            assert not any(p for _, pads, _ in plans for p in pads)
            counts = {len(batches) for batches, _, _ in plans}
            if batch > 1 and count >= world:  # a short rank's last batch was split
                assert counts == {plans[0][2]}, (count, batch)
            else:  # one-sample batches cannot be split: a rank may be one batch short
                assert max(counts) == plans[0][2] and min(counts) >= plans[0][2] - 1


@pytest.mark.parametrize("world", [2, 3])
def test_train_plan_keeps_the_single_process_batches(fresh, world):
    for count in range(1, 40):
        for batch in (1, 3):
            plans = _plans(fresh, count, batch, world, shuffle=True, training=True)
            order = list(RandomSampler(range(count), generator=torch.Generator().manual_seed(7)))
            padded_order = (order * (world + 1))[:-(-count // world) * world]
            assert len({len(batches) for batches, _, _ in plans} | {plans[0][2]}) == 1
            for step in range(len(plans[0][0])):
                union = sorted(i for batches, _, _ in plans for i in batches[step])
                start = step * batch * world
                assert union == sorted(padded_order[start:start + batch * world]), (count, batch)
            kept = [i for batches, pads, _ in plans for b, p in zip(batches, pads)
                    for i in b[:len(b) - p]]
            assert sorted(kept) == list(range(count))


def test_drop_last_plan_drops_what_one_process_drops(fresh):
    # One process with batches of 8 runs 2 full batches over 23 samples and drops the last 7.
    plans = _plans(fresh, 23, 4, 2, shuffle=False, drop_last=True)
    for batches, pads, length in plans:
        assert len(batches) == length == 2 and all(len(b) == 4 for b in batches)
        assert pads == [0, 0]
    assert sorted(i for batches, _, _ in plans for b in batches for i in b) == list(range(16))


# --- nested batches -------------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "x y")


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    label: str


def test_map_tensors_keeps_container_types():
    batch = {"pair": Pair(torch.ones(1), [torch.zeros(1), "text"]),
             "extra": collections.defaultdict(list, a=torch.ones(2)),
             "data": Batch(torch.ones(3), "a")}
    doubled = _tree.map_tensors(batch, lambda t: t * 2)
    assert isinstance(doubled["pair"], Pair) and doubled["pair"].x.item() == 2
    assert doubled["pair"].y[1] == "text"
    assert isinstance(doubled["extra"], collections.defaultdict)
    assert doubled["extra"]["a"].tolist() == [2, 2]
    assert isinstance(doubled["data"], Batch) and doubled["data"].x.sum().item() == 6
    assert batch["data"].x.sum().item() == 3  # the input is not modified
    assert len(_tree.tensors_in(batch)) == 4
