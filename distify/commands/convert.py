"""`distify convert`: rewrite a single-GPU training script (or a project) for distify's runtime."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from distify.convert.project import (
    STANDALONE_RUNTIME,
    ConfigOutcome,
    Planned,
    convert_file,
    copy_runtime,
    place_launch_config,
    plan_project,
    write_planned,
)
from distify.convert.report import (
    colour_diff,
    config_report,
    json_report,
    text_report,
    unified_diff,
)
from distify.errors import UserError
from distify.lint.config import load_config as load_project_config
from distify.rules import load_rules

EXAMPLES = """\b
Examples:
  distify convert train.py -o train_dist.py   # writes train_dist.py + train_dist.yaml
  distify convert train.py --mixed-precision bf16   # sets it in train_dist.yaml, new or not
  distify convert train.py --diff             # preview, writes nothing
  distify convert train.py --check            # exit 1 if the file would change (CI)
  distify convert src/ -o src_dist/           # a whole project
"""


@click.command(name="convert", epilog=EXAMPLES)
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Where to write the result (a file, or a folder for a project). "
                   "Default: <name>_dist.py beside the input.")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff; write nothing.")
@click.option("--check", "check_only", is_flag=True,
              help="Write nothing; exit 1 if the conversion would change anything.")
@click.option("-i", "--in-place", is_flag=True, help="Rewrite the input file(s) in place.")
@click.option("--mixed-precision", type=click.Choice(["no", "fp16", "bf16"]), default=None,
              help="Mixed precision recorded in the launch config: written into a new one, or "
                   "updated in the existing one (its other settings kept). [default: 'no' in a "
                   "new config; an existing config is kept as it is]")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--rules", "rule_files", multiple=True, type=click.Path(path_type=Path),
              help="Extra YAML rule pack (repeatable).")
@click.option("--standalone", is_flag=True,
              help="Copy the runtime beside the output as distify_runtime/, so the cluster "
                   "needs no distify install.")
@click.option("--no-config", is_flag=True, help="Do not write the launch config.")
def convert(path: Path, output: Path | None, show_diff: bool, check_only: bool, in_place: bool,
            mixed_precision: str | None, as_json: bool, rule_files: tuple[Path, ...],
            standalone: bool, no_config: bool) -> None:
    """Rewrite PATH (a training script, or a project folder) to run distributed.

    The model, optimizer, LR scheduler and DataLoaders are prepared, loss.backward() goes through
    the runtime, prints and saves happen on the main process only, evaluation sums are reduced
    across processes. A report lists every change with its line, every place that needs a human
    look, and how to launch the result. The conversion is static: your script is never run.
    """
    modes = sum(bool(m) for m in (show_diff, check_only, in_place))
    if modes > 1 or (output is not None and (show_diff or check_only or in_place)):
        raise UserError("choose one of -o, --diff, --check and -i")
    project = load_project_config(start=path if path.is_dir() else path.parent)
    rules = load_rules([*project.rules, *rule_files])
    runtime_module = STANDALONE_RUNTIME if standalone else "distify.runtime"
    if path.is_dir():
        planned = plan_project(path, None if (show_diff or check_only or in_place) else
                               _project_output(path, output), rules, runtime_module)
    else:
        target = path if (in_place or show_diff or check_only) else _file_output(path, output)
        planned = [Planned(path, target, convert_file(path, rules, runtime_module))]
    converted = [p for p in planned if p.result is not None]
    if check_only:
        _check(converted)
    if show_diff:
        for item in converted:
            click.echo(colour_diff(unified_diff(item.result, str(_display(item)))), nl=False)
        return
    write_planned(planned, in_place=in_place, make_dirs=path.is_dir())
    config = None if no_config else _write_config(planned, path, mixed_precision)
    if standalone:
        folder = (planned[0].target.parent if not path.is_dir() else planned[0].target.parent)
        copy_runtime(folder if not path.is_dir() else _project_output(path, output))
    _report(converted, as_json, config)


def _display(item: Planned) -> Path:
    return item.target if item.target != item.source else item.source


def _check(converted: list[Planned]) -> None:
    changed = [item for item in converted if item.result.changed]
    for item in changed:
        click.echo(f"would convert {item.source}", err=True)
    if not changed:
        click.echo("nothing to convert", err=True)
    sys.exit(1 if changed else 0)


def _file_output(path: Path, output: Path | None) -> Path:
    target = output if output is not None else path.with_name(f"{path.stem}_dist{path.suffix}")
    if target.is_dir():
        target = target / path.name
    if target.resolve() == path.resolve():
        raise UserError("the output is the input; use -i to convert in place", path=str(path))
    return target


def _project_output(path: Path, output: Path | None) -> Path:
    if output is None:
        return path.with_name(f"{path.name}_dist")
    return output


def _write_config(planned: list[Planned], path: Path,
                  mixed_precision: str | None) -> ConfigOutcome | None:
    """Write, keep or update the launch config beside the converted script (a single file)."""
    if path.is_dir() or not planned or planned[0].result.status != "converted":
        return None
    return place_launch_config(planned[0].target.with_suffix(".yaml"),
                               mixed_precision=mixed_precision,
                               own_scaler=planned[0].result.own_mixed_precision)


def _report(converted: list[Planned], as_json: bool, config: ConfigOutcome | None) -> None:
    single = len(converted) == 1
    hint = None
    if single and converted[0].result.status == "converted":
        hint = _launch_hint(converted[0].target, config)
    if as_json:
        click.echo(json_report(((p.result, str(p.target)) for p in converted), launch_hint=hint,
                               launch_config=str(config.path) if config else None))
        return
    if not single:
        done = [p for p in converted if p.result.status == "converted"]
        click.echo(f"{len(done)} of {len(converted)} Python file(s) converted")
    for item in converted:
        if not single and item.result.status != "converted" and not item.result.notes:
            continue
        click.echo(text_report(item.result, str(item.target), launch_hint=hint))
    if config:
        click.echo(config_report(config))


def _launch_hint(script: Path, config: ConfigOutcome | None) -> str:
    """The command that launches ``script`` as converted: it names the launch config unless
    `distify launch` finds it by itself (``<script>.yaml``)."""
    options = ""
    if config is not None and config.path != script.with_suffix(".yaml"):
        options = f"--config_file {config.path} "
    if _local_gpus():
        return f"distify launch {options}{script}"
    return (f"distify launch {options}--num_processes 2 --cpu {script}   "
            "(no GPU here: 2 processes on the CPU)")


def _local_gpus() -> int:
    from distify.launch.config import local_gpu_count

    return local_gpu_count()
