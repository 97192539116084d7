"""FSDP2 as a strategy (issue 14): the same converted script under DDP or FSDP by config alone.

The fixture (``tests/fixtures/fsdp/tiny_gpt.in.py``) is a minGPT-style single-GPU script with
``Block`` layers, weight tying, grouped AdamW from ``configure_optimizers``, gradient
accumulation and clipping, a summed evaluation, and ``torch.save`` of the model and optimizer
state dicts. It is converted here and run on 2 real processes (Gloo on the CPU, where torch
2.13's ``fully_shard`` works) under DDP and under FSDP: the FSDP run must match DDP's
evaluation, write a full checkpoint with the plain model's keys that loads into the plain model
on one process and gives the same evaluation, and a full optimizer state in the plain format.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.pool

torch = pytest.importorskip("torch")

from distify.convert.engine import convert_source  # noqa: E402
from distify.runtime import _fsdp, _state  # noqa: E402
from distify.runtime._errors import DistifyError  # noqa: E402
from tests.helpers import (  # noqa: E402
    FIXTURES,
    REPO,
    clean_env,
    compare_state,
    flatten,
    result_line,
    run_python,
    run_torchrun,
    simulated_rank,
)

SOURCE = FIXTURES / "fsdp" / "tiny_gpt.in.py"
FSDP = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block"}


def _load_module(path):
    """The fixture's classes (its training runs under ``if __name__ == "__main__":`` only)."""
    spec = importlib.util.spec_from_file_location(f"fixture_{path.stem.replace('.', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The converted script run on 2 processes under each strategy (and one process plain)."""
    converted = convert_source(SOURCE.read_bytes(), str(SOURCE)).output
    results = {}
    for name, extra in (("ddp", {}), ("fsdp", FSDP),
                        ("ddp-bf16", {"DISTIFY_MIXED_PRECISION": "bf16"}),
                        ("fsdp-bf16-checkpointing", {**FSDP, "DISTIFY_MIXED_PRECISION": "bf16",
                                                     "FSDP_ACTIVATION_CHECKPOINTING": "true",
                                                     "FSDP_RESHARD_AFTER_FORWARD": "false"})):
        folder = tmp_path_factory.mktemp(name)
        script = folder / "train.py"
        script.write_bytes(converted)
        env = clean_env(PYTHONPATH=str(REPO), **extra)
        # FSDP's ranks hold different shards: the replica recorder's equality does not apply
        proc = run_torchrun(script, cwd=folder, env=env, replicas=None if name.startswith(
            "ddp") else False, timeout=240)
        results[name] = (folder, result_line(proc.stdout), proc)
    return results


def test_fsdp_matches_ddp(runs) -> None:
    ddp, fsdp = runs["ddp"][1], runs["fsdp"][1]
    assert ddp["steps"] == fsdp["steps"] > 0
    assert fsdp["val_loss"] == pytest.approx(ddp["val_loss"], rel=1e-5)
    ddp_state = torch.load(runs["ddp"][0] / "gpt.pt", weights_only=True)
    fsdp_state = torch.load(runs["fsdp"][0] / "gpt.pt", weights_only=True)
    assert list(fsdp_state) == list(ddp_state)  # the plain model's keys, in its order
    for key, value in ddp_state.items():
        torch.testing.assert_close(fsdp_state[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_mixed_precision_and_activation_checkpointing_stay_close_to_ddp(runs) -> None:
    ddp, fsdp = runs["ddp-bf16"][1], runs["fsdp-bf16-checkpointing"][1]
    assert fsdp["val_loss"] == pytest.approx(ddp["val_loss"], rel=2e-2)


def test_the_fsdp_checkpoint_loads_into_the_plain_model_on_one_process(runs) -> None:
    folder, result, _ = runs["fsdp"]
    fixture = _load_module(SOURCE)
    torch.manual_seed(0)
    model = fixture.GPT(fixture.GPTConfig())
    model.load_state_dict(torch.load(folder / "gpt.pt", weights_only=True))  # strict
    loader = torch.utils.data.DataLoader(
        fixture.CharDataset(fixture.make_text(40, seed=2), fixture.GPTConfig().block_size),
        batch_size=16)
    assert fixture.evaluate(model, loader, "cpu") == pytest.approx(result["val_loss"], rel=1e-5)
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3)
    saved = torch.load(folder / "optimizer.pt", weights_only=True)
    optimizer.load_state_dict(saved)  # the plain index-keyed format, full tensors
    plain = torch.load(runs["ddp"][0] / "optimizer.pt", weights_only=True)
    assert saved["state"].keys() == plain["state"].keys()
    for index, entry in plain["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(saved["state"][index][key], value, rtol=1e-3, atol=1e-5)


def test_accelerate_launch_runs_the_fsdp_config_distify_writes(runs, tmp_path) -> None:
    """The launch config distify writes (Accelerate's schema) runs under `accelerate launch`
    too, which hands the FSDP settings to the runtime through the same variables."""
    pytest.importorskip("accelerate")
    from distify.launch.config import make_config, write_config
    from tests.helpers import free_port

    cfg = make_config(num_processes=2, distributed_type="FSDP", main_process_port=free_port(),
                      fsdp_config={"fsdp_version": 2,
                                   "fsdp_transformer_layer_cls_to_wrap": "Block"})
    write_config(cfg, tmp_path / "train.yaml")
    (tmp_path / "train.py").write_bytes((runs["fsdp"][0] / "train.py").read_bytes())
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                           "train.yaml", "train.py"], cwd=tmp_path,
                          env=clean_env(PYTHONPATH=str(REPO)), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert result_line(proc.stdout)["val_loss"] == pytest.approx(runs["fsdp"][1]["val_loss"],
                                                                 rel=1e-6)


def test_one_process_is_the_original_whatever_the_strategy(tmp_path) -> None:
    converted = convert_source(SOURCE.read_bytes(), str(SOURCE)).output
    (tmp_path / "train.py").write_bytes(converted)
    (tmp_path / "orig").mkdir()
    (tmp_path / "orig" / "train.py").write_bytes(SOURCE.read_bytes())
    got = run_python(tmp_path / "train.py", cwd=tmp_path,
                     env=clean_env(PYTHONPATH=str(REPO), **FSDP))
    want = run_python(tmp_path / "orig" / "train.py", cwd=tmp_path / "orig",
                      env=clean_env(PYTHONPATH=str(REPO)))
    assert got.stdout == want.stdout
    for name in ("gpt.pt", "optimizer.pt"):
        compare_state(flatten(torch.load(tmp_path / name, weights_only=True)),
                      flatten(torch.load(tmp_path / "orig" / name, weights_only=True)),
                      exact=True)


# ------------------------------------------------------------ options and errors, no processes


@pytest.mark.parametrize("env, message", [
    ({"FSDP_VERSION": "3"}, r"FSDP_VERSION='3' \(fsdp_version in the launch config\)"),
    ({"FSDP_AUTO_WRAP_POLICY": "LAYERS"},
     r"FSDP_AUTO_WRAP_POLICY='LAYERS' \(fsdp_auto_wrap_policy in the launch config\): use one of"),
    ({"FSDP_OFFLOAD_PARAMS": "maybe"}, r"FSDP_OFFLOAD_PARAMS='maybe' is not true or false"),
    ({"FSDP_MIN_NUM_PARAMS": "lots"}, r"FSDP_MIN_NUM_PARAMS='lots' \(fsdp_min_num_params"),
    ({"FSDP_SHARDING_STRATEGY": "HYBRID_SHARD", "FSDP_VERSION": "1"},
     r"FSDP_SHARDING_STRATEGY='HYBRID_SHARD' \(fsdp_sharding_strategy in the launch config\) "
     r"is not supported"),
    ({"FSDP_STATE_DICT_TYPE": "LOCAL_STATE_DICT"}, r"fsdp_state_dict_type in the launch config"),
], ids=["version", "policy", "bool", "min-params", "hybrid", "state-dict-type"])
def test_bad_fsdp_settings_are_one_line_errors_naming_the_key(monkeypatch, env, message) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DistifyError, match=message) as err:
        _fsdp.read_options()
    assert "\n" not in str(err.value)


def test_fsdp_settings_read_as_accelerate_writes_them(monkeypatch) -> None:
    for name, value in {"FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP",
                        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block, Head", "FSDP_MIN_NUM_PARAMS": "0",
                        "FSDP_OFFLOAD_PARAMS": "false",
                        "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT"}.items():
        monkeypatch.setenv(name, value)
    assert _fsdp.read_options() == _fsdp.FsdpOptions(
        reshard_after_forward=False, wrap_policy="TRANSFORMER_BASED_WRAP",
        layer_classes=("Block", "Head"), min_num_params=100_000_000, offload_params=False,
        state_dict_type="SHARDED_STATE_DICT")


def _strategy(monkeypatch, **options):
    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(0))
    return _fsdp.FSDPStrategy(dataclasses.replace(
        _state.settings(), strategy="fsdp", strategy_options=_fsdp.FsdpOptions(**options)))


