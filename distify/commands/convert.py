"""`distify convert`: rewrite a single-GPU training script (or a project) for distify's runtime."""

from __future__ import annotations

import difflib
import re
import shlex
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import click

from distify.convert.project import (
    STANDALONE_RUNTIME,
    ConfigOutcome,
    Planned,
    convert_file,
    copy_runtime,
    has_main_guard,
    launch_entries,
    launch_entry,
    place_launch_config,
    plan_project,
    write_planned,
)
from distify.convert.report import (
    colour_diff,
    config_report,
    json_report,
    launch_line,
    text_report,
    unified_diff,
)
from distify.errors import UserError
from distify.fsutil import resolved
from distify.lint.config import load_config as load_project_config
from distify.rules import RuleSet, load_rules

EXAMPLES = """\b
Examples:
  distify convert train.py -o train_dist.py   # writes train_dist.py + train_dist.yaml
  distify convert train.py --mixed-precision bf16   # sets it in train_dist.yaml, new or not
  distify convert train.py --diff > fix.patch # preview: the diff; the report on stderr
  distify convert train.py --check            # exit 1 if the file would change (CI)
  distify convert train.py -v                 # every changed line, even 300 identical ones
  distify convert src/ -o src_dist/           # a whole project, with its launch config
  distify convert nb.ipynb                    # nb_dist.ipynb: code converted, outputs cleared
  distify convert nb.ipynb -o nb_dist.py      # a notebook's code cells as one script
  distify convert train.py --skip progress-bars   # leave one rewrite out (see --list-rewrites)
  distify convert --explain reduce-metrics    # what a rewrite does, with examples

\b
Settings: [tool.distify.convert] skip = [...] in pyproject.toml; [tool.distify] rules = [...].
"""


@click.command(name="convert", epilog=EXAMPLES)
@click.argument("path", type=click.Path(path_type=Path), required=False)
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Where to write the result (a file, or a folder for a project). "
                   "Default: <name>_dist.py beside the input (<name>_dist.ipynb for a "
                   "notebook; -o x.py turns a notebook into a script), not written when "
                   "nothing changes.")
@click.option("--diff", "show_diff", is_flag=True,
              help="Print a unified diff on stdout and the report on stderr; write nothing.")
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
@click.option("--force", is_flag=True,
              help="Overwrite an existing output file that is not an earlier output of this "
                   "conversion.")
@click.option("-v", "--verbose", is_flag=True,
              help="List every changed line (the report gives the same change on many lines "
                   "as one line with the first few line numbers).")
@click.option("--skip", "skips", multiple=True, metavar="NAME",
              help="Leave a rewrite out (repeatable, or comma-separated): its places stay as "
                   "written and the report lists them. Names: --list-rewrites.")
@click.option("--list-rewrites", is_flag=True, help="List the rewrites and exit.")
@click.option("--explain", metavar="NAME",
              help="Print a rewrite's documentation with its examples, and exit.")
