"""The `distify` command line: a thin click layer over the library.

Every subcommand lives in :mod:`distify.commands`. Nothing here imports torch: `convert` and
`check` must start fast and run in environments (pre-commit, CI) where torch is not installed.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from distify import __version__
from distify.errors import UserError

#: subcommand → (module defining it, one-line help shown by `distify --help`). Modules are
#: imported only when their command runs, so `distify --help` does not load LibCST.
_COMMANDS = {
    "convert": ("distify.commands.convert",
                "Rewrite a training script (or a project folder) to run distributed."),
    "check": ("distify.commands.check", "Lint distributed training code for pitfalls."),
    "launch": ("distify.commands.launch", "Run a script on N processes or N machines."),
    "config": ("distify.commands.config", "Write a launch config, interactively or by flags."),
    "env": ("distify.commands.env", "Print versions, GPUs and the launch config for a bug report."),
    "verify": ("distify.commands.verify",
               "Run a script and its conversion side by side and check the conversion."),
    "test": ("distify.commands.selftest", "Check that 2 processes can train together here."),
}
_SIGPIPE_EXIT = 141  # what a shell reports for a process ended by SIGPIPE


class _Main(click.Group):
    """Loads subcommands lazily and renders every error a user can hit as one line on stderr,
    never a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        return getattr(importlib.import_module(_COMMANDS[name][0]), name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, text) in _COMMANDS.items()])

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as err:
            click.echo(f"distify: error: {err}", err=True)
            ctx.exit(err.exit_code)
        except BrokenPipeError:  # `distify convert x.py --diff | head`: the reader left
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            ctx.exit(_SIGPIPE_EXIT)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("distify: interrupted", err=True)
            ctx.exit(130)
        except Exception as err:
            if os.environ.get("DISTIFY_DEBUG"):
                raise
            click.echo(
                f"distify: internal error: {type(err).__name__}: {err} "
                "(set DISTIFY_DEBUG=1 for the traceback and please report it)",
                err=True,
            )
            ctx.exit(2)


@click.group(
    cls=_Main,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Example:
  distify convert train.py -o train_dist.py   # rewrite, write train_dist.yaml, report
  distify launch --num_processes 2 train_dist.py --epochs 1   # options before the script
  distify check src/                          # pre-commit linter
""",
)
@click.version_option(__version__, "-V", "--version", prog_name="distify")
def main() -> None:
    """Turn a single-GPU PyTorch training script into a correct distributed one.

    distify rewrites the script's source (LibCST codemods) to run on DDP with optional mixed
    precision through a small bundled runtime, writes a launch config, and lints distributed
    scripts for the classic pitfalls.
    """




if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