def test_a_wrap_class_the_model_lacks_names_the_key_and_the_classes(monkeypatch) -> None:
    fixture = _load_module(SOURCE)
    model = fixture.GPT(fixture.GPTConfig())
    strategy = _strategy(monkeypatch, wrap_policy="TRANSFORMER_BASED_WRAP",
                         layer_classes=("TransformerBlock",))
    with pytest.raises(DistifyError) as err:
        strategy._layers(model, "GPT")
    assert str(err.value) == (
        "fsdp_transformer_layer_cls_to_wrap: GPT has no TransformerBlock module (its classes: "
        "Block, CausalSelfAttention, Embedding, GELU, LayerNorm, Linear, ModuleList, "
        "Sequential); name one of them")
    found = _strategy(monkeypatch, wrap_policy="TRANSFORMER_BASED_WRAP",
                      layer_classes=("Block",))._layers(model, "GPT")
    assert found == list(reversed(list(model.h)))  # innermost (last) first
    with pytest.raises(DistifyError, match="names no class"):
        _strategy(monkeypatch, wrap_policy="TRANSFORMER_BASED_WRAP")._layers(model, "GPT")
    with pytest.raises(DistifyError, match="fsdp_activation_checkpointing needs layers"):
        _strategy(monkeypatch, activation_checkpointing=True)._layers(model, "GPT")


