"""Friction a new user hit (issue 25) and faults found by probing (issue 26), each through the
command line: `convert .`, -o over an unrelated file, the loader note, `distify.save({` kept in
place, paths spelled two ways, deep expressions, symlink loops, unwritable project outputs and
a quoted launch command."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from distify.convert.side_effects import path_key
from tests.helpers import REPO, clean_env

TRAIN = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(list(range(10)), batch_size=2)
    for epoch in range(2):
        for x in loader:
            opt.zero_grad()
            loss = model(torch.zeros(2)).sum()
            loss.backward()
            opt.step()
    torch.save({
        "model": model.state_dict(),
        "opt": opt.state_dict(),
    }, "ckpt.pt")
""")


def distify(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m distify ARGS`` as a real process."""
    return subprocess.run([sys.executable, "-m", "distify", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=clean_env(PYTHONPATH=str(REPO)))


def _one_error(proc: subprocess.CompletedProcess, *expected: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "internal error" not in lines[0] and "Traceback" not in proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink()
                                         else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    (folder / "data.csv").write_text("a,b\n1,2\n")
    return folder


# ------------------------------------------------------------ issue 25 item 1: convert .
@pytest.mark.parametrize("spelling", [".", "./"])
def test_convert_the_current_folder_works_like_naming_it(proj: Path, spelling: str) -> None:
    proc = distify("convert", spelling, cwd=proj)
    assert proc.returncode == 0, proc.stderr
    out = proj.parent / "proj_dist"
    assert (out / "train.py").read_text().count("distify.prepare") == 2
    assert (out / "data.csv").read_text() == "a,b\n1,2\n"
    assert (proj / "train.py").read_text() == TRAIN  # the input is untouched


def test_convert_dot_dot_works_like_naming_the_folder(proj: Path) -> None:
    (proj / "sub").mkdir()
    proc = distify("convert", "..", "-o", str(proj.parent / "out"), cwd=proj / "sub")
    assert proc.returncode == 0, proc.stderr
    assert (proj.parent / "out" / "train.py").is_file()


# ------------------------------------------------------------ issue 25 item 10: -o clobbering
def test_output_over_an_unrelated_file_is_refused(proj: Path) -> None:
    mine = proj / "mine.py"
    mine.write_text("print('my own work')\n")
    before = _tree(proj)
    line = _one_error(distify("convert", "train.py", "-o", "mine.py", cwd=proj),
                      "mine.py: already exists", "not an earlier output", "--force")
    assert line.startswith("distify: error: mine.py")
    assert _tree(proj) == before  # nothing written: not the file, not a launch config

    forced = distify("convert", "train.py", "-o", "mine.py", "--force", cwd=proj)
    assert forced.returncode == 0, forced.stderr
    assert "import distify.runtime as distify" in mine.read_text()


def test_default_output_over_an_unrelated_file_is_refused(proj: Path) -> None:
    (proj / "train_dist.py").write_text("# hand-written\n")
    _one_error(distify("convert", "train.py", cwd=proj), "train_dist.py: already exists")
    assert (proj / "train_dist.py").read_text() == "# hand-written\n"


def test_an_earlier_output_of_the_same_script_is_replaced(proj: Path) -> None:
    assert distify("convert", "train.py", "-o", "out.py", cwd=proj).returncode == 0
    again = distify("convert", "train.py", "-o", "out.py", cwd=proj)  # the same output
    assert again.returncode == 0, again.stderr
    with (proj / "train.py").open("a") as handle:  # the script edited since
        handle.write("print('done')\n")
    edited = distify("convert", "train.py", "-o", "out.py", cwd=proj)
    assert edited.returncode == 0, edited.stderr
    assert (proj / "out.py").read_text().endswith("distify.print('done')\n")


def test_an_output_of_another_script_is_refused(proj: Path, tmp_path: Path) -> None:
    other = proj / "other.py"
    other.write_text("import torch\nmodel = torch.nn.Linear(3, 3)\n"
                     "for step in range(3):\n    print(step)\n")
    assert distify("convert", "other.py", "-o", "out.py", cwd=proj).returncode == 0
    before = (proj / "out.py").read_bytes()
    _one_error(distify("convert", "train.py", "-o", "out.py", cwd=proj), "--force")
    assert (proj / "out.py").read_bytes() == before


def test_a_copy_of_the_input_is_replaced(proj: Path) -> None:
    (proj / "train_copy.py").write_text(TRAIN)  # nothing is lost: the input holds the same bytes
    assert distify("convert", "train.py", "-o", "train_copy.py", cwd=proj).returncode == 0


def test_in_place_is_unaffected(proj: Path) -> None:
    proc = distify("convert", "train.py", "-i", "--no-config", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    assert "distify.prepare" in (proj / "train.py").read_text()


# ------------------------------------------------------------ issue 25 item 11: loader note
def test_a_loader_built_by_an_unseen_function_is_named() -> None:
    source = textwrap.dedent("""\
        import torch
        from mydata import make_loader

        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = make_loader(32)
        for x in loader:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    """).encode()
    notes = [n.message for n in convert_source(source).notes]
    assert any(m.startswith("`loader` is built by `make_loader(...)`, which distify cannot see "
                            "into") for m in notes), notes
    assert not any("not built in this file" in m for m in notes)


def test_loaders_unpacked_from_a_builder_and_in_a_function() -> None:
    source = textwrap.dedent("""\
        import torch
        from mydata import Loaders

        def main():
            model = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            train_loader, val_loader = Loaders.build(32)
            for x in train_loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    """).encode()
    notes = [n.message for n in convert_source(source).notes]
    assert any("`train_loader` is built by `Loaders.build(...)`" in m for m in notes), notes


def test_a_loader_parameter_is_still_not_built_in_this_file() -> None:
    source = textwrap.dedent("""\
        import torch

        loader = object()

        def train(model, opt, loader):
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    """).encode()
    notes = [n.message for n in convert_source(source).notes]
    assert any("`loader` is not built in this file" in m for m in notes), notes


# ------------------------------------------------------------ issue 25 item 12: save({ in place
def test_renamed_save_keeps_a_hanging_dict_where_it_was() -> None:
    out = convert_source(TRAIN.encode()).output.decode()
    assert 'distify.save({\n    "model": model.state_dict(),\n    "opt": opt.state_dict(),\n' \
           '}, "ckpt.pt")\n' in out


@pytest.mark.parametrize("before, after", [
    ('x = torch.load({\n    "a": 1,\n})\n', 'x = distify.load({\n    "a": 1,\n})\n'),
    ('torch.save(m.state_dict(),\n           "x.pt")\n',
     'distify.save(m.state_dict(),\n             "x.pt")\n'),
    ('torch.save({"a": 1,\n            "b": 2}, "x.pt")\n',
     'distify.save({"a": 1,\n              "b": 2}, "x.pt")\n'),
    ('torch.save([\n    m], "x")\n', 'distify.save([\n    m], "x")\n'),
], ids=["assigned-hanging", "aligned", "aligned-dict", "hanging-list"])
def test_only_lines_aligned_with_the_call_move(before: str, after: str) -> None:
    source = f"import torch\nm = torch.nn.Linear(2, 2)\n{before}"
    assert convert_source(source.encode()).output.decode().endswith(after)


def test_the_diff_of_a_dict_save_is_one_line(proj: Path) -> None:
    proc = distify("convert", "train.py", "--diff", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    assert '+distify.save({\n     "model"' in proc.stdout
    assert '+    "model"' not in proc.stdout and '+  }, "ckpt.pt")' not in proc.stdout


# ------------------------------------------------------------ issue 26 item 6: path spellings
@pytest.mark.parametrize("spelling", [
    '"runs/history.json"', '"./runs/history.json"', 'os.path.join("runs", "history.json")',
    'Path("runs") / "history.json"', 'f"runs/{\'history\'}.json"', '"runs//x/../history.json"',
    'str(Path("runs", "history.json"))', '"runs" + "/history.json"',
])
def test_constant_paths_normalise_alike(spelling: str) -> None:
    assert path_key(spelling) == "runs/history.json"


def test_paths_built_from_the_same_variable_agree() -> None:
    assert path_key('os.path.join(args.out, "h.json")') == path_key('f"{args.out}/h.json"') \
        == path_key('Path(args.out) / "h.json"')
    assert path_key('os.path.join(args.out, "h.json")') != path_key('"h.json"')


def test_a_read_through_another_spelling_waits_for_the_write(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import json
        import os
        from pathlib import Path

        import torch

        model = torch.nn.Linear(2, 2)
        with open(os.path.join("runs", "history.json"), "w") as f:
            json.dump({"a": 1}, f)
        with open("runs/history.json") as f:
            history = json.load(f)
        with open(Path("runs") / "other.json", "w") as f:
            json.dump({"a": 1}, f)
        with open(f"./runs/other.json") as f:
            other = json.load(f)
        with open("history.json") as f:
            unrelated = json.load(f)
    """))
    proc = distify("convert", "train.py", "--diff", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '+with distify.open("runs/history.json") as f:' in proc.stdout
    assert '+with distify.open(f"./runs/other.json") as f:' in proc.stdout
    assert ' with open("history.json") as f:' in proc.stdout  # another file: left alone
    assert "cannot tell" not in proc.stderr


def test_a_read_that_cannot_be_matched_to_its_write_is_reported() -> None:
    source = textwrap.dedent("""\
        import json
        import os
        import torch

        out = os.environ["OUT"]
        with open(os.path.join(out, "history.json"), "w") as f:
            json.dump({}, f)
        with open("runs/history.json") as f:
            history = json.load(f)
    """).encode()
    result = convert_source(source)
    notes = [(n.line, n.message) for n in result.notes]
    assert any(line == 9 and "reads `history.json`" in m and
               "os.path.join(out, 'history.json')" in m for line, m in notes), notes


# ------------------------------------------------------------ issue 26 item 10: deep trees
def _deep(terms: int) -> str:
    return "import torch\nx = " + " + ".join(["1"] * terms) + "\n"


def test_check_handles_a_2000_term_expression(tmp_path: Path) -> None:
    (tmp_path / "deep.py").write_text(_deep(2000))
    proc = distify("check", "--all", "deep.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "internal error" not in proc.stderr


def test_convert_handles_a_2000_term_expression(tmp_path: Path) -> None:
    (tmp_path / "deep.py").write_text(TRAIN + "y = " + " + ".join(["1"] * 2000) + "\n")
    proc = distify("convert", "deep.py", "-o", "out.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "distify.save({" in (tmp_path / "out.py").read_text()


def test_too_deep_is_one_line_with_the_position(monkeypatch) -> None:
    """Past even the big stack (simulated: every walk runs out of stack): one line with the
    line and the depth, for convert; a finding at that line for check."""
    from distify.convert import project
    from distify.errors import UserError
    from distify.lint import runner
    from distify.lint.engine import LintOptions
    from distify.lint.matcher import Matcher
    from distify.rules import default_rules

    def exhausted(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(project, "convert_source", exhausted)
    monkeypatch.setattr(runner, "lint_source", exhausted)
    path = Path(__file__).parent / "fixtures" / "convert_friction" / "deep_sum.py"
    with pytest.raises(UserError) as caught:
        project.convert_file(path, default_rules(), "distify.runtime")
    assert str(caught.value) == (f"{path}:3: expression nested too deeply for distify (302 "
                                 "levels); split it over a few statements")
    result = runner.check_file(str(path), LintOptions(Matcher(default_rules()), (), True))
    assert [(f.line, f.code) for f in result.findings] == [(3, "DST000")]
    assert result.findings[0].message.startswith("expression nested too deeply for distify")


def test_too_deep_from_the_command_line(tmp_path: Path) -> None:
    """The parser's own limit, well past 2,000 terms, is a one-line error too."""
    (tmp_path / "deeper.py").write_text(_deep(20000))
    _one_error(distify("convert", "deeper.py", cwd=tmp_path), "deeper.py")
    proc = distify("check", "--all", "deeper.py", cwd=tmp_path)
    assert proc.returncode == 1 and "internal error" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("deeper.py:"), proc.stdout


# ------------------------------------------------------------ issue 26 item 11: symlink loops
@pytest.fixture
def loops(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").symlink_to("b.py")
    (tmp_path / "pkg" / "b.py").symlink_to("a.py")
    (tmp_path / "pkg" / "ok.py").write_text("import torch.distributed as dist\n"
                                            "dist.init_process_group('gloo')\n")
    (tmp_path / "self.py").symlink_to("self.py")
    return tmp_path


def test_check_a_folder_with_a_symlink_loop(loops: Path) -> None:
    for extra in ([], ["--all"]):
        proc = distify("check", "pkg", *extra, cwd=loops)
        assert proc.returncode == 1, proc.stderr
        assert "internal error" not in proc.stderr
        assert "pkg/a.py:1:1: DST000 symlink loop" in proc.stdout
        assert "pkg/b.py:1:1: DST000 symlink loop" in proc.stdout


def test_check_a_looping_file(loops: Path) -> None:
    _one_error(distify("check", "self.py", cwd=loops), "self.py: symlink loop")


@pytest.mark.parametrize("args", [["self.py"], ["self.py", "-o", "x.py"], ["self.py", "--diff"],
                                  ["pkg", "-o", "out"], ["pkg/ok.py", "-o", "self.py"]])
def test_convert_a_symlink_loop(loops: Path, args: list[str]) -> None:
    before = _tree(loops)
    _one_error(distify("convert", *args, cwd=loops), "symlink loop")
    assert _tree(loops) == before


# ------------------------------------------------------------ issue 26 item 12: unwritable -o
@pytest.mark.parametrize("where", ["afile/out", "afile/deeper/out", "/proc/distify_out"])
def test_project_output_where_no_folder_can_be_made(proj: Path, where: str) -> None:
    (proj.parent / "afile").write_text("a file, not a folder\n")
    if where.startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("no /proc")
    before = _tree(proj.parent)
    _one_error(distify("convert", "proj", "-o", where, cwd=proj.parent),
               "cannot make this output folder")
    assert _tree(proj.parent) == before


def test_project_output_folder_is_read_only(proj: Path) -> None:
    out = proj.parent / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        if os.access(out, os.W_OK):
            pytest.skip("running as root: a read-only folder is still writable")
        _one_error(distify("convert", "proj", "-o", "ro/out", cwd=proj.parent), "ro/out")
    finally:
        out.chmod(0o755)


# ------------------------------------------------------------ issue 26 item 13: quoted launch
def test_launch_command_is_shell_quoted(tmp_path: Path) -> None:
    folder = tmp_path / "my runs"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    proc = distify("convert", "my runs/train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("Launch: "))
    command = line.removeprefix("Launch: ").split("   (")[0]
    words = shlex.split(command)
    assert words[-1] == "my runs/train_dist.py", words
    assert "'my runs/train_dist.py'" in command


def test_launch_command_quotes_a_named_config(tmp_path: Path) -> None:
    folder = tmp_path / "my runs"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    (folder / "train_dist.yaml").write_text("lr: 0.1\n")  # hyper-parameters, not a config
    proc = distify("convert", "my runs/train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("Launch: "))
    words = shlex.split(line.removeprefix("Launch: ").split("   (")[0])
    assert words[words.index("--config_file") + 1] == "my runs/train_dist.launch.yaml"
