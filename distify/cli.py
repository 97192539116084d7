"""The `distify` command line: a thin click layer over the library.

Every subcommand lives in :mod:`distify.commands`. Nothing here imports torch: `convert` and
`check` must start fast and run in environments (pre-commit, CI) where torch is not installed.
"""

from __future__ import annotations

import os
import sys

import click

from distify import __version__
from distify.commands.check import check
from distify.commands.config import config
from distify.commands.convert import convert
from distify.commands.launch import launch
from distify.errors import UserError


class _Main(click.Group):
    """Renders every error a user can hit as one line on stderr, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as err:
            click.echo(f"distify: error: {err}", err=True)
            ctx.exit(err.exit_code)
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
  distify launch train_dist.py --num_processes 2
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


main.add_command(convert)
main.add_command(check)
main.add_command(launch)
main.add_command(config)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
