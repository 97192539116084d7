"""Launch config files: what distify writes, what it accepts, and what Accelerate makes of them."""

from __future__ import annotations

import os
import stat
import textwrap

import pytest
import yaml

from distify.errors import UserError
from distify.launch.config import (
    FILE_KEYS,
    LaunchConfig,
    default_config,
    dump_config,
    load_config,
    local_gpu_count,
    make_config,
    with_overrides,
    write_config,
)

# What `accelerate config` writes for a one-machine multi-GPU setup (Accelerate 1.x), verbatim.
ACCELERATE_WRITTEN = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_GPU
downcast_bf16: 'no'
enable_cpu_affinity: false
gpu_ids: all
machine_rank: 0
main_training_function: main
mixed_precision: fp16
num_machines: 1
num_processes: 4
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""

CONFIGS = {
    "one-process": {"num_processes": 1},
    "one-machine-bf16": {"num_processes": 4, "mixed_precision": "bf16", "gpu_ids": "0,1,2,3"},
    "two-machines-static": {"num_processes": 16, "num_machines": 2, "machine_rank": 1,
                            "main_process_ip": "10.0.0.1", "main_process_port": 29500},
    "two-machines-c10d": {"num_processes": 4, "num_machines": 2, "main_process_ip": "head",
                          "main_process_port": 1234, "rdzv_backend": "c10d",
                          "same_network": False},
    "cpu": {"num_processes": 2, "use_cpu": True, "debug": True},
}


