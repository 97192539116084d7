"""`distify check` as a user runs it: exit codes, output formats, fixes, config, parallel runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from distify.cli import main
from tests.helpers import REPO

BAD = """\
import torch
import torch.distributed as dist

rank = dist.get_rank()
if rank == 0:
    print("start")
torch.save(model.state_dict(), "model.pt")
with open("log.txt", "w") as f:
    f.write("done")
writer = torch.utils.tensorboard.SummaryWriter()
"""
GOOD = """\
import torch
import torch.distributed as dist

if dist.get_rank() == 0:
    torch.save(model.state_dict(), "model.pt")
"""
PLAIN = """\
import torch

torch.save(model.state_dict(), "model.pt")
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def write(name: str, text: str):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return write


def run(*args: str):
    return CliRunner().invoke(main, ["check", *args], catch_exceptions=False)


def test_clean_files_exit_0_with_a_summary_on_stderr(project):
    project("good.py", GOOD)
    result = run("good.py")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "all checks passed" in result.stderr


def test_findings_exit_1_sorted_with_fixable_marks(project):
    project("b.py", BAD)
    project("a.py", BAD)
    result = run(".")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines == sorted(lines, key=lambda line: (line.split(":")[0], int(line.split(":")[1])))
    assert lines[0] == ("a.py:7:1: DST101 [*] `torch.save` saves a checkpoint on every rank; "
                        "save on the main process only")
    assert "a.py:8:6: DST102 [*]" in result.stdout
    assert "a.py:10:10: DST103 `torch" in result.stdout  # assigned: reported, not fixable
    assert "6 findings (4 fixable with --fix)" in result.stderr


def test_fix_rewrites_in_place_and_leaves_the_unfixable(project):
    path = project("train.py", BAD)
    result = run("--fix", "train.py")
    assert result.exit_code == 1  # the SummaryWriter assignment remains
    text = path.read_text()
    assert 'if rank == 0:\n    torch.save(model.state_dict(), "model.pt")\n    with open' in text
    assert result.stdout.splitlines() == [
        ("train.py:11:10: DST103 `torch.utils.tensorboard.SummaryWriter` logs to an experiment "
         "tracker from every rank; log on the main process only")]
    assert "fixed 2 findings, 1 remaining" in result.stderr
    assert run("--fix", "train.py").exit_code == 1
    assert path.read_text() == text  # idempotent


def test_fix_of_everything_exits_0(project):
    path = project("train.py", BAD.replace("writer = ", "# writer = "))
    assert run("--fix", "train.py").exit_code == 0
    assert run("train.py").exit_code == 0
    assert "distify" not in path.read_text()  # the file's own guard, no runtime import


def test_diff_shows_the_fix_and_writes_nothing(project):
    path = project("train.py", BAD)
    result = run("--diff", "train.py")
    assert result.exit_code == 1
    assert result.stdout.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "+if rank == 0:\n+    torch.save(" in result.stdout
    assert path.read_text() == textwrap.dedent(BAD)
    assert "would fix 2 findings, 1 remaining" in result.stderr


def test_select_and_ignore(project):
    project("train.py", BAD)
    assert {line.split()[1] for line in run("--select", "DST101,DST103", "train.py")
            .stdout.splitlines()} == {"DST101", "DST103"}
    assert {line.split()[1] for line in run("--ignore", "DST1", "train.py")
            .stdout.splitlines()} == set()
    assert {line.split()[1] for line in run("--select", "DST10", "--ignore", "DST102",
                                            "train.py").stdout.splitlines()} == {"DST101",
                                                                                 "DST103"}


def test_unknown_code_and_missing_path_exit_2(project):
    project("train.py", BAD)
    result = CliRunner().invoke(main, ["check", "--select", "XYZ1", "train.py"])
    assert result.exit_code == 2
    assert "unknown rule code 'XYZ1'" in result.stderr
    result = CliRunner().invoke(main, ["check", "missing.py"])
    assert result.exit_code == 2
    assert "missing.py: no such file or folder" in result.stderr


def test_syntax_error_is_reported_and_other_files_still_checked(project):
    project("broken.py", "import torch\ndef f(:\n    pass\n")
    project("train.py", BAD)
    result = run(".")
    assert result.exit_code == 1
    assert "broken.py:2:7: DST000 syntax error: invalid syntax" in result.stdout
    assert "train.py:7:1: DST101" in result.stdout
    assert "1 file could not be parsed" in result.stderr


