"""Notebooks (issue 24): convert to a script or a notebook, check by cell, launch on N processes.

The fixture ``tests/fixtures/notebooks/course.ipynb`` is a course-style notebook: seeded, with
``%matplotlib inline``, ``!pip install``, ``%%time``, a model class cell (ending in a bare
``model``), a data-loader cell, a training cell, an evaluation cell that prints accuracy, and a
``torch.save``. Real runs: its cells run in order as one plain process, against the converted
script on 1 process (same output, same tensors), and the converted notebook launched on 2
processes (identical replicas, one writer, one line of output).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from distify.cli import main
from distify.errors import UserError
from distify.launch.notebook import in_notebook, write_script
from distify.notebook import parse_notebook, read_notebook, to_script
from tests.helpers import FIXTURES, check_replicas, clean_env, replicas_env

COURSE = FIXTURES / "notebooks" / "course.ipynb"
TIMEOUT = 240


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def notebook(*cells: str | tuple[str, str], nbformat: int = 4) -> dict:
    """A notebook: each cell its code, or (cell_type, source)."""
    out = []
    for cell in cells:
        kind, source = cell if isinstance(cell, tuple) else ("code", cell)
        entry = {"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)}
        if kind == "code":
            entry.update(outputs=[{"output_type": "stream", "name": "stdout", "text": ["x\n"]}],
                         execution_count=1)
        out.append(entry)
    return {"cells": out, "metadata": {"kernelspec": {"name": "python3"}},
            "nbformat": nbformat, "nbformat_minor": 5}


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def script_of(*cells: str | tuple[str, str]):
    return to_script(parse_notebook(json.dumps(notebook(*cells)).encode(), "nb.ipynb"))


# ---------------------------------------------------------------- IPython syntax, one line each

IPYTHON = [
    pytest.param("%matplotlib inline\nx = 1", "# %matplotlib inline\nx = 1\n",
                 "`%matplotlib inline` commented out: IPython magic", False, id="line-magic"),
    pytest.param("!pip install timm --quiet", "# !pip install timm --quiet\n",
                 "install it before launching", False, id="pip-install"),
    pytest.param("!nvidia-smi", "# !nvidia-smi\n", "only shows something", False,
                 id="shell-show"),
    pytest.param("!wget http://x/data.zip", "# !wget http://x/data.zip\n",
                 "a shell command a script does not run", True, id="shell-other"),
    pytest.param("files = !ls data", "# files = !ls data\n", "the script never sets it", True,
                 id="shell-assign"),
    pytest.param("%time y = sum([1, 2])", "y = sum([1, 2])\n", "`%time` only", False,
                 id="time-line"),
    pytest.param("%%time\ny = 2\nprint(y)", "# %%time\ny = 2\nprint(y)\n",
                 "the cell's code runs as written", False, id="time-cell"),
    pytest.param("%%bash\nmkdir -p out\n", "# %%bash\n# mkdir -p out\n", "the whole cell", True,
                 id="bash-cell"),
    pytest.param("%%html\n<b>hi</b>", "# %%html\n# <b>hi</b>\n", "only shows something",
                 False, id="html-cell"),
    pytest.param("%cd /data", "# %cd /data\n", "do its work in Python", True, id="cd-magic"),
    pytest.param("%env WANDB_MODE=offline", "# %env WANDB_MODE=offline\n",
                 "set it in the environment", True, id="env-magic"),
    pytest.param("!pip list", "# !pip list\n", "only shows something", False, id="pip-list"),
    pytest.param("!python -m pip install -q x", "# !python -m pip install -q x\n",
                 "install it before launching", False, id="python-m-pip"),
    pytest.param("len?", "# len?\n", "IPython help", False, id="help"),
    pytest.param("if True:\n    !ls\n    x = 1", "if True:\n    pass  # !ls\n    x = 1\n",
                 "only shows something", False, id="indented-shell"),
    pytest.param("display(3)", "print(3)\n", "display(...) → print(...)", False, id="display"),
    pytest.param("x = 1\nx", "x = 1\nx\n", "the notebook shows this last value", False,
                 id="trailing-expression"),
]


@pytest.mark.parametrize(("code", "expected", "message", "human"), IPYTHON)
def test_ipython_syntax_becomes_python_with_one_report_line(code, expected, message, human):
    script = script_of(code)
    assert script.text == f"# %% cell 1\n{expected}"
    compile(script.text, "nb.py", "exec")
    assert len(script.notes) == 1, script.notes
    (note,) = script.notes
    assert message in note.message and note.needs_human is human
    assert script.text.splitlines()[note.line - 1].strip() in expected  # it names its line


@pytest.mark.parametrize("code", [
    pytest.param('s = """\n%not a magic\n!not a shell line\n"""', id="inside-a-string"),
    pytest.param("x = (1 +\n     2)\nprint(x)", id="continued-line"),
    pytest.param("x = 1\nx;", id="trailing-semicolon"),
    pytest.param("print(1)", id="trailing-print"),
    pytest.param("def display(v):\n    return v\n\n\ndisplay(1);", id="own-display"),
    pytest.param("a = 3 if 1 != 2 else 4", id="not-equal"),
])
def test_python_is_left_alone(code):
    script = script_of(code)
    assert script.text == f"# %% cell 1\n{code}\n" and script.notes == ()


def test_a_display_of_the_notebooks_own_is_kept_in_every_cell():
    script = script_of("from viz import display", "display(3)")
    assert script.text.endswith("# %% cell 2\ndisplay(3)\n") and script.notes == ()
    ipython = script_of("from IPython.display import display", "display(3)")
    assert ipython.text.endswith("# %% cell 2\nprint(3)\n")


def test_a_comment_that_looks_like_a_cell_boundary_stays_in_its_cell(tmp_path):
    nb = write(tmp_path / "nb.ipynb", notebook("import torch\n# %% cell 1\nx = 1", "y = 2"))
    result = run("convert", str(nb), "-o", str(tmp_path / "out.ipynb"), "--no-config")
    assert result.exit_code == 0, result.output
    cells = json.loads((tmp_path / "out.ipynb").read_text())["cells"]
    assert ["".join(cell["source"]) for cell in cells] == ["import torch\n# %% cell 1\nx = 1",
                                                           "y = 2"]


def test_a_source_written_as_one_string_converts_too(tmp_path):
    data = notebook("import torch", "x = 1")
    data["cells"][0]["source"] = "import torch\nprint(torch.ones(1))"
    data["cells"][1]["source"] = "x = 1"
    nb = write(tmp_path / "nb.ipynb", data)
    assert run("convert", str(nb), "--no-config").exit_code == 0
    cells = json.loads((tmp_path / "nb_dist.ipynb").read_text())["cells"]
    assert cells[0]["source"] == ["import torch\n", "import distify.runtime as distify\n",
                                  "distify.print(torch.ones(1))"]
    assert cells[1]["source"] == "x = 1"  # untouched: as it was written


def test_markdown_becomes_comments_and_cells_are_numbered_over_all_cells():
    script = script_of(("markdown", "# Title\n\ntext"), "x = 1", ("raw", "raw text"), "y = 2")
    assert script.text == ("# %% [markdown] cell 1\n# # Title\n#\n# text\n\n"
                           "# %% cell 2\nx = 1\n\n# %% [raw] cell 3\n# raw text\n\n"
                           "# %% cell 4\ny = 2\n")


# ----------------------------------------------------------- convert: both ways, diff, check

def test_convert_to_a_script_reports_by_cell(tmp_path):
    out = tmp_path / "course_dist.py"
    result = run("convert", str(COURSE), "-o", str(out), "--no-config")
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "null" not in text and "\"cell_type\"" not in text  # never the JSON as Python
    assert text.startswith("# %% [markdown] cell 1\n# # A tiny classifier")
    assert "# %% cell 9\ndistify.save(model.state_dict(), \"model.pt\")\n" in text
    report = result.output
    assert f"{out}:8 (cell 2, line 2): `!pip install torch --quiet` commented out" in report
    assert f"{out}:72 (cell 9, line 1): torch.save → distify.save" in report
    assert "(cell 4, line 12): `model` kept" in report
    assert "(cell 7, line 1): `%%time` commented out" in report
    lines = text.splitlines()
    assert lines[71] == 'distify.save(model.state_dict(), "model.pt")'  # line 72 as reported


def test_convert_to_a_notebook_keeps_markdown_and_metadata_and_clears_outputs(tmp_path):
    source = json.loads(COURSE.read_text())
    result = run("convert", str(COURSE), "-o", str(tmp_path / "nb_dist.ipynb"), "--no-config")
    assert result.exit_code == 0, result.output
    assert "nb_dist.ipynb: cell 9, line 1: torch.save → distify.save" in result.output
    out = json.loads((tmp_path / "nb_dist.ipynb").read_text())
    assert out["metadata"] == source["metadata"] and out["nbformat"] == 4
    assert len(out["cells"]) == len(source["cells"])
    for old, new in zip(source["cells"], out["cells"]):
        assert (new["cell_type"], new["metadata"], new["id"]) == (
            old["cell_type"], old["metadata"], old["id"])
        if old["cell_type"] == "markdown":
            assert new == old
        else:
            assert new["outputs"] == [] and new["execution_count"] is None
    code = ["".join(cell["source"]) for cell in out["cells"]]
    assert code[1].startswith("%matplotlib inline\n!pip install torch --quiet\n")  # kept
    assert code[6].startswith("%%time\n")
    assert "model, optimizer = distify.prepare(model, optimizer)" in code[6]
    assert code[3] == "".join(source["cells"][3]["source"])  # an untouched cell, as it was


def test_json_report_places_items_in_cells(tmp_path):
    result = run("convert", str(COURSE), "-o", str(tmp_path / "nb.ipynb"), "--json")
    report = json.loads(result.stdout)["files"][0]
    save = [item for item in report["changes"] if item["message"].startswith("torch.save")]
    assert [(i["line"], i["cell"], i["cell_line"]) for i in save] == [(72, 9, 1)]


def test_the_notebook_and_the_script_hold_the_same_code(tmp_path):
    """What `distify launch nb_dist.ipynb` runs is what `-o nb_dist.py` writes."""
    assert run("convert", str(COURSE), "-o", str(tmp_path / "a.ipynb"), "--no-config"
               ).exit_code == 0
    assert run("convert", str(COURSE), "-o", str(tmp_path / "a.py"), "--no-config"
               ).exit_code == 0
    assert to_script(read_notebook(tmp_path / "a.ipynb")).text == \
        (tmp_path / "a.py").read_text()


def test_converting_the_output_again_changes_nothing(tmp_path):
    first, second = tmp_path / "nb_dist.ipynb", tmp_path / "again.ipynb"
    assert run("convert", str(COURSE), "-o", str(first), "--no-config").exit_code == 0
    result = run("convert", str(first), "-o", str(second), "--no-config")
    assert result.exit_code == 0 and "unchanged (already distributed" in result.output
    assert "(cell 2, line 6 imports distify.runtime)" in result.output
    assert second.read_bytes() == first.read_bytes()
    assert run("convert", str(first), "--check").exit_code == 0
    assert run("check", str(first)).exit_code == 0  # convert's output passes the linter


def test_diff_is_per_cell_and_writes_nothing(tmp_path):
    nb = tmp_path / "course.ipynb"
    nb.write_bytes(COURSE.read_bytes())
    result = run("convert", str(nb), "--diff")
    assert result.exit_code == 0
    diff = result.stdout
    headers = [line for line in diff.splitlines() if line.startswith("--- ")]
    assert headers == [f"--- {nb}: cell {n}" for n in (2, 5, 7, 8, 9)]
    assert "-        loss.backward()\n+        distify.backward(loss)\n" in diff
    assert "%matplotlib" not in "".join(line for line in diff.splitlines(keepends=True)
                                        if line.startswith(("+", "-")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["course.ipynb"]


def test_check_counts_code_not_outputs(tmp_path):
    nb = tmp_path / "course.ipynb"
    nb.write_bytes(COURSE.read_bytes())
    assert run("convert", str(nb), "--check").exit_code == 1
    out = tmp_path / "course_dist.ipynb"
    assert run("convert", str(nb), "--no-config").exit_code == 0
    data = json.loads(out.read_text())
    data["cells"][7]["outputs"] = [{"output_type": "stream", "name": "stdout",
                                    "text": ["accuracy 0.5\n"]}]
    out.write_text(json.dumps(data))  # run in Jupyter and saved with its outputs
    result = run("convert", str(out), "--check")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------- check: by cell and line

def test_check_reports_findings_by_cell_and_line(tmp_path):
    nb = write(tmp_path / "dist.ipynb", notebook(
        ("markdown", "# Distributed"),
        "%matplotlib inline\nimport torch\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')",
        "model = torch.nn.Linear(2, 2)\n\ntorch.save(model.state_dict(), 'm.pt')"))
    result = run("check", str(tmp_path))
    assert result.exit_code == 1
    assert result.stdout.startswith(f"{nb}:cell 3:3:1: DST101 `torch.save` saves a checkpoint")
    assert "[*]" not in result.stdout  # --fix never rewrites a notebook's JSON
    as_json = json.loads(run("check", str(nb), "--output-format", "json").stdout)
    assert (as_json[0]["cell"], as_json[0]["location"]["row"]) == (3, 3)


def test_check_reports_a_bad_notebook_with_its_position(tmp_path):
    (tmp_path / "broken.ipynb").write_text('{"cells": [\n  {"cell_type": "code", }\n] torch')
    result = run("check", "--all", str(tmp_path / "broken.ipynb"))
    assert result.exit_code == 1
    assert result.stdout.startswith(f"{tmp_path / 'broken.ipynb'}:2:25: DST000 not a notebook: "
                                    "invalid JSON")


# --------------------------------------------------------------------------- bad notebooks

BAD = [
    pytest.param(b'{"cells": [\n  {"cell_type": "code", }\n]}', "bad.ipynb:2:25: not a notebook: "
                 "invalid JSON (Expecting property name enclosed in double quotes)", id="json"),
    pytest.param(json.dumps(notebook("x = 1", nbformat=3)).encode(),
                 "bad.ipynb:1: not an nbformat 4 notebook (nbformat: 3)", id="nbformat-3"),
    pytest.param(b"[1, 2]", "bad.ipynb:1:1: not a notebook: the JSON is not an object",
                 id="not-an-object"),
    pytest.param(b'{\n "nbformat": 4,\n "cells": [\n  {"cell_type": "code", "source": 3}\n]}',
                 "bad.ipynb:4: cell 1: 'source' must be a string or a list of strings",
                 id="cell-source"),
    pytest.param(b"\xff\xfe{}", "bad.ipynb:1: not a notebook: not UTF-8 text", id="encoding"),
    pytest.param(json.dumps(notebook("import torch", "x = (\n")).encode(),
                 "bad.ipynb: cell 2, line 1, column 5: ", id="python-syntax"),
]


@pytest.mark.parametrize(("raw", "expected"), BAD)
def test_a_bad_notebook_is_one_line_exit_2_nothing_written(tmp_path, monkeypatch, raw,
                                                           expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.ipynb").write_bytes(raw)
    for args in (["convert", "bad.ipynb"], ["convert", "bad.ipynb", "-o", "out.py"],
                 ["launch", "--num_processes", "2", "--cpu", "bad.ipynb"]):
        result = run(*args)
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, (args, result.output)
        assert lines[0].startswith(f"distify: error: {expected}"), (args, lines)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.ipynb"]


def test_nbformat_3_says_how_to_upgrade():
    raw = json.dumps(notebook("x = 1", nbformat=3), indent=1).encode()
    with pytest.raises(UserError) as err:
        parse_notebook(raw, "old.ipynb")
    assert str(err.value).startswith("old.ipynb:")
    assert "not an nbformat 4 notebook (nbformat: 3); upgrade it with: jupyter nbconvert" in \
        str(err.value)
    assert err.value.line == raw.decode().splitlines().index(' "nbformat": 3,') + 1


def test_launch_runs_a_hidden_script_beside_the_notebook_and_names_cells(tmp_path):
    nb = write(tmp_path / "nb.ipynb", notebook("!nvidia-smi\nimport os", ("markdown", "m"),
                                                "x = 1\nraise SystemExit(os.getcwd())"))
    script = write_script(str(nb))
    try:
        assert Path(script).parent == tmp_path and Path(script).name.startswith(".nb.")
        assert Path(script).read_text() == to_script(read_notebook(nb)).text
        line = f"  at {script}:10: raise SystemExit(os.getcwd())"
        assert in_notebook(line, script, str(nb)) == \
            f"  at {nb} cell 3, line 2: raise SystemExit(os.getcwd())"
    finally:
        Path(script).unlink()


def test_launch_dry_run_of_a_notebook_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "nb.ipynb", notebook("import torch"))
    for option in ("--dry-run", "--slurm"):
        result = run("launch", option, "nb.ipynb")
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert "distify convert nb.ipynb -o NAME.py" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nb.ipynb"]


def test_convert_and_check_of_a_notebook_run_without_torch(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from distify.cli import main\nmain(sys.argv[1:])\n")
    for args in (["convert", str(COURSE), "-o", "x.ipynb"], ["check", "--all", str(COURSE)]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode in (0, 1), (args, proc.stderr)
    assert (tmp_path / "x.ipynb").is_file()


# ------------------------------------------------------------------------------ real runs

def _reference(cells: list[dict]) -> str:
    """The notebook's code cells in order, as Jupyter runs them; IPython lines (this fixture's
    start with % or !) do nothing to the computation and are left out."""
    return "".join(
        "".join(line for line in "".join(cell["source"]).splitlines(keepends=True)
                if not line.lstrip().startswith(("%", "!"))) + "\n"
        for cell in cells if cell["cell_type"] == "code")


def _python(script: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)


def _launch(notebook_path: Path, cwd: Path, replicas: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distify", "launch", "--num_processes", "2", "--cpu",
         notebook_path.name], cwd=cwd, env=replicas_env(None, replicas), capture_output=True,
        text=True, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The original cells in order, the converted script on 1 process, and the converted
    notebook launched on 2 processes: at once, each in a folder of its own."""
    root = tmp_path_factory.mktemp("notebook-runs")
    folders = {name: root / name for name in ("original", "one", "two")}
    for folder in folders.values():
        folder.mkdir()
    (folders["original"] / "reference.py").write_text(
        _reference(json.loads(COURSE.read_text())["cells"]))
    for target in (folders["one"] / "nb_dist.py", folders["two"] / "nb_dist.ipynb"):
        converted = run("convert", str(COURSE), "-o", str(target))
        assert converted.exit_code == 0, converted.output
    with ThreadPoolExecutor(3) as pool:
        two = pool.submit(_launch, folders["two"] / "nb_dist.ipynb", folders["two"],
                          root / "replicas")
        original = pool.submit(_python, folders["original"] / "reference.py",
                               folders["original"])
        one = pool.submit(_python, folders["one"] / "nb_dist.py", folders["one"])
        procs = {"original": original.result(), "one": one.result(), "two": two.result()}
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return {"procs": procs, "folders": folders, "replicas": root / "replicas"}


def test_one_process_behaves_like_the_cells_in_order(runs):
    import torch

    procs, folders = runs["procs"], runs["folders"]
    assert procs["original"].stdout.startswith("accuracy ")
    assert procs["one"].stdout == procs["original"].stdout
    want = torch.load(folders["original"] / "model.pt")
    got = torch.load(folders["one"] / "model.pt")
    assert list(got) == list(want)
    assert all(torch.equal(got[key], want[key]) for key in want)


def test_two_processes_identical_replicas_one_writer_one_line(runs):
    import torch

    two, folder = runs["procs"]["two"], runs["folders"]["two"]
    check_replicas(runs["replicas"], 2, distinct_data=True, output=two.stderr)
    lines = two.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("accuracy "), two.stdout
    assert lines[0].endswith("/32)")  # the whole test set, counted once over both ranks
    # one writer: the checkpoint, and nothing else; the script launch wrote is gone
    assert sorted(p.name for p in folder.iterdir()) == ["model.pt", "nb_dist.ipynb",
                                                         "nb_dist.yaml"]
    want = torch.load(runs["folders"]["original"] / "model.pt")
    assert list(torch.load(folder / "model.pt")) == list(want)  # no `module.` prefix
