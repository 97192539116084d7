"""`distify check`: the pre-commit linter (a thin click layer over :mod:`distify.lint`).

The linter is imported inside the command, so ``distify --help`` stays fast; neither imports
torch.
"""

from __future__ import annotations

from pathlib import Path

import click

_FORMATS = ("concise", "json", "github", "sarif")


def _codes(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(code for value in values for code in value.split(",") if code.strip())


@click.command(
    name="check",
    epilog="""\b
Examples:
  distify check src/                         # lint a project
  distify check train.py --diff              # show what --fix would change
  distify check . --select DST1 --ignore DST104
  distify check . --output-format sarif > distify.sarif
  distify check --explain DST101             # a rule's full documentation and examples
  distify check nb_dist.ipynb                # a notebook: findings by cell and line

\b
Exit status: 0 clean, 1 findings (or a file that does not parse), 2 usage or internal error.
Suppress one finding with `# noqa: DST101` (or a bare `# noqa`) on its line.
Settings: [tool.distify.check] in pyproject.toml (select, ignore, extend-select, exclude, all).
""",
)
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--fix", is_flag=True, help="Apply the safe fixes (findings marked [*]) in place.")
@click.option("--diff", is_flag=True,
              help="Print the fixes as a unified diff instead of writing them.")
@click.option("--select", multiple=True, metavar="CODES",
              help="Only these rule codes or prefixes (comma-separated; replaces the config's "
                   "select and ignore).")
@click.option("--ignore", multiple=True, metavar="CODES",
              help="Skip these rule codes or prefixes (comma-separated; adds to the config's).")
@click.option("--output-format", type=click.Choice(_FORMATS), default="concise",
              show_default=True, help="How findings are printed.")
@click.option("--all", "check_all", is_flag=True,
              help="Check files that are not distributed too (plain single-GPU scripts).")
@click.option("--jobs", "-j", type=click.IntRange(min=0), default=0, show_default=True,
              help="Worker processes; 0 picks one per CPU for many files.")
@click.option("--rules", "rule_packs", multiple=True, type=click.Path(path_type=Path),
              help="Extra YAML rule pack (repeatable).")
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="pyproject.toml to read [tool.distify] from (default: the nearest one).")
@click.option("--list-rules", is_flag=True, help="List the rules and exit.")
@click.option("--explain", metavar="CODE",
              help="Print a rule's documentation with its valid and invalid examples, and exit.")
def check(paths, fix, diff, select, ignore, output_format, check_all, jobs, rule_packs,
          config_path, list_rules, explain) -> None:
    """Lint distributed training scripts: side effects on every rank, hangs, and other pitfalls.

    PATHS are files and folders (default: the current folder). Files that never mention torch
    or a distributed API are skipped unread; only distributed scripts (torch.distributed, DDP,
    Accelerate, Lightning, the distify runtime) are checked unless --all is given. Findings go
    to stdout as `path:line:col: DSTxxx message`, `[*]` marking those --fix can fix; a summary
    goes to stderr. Notebooks (.ipynb) are checked by their code cells, as one script:
    `nb.ipynb:cell 7:3:1: DSTxxx message` (--fix leaves notebooks alone).
    """
    from distify.lint.cli import CheckRequest, run_check

    if list_rules:
        from distify.lint.cli import rule_table

        click.echo(rule_table())
        return
    if explain:
        from distify.lint.cli import explain_rule

        click.echo(explain_rule(explain), nl=False)
        return
    ctx = click.get_current_context()
    request = CheckRequest(
        paths=tuple(paths) or (".",), fix=fix, diff=diff, select=_codes(select),
        ignore=_codes(ignore), output_format=output_format, check_all=check_all, jobs=jobs,
        rule_packs=tuple(rule_packs), config_path=config_path)
    ctx.exit(run_check(request, out=lambda text: click.echo(text, nl=False),
                       err=lambda text: click.echo(text, nl=False, err=True)))