def test_size_based_wrap_picks_the_smallest_modules_over_the_threshold(monkeypatch) -> None:
    fixture = _load_module(SOURCE)
    model = fixture.GPT(fixture.GPTConfig())
    block = sum(p.numel() for p in model.h[0].parameters())
    layers = _strategy(monkeypatch, wrap_policy="SIZE_BASED_WRAP",
                       min_num_params=block)._layers(model, "GPT")
    # every Block holds `block` parameters (its MLP fewer); the ModuleList holds no more of
    # its own once they are wrapped
    assert set(map(id, layers)) == set(map(id, model.h))


def test_a_strategy_added_from_outside_trains_and_runs_every_collective(tmp_path) -> None:
    """The seam: a strategy is a subclass plus ``register``; the runtime's collectives (metrics,
    the loaders' agreement, objects, barriers, the debug checks) all go through it."""
    import json

    from tests.fixture_runs import tagged

    proc = run_torchrun(REPO / "tests" / "runtime_scripts" / "custom_strategy.py", nproc=2,
                        cwd=tmp_path, env=clean_env(PYTHONPATH=str(REPO), DISTIFY_DEBUG="1"),
                        replicas=True)
    got = [json.loads(lines[0]) for lines in tagged(proc.stderr, "STRATEGY").values()]
    assert len(got) == 2
    for one in got:
        assert one["strategy"] == "counting"
        assert (one["sum"], one["gather"], one["object"], one["any"]) == (3, [0, 1], 0, True)
        assert one["evaluated"] == 40  # every sample once, gathered from both ranks
        # every kind of collective the runtime makes went through the strategy: the debug
        # checks and gathers (all_gather), reduce/any_process (all_reduce), broadcast_object and
        # the BatchNorm buffers (broadcast), wait_for_everyone (barrier)
        assert set(one["calls"]) == {"all_reduce", "all_gather", "broadcast", "barrier"}
        # training itself: the buffers' broadcast after every forward (5 steps), debug checks
        assert one["training"]["broadcast"] >= 5 and one["training"]["all_gather"] >= 5