def convert(path: Path | None, output: Path | None, show_diff: bool, check_only: bool,
            in_place: bool, mixed_precision: str | None, as_json: bool,
            rule_files: tuple[Path, ...], standalone: bool, no_config: bool, force: bool,
            verbose: bool, skips: tuple[str, ...], list_rewrites: bool,
            explain: str | None) -> None:
    """Rewrite PATH (a training script, or a project folder) to run distributed.

    The model, optimizer, LR scheduler and DataLoaders are prepared, loss.backward() goes through
    the runtime, prints, saves and result files happen on the main process only, and metrics
    (sums, prediction lists, meters) are combined across processes. A report lists every change
    with its line, every place that needs a human look, and how to launch the result. The
    conversion is static: your script is never run.
    """
    if list_rewrites or explain:
        from distify.convert.rewrites import explain_rewrite, rewrite_table

        click.echo(rewrite_table() if list_rewrites else explain_rewrite(explain),
                   nl=list_rewrites)
        return
    if path is None:
        raise click.UsageError("Missing argument 'PATH'.")
    path = _named(path)
    modes = sum(bool(m) for m in (show_diff, check_only, in_place))
    if modes > 1 or (output is not None and (show_diff or check_only or in_place)):
        raise UserError("choose one of -o, --diff, --check and -i")
    project = load_project_config(start=path if path.is_dir() else path.parent)
    rules = load_rules([*project.rules, *rule_files])
    skip = _skips(skips, project)
    runtime_module = STANDALONE_RUNTIME if standalone else "distify.runtime"
    planned, out = _plan(path, output, rules, runtime_module,
                         to_output=not (show_diff or check_only or in_place), skip=skip)
    converted = [p for p in planned if p.result is not None]
    if check_only:
        _check(converted)
    if show_diff:
        for item in converted:
            diff = item.result.cell_diff(str(_display(item))) \
                if _notebook_result(item.result) else \
                unified_diff(item.result, str(_display(item)))
            click.echo(colour_diff(diff), nl=False)
        # stdout stays a diff that `patch` and `git apply` read; the report goes to stderr
        _report(converted, as_json, None, verbose=verbose, err=True)
        return
    unwritten = _not_written(path, output, in_place, converted)
    if not (force or in_place or path.is_dir() or unwritten):
        _refuse_to_clobber(converted[0])
    write_planned([p for p in planned if p not in unwritten], in_place=in_place,
                  make_dirs=path.is_dir())
    root = (out or path) if path.is_dir() else None
    entries = _entries(planned, path)
    # nvidia-smi runs once (a process of its own), for the configs and the launch line alike
    gpus = _local_gpus() if any(p.result.status == "converted" for p in converted) else 0
    configs = _configure(converted, entries, root, mixed_precision, no_config=no_config,
                         gpus=gpus)
    if standalone and not unwritten:
        copy_runtime(root or planned[0].target.parent)
    _report(converted, as_json, configs, verbose=verbose, unwritten=unwritten,
            launch=_launch_hints(converted, entries, configs, gpus))


def _named(path: Path) -> Path:
    """``.``, ``./``, ``..`` or ``proj/..`` name a folder without naming it (its name is empty
    or ``..``, so ``proj_dist`` cannot be derived from it): the folder itself, resolved."""
    if path.name in ("", ".", ".."):
        return resolved(path)
    return path


def _skips(names: tuple[str, ...], project) -> frozenset[str]:
    """The rewrites to leave out: ``--skip`` (repeatable, comma-separated) and the project's
    ``[tool.distify.convert] skip``, each name checked."""
    from distify.convert.rewrites import select_skips

    source = f"{project.source}: [tool.distify.convert] skip" if project.source else "skip"
    configured = select_skips(project.convert_skip, source=source)
    given = select_skips(n for item in names for n in item.split(",") if n.strip())
    return configured | given


def _plan(path: Path, output: Path | None, rules: RuleSet, runtime_module: str, *,
          to_output: bool, skip: frozenset[str]) -> tuple[list[Planned], Path | None]:
    """Convert the file or project (nothing written yet); also the project's output folder
    (None: a single file, or a project converted in place or previewed)."""
    if path.is_dir():
        out = _project_output(path, output) if to_output else None
        return plan_project(path, out, rules, runtime_module, progress=_progress,
                            skip=skip), out
    target = _file_output(path, output) if to_output else path
    if str(path).lower().endswith(".ipynb"):  # distify.notebook.is_notebook, unimported
        # a notebook: JSON, never parsed as Python; a notebook or a script comes out
        from distify.convert.notebook import convert_notebook

        return [Planned(path, target, convert_notebook(path, target, rules, runtime_module,
                                                       skip=skip))], None
    return [Planned(path, target, convert_file(path, rules, runtime_module, skip=skip))], None


def _notebook_result(result: object) -> bool:
    """Is ``result`` a notebook's (a ``NotebookResult``)? The notebook modules are imported
    only when a notebook is converted (a script's conversion does without them), so until
    then no result is one."""
    module = sys.modules.get("distify.convert.notebook")
    return module is not None and isinstance(result, module.NotebookResult)


