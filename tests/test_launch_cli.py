"""`distify launch` without running a job: options, config lookup, --dry-run, --slurm, errors."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner

from distify.cli import main
from distify.launch.config import make_config, write_config

PYTHON_TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@pytest.fixture
def script(tmp_path, monkeypatch):
    """A script in an empty folder (cwd), with no GPUs visible and no job ever started."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("distify.launch.config.local_gpu_count", lambda: 0)

    def no_job(*args, **kwargs):
        raise AssertionError(f"a job was started: {args}")

    monkeypatch.setattr("distify.launch.torchrun.run_plan", no_job)
    path = tmp_path / "train_dist.py"
    # Converted (it imports the runtime), so launching it on N processes warns about nothing.
    path.write_text("import distify.runtime\nprint('trained')\n")
    return path


def launch(*args: str):
    return CliRunner().invoke(main, ["launch", *args])


def dry_run(*args: str) -> tuple[dict[str, str], list[str]]:
    """The environment and the argument list that `--dry-run` prints."""
    result = launch("--dry-run", *args)
    assert result.exit_code == 0, result.output
    *exports, command = result.output.strip().splitlines()
    env = dict(line.removeprefix("export ").split("=", 1) for line in exports)
    return env, shlex.split(command)


def test_dry_run_one_machine_defaults(script):
    env, argv = dry_run("train_dist.py")
    assert argv == [*PYTHON_TORCHRUN, "--standalone", "--nproc-per-node", "1", "train_dist.py"]
    assert env == {"DISTIFY_MIXED_PRECISION": "no", "ACCELERATE_MIXED_PRECISION": "no"}


@pytest.mark.parametrize("spelling", ["--num_processes", "--num-processes"])
def test_options_in_both_spellings(script, spelling):
    _, argv = dry_run(spelling, "2", "--mixed-precision", "bf16", "train_dist.py")
    assert argv[argv.index("--nproc-per-node") + 1] == "2"


@pytest.mark.parametrize("args,script_args", [
    (["train_dist.py", "--lr", "3", "--num_processes", "8"], ["--lr", "3", "--num_processes", "8"]),
    (["train_dist.py", "--", "--lr", "3"], ["--lr", "3"]),
    (["--", "train_dist.py", "-h"], ["-h"]),
], ids=["after-script", "after-double-dash", "help-for-the-script"])
def test_everything_after_the_script_goes_to_the_script(script, args, script_args):
    _, argv = dry_run(*args)
    assert argv[argv.index("train_dist.py") + 1:] == script_args
    assert argv[argv.index("--nproc-per-node") + 1] == "1"


def test_sibling_config_is_used_and_options_override_it(script, monkeypatch):
    write_config(make_config(num_processes=4, mixed_precision="fp16", gpu_ids="0,1,2,3"),
                 script.with_suffix(".yaml"))
    env, argv = dry_run("train_dist.py")
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert env["DISTIFY_MIXED_PRECISION"] == "fp16"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    # --gpu_ids is checked on --dry-run too (issue 25 item 9): a machine with 4 GPUs
    monkeypatch.setattr("distify.launch.config.local_gpu_count", lambda: 4)
    env, argv = dry_run("--num_processes", "2", "--gpu_ids", "2,3", "--mixed_precision", "no",
                        "train_dist.py")
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert (env["DISTIFY_MIXED_PRECISION"], env["CUDA_VISIBLE_DEVICES"]) == ("no", "2,3")


def test_config_file_option_wins_over_sibling(script, tmp_path):
    write_config(make_config(num_processes=4), script.with_suffix(".yaml"))
    write_config(make_config(num_processes=3), tmp_path / "other.yaml")
    _, argv = dry_run("--config-file", "other.yaml", "train_dist.py")
    assert argv[argv.index("--nproc-per-node") + 1] == "3"


def test_static_multi_machine(script):
    _, argv = dry_run("--num_machines", "2", "--machine_rank", "1", "--num_processes", "16",
                      "--main_process_ip", "10.0.0.1", "--main_process_port", "29400",
                      "--max_restarts", "3", "train_dist.py")
    assert argv == [*PYTHON_TORCHRUN, "--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1",
                    "--master-addr", "10.0.0.1", "--master-port", "29400", "--max-restarts", "3",
                    "train_dist.py"]