def test_non_distributed_files_need_all(project):
    project("plain.py", PLAIN)
    project("notes.py", "print('no torch here')\n")
    result = run(".")
    assert result.exit_code == 0
    assert "2 skipped" in result.stderr
    result = run("--all", ".")
    assert result.exit_code == 1
    assert result.stdout.startswith("plain.py:3:1: DST101")


def test_noqa_bare_and_with_codes(project):
    project("train.py", """\
        import torch
        import torch.distributed as dist
        torch.save(state, "a.pt")  # noqa
        torch.save(state, "b.pt")  # noqa: DST101
        torch.save(state, "c.pt")  # noqa: DST104
        """)
    assert [line.split(":")[1] for line in run("train.py").stdout.splitlines()] == ["5"]


def test_json_output(project):
    project("train.py", BAD)
    result = run("--output-format", "json", "train.py")
    rows = json.loads(result.stdout)
    assert [row["code"] for row in rows] == ["DST101", "DST102", "DST103"]
    assert rows[0]["location"] == {"row": 7, "column": 1}
    assert rows[0]["fixable"] is True and rows[2]["fixable"] is False


def test_github_output(project):
    project("train.py", BAD)
    lines = run("--output-format", "github", "train.py").stdout.splitlines()
    assert lines[0].startswith("::error title=distify (DST101),file=train.py,line=7,col=1,")
    assert lines[0].endswith("::DST101 `torch.save` saves a checkpoint on every rank; save on "
                             "the main process only")


def test_sarif_output(project):
    project("train.py", BAD)
    log = json.loads(run("--output-format", "sarif", "train.py").stdout)
    assert log["version"] == "2.1.0"
    run_ = log["runs"][0]
    rule_ids = {rule["id"] for rule in run_["tool"]["driver"]["rules"]}
    assert {"DST101", "DST201", "DST303"} <= rule_ids
    first = run_["results"][0]
    assert first["ruleId"] == "DST101"
    assert first["locations"][0]["physicalLocation"]["region"]["startLine"] == 7


def test_parallel_jobs_give_the_same_output(project):
    for index in range(40):
        project(f"pkg/m{index:02d}.py", BAD if index % 3 else GOOD)
    project("pkg/readme_like.py", "x = 1\n")
    one = run("--jobs", "1", "pkg")
    two = run("--jobs", "2", "pkg")
    assert one.exit_code == two.exit_code == 1
    assert one.stdout == two.stdout
    assert len(one.stdout.splitlines()) == 26 * 3


def test_pyproject_config(project):
    project("pyproject.toml", """\
        [tool.distify.check]
        ignore = ["DST103"]
        exclude = ["legacy/"]
        """)
    project("train.py", BAD)
    project("legacy/old.py", BAD)
    result = run(".")
    assert {line.split(":")[0] for line in result.stdout.splitlines()} == {"train.py"}
    assert "DST103" not in result.stdout
    assert "DST103" in run("--select", "DST103", ".").stdout  # --select replaces the config's


def test_bad_pyproject_config_exits_2(project):
    project("pyproject.toml", "[tool.distify.check]\nselct = ['DST1']\n")
    project("train.py", BAD)
    result = CliRunner().invoke(main, ["check", "."])
    assert result.exit_code == 2
    assert "unknown key 'selct'" in result.stderr


def test_list_rules():
    result = run("--list-rules")
    assert result.exit_code == 0
    assert [line.split()[0] for line in result.stdout.splitlines()] == [
        "DST101", "DST102", "DST103", "DST104", "DST201", "DST202", "DST203", "DST301", "DST302",
        "DST303", "DST304", "DST305"]


def test_real_process_exit_codes_and_no_torch_import(tmp_path):
    (tmp_path / "train.py").write_text(BAD)
    proc = subprocess.run([sys.executable, "-m", "distify", "check", "train.py"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("train.py:7:1: DST101 [*]")
    code = ("import sys, distify.cli, distify.lint.cli, distify.lint.fixer; "
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, check=False)
    assert proc.stdout.strip() == "False"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import distify.cli"],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert "torch" not in proc.stderr
