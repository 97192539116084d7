"""What a newcomer sees in their first hour (issue 13): launch configs that `convert` writes,
keeps or updates, hyper-parameter YAML files it never adopts, project conversions that are ready
to launch, the report on stderr with --diff, no clutter for unchanged files, summarised reports,
progress on a terminal, and `distify check --explain`."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from distify.cli import main
from distify.launch.config import load_config
from distify.lint.registry import REGISTRY
from tests.helpers import FIXTURES, REPO, clean_env

CONVERT = FIXTURES / "convert"
TRAIN = (CONVERT / "mnist_style.in.py").read_bytes()


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def distify(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m distify ARGS`` as a real process (stdout and stderr apart)."""
    return subprocess.run([sys.executable, "-m", "distify", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env=clean_env(PYTHONPATH=str(REPO)))


# ------------------------------------------------------------------ distify check --explain
def test_explain_prints_the_rules_documentation_and_examples(tmp_path: Path) -> None:
    proc = distify("check", "--explain", "DST101", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rule = REGISTRY["DST101"]
    assert proc.stdout.startswith("DST101: A checkpoint is saved by every rank.\n")
    assert "It does not touch a save\nwhose result is assigned" in proc.stdout  # the whole doc
    assert proc.stdout.count("VALID (not reported):") == len(rule.VALID)
    assert proc.stdout.count("INVALID (reported") == len(rule.INVALID)
    assert "INVALID (reported at line 9):" in proc.stdout
    assert "        torch.save(model.state_dict(), \"model.pt\")" in proc.stdout
    assert "after --fix:" in proc.stdout


def test_explain_accepts_any_case() -> None:
    result = run("check", "--explain", "dst305")
    assert result.exit_code == 0
    assert result.output.startswith("DST305: ")


def test_explain_an_unknown_code_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = distify("check", "--explain", "DST999", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"distify: error: unknown rule code 'DST999' (known: {', '.join(sorted(REGISTRY))})"]


# ------------------------------------------------------------------ item 3: --mixed-precision
@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_bytes(TRAIN)
    return tmp_path


def _config_lines(output: str) -> list[str]:
    return [line for line in output.splitlines()
            if line.startswith(("Wrote the launch", "Kept the existing", "Updated the launch",
                                "Left "))]


def test_explicit_mixed_precision_updates_an_existing_config(workdir: Path) -> None:
    assert distify("convert", "train.py", cwd=workdir).returncode == 0
    config = workdir / "train_dist.yaml"
    mine = config.read_text().replace("num_machines: 1\n", "num_machines: 1  # one box\n")
    config.write_text(mine)
    proc = distify("convert", "train.py", "--mixed-precision", "fp16", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert _config_lines(proc.stdout) == ["Updated the launch config train_dist.yaml: "
                                          "mixed_precision fp16"]
    # only that value changed: comments, order and the other settings are kept
    assert config.read_text() == mine.replace("mixed_precision: 'no'", "mixed_precision: fp16")
    assert load_config(config).mixed_precision == "fp16"
    assert not list(workdir.glob(".train_dist.yaml.*"))  # no temporary file left behind


def test_without_the_flag_an_existing_config_is_kept(workdir: Path) -> None:
    assert run("convert", "train.py", "--mixed-precision", "bf16").exit_code == 0
    before = (workdir / "train_dist.yaml").read_bytes()
    result = run("convert", "train.py")
    assert result.exit_code == 0
    assert _config_lines(result.output) == ["Kept the existing launch config train_dist.yaml"]
    result = run("convert", "train.py", "--mixed-precision", "bf16")
    assert _config_lines(result.output) == [
        "Kept the existing launch config train_dist.yaml: it already has mixed_precision bf16"]
    assert (workdir / "train_dist.yaml").read_bytes() == before


@pytest.mark.parametrize("text, expected", [
    ("distributed_type: 'NO'\nnum_processes: 1\n",
     "distributed_type: 'NO'\nnum_processes: 1\nmixed_precision: bf16\n"),
    ("distributed_type: 'NO'\nmixed_precision:\nnum_processes: 1\n",
     "distributed_type: 'NO'\nmixed_precision: bf16\nnum_processes: 1\n"),
    ("distributed_type: 'NO'\r\nmixed_precision: fp16\r\n",
     "distributed_type: 'NO'\r\nmixed_precision: bf16\r\n"),
    ("{distributed_type: 'NO', mixed_precision: fp16}\n",
     "{distributed_type: 'NO', mixed_precision: bf16}\n"),
], ids=["missing", "null", "crlf", "flow"])
def test_the_update_keeps_every_other_byte(workdir: Path, text: str, expected: str) -> None:
    (workdir / "train_dist.yaml").write_bytes(text.encode())
    result = run("convert", "train.py", "--mixed-precision", "bf16")
    assert result.exit_code == 0, result.output
    assert (workdir / "train_dist.yaml").read_bytes() == expected.encode()
    assert load_config(workdir / "train_dist.yaml").mixed_precision == "bf16"


def test_an_alias_shared_with_another_key_is_rewritten_not_corrupted(workdir: Path) -> None:
    (workdir / "train_dist.yaml").write_text(
        "distributed_type: 'NO'\ndowncast_bf16: &off 'no'\nmixed_precision: *off\n")
    result = run("convert", "train.py", "--mixed-precision", "fp16")
    assert "Updated the launch config train_dist.yaml: mixed_precision fp16" in result.output
    cfg = load_config(workdir / "train_dist.yaml")
    assert (cfg.mixed_precision, cfg.downcast_bf16) == ("fp16", "no")


def test_a_script_with_its_own_grad_scaler_keeps_mixed_precision_off(workdir: Path) -> None:
    (workdir / "amp.py").write_bytes((FIXTURES / "idioms" / "amp_accumulation.in.py").read_bytes())
    proc = distify("convert", "amp.py", "--mixed-precision", "fp16", cwd=workdir)
    why = "mixed_precision 'no' (not 'fp16': the script scales its own loss)"
    assert _config_lines(proc.stdout) == [f"Wrote the launch config amp_dist.yaml with {why}"]
    config = workdir / "amp_dist.yaml"
    config.write_text(config.read_text().replace("mixed_precision: 'no'", "mixed_precision: bf16"))
    proc = distify("convert", "amp.py", "--mixed-precision", "fp16", cwd=workdir)
    assert _config_lines(proc.stdout) == [f"Updated the launch config amp_dist.yaml: {why}"]
    assert load_config(config).mixed_precision == "no"
    proc = distify("convert", "amp.py", "--mixed-precision", "fp16", cwd=workdir)
    assert _config_lines(proc.stdout) == [
        f"Kept the existing launch config amp_dist.yaml: it already has {why}"]


def test_help_shows_the_default_and_an_example() -> None:
    text = " ".join(run("convert", "--help").output.split())
    assert "[default: 'no' in a new config; an existing config is kept as it is]" in text
    assert "distify convert train.py --mixed-precision bf16 #" in text


# ------------------------------------------------------------------ item 4: someone's own YAML
HYPER = b"lr: 0.1\nepochs: 3\n"


def _launch_line(output: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith("Launch: "))
    return line.removeprefix("Launch: ").split("   (")[0]


def _launches_as_printed(command: str, cwd: Path) -> None:
    """The printed command, run with --dry-run, finds a valid launch config."""
    argv = shlex.split(command)
    assert argv[:2] == ["distify", "launch"]
    proc = distify("launch", "--dry-run", *argv[2:], cwd=cwd)
    assert proc.returncode == 0, proc.stderr


def test_in_place_never_adopts_the_scripts_hyper_parameters(workdir: Path) -> None:
    (workdir / "train.yaml").write_bytes(HYPER)
    assert distify("launch", "--dry-run", "train.py", cwd=workdir).returncode == 2  # the bug
    proc = distify("convert", "train.py", "-i", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert (workdir / "train.yaml").read_bytes() == HYPER
    assert _config_lines(proc.stdout) == [
        "Left train.yaml alone: not a launch config (train.yaml:1:1: lr: unknown key)",
        "Wrote the launch config train.launch.yaml"]
    load_config(workdir / "train.launch.yaml")
    command = _launch_line(proc.stdout)
    assert command.startswith("distify launch --config_file train.launch.yaml ")
    assert command.endswith(" train.py")
    _launches_as_printed(command, workdir)


def test_someone_elses_dist_yaml_is_left_alone_and_the_next_names_are_tried(
        workdir: Path) -> None:
    (workdir / "train_dist.yaml").write_bytes(HYPER)
    (workdir / "train_dist.launch.yaml").write_text("model: resnet\n")
    proc = distify("convert", "train.py", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert _config_lines(proc.stdout) == [
        "Left train_dist.yaml alone: not a launch config "
        "(train_dist.yaml:1:1: lr: unknown key)",
        "Left train_dist.launch.yaml alone: not a launch config "
        "(train_dist.launch.yaml:1:1: model: unknown key)",
        "Wrote the launch config train_dist.launch-2.yaml"]
    assert (workdir / "train_dist.yaml").read_bytes() == HYPER
    _launches_as_printed(_launch_line(proc.stdout), workdir)
    # converted again: the config distify wrote is found and kept, the others still left alone
    again = run("convert", "train.py", "--json")
    report = json.loads(again.output)
    assert report["launch_config"] == "train_dist.launch-2.yaml"
    assert "--config_file train_dist.launch-2.yaml" in report["launch"]


def test_a_broken_launch_config_is_not_overwritten(workdir: Path) -> None:
    (workdir / "train_dist.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 0\n")
    result = run("convert", "train.py", "--mixed-precision", "fp16")
    assert _config_lines(result.output) == [
        "Left train_dist.yaml alone: not a launch config "
        "(train_dist.yaml:2:1: num_processes: must be 1 or more, got 0)",
        "Wrote the launch config train_dist.launch.yaml"]
    assert load_config(workdir / "train_dist.launch.yaml").mixed_precision == "fp16"