def _place(name: str, script: str, *, notebook: bool):
    from distify.notebook import place

    return place(name, script, notebook=notebook)


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
    if resolved(target) == resolved(path):
        raise UserError("the output is the input; use -i to convert in place", path=str(path))
    return target


#: ``import distify.runtime as distify`` (or the standalone copy): a line every conversion adds
_RUNTIME_IMPORT = re.compile(rb"^import (?:distify\.runtime|distify_runtime)\b", re.MULTILINE)
#: how much of an earlier output must survive in the new one (lines, difflib's ratio) for it to
#: be an earlier conversion of the same script, edited since
_SAME_SCRIPT = 0.5


def _refuse_to_clobber(item: Planned) -> None:
    """Refuse to replace an existing file at the output path unless nothing is lost: it holds
    the new output already, or the input's own bytes (a copy, a hard link), or it is an earlier
    output of converting this script (it imports distify's runtime, as every conversion does,
    and at least half its lines are in the new output: the script was edited since)."""
    target = item.target
    try:
        if not stat.S_ISREG(target.stat().st_mode):
            return  # a named pipe or a device (-o /dev/null) holds nothing to lose; reading
            # a pipe would block until a writer came
        old = target.read_bytes()
    except FileNotFoundError:
        return
    except OSError:
        return  # not readable (a folder, a loop): the write reports it
    new = item.result.output
    if _notebook_result(item.result):  # compare the code, as scripts
        old, new = item.result.comparable(old), item.result.script_after.encode()
    if old in (new, item.result.source) or (_RUNTIME_IMPORT.search(old) and difflib.SequenceMatcher(
            None, old.splitlines(), new.splitlines()).ratio() >= _SAME_SCRIPT):
        return
    raise UserError(f"already exists and is not an earlier output of converting {item.source}: "
                    "pass --force to overwrite it, or choose another -o", path=str(target))


def _project_output(path: Path, output: Path | None) -> Path:
    if output is None:
        return path.with_name(f"{path.name}_dist")
    return output


def _not_written(path: Path, output: Path | None, in_place: bool,
                 converted: list[Planned]) -> list[Planned]:
    """A single file that comes out unchanged is not copied to the default ``<name>_dist.py``
    (clutter); an explicit ``-o`` still writes it. A project keeps all its files."""
    if path.is_dir() or in_place or output is not None or converted[0].result.changed:
        return []
    return converted


def _entries(planned: list[Planned], path: Path) -> list[Planned]:
    """The scripts to launch: a project's training scripts (see ``launch_entries``), or the
    one converted file; empty when nothing was converted or a project's entry is unclear."""
    if path.is_dir():
        return launch_entries(planned, path)
    done = [p for p in planned if p.result is not None and p.result.status == "converted"]
    entry = launch_entry(done) if done else None
    return [entry] if entry is not None else []


def _configure(converted: list[Planned], entries: list[Planned], root: Path | None,
               mixed_precision: str | None, *, no_config: bool,
               gpus: int) -> list[ConfigOutcome]:
    """The launch configs: one beside each script to launch (where ``distify launch`` looks
    for it), or ``launch.yaml`` at the top of a project (``root``) whose entry is unclear;
    a new one runs a process per GPU of the ``gpus`` here (one without)."""
    done = [p for p in converted if p.result.status == "converted"]
    if not done or no_config:
        return []
    if not entries:
        return [place_launch_config(root / "launch.yaml", mixed_precision=mixed_precision,
                                    own_scaler=any(p.result.own_mixed_precision for p in done),
                                    gpus=gpus)]
    return [place_launch_config(entry.target.with_suffix(".yaml"),
                                mixed_precision=mixed_precision,
                                own_scaler=entry.result.own_mixed_precision, gpus=gpus)
            for entry in entries]