def test_c10d_multi_machine(script):
    _, argv = dry_run("--num_machines", "2", "--num_processes", "4", "--rdzv-backend", "c10d",
                      "--main_process_ip", "head", "--main_process_port", "29400",
                      "train_dist.py")
    assert argv == [*PYTHON_TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend",
                    "c10d", "--rdzv-endpoint", "head:29400", "train_dist.py"]


def test_cpu_and_debug_environment(script):
    env, _ = dry_run("--cpu", "--num_processes", "2", "train_dist.py")
    assert env["DISTIFY_USE_CPU"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in env  # (--gpu_ids with --cpu: an error, issue 25 item 9)
    write_config(make_config(debug=True, use_cpu=True), script.with_suffix(".yaml"))
    env, _ = dry_run("--num_processes", "2", "train_dist.py")
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert env["DISTIFY_USE_CPU"] == "1"  # no --cpu given: the config's use_cpu stands


def test_fsdp_options_and_config_become_accelerates_variables(script):
    env, argv = dry_run("--num_processes", "2", "--use_fsdp",
                        "--fsdp_transformer_layer_cls_to_wrap", "Block",
                        "--fsdp-activation-checkpointing", "true", "train_dist.py")
    assert argv[-1] == "train_dist.py"
    assert {key: value for key, value in env.items() if "FSDP" in key or "STRATEGY" in key} == {
        "DISTIFY_STRATEGY": "fsdp", "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block", "FSDP_ACTIVATION_CHECKPOINTING": "true"}
    # a config's fsdp_config, with an option on top; --cpu keeps it an FSDP job
    write_config(make_config(num_processes=2, distributed_type="FSDP",
                             fsdp_config={"fsdp_reshard_after_forward": False,
                                          "fsdp_state_dict_type": "SHARDED_STATE_DICT"}),
                 script.with_suffix(".yaml"))
    env, _ = dry_run("--cpu", "--fsdp_offload_params", "false", "train_dist.py")
    assert (env["ACCELERATE_USE_FSDP"], env["FSDP_RESHARD_AFTER_FORWARD"],
            env["FSDP_STATE_DICT_TYPE"], env["FSDP_OFFLOAD_PARAMS"], env["DISTIFY_USE_CPU"]) == (
        "true", "false", "SHARDED_STATE_DICT", "false", "1")
    env, _ = dry_run("--num_processes", "4", "train_dist.py")
    assert env["ACCELERATE_USE_FSDP"] == "true"  # more processes: still FSDP
    bad = launch("--dry-run", "--fsdp_state_dict_type", "LOCAL", "train_dist.py")
    assert bad.exit_code == 2 and "'LOCAL' is not one of 'FULL_STATE_DICT'" in bad.output


def test_dry_run_quotes_for_the_shell(script, tmp_path):
    odd = tmp_path / "my script.py"
    odd.write_text("")
    result = launch("--dry-run", "my script.py", "--name", "it's")
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].endswith("""'my script.py' --name 'it'"'"'s'""")


def test_slurm_script(script):
    result = launch("--slurm", "--num_machines", "2", "--num_processes", "16", "--mixed_precision",
                    "bf16", "--main_process_port", "29400", "--max_restarts", "1",
                    "train_dist.py", "--epochs", "3")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "#!/bin/bash"
    for expected in ["#SBATCH --job-name=train_dist", "#SBATCH --nodes=2",
                     "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                     "export DISTIFY_MIXED_PRECISION=bf16",
                     'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                     ("srun python -m torch.distributed.run --nnodes 2 --nproc-per-node 8 "
                      "--rdzv-backend c10d \\"),
                     ('  --rdzv-endpoint "$head_node:29400" --rdzv-id "$SLURM_JOB_ID" '
                      "--max-restarts 1 \\"),
                     "  train_dist.py --epochs 3"]:
        assert expected in lines
    # The script is valid shell.
    subprocess.run(["bash", "-n"], input=result.output, text=True, check=True)


def test_slurm_on_cpus_requests_no_gpus(script):
    result = launch("--slurm", "--cpu", "--num_machines", "2", "--num_processes", "4",
                    "train_dist.py")
    assert result.exit_code == 0, result.output
    assert "--gpus-per-node" not in result.output
    assert "export DISTIFY_USE_CPU=1" in result.output.splitlines()


