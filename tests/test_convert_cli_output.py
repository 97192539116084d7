"""What a newcomer sees in their first hour (issue 13): launch configs that `convert` writes,
keeps or updates, hyper-parameter YAML files it never adopts, project conversions that are ready
to launch, the report on stderr with --diff, no clutter for unchanged files, summarised reports,
progress on a terminal, and `distify check --explain`."""

from __future__ import annotations

import inspect
import json
import os
import shlex
import subprocess
import sys
import textwrap
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
    title, body = inspect.cleandoc(rule.__doc__).split("\n\n", 1)
    assert proc.stdout.startswith(f"DST101: {' '.join(title.split())}\n\n{body}\n\n")
    assert f"Message: {rule.MESSAGE}\n" in proc.stdout
    assert proc.stdout.count("VALID (not reported):") == len(rule.VALID)
    assert proc.stdout.count("INVALID (reported") == len(rule.INVALID)
    for example in (*rule.VALID, *rule.INVALID):
        assert textwrap.indent(example.code, "    ") in proc.stdout
    assert "INVALID (reported at line 9):" in proc.stdout
    assert proc.stdout.count("after --fix:") == sum(e.fixed is not None for e in rule.INVALID)


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


# ------------------------------------------------------------------ item 9: projects
def _project(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


TRAINER = (CONVERT / "trainer_class.in.py").read_bytes()  # ends in `if __name__ == "__main__":`
UTILS = (CONVERT / "tensor_utils.noop.py").read_bytes()
NO_MAIN = b"import torch\n\ndef report(x):\n    print(x)\n"


def test_a_project_gets_a_launch_config_beside_its_entry_point(tmp_path: Path) -> None:
    _project(tmp_path / "src", {"pkg/train.py": TRAINER, "pkg/log.py": NO_MAIN,
                                "utils.py": UTILS})
    proc = distify("convert", "src", "-o", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "2 of 3 Python file(s) converted" in proc.stdout
    assert _config_lines(proc.stdout) == ["Wrote the launch config out/pkg/train.yaml"]
    load_config(tmp_path / "out" / "pkg" / "train.yaml")
    command = _launch_line(proc.stdout)
    assert command.endswith(" out/pkg/train.py") and "--config_file" not in command
    _launches_as_printed(command, tmp_path)
    assert (tmp_path / "out" / "utils.py").read_bytes() == UTILS  # unchanged files still copied


def test_a_project_with_two_training_scripts_gets_a_launch_line_and_config_each(
        tmp_path: Path) -> None:
    _project(tmp_path / "src", {"a.py": TRAINER, "b.py": TRAINER})
    proc = distify("convert", "src", "-o", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _config_lines(proc.stdout) == ["Wrote the launch config out/a.yaml",
                                          "Wrote the launch config out/b.yaml"]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("Launch: ")]
    commands = [line.removeprefix("Launch: ").split("   (")[0] for line in lines]
    assert [c.split()[-1] for c in commands] == ["out/a.py", "out/b.py"]
    for command in commands:
        assert "--config_file" not in command and "SCRIPT" not in command
        _launches_as_printed(command, tmp_path)


#: a training function in a module that no script runs: which file is launched is unclear
FIT = (b"import torch\n\n\ndef fit(model, loader, opt):\n    for x, y in loader:\n"
       b"        opt.zero_grad()\n        torch.nn.functional.mse_loss(model(x), y).backward()\n"
       b"        opt.step()\n")


def test_a_project_whose_entry_point_is_unclear_gets_launch_yaml_at_its_top(
        tmp_path: Path) -> None:
    _project(tmp_path / "src", {"a.py": FIT, "b.py": FIT})
    result_dir = tmp_path / "out"
    proc = distify("convert", "src", "-o", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _config_lines(proc.stdout) == ["Wrote the launch config out/launch.yaml"]
    load_config(result_dir / "launch.yaml")
    # not ready either: no model is built where the loss is computed
    line = next(line for line in proc.stdout.splitlines() if "distify launch " in line)
    assert "SCRIPT: the entry point, one of out/a.py, out/b.py" in line
    command = ("distify launch " + line.split("distify launch ", 1)[1]).split("   (")[0]
    assert command.startswith("distify launch --config_file out/launch.yaml ")
    _launches_as_printed(command.replace("SCRIPT", "out/a.py"), tmp_path)


def test_a_project_in_place_gets_its_config_and_a_project_not_ready_says_so(
        workdir: Path) -> None:
    _project(workdir / "proj", {"train.py": TRAINER,
                                "other.py": b"import torch\nloss = f(x)\nloss.backward()\n"})
    result = run("convert", "proj", "-i")
    assert result.exit_code == 0, result.output
    assert (workdir / "proj" / "train.yaml").is_file()
    assert "\nLaunch:" not in result.output
    assert "Not ready to launch: a model that trains may not be prepared" in result.output
    assert "Once it is: distify launch " in result.output


def test_a_project_with_no_config_writes_none_but_still_says_how_to_launch(
        workdir: Path) -> None:
    _project(workdir / "proj", {"train.py": TRAINER})
    result = run("convert", "proj", "-o", "out", "--no-config")
    assert not list((workdir / "out").glob("*.yaml"))
    assert "Launch: distify launch " in result.output and "out/train.py" in result.output


def test_a_project_is_never_written_into_itself(workdir: Path) -> None:
    _project(workdir / "proj", {"train.py": TRAINER})
    result = run("convert", "proj", "-o", "proj")
    assert result.exit_code == 2
    assert "the output folder must not be the project folder" in result.output
    assert sorted(p.name for p in (workdir / "proj").iterdir()) == ["train.py"]


# ------------------------------------------------------------------ item 9: --diff
def test_diff_prints_a_pure_diff_on_stdout_and_the_report_on_stderr(workdir: Path) -> None:
    proc = distify("convert", "train.py", "--diff", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["--- train.py", "+++ train.py"]
    assert all(line[:1] in {" ", "+", "-", "@", "\\"} for line in lines)
    assert proc.stderr.startswith("train.py: 11 change(s)\n")
    assert "train.py:49: backward through the runtime" in proc.stderr
    assert "Batch size: " in proc.stderr
    assert sorted(p.name for p in workdir.iterdir()) == ["train.py"]
    patched = subprocess.run(["patch", "--dry-run", "-p0"], input=proc.stdout, cwd=workdir,
                             capture_output=True, text=True)
    assert patched.returncode == 0, patched.stdout + patched.stderr


# ------------------------------------------------------------------ item 9: no clutter
@pytest.mark.parametrize("data, reason", [
    (b"", "does not import torch"),
    ((CONVERT / "mnist_style.out.py").read_bytes(), "already distributed"),
], ids=["empty", "already-converted"])
def test_an_unchanged_file_is_not_written_to_the_default_output(tmp_path: Path, data: bytes,
                                                                  reason: str) -> None:
    (tmp_path / "done.py").write_bytes(data)
    proc = distify("convert", "done.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done.py"]
    (first,) = proc.stdout.splitlines()
    assert first.startswith(f"done.py: unchanged ({reason}")
    assert first.endswith("; done_dist.py not written (-o done_dist.py writes a copy anyway)")
    # asked for explicitly, it is written
    assert distify("convert", "done.py", "-o", "done_dist.py", cwd=tmp_path).returncode == 0
    assert (tmp_path / "done_dist.py").read_bytes() == data


def test_a_standalone_conversion_of_an_unchanged_file_copies_no_runtime(workdir: Path) -> None:
    (workdir / "empty.py").write_bytes(b"")
    assert run("convert", "empty.py", "--standalone").exit_code == 0
    assert sorted(p.name for p in workdir.iterdir()) == ["empty.py", "train.py"]


# ------------------------------------------------------------------ item 9: summaries
MANY_PRINTS = ("import torch\nscalers = [torch.cuda.amp.GradScaler()]\n"
               "scalers.append(torch.cuda.amp.GradScaler())\n"
               "scalers.append(torch.cuda.amp.GradScaler())\n"
               "for step in range(3):\n" + "".join(f"    print({i})\n" for i in range(300)))


def test_many_identical_changes_are_one_line_and_verbose_lists_them(workdir: Path) -> None:
    (workdir / "many.py").write_text(MANY_PRINTS)
    proc = distify("convert", "many.py", "--no-config", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "many.py → many_dist.py: 300 change(s)"
    assert lines[1] == ("  many_dist.py: print on the main process only: 300 lines "
                        "(7, 8, 9, 10, 11, ...)")
    assert lines[2] == "  (--verbose lists every line)"
    # the places that need a look are never summarised, even when they say the same thing
    assert sum("manages its own mixed precision" in line for line in lines) == 3
    verbose = distify("convert", "many.py", "--no-config", "--verbose", cwd=workdir).stdout
    assert sum(": print on the main process only" in line for line in verbose.splitlines()) \
        == 300
    assert "  many_dist.py:306: print on the main process only" in verbose
    assert "--verbose lists" not in verbose


def test_a_few_identical_changes_are_summarised_without_losing_a_line(workdir: Path) -> None:
    (workdir / "few.py").write_text("import torch\nprint(1)\nprint(2)\nprint(3)\n")
    lines = run("convert", "few.py", "--no-config").output.splitlines()
    assert lines[1] == "  few_dist.py: print on the main process only: 3 lines (3, 4, 5)"
    assert "--verbose" not in lines[2]


# ------------------------------------------------------------------ item 9: progress
def _many_files(root: Path) -> None:
    _project(root / "src", {"train.py": TRAINER, **{f"m{i}.py": UTILS for i in range(12)}})


def test_a_long_project_shows_progress_on_a_terminal(tmp_path: Path) -> None:
    pty = pytest.importorskip("pty")
    _many_files(tmp_path)
    master, slave = pty.openpty()
    with subprocess.Popen([sys.executable, "-m", "distify", "convert", "src", "-o", "out"],
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave,
                          env=clean_env(PYTHONPATH=str(REPO))) as proc:
        os.close(slave)
        shown = _read_all(master)
        stdout = proc.stdout.read().decode()
    assert proc.returncode == 0
    assert b"Converting" in shown and b"100%" in shown
    assert "Converting" not in stdout and "Launch: " in stdout


def _read_all(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data


def test_no_progress_when_stderr_is_piped(tmp_path: Path) -> None:
    _many_files(tmp_path)
    proc = distify("convert", "src", "-o", "out", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stderr == ""


# ------------------------------------------------------------------ item 9: progress lines
def test_the_report_says_progress_lines_count_one_process(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_bytes((REPO / "examples" / "train.py").read_bytes())
    proc = distify("convert", "train.py", cwd=tmp_path)
    note = next(line for line in proc.stdout.splitlines() if line.startswith("Progress lines"))
    assert note == ("Progress lines (train_dist.py:52) count the main process's own samples; "
                    "on N processes the global count is N × that.")
    line = (tmp_path / "train_dist.py").read_text().splitlines()[51]
    assert "distify.print(" in line and "Train Epoch" in line and "batch_idx * len(data)" in line


@pytest.mark.parametrize("body", [
    "    print(f'epoch {epoch} loss {loss}')\n",  # no counter: nothing per-process is counted
    "    print(f'{i}/{len(loader)}')\n",  # counter over the shard's own length: true as printed
], ids=["no-counter", "own-length"])
def test_no_progress_note_where_it_would_not_be_true(workdir: Path, body: str) -> None:
    (workdir / "t.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(ds, batch_size=8)\n"
        "for epoch in range(2):\n  for i, (x, y) in enumerate(loader):\n"
        "    loss = model(x).sum()\n    loss.backward()\n" + body)
    result = run("convert", "t.py", "--no-config")
    assert "Batch size: 8" in result.output
    assert "Progress lines" not in result.output


def test_the_json_report_says_an_unchanged_file_was_not_written(workdir: Path) -> None:
    (workdir / "empty.py").write_bytes(b"")
    (entry,) = json.loads(run("convert", "empty.py", "--json").output)["files"]
    assert entry["status"] == "no-torch" and entry["output"] is None
    assert not (workdir / "empty_dist.py").exists()
