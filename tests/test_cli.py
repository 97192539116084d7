"""The `distify` command line as a whole: help, version, start-up without torch, pipes."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from distify import __version__
from distify.cli import main
from tests.helpers import FIXTURES


def test_help_lists_every_command_with_an_example() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("convert", "check", "launch", "config"):
        assert f"  {command} " in result.output
    assert "Example:" in result.output


def test_every_subcommand_has_help_with_an_example() -> None:
    for command in ("convert", "check", "launch", "config"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0, result.output
        assert "xample" in result.output, command


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.output.strip() == f"distify, version {__version__}"


def test_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["frobnicate"])
    assert result.exit_code == 2
    assert "No such command" in result.output


def _imported_modules(code: str) -> set[str]:
    probe = f"import sys; {code}; print('\\n'.join(sys.modules))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_help_loads_neither_torch_nor_libcst() -> None:
    modules = _imported_modules("from distify.cli import main; "
                                "main(['--help'], standalone_mode=False)")
    assert not {m for m in modules if m.split(".")[0] in ("torch", "libcst")}


def test_convert_and_check_run_where_torch_cannot_be_imported(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes((FIXTURES / "convert" / "mnist_style.in.py").read_bytes())
    for args in (["convert", str(script), "--check"], ["check", str(script)]):
        code = ("import sys; sys.modules['torch'] = None\n"
                "from distify.cli import main\nmain(sys.argv[1:])\n")
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, cwd=tmp_path)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode in (0, 1), (args, proc.stderr)


def test_a_closed_pipe_is_not_an_internal_error(tmp_path) -> None:
    source = tmp_path / "big.py"  # a diff far larger than a pipe's buffer
    source.write_text("import torch\n" + "print('a fairly long line of output')\n" * 5000)
    proc = subprocess.run(
        f"{sys.executable} -m distify convert {source} --diff | head -c 10 > /dev/null; "
        "echo ${PIPESTATUS[0]} >&2", shell=True, executable="/bin/bash", capture_output=True,
        text=True)
    assert "internal error" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] in ("0", "141")  # quiet, like `cat`
