"""Every shell example in README.md and in the `--help` texts runs as written.

The examples are read out of the README's plain code blocks and out of the `Example(s):` part of
`distify --help` and of each subcommand's `--help`, then run with bash, verbatim (comments,
line continuations and `> file` included), in a fresh folder holding what they name: the bundled
example `train.py`, its conversion `train_dist.py` + `train_dist.yaml`, a notebook `nb.ipynb` and
its conversion `nb_dist.ipynb`, a project `src/`, and the configs `distify_config.yaml` /
`node1.yaml`.

What cannot run here runs in its `--dry-run` form: a `distify launch` that would start a job
(the torchrun command is printed instead); the script arguments it passes must then be options
the script has, since options after the script go to the script. An example whose comment says
it is an error must fail with that error; one that says it warns must warn.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO, clean_env

BIN = Path(sys.executable).parent  # where `distify` is installed
ENV = clean_env(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONPATH=str(REPO),
                COLUMNS="120")
TRAIN = (REPO / "examples" / "train.py").read_text()
SCRIPT_OPTIONS = set(re.findall(r'add_argument\("(--[\w-]+)"', TRAIN))


@dataclass(frozen=True)
class Example:
    where: str  # "README.md" or "distify launch --help"
    text: str   # as written, possibly several lines

    def __str__(self) -> str:
        return f"{self.where}: {self.text.splitlines()[0]}"


# --- extraction ---------------------------------------------------------------------------

def _commands(lines: list[str], starts: tuple[str, ...]) -> list[str]:
    """Commands starting with one of ``starts``, each with its continuation lines (after a
    trailing backslash) and the comment-only lines that go on its comment."""
    commands: list[list[str]] = []
    continued = False
    for raw in lines:
        line = raw.strip()
        if not line:
            continued = False
            continue
        if continued or (commands and line.startswith("#")):
            commands[-1].append(line)
        elif line.startswith(starts):
            commands.append([line])
        else:
            continued = False
            continue
        continued = line.split(" #", 1)[0].rstrip().endswith("\\")
    return ["\n".join(c) for c in commands]


def readme_examples() -> list[Example]:
    """Commands in the README's code blocks without a language (```yaml, ```diff: not shell)."""
    blocks: list[list[str]] = []
    fence: str | None = None  # the open block's language, None outside one
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            if fence is None:
                fence = line[3:].strip()
                blocks.append([])
            else:
                if fence:
                    blocks.pop()
                fence = None
        elif fence is not None:
            blocks[-1].append(line)
    return [Example("README.md", command) for block in blocks
            for command in _commands(block, ("distify ", "pip ", "ruff "))]


