"""Convert files and whole projects on disk: read, convert, and write outputs atomically.

Inputs are never modified unless the caller asks for in-place conversion. Every output is written
through a temporary file and a rename, and nothing is written before every input has been read
and converted, so a bad file in a project leaves no half-converted output folder behind.

The launch config goes beside the converted script (``train_dist.yaml``), where ``distify
launch`` looks for it. A YAML file already there is adopted only when it is a launch config
(``train.yaml`` is often the script's own hyper-parameters): otherwise it is left alone and the
config gets a name of its own (``train_dist.launch.yaml``), which the launch command then names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import errno
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from distify.analysis.project import (
    BackwardReach,
    imported_by_parallel,
    reach,
    resolve,
    runs_as_script,
    shared_with_parallel,
)
from distify.convert.engine import FileResult, Item, convert_source
from distify.convert.loops import LOADER_ELSEWHERE
from distify.errors import UserError
from distify.fsutil import (
    SYMLINK_LOOP,
    atomic_write_bytes,
    atomic_write_text,
    on_deep_stack,
    resolved,
    too_deep,
)
from distify.launch.config import (
    LaunchConfig,
    default_config,
    load_config,
    with_overrides,
    write_config,
)
from distify.rules import RuleSet

#: folders never descended into when converting a project
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox",
             ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules", "build", "dist"}
STANDALONE_RUNTIME = "distify_runtime"


@dataclass(frozen=True)
class Planned:
    """One output to write: a converted script, or a file copied as it is."""

    source: Path
    target: Path
    result: FileResult | None  # None: a non-Python file, copied
    #: the report names it even when it is unchanged, with why it was left alone
    listed: bool = False


def read_source(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError("no such file", path=str(path)) from None
    except IsADirectoryError:
        raise UserError("is a directory (give a folder to convert a project)",
                        path=str(path)) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserError(SYMLINK_LOOP, path=str(path)) from None
        raise UserError(f"cannot read: {err.strerror}", path=str(path)) from None


def convert_file(path: Path, rules: RuleSet, runtime_module: str, *,
                 skip: frozenset[str] = frozenset()) -> FileResult:
    """Convert one file (``skip``: rewrites turned off). A syntax tree too deep for the usual
    recursion limit (a sum of thousands of terms) is converted again on a big stack; deeper
    still, a one-line error."""
    source = read_source(path)
    try:
        return convert_source(source, str(path), rules, runtime_module, skip=skip)
    except RecursionError:
        pass
    try:
        return on_deep_stack(convert_source, source, str(path), rules, runtime_module,
                             skip=skip)
    except RecursionError:
        raise too_deep(source, str(path)) from None


def iter_project(root: Path) -> Iterator[Path]:
    """Every file under ``root``, sorted, skipping VCS, cache and virtual-env folders."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            yield Path(folder) / name


def plan_project(root: Path, out: Path | None, rules: RuleSet, runtime_module: str, *,
                 progress: Callable[[list[Path]], Iterable[Path]] = iter,
                 skip: frozenset[str] = frozenset()) -> list[Planned]:
    """Convert every Python file under ``root``; other files are copied when ``out`` is set.

    Args:
        progress: wraps the list of files as they are converted (a progress bar).
        skip: rewrites turned off (:mod:`distify.convert.rewrites`).
    """
    if out is not None:
        _check_outside(root, out)
    planned = []
    for path in progress(list(iter_project(root))):
        target = (out / path.relative_to(root)) if out is not None else path
        if path.suffix == ".py":
            planned.append(Planned(path, target,
                                   convert_file(path, rules, runtime_module, skip=skip)))
        elif out is not None:
            planned.append(Planned(path, target, None))
    planned = _leave_scripts_without_backward(planned, root)
    planned = _convert_helpers(planned, root, rules, runtime_module, skip)
    planned = _leave_helpers_shared_with_parallel(planned, root)
    return _loaders_prepared_next_door(_keep_helpers_of_parallel(planned, root), root)


def _project_files(planned: list[Planned]) -> dict[Path, FileResult]:
    return {p.source: p.result for p in planned if p.result is not None
            and p.source.suffix == ".py"}


def _replaced(planned: list[Planned], results: dict[Path, FileResult]) -> list[Planned]:
    """``planned`` with the results of ``results`` put in (and the report naming them)."""
    return [Planned(p.source, p.target, results[p.source], listed=True)
            if p.source in results else p for p in planned]