def _report(converted: list[Planned], as_json: bool, configs: Sequence[ConfigOutcome] | None,
            *, verbose: bool, err: bool = False, unwritten: Sequence[Planned] = (),
            launch: Sequence[tuple[str, bool]] = ()) -> None:
    """Print the report (on stderr with ``err``); ``launch`` holds the commands (one per
    training script of a project) and whether every file is ready for them."""
    configs = configs or []
    # JSON: one command (and config) per line when a project has several training scripts
    hint = "\n".join(command for command, _ in launch) or None
    if as_json:
        outputs = ((p.result, None if p in unwritten else str(p.target)) for p in converted)
        click.echo(json_report(outputs, launch_hint=hint, launch_config="\n".join(
            str(c.path) for c in configs) or None), err=err)
        return
    single = len(converted) == 1
    if not single:
        done = [p for p in converted if p.result.status == "converted"]
        click.echo(f"{len(done)} of {len(converted)} Python file(s) converted", err=err)
    for item in converted:
        if not single and item.result.status in ("unchanged", "no-torch") \
                and not item.result.notes and not item.listed:
            continue  # a distributed file is listed: the report says why it was left alone
        why = f"-o {item.target} writes a copy anyway" if item in unwritten else None
        result, name = item.result, str(_display(item))
        where = _place(name, result.script_after, notebook=result.to_notebook) \
            if _notebook_result(result) else None
        click.echo(text_report(result, name, launch_hint=hint if single else None,
                               verbose=verbose, not_written=why, place=where), err=err)
    if not single:
        if len(launch) > 1:
            click.echo(f"{len(launch)} training scripts: one launch command each", err=err)
        for command, ready in launch:
            click.echo(launch_line(command, ready=ready), err=err)
    for config in configs:
        click.echo(config_report(config), err=err)


def _launch_hints(converted: list[Planned], entries: list[Planned],
                  configs: list[ConfigOutcome], gpus: int) -> list[tuple[str, bool]]:
    """The commands that launch the result as converted (one per script to launch), each with
    whether every file is ready: the converted ones, and a module left as written with a note
    that a model or loader it builds is not prepared.

    A command names its launch config unless `distify launch` finds it by itself
    (``<script>.yaml``); in a project whose entry point is unclear it says which scripts it
    could be."""
    done = [p for p in converted if p.result.status == "converted"]
    if not done:
        return []
    ready = all(p.result.ready for p in converted if p.result.status == "converted" or p.listed)
    hints = []
    for index, entry in enumerate(entries or [None]):
        config = configs[index] if index < len(configs) else None
        script, choices = (shlex.quote(str(entry.target)), "") if entry else \
            ("SCRIPT", _choices(done))
        options = ""
        if config is not None and (entry is None
                                   or config.path != entry.target.with_suffix(".yaml")):
            options = f"--config_file {shlex.quote(str(config.path))} "
        where = [f"SCRIPT: the entry point, {choices}"] if choices else []
        if not gpus:
            options += "--num_processes 2 --cpu "
            where.append("no GPU here: 2 processes on the CPU")
        comment = f"   ({'; '.join(where)})" if where else ""
        hints.append((f"distify launch {options}{script}{comment}", ready))
    return hints


def _choices(done: list[Planned]) -> str:
    mains = [p for p in done if has_main_guard(p.result)] or done
    names = [str(p.target) for p in mains[:3]] + (["..."] if len(mains) > 3 else [])
    return "one of " + ", ".join(names)


#: a project with fewer Python files converts too fast for a progress bar to help
_PROGRESS_MIN_FILES = 10


def _progress(files: list[Path]) -> Iterator[Path]:
    """The files, with a progress bar on stderr while a long project converts; nothing when
    stderr is not a terminal (piped, in CI)."""
    if sum(p.suffix == ".py" for p in files) < _PROGRESS_MIN_FILES or not sys.stderr.isatty():
        yield from files
        return
    with click.progressbar(files, label="Converting", file=sys.stderr,
                           item_show_func=lambda p: str(p) if p else None) as bar:
        yield from bar


def _local_gpus() -> int:
    from distify.launch.config import local_gpu_count

    return local_gpu_count()