def _help(*args: str) -> str:
    proc = subprocess.run([str(BIN / "distify"), *args, "--help"], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def help_examples() -> list[Example]:
    top = _help()
    subcommands = re.findall(r"^  (\w+)  ", top.split("\nCommands:\n", 1)[1], re.MULTILINE)
    found = []
    for args in [(), *((name,) for name in subcommands)]:
        text = _help(*args)
        section = re.split(r"^\s*Examples?:\n", text, maxsplit=1, flags=re.MULTILINE)
        assert len(section) == 2, f"distify {' '.join(args)} --help shows no example"
        block = section[1].split("\n\n", 1)[0]
        where = " ".join(["distify", *args, "--help"])
        found += [Example(where, command) for command in _commands(block.splitlines(),
                                                                   ("distify ",))]
    return found


def _distinct(examples: list[Example]) -> list[Example]:
    """One of each command: the README and a ``--help`` often show the same one (``distify
    test --cpu --num_processes 4``); it runs once, unless their comments expect different
    outcomes (an error, a warning)."""
    seen, kept = set(), []
    for example in examples:
        comment = " ".join(line.split("#", 1)[1] for line in example.text.splitlines()
                           if "#" in line)
        key = (tuple(shlex.split(example.text.replace("\\\n", " "), comments=True)),
               bool(re.search(r"\b(error|warn)", comment)))
        if key not in seen:
            seen.add(key)
            kept.append(example)
    return kept


EXAMPLES = _distinct(readme_examples() + help_examples())


# --- the folder the examples run in --------------------------------------------------------

def _run(command: str, cwd: Path, stdin: str = "", timeout: float = 300
         ) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=ENV, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples")
    shutil.copy(REPO / "examples" / "train.py", root / "train.py")
    (root / "src").mkdir()
    shutil.copy(REPO / "examples" / "train.py", root / "src" / "train.py")
    (root / "src" / "utils.py").write_text("def accuracy(correct, total):\n"
                                           "    return correct / total\n")
    shutil.copy(REPO / "tests" / "fixtures" / "notebooks" / "course.ipynb", root / "nb.ipynb")
    for setup in ("distify convert train.py -o train_dist.py",
                  "distify convert nb.ipynb -o nb_dist.ipynb",
                  "distify config --num_processes 2 --cpu --yes",
                  "distify config --num_processes 2 --cpu --config_file node1.yaml --yes"):
        proc = _run(setup, root)
        assert proc.returncode == 0, setup + "\n" + proc.stdout + proc.stderr
    assert (root / "train_dist.yaml").is_file() and (root / "node1.yaml").is_file()
    return root


@pytest.fixture()
def workdir(template: Path, tmp_path: Path) -> Path:
    work = tmp_path / "work"
    shutil.copytree(template, work, symlinks=True)
    return work


# --- running one example ---------------------------------------------------------------------

def _tokens(example: Example) -> list[str]:
    return shlex.split(example.text.replace("\\\n", " "), comments=True)


def _comment(example: Example) -> str:
    return " ".join(line.split("#", 1)[1].strip() for line in example.text.splitlines()
                    if "#" in line)


def _has_gpu() -> bool:
    torch = pytest.importorskip("torch")
    return torch.cuda.is_available()


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_example_runs_as_written(example: Example, workdir: Path) -> None:
    tokens = _tokens(example)
    comment = _comment(example)
    command = example.text
    if tokens[0] == "pip":
        pytest.skip("the set-up commands are run verbatim by tests/test_readme.py and .ci/run")
    if tokens[0] == "ruff":
        if shutil.which("ruff", path=ENV["PATH"]) is None:
            pytest.skip("ruff is not installed here")
        proc = _run(command, REPO)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # it ran (findings or not)
        return
    if tokens[1] in ("launch", "test") or tokens[:2] == ["distify", "config"] and len(tokens) == 2:
        pytest.importorskip("torch")
    expect_error = re.match(r"error\b", comment)
    expected_rc: tuple[int, ...] = (0,)
    if tokens[1] == "check" or "--check" in tokens:
        expected_rc = (0, 1)  # a linter / CI check: findings are exit 1, errors exit 2
    stdin = ""
    if tokens[1] == "config" and "--yes" not in tokens:
        stdin = "\n" * 40  # the wizard: every default
    if tokens[1] == "launch":
        script = next(i for i, t in enumerate(tokens) if t.endswith(".py"))
        unknown = [t.split("=", 1)[0] for t in tokens[script + 1:]
                   if t.startswith("-") and t.split("=", 1)[0] not in SCRIPT_OPTIONS]
        assert not unknown, (f"{example}: {unknown} come after the script, so they go to the "
                             f"script, which has no such option; put launch options first")
        if "error on a machine without GPUs" in comment:
            if _has_gpu():
                pytest.skip("this machine has GPUs")
        elif not expect_error and not {"--dry-run", "--slurm"} & set(tokens):
            command = command.replace("distify launch", "distify launch --dry-run", 1)
        expected_rc = (0,)
    proc = _run(command, workdir, stdin=stdin)
    output = proc.stdout + proc.stderr
    if expect_error or "error on a machine without GPUs" in comment:
        assert proc.returncode != 0, f"{example}: expected an error\n{output}"
        message = re.match(r"error: ([^(]+)", comment)
        if message:
            assert message[1].strip() in output, output
        assert "Traceback" not in output, output
        return
    assert proc.returncode in expected_rc, f"{command}\nexit {proc.returncode}\n{output[-3000:]}"
    assert "Traceback" not in output, output
    if comment.startswith("warns"):
        assert "warning" in output.lower(), output
    if tokens[1] == "launch" and "--slurm" in tokens:
        assert "#SBATCH" in (workdir / "job.sbatch").read_text()


def test_examples_are_found() -> None:
    """The extraction sees the README's and every command's examples."""
    places = {example.where for example in EXAMPLES}
    assert {"README.md", "distify --help", "distify convert --help", "distify check --help",
            "distify launch --help", "distify config --help", "distify env --help",
            "distify test --help"} <= places
    texts = [example.text for example in EXAMPLES]
    assert any(t.startswith("distify launch --slurm --num_machines 4 train_dist.py > job.sbatch")
               for t in texts)
    assert any("\\\n" in t for t in texts)  # continued lines stay one example
    readme = [example.text for example in EXAMPLES if example.where == "README.md"]
    assert "distify check --explain DST101  # a rule's full documentation, with valid and " \
        "invalid examples" in readme
    assert "distify test --cpu --num_processes 4" in readme