@pytest.mark.parametrize("settings", CONFIGS.values(), ids=CONFIGS.keys())
def test_written_config_reads_back_equal(tmp_path, settings):
    cfg = make_config(**settings)
    write_config(cfg, tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


@pytest.mark.parametrize("settings", CONFIGS.values(), ids=CONFIGS.keys())
def test_accelerate_reader_loads_written_config(tmp_path, settings):
    config_args = pytest.importorskip("accelerate.commands.config.config_args",
                                      reason="accelerate is a test dependency: pip install "
                                             "accelerate")
    cfg = make_config(**settings)
    write_config(cfg, tmp_path / "c.yaml")
    loaded = config_args.load_config_from_file(str(tmp_path / "c.yaml"))
    assert isinstance(loaded, config_args.ClusterConfig)
    assert loaded.distributed_type.value == cfg.distributed_type
    for key in ("num_processes", "num_machines", "machine_rank", "main_process_ip",
                "main_process_port", "mixed_precision", "gpu_ids", "rdzv_backend", "use_cpu"):
        assert getattr(loaded, key) == getattr(cfg, key), key


def test_written_keys_are_those_accelerate_config_writes(tmp_path):
    written = yaml.safe_load(dump_config(make_config(num_processes=4, mixed_precision="fp16")))
    assert written == yaml.safe_load(ACCELERATE_WRITTEN)
    assert "max_restarts" not in written


def test_reads_what_accelerate_writes(tmp_path):
    path = tmp_path / "accelerate.yaml"
    path.write_text(ACCELERATE_WRITTEN)
    cfg = load_config(path)
    assert (cfg.distributed_type, cfg.num_processes, cfg.mixed_precision) == ("MULTI_GPU", 4,
                                                                               "fp16")


def test_reads_accelerate_basic_config(tmp_path):
    utils = pytest.importorskip("accelerate.utils", reason="accelerate is a test dependency")
    path = tmp_path / "basic.yaml"
    utils.write_basic_config(mixed_precision="bf16", save_location=str(path))
    assert load_config(path).mixed_precision == "bf16"


def test_empty_accelerate_sections_are_accepted_and_dropped(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(ACCELERATE_WRITTEN + "dynamo_config: {}\nfsdp_config: {}\ntpu_name: null\n")
    cfg = load_config(path)
    assert "dynamo_config" not in dump_config(cfg)


def test_write_is_atomic_and_keeps_mode(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("old")
    os.chmod(path, 0o640)
    write_config(make_config(), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


def test_write_into_missing_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="output folder does not exist"):
        write_config(make_config(), tmp_path / "nope" / "c.yaml")


_FSDP = ("distributed_type: FSDP\nnum_processes: 2\nmixed_precision: bf16\nfsdp_config:\n"
         "  fsdp_version: 2\n")

BAD = {
    "malformed-yaml": ("num_processes: 2\n  bad: [\n", r"c\.yaml:2:\d+: malformed YAML"),
    "tab-indent": ("a:\n\tb: 1\n", r"c\.yaml:2:1: malformed YAML"),
    "not-a-mapping": ("- 1\n- 2\n", (r"c\.yaml: a launch config must be a mapping of settings, "
                                     r"got a list")),
    "empty": ("", r"c\.yaml: .*got an empty file"),
    "unknown-key": ("distributed_type: 'NO'\nnum_proceses: 1\n",
                    r"c\.yaml:2:1: num_proceses: unknown key \(did you mean 'num_processes'\?\)"),
    "port-out-of-range": (("distributed_type: MULTI_GPU\nnum_processes: 2\n"
                           "main_process_port: 70000\n"),
                          r"c\.yaml:3:1: main_process_port: 70000 is out of range \(0-65535\)"),
    "negative-port": ("distributed_type: 'NO'\nmain_process_port: -1\n",
                      r"main_process_port: -1 is out of range"),
    "not-divisible": ("distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 3\n",
                      r"c\.yaml:3:1: num_processes: 3 is not a multiple of num_machines \(2\)"),
    "machine-rank": (("distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 2\n"
                      "machine_rank: 2\n"),
                     r"c\.yaml:4:1: machine_rank: 2 must be below num_machines \(2\)"),
    "mixed-precision": ("distributed_type: 'NO'\nmixed_precision: fp8\n",
                        r"mixed_precision: must be one of no, fp16, bf16, got 'fp8'"),
    "wrong-type": ("distributed_type: MULTI_GPU\nnum_processes: two\n",
                   r"c\.yaml:2:1: num_processes: must be a whole number, got 'two'"),
    "bool-as-int": ("distributed_type: MULTI_GPU\nnum_processes: true\n",
                    r"num_processes: must be a whole number, got True"),
    "gpu-ids-int": ("distributed_type: 'NO'\ngpu_ids: 0\n", r"gpu_ids: must be a string.*quote"),
    "gpu-ids-junk": ("distributed_type: 'NO'\ngpu_ids: 'a,b'\n", r"gpu_ids: must be 'all' or"),
    "too-few-gpus": ("distributed_type: MULTI_GPU\nnum_processes: 4\ngpu_ids: '0,1'\n",
                     r"gpu_ids: '0,1' selects 2 GPU\(s\) but each machine runs 4"),
    "bare-no": ("distributed_type: NO\n", (r"c\.yaml:1:1: distributed_type: must be a string, "
                                           r"got False \(YAML reads a bare no as a boolean")),
    "missing-type": ("num_processes: 1\n", r"distributed_type: missing"),
    "unsupported-type": ("distributed_type: DEEPSPEED\n", r"distributed_type: must be one of NO"),
    "no-with-many": ("distributed_type: 'NO'\nnum_processes: 4\n",
                     r"distributed_type: NO runs one process but num_processes is 4"),
    "max-restarts-in-file": ("distributed_type: 'NO'\nmax_restarts: 3\n",
                             r"max_restarts: not a config key .*pass --max_restarts"),
    "accelerate-only": ("distributed_type: 'NO'\ndeepspeed_config:\n  zero_stage: 2\n",
                        r"c\.yaml:2:1: deepspeed_config: an Accelerate setting that distify "
                        r"launch does not support"),
    "fsdp-config-without-fsdp": ("distributed_type: 'NO'\nfsdp_config:\n  fsdp_version: 2\n",
                                 r"fsdp_config: is set but distributed_type is NO; set "
                                 r"distributed_type: FSDP"),
    "fsdp-unknown-key": (_FSDP + "  fsdp_transformer_layer_cls_to_wrp: Block\n",
                         r"c\.yaml:6:3: fsdp_config\.fsdp_transformer_layer_cls_to_wrp: unknown "
                         r"key \(did you mean 'fsdp_transformer_layer_cls_to_wrap'\?\)"),
    "fsdp-bad-policy": (_FSDP + "  fsdp_auto_wrap_policy: LAYER_WRAP\n",
                        r"c\.yaml:6:3: fsdp_config\.fsdp_auto_wrap_policy: must be one of "
                        r"TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP"),
    "fsdp-hybrid": (_FSDP + "  fsdp_sharding_strategy: HYBRID_SHARD\n",
                    r"fsdp_config\.fsdp_sharding_strategy: HYBRID_SHARD is not supported"),
    "fsdp-bool": (_FSDP + "  fsdp_offload_params: 'yes'\n",
                  r"fsdp_config\.fsdp_offload_params: must be true or false"),
    "fsdp-classes": (_FSDP + "  fsdp_transformer_layer_cls_to_wrap: 'Block; Head'\n",
                     r"fsdp_transformer_layer_cls_to_wrap: must be class names separated by "
                     r"commas"),
    "fsdp-version": (_FSDP + "  fsdp_version: 3\n", r"fsdp_version: must be 1 or 2"),
    "fsdp-not-a-mapping": ("distributed_type: FSDP\nfsdp_config: [1]\n",
                           r"c\.yaml:2:1: fsdp_config: must be a mapping"),
    "sagemaker": ("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\n",
                  r"compute_environment: must be one of LOCAL_MACHINE"),
    "port-0-multinode": (("distributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 2\n"
                          "main_process_port: 0\n"), r"main_process_port: 0 \(a free port\)"),
}


@pytest.mark.parametrize("text,message", BAD.values(), ids=BAD.keys())
def test_bad_config_is_one_line_error_naming_file_and_key(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_config(path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(str(path))
    assert err.match(message)


def test_missing_and_binary_config_files(tmp_path):
    with pytest.raises(UserError, match=r"nope\.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="not UTF-8"):
        load_config(tmp_path / "bin.yaml")


def test_null_values_mean_what_accelerate_makes_of_them(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("distributed_type: 'NO'\nmixed_precision: null\ngpu_ids: null\n")
    cfg = load_config(path)
    assert (cfg.mixed_precision, cfg.gpu_ids) == ("no", "all")


def test_dump_is_sorted_yaml_without_distify_only_keys():
    text = dump_config(make_config(num_processes=2, max_restarts=3))
    keys = [line.split(":")[0] for line in text.splitlines() if not line.startswith("#")]
    assert keys == sorted(keys)
    assert set(keys) <= set(FILE_KEYS)
    assert "max_restarts" not in text


@pytest.mark.parametrize("visible,smi,expected", [
    (None, None, 0), ("", None, 0), ("-1", 4, 0), ("0,1", None, 2), ("0,1,2,3", 2, 2),
    (None, 8, 8), ("GPU-3f2a,GPU-77c1", 8, 2), ("0,-1,2", None, 1),
], ids=["nothing", "hidden", "minus-one", "visible", "visible-capped", "smi", "uuids",
        "stops-at-invalid"])
def test_local_gpu_count_without_torch(tmp_path, monkeypatch, visible, smi, expected):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        tool = bin_dir / "nvidia-smi"
        lines = "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(smi))
        tool.write_text(f"#!/bin/sh\n{lines}")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert local_gpu_count() == expected


def test_default_config_one_process_per_gpu_or_one_without(monkeypatch):
    monkeypatch.setattr("distify.launch.config.local_gpu_count", lambda: 8)
    cfg = default_config(mixed_precision="bf16")
    assert (cfg.distributed_type, cfg.num_processes, cfg.mixed_precision) == ("MULTI_GPU", 8,
                                                                              "bf16")
    monkeypatch.setattr("distify.launch.config.local_gpu_count", lambda: 0)
    cfg = default_config()
    # Not forced onto the CPU: the config usually travels to a GPU machine.
    assert (cfg.distributed_type, cfg.num_processes, cfg.use_cpu) == ("NO", 1, False)
    assert default_config(num_processes=2).distributed_type == "MULTI_GPU"


def test_overrides_rederive_distributed_type():
    base = make_config()
    assert with_overrides(base, num_processes=4).distributed_type == "MULTI_GPU"
    assert with_overrides(base, num_processes=4, use_cpu=True).distributed_type == "MULTI_CPU"
    assert with_overrides(make_config(num_processes=4), num_processes=1).distributed_type == "NO"
    cpu = make_config(num_processes=2, use_cpu=True)
    assert with_overrides(cpu, mixed_precision="bf16").distributed_type == "MULTI_CPU"
    assert with_overrides(base, num_processes=None) == base


def test_overrides_are_validated_as_a_whole():
    cfg = make_config(num_processes=4, num_machines=2, main_process_ip="h", main_process_port=1)
    with pytest.raises(UserError, match=r"num_processes: 3 is not a multiple of num_machines "
                                        r"\(2\).*command-line options"):
        with_overrides(cfg, num_processes=3)


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        LaunchConfig().num_processes = 2  # type: ignore[misc]


def test_yaml_is_read_safely(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent("""\
        distributed_type: !!python/object/apply:os.system ["echo pwned"]
    """))
    with pytest.raises(UserError, match="malformed YAML"):
        load_config(path)


@pytest.mark.parametrize("settings", [
    {}, {"mixed_precision": "fp16"}, {"mixed_precision": "bf16"}, {"num_processes": 4},
    {"num_processes": 2, "use_cpu": True}, {"num_processes": 2, "max_restarts": 3},
    {"num_machines": 2, "num_processes": 8, "machine_rank": 1, "main_process_ip": "10.0.0.1",
     "main_process_port": 29500},
    {"num_processes": 2, "gpu_ids": "0,1"}, {"num_processes": 2, "use_fsdp": True},
], ids=repr)
def test_a_config_is_written_as_pyyaml_writes_it(settings) -> None:
    """``dump_config`` writes the configs ``convert`` makes without importing PyYAML: byte for
    byte what ``yaml.safe_dump`` writes (anything else goes to PyYAML)."""
    from distify.launch.config import _file_mapping

    cfg = with_overrides(make_config(), **settings) if "use_fsdp" in settings else \
        make_config(**settings)
    mapping = _file_mapping(cfg)
    expected = yaml.safe_dump(mapping, sort_keys=True, default_flow_style=False)
    assert dump_config(cfg).endswith(expected)
    assert yaml.safe_load(dump_config(cfg)) == mapping


def test_words_yaml_reads_as_booleans_or_null_are_quoted_as_pyyaml_quotes_them() -> None:
    from distify.launch.config import _plain_yaml

    words = ["no", "No", "NO", "yes", "on", "Off", "TRUE", "false", "null", "Null", "NULL", "n",
             "y", "Y", "nO", "yEs", "main", "all", "LOCAL_MACHINE", "_x", "x1", "static", "none",
             "None", "inf", "nan", "Nan", "x" * 100]
    mapping = {f"key_{index}": word for index, word in enumerate(words)}
    mapping.update({"a": True, "b": False, "c": 0, "d": -3, "e": 12345678901234, "f": []})
    assert _plain_yaml(mapping) == yaml.safe_dump(mapping, sort_keys=True,
                                                  default_flow_style=False)
    for other in ("0,1", "", "x" * 101, "a b", "1x", ["x"], {"a": 1}, None, 1.5, "10.0.0.1"):
        assert _plain_yaml({"k": other}) is None
    assert _plain_yaml({"on": 1}) is None