def _left_alone(result: FileResult, reason: str, notes: tuple[Item, ...] = ()) -> FileResult:
    return FileResult(result.path, result.source, result.source, "unchanged", notes=notes,
                      reason=reason, imports=result.imports)


def _leave_scripts_without_backward(planned: list[Planned], root: Path) -> list[Planned]:
    """A script of the project that reaches no backward pass (``predict.py``, ``sample.py``,
    ``prepare_data.py``; see :class:`BackwardReach`) is not a training script: it is run with
    plain ``python``, on one process, where it is right as written. It is left unchanged, with
    the project modules that only such scripts import, rather than converted for N processes
    it never runs on. A script is a file no other project file imports that does work when run
    (a ``__main__`` block, a top-level loop or call)."""
    results = _project_files(planned)
    imports = {path: r.imports for path, r in results.items()}
    imported = reach(imports, list(results), root)
    backward = BackwardReach({path: r.source for path, r in results.items()}, root)
    inference = [path for path, r in results.items() if path not in imported
                 and r.status != "already-distributed" and _is_script(backward, path)
                 and not backward.reaches_backward(path)]
    if not inference:
        return planned
    theirs = reach(imports, inference, root)
    others = reach(imports, [p for p in results if p not in inference and p not in theirs], root)
    left = {}
    for path in (p for p in inference if results[p].status == "converted"):
        left[path] = _left_alone(results[path], (
            "no backward pass in it or in the project code it calls: not a training script "
            "(inference, prediction, sampling or data preparation); it runs on one process as "
            f"before (`python {path.relative_to(root).as_posix()}`) and is not launched on N "
            "processes, so its prints and file writes already happen once"))
    for path, script in theirs.items():
        if path not in others and path not in left and results[path].status == "converted":
            left[path] = _left_alone(results[path], (
                f"imported only by {script.relative_to(root).as_posix()} (no backward pass: "
                "run on one process, not launched on N), left unchanged with it"))
    return _replaced(planned, left)


def _is_script(backward: BackwardReach, path: Path) -> bool:
    tree = backward.tree(path)
    return tree is not None and runs_as_script(tree)


def _leave_helpers_shared_with_parallel(planned: list[Planned], root: Path) -> list[Planned]:
    """A module that both an already-distributed script (``train_ddp.py``) and a script being
    converted (``train.py``) import runs in both jobs. Converted, it would run distify's
    rewrites inside the other script's own DDP job, where ``distify.backward`` finds no model
    prepared by distify and stops the job; so it is left as written, and every rewrite left out
    is reported on its line with what it means for the converted script."""
    results = _project_files(planned)
    parallel = [path for path, r in results.items() if r.status == "already-distributed"]
    if not parallel:
        return planned
    shared = shared_with_parallel(
        {path: r.imports for path, r in results.items()}, parallel,
        [path for path, r in results.items() if r.status == "converted"], root)
    left = {}
    for path, (ddp, script) in shared.items():
        result = results[path]
        if result.status != "converted":
            continue
        ddp_name, name = (p.relative_to(root).as_posix() for p in (ddp, script))
        lines = _source_lines(result)
        notes = tuple(Item(lines(change.line), *_left_out(change, name))
                      for change in result.changes)
        harm = (f"would stop {ddp_name}'s own DDP job (distify.backward finds no model "
                "prepared by distify there)"
                if any(change.kind == "backward" for change in result.changes) else
                f"would call distify's runtime inside {ddp_name}'s own DDP job, which distify "
                "does not set up")
        left[path] = _left_alone(result, (
            f"imported by {ddp_name}, which is {results[ddp].reason}, and by {name}, which is "
            f"converted: it runs in both jobs, and converted it {harm}, so it is left as "
            f"written; {name} runs it as written too (the lines below)"), notes)
    return _replaced(planned, left)


#: what a rewrite left out of a shared module means for the converted script that calls it
_LEFT_OUT = {
    "backward": "`.backward()` stays as written: DDP still averages the gradients of a model "
                "that {script} prepares, but there is no loss scaling: under fp16 the runtime "
                "stops the job at this backward (keep mixed precision 'no' or 'bf16')",
    "clip": "clipping stays torch's own: right without fp16 (under fp16 the job stops at the "
            "backward first)",
    "reduce": "not summed over processes: under {script} on N processes it covers one "
              "process's shard (rank 0's value where rank 0 prints it), not the whole data set "
              "as in one process",
    "print": "prints on every process of {script}'s job",
    "stop": "decided by each process alone in {script}'s job: a process that stops here "
            "leaves the others waiting at their next collective until the timeout",
}