def write(path, text):
    path.write_text(text)
    return path.name


BAD = {
    "malformed-yaml": (lambda d: ["--config_file", write(d / "c.yaml", "a: [\n"),
                                  "train_dist.py"], r"c\.yaml:2:1: malformed YAML"),
    "unknown-key": (lambda d: ["--config_file",
                               write(d / "c.yaml", "distributed_type: 'NO'\nnum_gpus: 2\n"),
                               "train_dist.py"], r"c\.yaml:2:1: num_gpus: unknown key"),
    "port-out-of-range": (lambda d: ["--config_file", write(
        d / "c.yaml", "distributed_type: MULTI_GPU\nnum_processes: 2\nmain_process_port: 99999\n"),
        "train_dist.py"], r"c\.yaml:3:1: main_process_port: 99999 is out of range"),
    "not-divisible": (lambda d: ["--num_machines", "2", "--num_processes", "3",
                                 "train_dist.py"], r"num_processes: 3 is not a multiple"),
    "sibling-config-broken": (lambda d: [write(d / "train_dist.yaml", "- a list\n") and
                                         "train_dist.py"],
                              r"train_dist\.yaml: a launch config must be a mapping"),
    "missing-script": (lambda d: ["nope.py"], r"nope\.py: script not found"),
    "missing-config": (lambda d: ["--config_file", "nope.yaml", "train_dist.py"],
                       r"nope\.yaml: config file not found"),
    "multi-machine-without-address": (lambda d: ["--num_machines", "2", "--num_processes", "2",
                                                 "train_dist.py"],
                                      r"needs --main_process_ip and --main_process_port"),
    "dry-run-and-slurm": (lambda d: ["--dry-run", "--slurm", "train_dist.py"],
                          r"--dry-run and --slurm both print"),
    "fsdp-unknown-key": (lambda d: ["--config_file", write(
        d / "c.yaml", "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n"
                      "  fsdp_wrap_class: Block\n"), "train_dist.py"],
        r"c\.yaml:4:3: fsdp_config\.fsdp_wrap_class: unknown key"),
}


@pytest.mark.parametrize("make_args,message", BAD.values(), ids=BAD.keys())
def test_bad_input_is_one_line_exit_2_and_nothing_launched(script, make_args, message):
    result = launch(*make_args(script.parent))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distify: error: "), result.output
    assert re.search(message, lines[0]), lines[0]


def test_missing_torch_is_said_clearly(script, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    result = launch("train_dist.py")
    assert result.exit_code == 2
    assert "distify launch needs torch" in result.output and "pip install torch" in result.output
    # Printing a command or a batch script does not need torch.
    assert launch("--dry-run", "train_dist.py").exit_code == 0


def test_cli_import_does_not_import_torch():
    code = ("import sys, distify.cli, distify.launch.torchrun, distify.launch.slurm, "
            "distify.launch.wizard; print(sorted(m for m in sys.modules "
            "if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_has_examples_and_both_spellings():
    result = CliRunner().invoke(main, ["launch", "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output and "distify launch --num_processes 2" in result.output
    for option in ("--num_processes, --num-processes", "--config_file, --config-file",
                   "--main_process_ip, --main-process-ip", "--max_restarts, --max-restarts",
                   "--rdzv_backend, --rdzv-backend", "--gpu_ids, --gpu-ids", "--cpu", "--slurm",
                   "--dry-run"):
        assert option in result.output, option


def test_restartable_job_on_one_machine_uses_a_static_rendezvous(script):
    # torchrun's --standalone rendezvous cannot restart Gloo workers (stale peer addresses);
    # test_faults.py runs a real restart through this path.
    result = launch("--dry-run", "--num_processes", "2", "--cpu", "--max_restarts", "2",
                    "--main_process_port", "29512", "train_dist.py")
    assert result.exit_code == 0, result.output
    command = result.output.strip().splitlines()[-1]
    assert "--standalone" not in command
    assert ("--nnodes 1 --node-rank 0 --master-addr 127.0.0.1 --master-port 29512 "
            "--nproc-per-node 2 --max-restarts 2") in command
