"""`distify config`: the wizard, driven by flags and by answers typed into a terminal."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from distify.cli import main
from distify.launch.config import load_config


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("distify.launch.wizard._gpus", lambda: 0)
    return tmp_path


@pytest.fixture
def terminal(monkeypatch):
    """Make the wizard believe stdin is a terminal, so it asks."""
    monkeypatch.setattr("distify.commands.config._stdin_is_terminal", lambda: True)


def run(args, input=None):
    return CliRunner().invoke(main, ["config", *args], input=input)


def test_flags_without_terminal_write_config_without_asking(in_tmp):
    result = run(["--num_processes", "4", "--mixed-precision", "bf16", "--gpu_ids", "0,1,2,3"])
    assert result.exit_code == 0, result.output
    assert "?" not in result.output  # nothing was asked
    cfg = load_config(in_tmp / "distify_config.yaml")
    assert (cfg.num_processes, cfg.mixed_precision, cfg.gpu_ids, cfg.distributed_type) == (
        4, "bf16", "0,1,2,3", "MULTI_GPU")
    assert "distify launch --config_file distify_config.yaml" in result.output


def test_defaults_without_terminal_are_one_process_here(in_tmp):
    result = run(["--config-file", "one.yaml"])
    assert result.exit_code == 0, result.output
    cfg = load_config(in_tmp / "one.yaml")
    assert (cfg.num_processes, cfg.num_machines, cfg.distributed_type) == (1, 1, "NO")


def test_multi_machine_flags(in_tmp):
    result = run(["--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
                  "--num_processes", "16", "--rdzv_backend", "c10d", "--cpu", "--debug",
                  "--config_file", "node1.yaml"])
    assert result.exit_code == 0, result.output
    cfg = load_config(in_tmp / "node1.yaml")
    assert (cfg.num_machines, cfg.machine_rank, cfg.main_process_ip, cfg.main_process_port,
            cfg.rdzv_backend, cfg.distributed_type, cfg.use_cpu, cfg.debug) == (
        2, 1, "10.0.0.1", 29500, "c10d", "MULTI_CPU", True, True)


def test_question_without_default_needs_its_flag_when_not_asked(in_tmp):
    result = run(["--num_machines", "2", "--num_processes", "2"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        ("distify: error: --main_process_ip is needed (there is no terminal to ask: IP address "
         "or hostname of the machine with rank 0?)")]
    assert not (in_tmp / "distify_config.yaml").exists()


@pytest.mark.parametrize("args,message", [
    (["--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "h"],
     "--machine_rank: 2 is not in the range 0<=x<=1."),
    (["--num_machines", "2", "--main_process_ip", "h", "--num_processes", "3"],
     "--num_processes: 3 is not a multiple of 2 machines"),
    (["--num_processes", "4", "--gpu_ids", "0,1"],
     "--gpu_ids: '0,1': give 'all' or at least 4 comma-separated GPU ids, like 0,1"),
], ids=["rank-too-high", "not-divisible", "too-few-gpus"])
def test_bad_flag_values_are_one_line_errors(in_tmp, args, message):
    result = run(args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"distify: error: {message}"]
    assert not (in_tmp / "distify_config.yaml").exists()


def test_interactive_answers(in_tmp, terminal):
    answers = (
        "2\n"          # machines
        "1\n"          # this machine's rank
        "10.0.0.1\n"   # main machine
        "\n"           # port: default 29500
        "c10d\n"       # rendezvous
        "n\n"          # CPU only?
        "3\n"          # processes: not a multiple of 2, asked again
        "4\n"
        "\n"           # GPUs: all
        "fp16\n"       # mixed precision
        "\n"           # FSDP: no
        "\n"           # debug: no
    )
    result = run([], input=answers)
    assert result.exit_code == 0, result.output
    assert "3 is not a multiple of 2 machines" in result.output
    cfg = load_config(in_tmp / "distify_config.yaml")
    assert (cfg.num_machines, cfg.machine_rank, cfg.main_process_ip, cfg.main_process_port,
            cfg.rdzv_backend, cfg.num_processes, cfg.gpu_ids, cfg.mixed_precision,
            cfg.debug) == (2, 1, "10.0.0.1", 29500, "c10d", 4, "all", "fp16", False)


def test_interactive_fsdp_answers(in_tmp, terminal):
    answers = (
        "\n"           # machines: 1
        "n\n"          # CPU only?
        "2\n"          # processes
        "\n"           # GPUs: all
        "bf16\n"       # mixed precision
        "y\n"          # FSDP
        "Block\n"      # the layer class
        "\n"           # reshard after forward: yes
        "\n"           # offload: no
        "y\n"          # activation checkpointing
        "\n"           # state dict: FULL_STATE_DICT
        "\n"           # debug: no
    )
    result = run([], input=answers)
    assert result.exit_code == 0, result.output
    assert "mixed precision bf16, FSDP" in result.output
    cfg = load_config(in_tmp / "distify_config.yaml")
    assert cfg.distributed_type == "FSDP"
    assert cfg.fsdp_config.as_mapping() == {
        "fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "Block", "fsdp_reshard_after_forward": True,
        "fsdp_offload_params": False, "fsdp_activation_checkpointing": True,
        "fsdp_state_dict_type": "FULL_STATE_DICT"}


def test_fsdp_flags_without_a_terminal(in_tmp):
    result = run(["--num_processes", "4", "--use_fsdp", "--fsdp_min_num_params", "1000",
                  "--fsdp_auto_wrap_policy", "SIZE_BASED_WRAP", "--yes"])
    assert result.exit_code == 0, result.output
    cfg = load_config(in_tmp / "distify_config.yaml")
    assert cfg.distributed_type == "FSDP" and cfg.num_processes == 4
    assert cfg.fsdp_config.fsdp_min_num_params == 1000
    assert cfg.fsdp_config.fsdp_auto_wrap_policy == "SIZE_BASED_WRAP"
    assert cfg.fsdp_config.fsdp_activation_checkpointing is None  # not asked without a class
    plain = run(["--num_processes", "4", "--yes", "--config_file", "plain.yaml"])
    assert plain.exit_code == 0 and load_config(in_tmp / "plain.yaml").fsdp_config is None


def test_interactive_skips_questions_answered_by_flags(in_tmp, terminal):
    result = run(["--num_machines", "1", "--mixed_precision", "bf16", "--no-debug"],
                 input="\n\n\n")
    assert result.exit_code == 0, result.output
    assert "How many machines" not in result.output
    assert "Mixed precision" not in result.output
    assert "How many processes in total, over all machines? [1]" in result.output
    assert load_config(in_tmp / "distify_config.yaml").mixed_precision == "bf16"


def test_yes_never_asks_even_on_a_terminal(in_tmp, terminal):
    result = run(["--yes", "--num_processes", "2"])
    assert result.exit_code == 0, result.output
    assert "?" not in result.output
    assert load_config(in_tmp / "distify_config.yaml").num_processes == 2


def test_interactive_default_processes_follow_local_gpus(in_tmp, terminal, monkeypatch):
    from distify.launch import wizard

    monkeypatch.setattr(wizard, "_gpus", lambda: 4)
    result = run(["--num_machines", "2", "--main_process_ip", "h", "--machine_rank", "0",
                  "--main_process_port", "1234", "--rdzv_backend", "static"],
                 input="\n" * 6)  # the FSDP question too (8 processes)
    assert result.exit_code == 0, result.output
    assert "How many processes in total, over all machines? [8]" in result.output
    assert load_config(in_tmp / "distify_config.yaml").num_processes == 8


def test_help_has_an_example():
    result = CliRunner().invoke(main, ["config", "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output and "distify config --num_processes 8" in result.output
    assert "--num-processes" in result.output and "--num_processes" in result.output