def _left_out(change: Item, script: str) -> tuple[str, str, bool]:
    """The note for a rewrite left out of a shared module: (kind, message, needs_human)."""
    if change.kind.startswith("prepare"):  # launched as it is, the job would train wrong
        return "model", (f"not prepared here (shared with a DDP script): prepare it in "
                         f"{script} instead, or each process of its job trains on its own "
                         f"({change.message})"), True
    text = _LEFT_OUT.get(change.kind)
    if text is None:
        return (f"shared-{change.kind}",
                f"left as written, so not done in {script}'s job: {change.message}", True)
    text = text.format(script=script)
    if change.kind == "reduce" and change.message.startswith("`"):  # name the value
        text = f"`{change.message.split('`')[1]}`: {text}"
    return f"shared-{change.kind}", text, True


def _source_lines(result: FileResult) -> Callable[[int], int]:
    """Maps a line of the conversion's output to the line of the source it came from (a line
    the conversion added: the source line before it)."""
    before = result.source.decode("utf-8", "replace").splitlines()
    after = result.output.decode("utf-8", "replace").splitlines()
    mapping: dict[int, int] = {}
    for _tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before, after,
                                                       autojunk=False).get_opcodes():
        for offset, j in enumerate(range(j1, j2)):
            mapping[j + 1] = (i1 + min(offset, max(i2 - i1 - 1, 0)) + 1 if i2 > i1
                              else max(i1, 1))
    return lambda line: mapping.get(line, line)


def _convert_helpers(planned: list[Planned], root: Path, rules: RuleSet,
                     runtime_module: str, skip: frozenset[str]) -> list[Planned]:
    """A local module without torch that a converted script imports (directly or through other
    such modules) runs in every process of its job: its prints and file writes (a ``utils.py``
    that dumps the class indices to JSON, a ``progress_bar``) are converted too."""
    by_path = {p.source.resolve(): i for i, p in enumerate(planned) if p.result is not None}
    pending = [p for p in planned if p.result is not None and p.result.status == "converted"]
    seen: set[Path] = set()
    planned = list(planned)
    while pending:
        importer = pending.pop()
        for name in importer.result.imports:
            target = resolve(name, importer.source.resolve(), root.resolve())
            index = by_path.get(target) if target is not None else None
            if index is None or target in seen:
                continue
            seen.add(target)
            item = planned[index]
            if item.result.status != "no-torch":
                continue
            result = convert_source(item.result.source, item.result.path, rules, runtime_module,
                                    helper=True, skip=skip)
            if result.status == "converted":
                planned[index] = item = Planned(item.source, item.target, result)
                pending.append(item)
    return planned


def _keep_helpers_of_parallel(planned: list[Planned], root: Path) -> list[Planned]:
    """A local module that an already-distributed (or Hogwild) script imports runs inside that
    job: leave it as written, unless a script being converted imports it too."""
    results = {p.source: p.result for p in planned if p.result is not None}
    parallel = [path for path, r in results.items() if r.status == "already-distributed"]
    if not parallel:
        return planned
    helpers = imported_by_parallel(
        {path: r.imports for path, r in results.items()}, parallel,
        [path for path, r in results.items() if r.status == "converted"], root)
    kept = []
    for item in planned:
        entry = helpers.get(item.source)
        result = item.result
        if entry is not None and result is not None \
                and result.status in ("converted", "unchanged"):
            why = results[entry].reason.replace("already ", "", 1)
            result = FileResult(
                result.path, result.source, result.source, "already-distributed",
                reason=f"imported by {entry.relative_to(root).as_posix()}, which is {why}: it "
                       "runs in that job's processes as written", imports=result.imports)
            item = Planned(item.source, item.target, result)
        kept.append(item)
    return kept


def _loaders_prepared_next_door(planned: list[Planned], root: Path) -> list[Planned]:
    """A training loop over a loader that its file does not build gets a note (see
    ``convert.loops``); in a project, when a module that file imports was converted and its
    DataLoaders prepared, the loader is (most likely) one of those: the note goes."""
    preparing = {p.source.resolve() for p in planned if p.result is not None and any(
        change.kind == "prepare-dataloader" for change in p.result.changes)}
    if not preparing:
        return planned
    kept = []
    for item in planned:
        result = item.result
        if result is not None and any(n.kind == LOADER_ELSEWHERE for n in result.notes) and any(
                (target := resolve(name, item.source.resolve(), root.resolve())) is not None
                and target.resolve() in preparing for name in result.imports):
            notes = tuple(n for n in result.notes if n.kind != LOADER_ELSEWHERE)
            item = Planned(item.source, item.target, dataclasses.replace(result, notes=notes))
        kept.append(item)
    return kept


#: ``if __name__ == "__main__":`` at the top level of a file
_MAIN_GUARD = re.compile(rb"""^if\s+(__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*"""
                         rb"__name__)\s*:", re.MULTILINE)


def has_main_guard(result: FileResult) -> bool:
    return _MAIN_GUARD.search(result.source) is not None


def launch_entries(planned: list[Planned], root: Path) -> list[Planned]:
    """The scripts a project is launched with: every converted file that does work when run (a
    ``__main__`` block, a top-level loop) and reaches a backward pass (a training loop), those
    that no other project file imports first; a model file's ``__main__`` smoke test or a
    predict script is never one. When no file is such a script, :func:`launch_entry`'s choice
    (empty when unclear)."""
    results = _project_files(planned)
    done = [p for p in planned if p.result is not None and p.result.status == "converted"
            and not p.result.helper]
    backward = BackwardReach({path: r.source for path, r in results.items()}, root)
    training = [p for p in done if _is_script(backward, p.source)
                and backward.reaches_backward(p.source)]
    imported = reach({path: r.imports for path, r in results.items()}, list(results), root)
    training = [p for p in training if p.source not in imported] or training
    if training:
        return training
    entry = launch_entry(done)
    return [entry] if entry is not None else []


def launch_entry(converted: list[Planned]) -> Planned | None:
    """The script a project is launched with: the one converted file with an
    ``if __name__ == "__main__":``, else the only converted file; None when unclear."""
    converted = [p for p in converted if not p.result.helper]
    mains = [p for p in converted if has_main_guard(p.result)]
    if len(mains) == 1:
        return mains[0]
    return converted[0] if len(converted) == 1 else None


def _check_outside(root: Path, out: Path) -> None:
    root_abs, out_abs = resolved(root), resolved(out)
    if out_abs == root_abs or root_abs in out_abs.parents:
        raise UserError("the output folder must not be the project folder or inside it "
                        "(use -i to convert in place)", path=str(out))


def write_planned(planned: list[Planned], *, in_place: bool = False,
                  make_dirs: bool = False) -> list[Path]:
    """Write the outputs; with ``in_place`` only changed files are rewritten; ``make_dirs``
    creates missing folders (for a project). Returns the paths written."""
    written = []
    for item in planned:
        if item.result is None:
            _make_folder(item.target.parent)
            _copy(item.source, item.target)
            written.append(item.target)
            continue
        if in_place and not item.result.changed:
            continue
        if make_dirs:
            _make_folder(item.target.parent)
        atomic_write_bytes(item.target, item.result.output)
        written.append(item.target)
    return written


def _make_folder(folder: Path) -> None:
    """``mkdir -p``; a place where no folder can be made (read-only, under a file) is a
    one-line error."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file (or a dangling link) where the folder should be
        raise UserError("cannot make this output folder: a file is in the way",
                        path=str(folder)) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UserError(SYMLINK_LOOP, path=str(folder)) from None
        raise UserError(f"cannot make this output folder: {err.strerror}",
                        path=str(folder)) from None


def _copy(source: Path, target: Path) -> None:
    """Copy a file that is not Python as it is (with its times and mode), through a temporary
    file and a rename: a failed copy leaves no half file behind."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        shutil.copy2(source, tmp)
        os.replace(tmp, target)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if err.errno == errno.ELOOP:
            raise UserError(SYMLINK_LOOP, path=str(err.filename or source)) from None
        where = source if err.filename in (str(source), source) else target
        raise UserError(f"cannot {'read' if where == source else 'write'}: {err.strerror}",
                        path=str(where)) from None


def copy_runtime(folder: Path) -> Path:
    """Copy the runtime beside a standalone conversion, as the package ``distify_runtime``."""
    source = Path(__file__).resolve().parent.parent / "runtime"
    target = folder / STANDALONE_RUNTIME
    staging = folder / f".{STANDALONE_RUNTIME}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(staging, target)
    return target


@dataclass(frozen=True)
class ConfigOutcome:
    """What became of the launch config of a conversion."""

    path: Path
    action: Literal["wrote", "kept", "updated"]
    #: the file's mixed precision afterwards
    mixed_precision: str
    #: what ``--mixed-precision`` asked for (None: not given)
    asked: str | None = None
    #: the script scales its own loss, so ``asked`` was turned into 'no'
    own_scaler: bool = False
    #: YAML files that were in the way and are not launch configs: (path, why)
    passed_over: tuple[tuple[Path, str], ...] = ()


#: how many other names are tried when the usual ones hold files that are not launch configs
_MAX_CANDIDATES = 100


def place_launch_config(first: Path, *, mixed_precision: str | None,
                        own_scaler: bool, gpus: int | None = None) -> ConfigOutcome:
    """Write, keep or update the launch config at ``first`` or, when a file there is not a
    launch config, at the next free name (``x.launch.yaml``, ``x.launch-2.yaml``, ...).

    Args:
        first: where ``distify launch`` looks for it (``<script>.yaml``).
        mixed_precision: ``--mixed-precision`` (None: not given, an existing config is kept).
        own_scaler: the script has its own GradScaler, so mixed precision must stay 'no'.
        gpus: the GPUs here, when counted already (None: a new config counts them).

    Raises:
        UserError: the folder is not writable, or no free name was found.
    """
    asked, value = mixed_precision, mixed_precision
    if own_scaler and value in ("fp16", "bf16"):
        value = "no"
    passed_over = []
    for path in _config_names(first):
        if not path.exists() and not path.is_symlink():
            write_config(default_config(mixed_precision=value or "no", num_processes=None
                                        if gpus is None else max(gpus, 1)), path)
            return ConfigOutcome(path, "wrote", value or "no", asked, value != asked,
                                 tuple(passed_over))
        cfg, why = _launch_config(path)
        if cfg is None:
            passed_over.append((path, why))
            continue
        action = "kept"
        if value is not None and value != cfg.mixed_precision:
            _set_mixed_precision(path, cfg, value)
            action = "updated"
        return ConfigOutcome(path, action, value or cfg.mixed_precision, asked, value != asked,
                             tuple(passed_over))
    raise UserError(f"no free name for the launch config after {_MAX_CANDIDATES} tries; "
                    "pass --no-config and write one with `distify config`", path=str(first))


def _config_names(first: Path) -> Iterator[Path]:
    """``first`` (``x.yaml``), then ``x.launch.yaml``, ``x.launch-2.yaml``, ..."""
    yield first
    stem = first.stem if first.stem.endswith("launch") else f"{first.stem}.launch"
    if stem != first.stem:
        yield first.with_name(f"{stem}.yaml")
    for number in range(2, _MAX_CANDIDATES):
        yield first.with_name(f"{stem}-{number}.yaml")


def _launch_config(path: Path) -> tuple[LaunchConfig | None, str]:
    """The config in ``path`` when it is a valid launch config, else None and why not."""
    if not path.is_file():
        return None, "not a regular file"
    try:
        return load_config(path), ""
    except UserError as err:
        return None, str(err)


def _set_mixed_precision(path: Path, cfg: LaunchConfig, value: str) -> None:
    """Set ``mixed_precision`` in the file, keeping every other byte (comments, order, keys
    Accelerate writes); a layout the text edit cannot handle safely is written out anew."""
    import yaml  # only to edit an existing config (~10 ms to import)

    text = path.read_bytes().decode("utf-8")
    edited = _edited_mixed_precision(text, value)
    before = yaml.safe_load(text)
    try:
        after = yaml.safe_load(edited) if edited is not None else None
    except yaml.YAMLError:  # the value was an anchor another key refers to
        after = None
    if isinstance(after, dict) and after.get("mixed_precision") == value and \
            {k: v for k, v in after.items() if k != "mixed_precision"} == \
            {k: v for k, v in before.items() if k != "mixed_precision"}:
        atomic_write_text(path, edited)
    else:  # e.g. an alias shared with another key: rewrite the whole file instead
        write_config(with_overrides(cfg, mixed_precision=value), path)


def _edited_mixed_precision(text: str, value: str) -> str | None:
    import yaml

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    scalar = "'no'" if value == "no" else value  # a bare `no` is YAML's false
    if not isinstance(root, yaml.MappingNode):
        return None
    for key, node in root.value:
        if getattr(key, "value", None) == "mixed_precision":
            if not isinstance(node, yaml.ScalarNode):
                return None
            start, end = node.start_mark.index, node.end_mark.index
            return text[:start] + (scalar if start < end else f" {scalar}") + text[end:]
    if root.flow_style:
        return None
    newline = "\r\n" if "\r\n" in text else "\n"
    return f"{text}{'' if text.endswith(chr(10)) else newline}mixed_precision: {scalar}{newline}"
