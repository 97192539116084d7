"""One ``distify verify``: convert if asked, make the runs, run the checks.

Runs, each in its own temporary copy of the script's folder (nothing is written beside the
script): the original on 1 process, the conversion on 1 process (plain ``python``), the
conversion on N processes (the job ``distify launch`` would run), and check 5's frozen-weights
pair: the original on 1 process and the conversion on N processes, optimizer steps undone and
BatchNorm statistics kept (``hooks/_distify_verify.py``). The original runs first: if it
fails on its own there is nothing to verify, and the other runs are not made.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from distify.errors import UserError
from distify.verify import checks
from distify.verify.checks import Check
from distify.verify.runs import Caps, Run, copy_folder, run_parallel, run_single


@dataclass(frozen=True)
class Outcome:
    """What ``verify`` found: the checks (empty when the original failed) and the runs."""

    original: str
    converted: str  # as the user named it, or "<converted in a temporary folder>"
    runs: tuple[Run, ...]
    checks: tuple[Check, ...]

    @property
    def original_failed(self) -> bool:
        return not self.runs[0].ok

    @property
    def ok(self) -> bool:
        return not self.original_failed and all(check.ok for check in self.checks)


def verify(original: Path, converted: Path | None, args: Sequence[str], *, processes: int,
           cpu: bool, steps: int | None, timeout: float,
           eval_steps: int | None = None) -> Outcome:
    """Run ``original`` and its conversion and check them (see the module docstring).

    Args:
        original: the single-process script (or notebook: its code cells, as a script).
        converted: its conversion; None: converted here, in a temporary folder.
        args: the script's arguments, the same for every run.
        processes: N, the processes of the distributed run (2 or more).
        cpu: run on CPUs (Gloo) even where GPUs are present.
        steps: cap every training DataLoader iteration at this many batches; None: whole.
        eval_steps: cap every evaluation DataLoader iteration (see the hooks); None: whole.
        timeout: seconds each run may take before it is stopped.

    Raises:
        UserError: the script cannot be read or converted.
    """
    work = Path(tempfile.mkdtemp(prefix="distify-verify-"))
    try:
        return _verify(original, converted, args, processes=processes, cpu=cpu,
                       caps=Caps(steps, eval_steps), timeout=timeout, work=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _verify(original: Path, converted: Path | None, args: Sequence[str], *, processes: int,
            cpu: bool, caps: Caps, timeout: float, work: Path) -> Outcome:
    source = _script_text(original)
    if converted is not None:
        converted_text = _script_text(converted)
        converted_home = converted.resolve().parent
    else:
        converted_text = _convert(source, str(original))
        converted_home = original.resolve().parent
    stem = original.stem
    original_folder = work / "original"
    copy_folder(original.resolve().parent, original_folder)
    original_script = original_folder / f"{stem}.py"
    if original.suffix != ".py" or not original_script.is_file():  # a notebook's cells
        original_script.write_text(source, encoding="utf-8")
    if converted is not None and not converted.name.endswith(".ipynb"):
        converted_name = converted.name
    else:
        converted_name = f"{stem}_dist.py"
    shown = str(converted) if converted is not None else "<converted in a temporary folder>"
    first = run_single("the original on 1 process", original_script, original_folder, args,
                       cpu=cpu, timeout=timeout, caps=caps, work=work / "r0")
    if not first.ok:
        return Outcome(str(original), shown, (first,), ())
    folders = []
    for number in (1, 2, 3):
        folder = work / f"conversion{number}"
        copy_folder(converted_home, folder)
        (folder / converted_name).write_text(converted_text, encoding="utf-8")
        folders.append(folder)
    single = run_single("the conversion on 1 process", folders[0] / converted_name, folders[0],
                        args, cpu=cpu, timeout=timeout, caps=caps, work=work / "r1")
    job = run_parallel(f"the conversion on {processes} processes", folders[1] / converted_name,
                       folders[1], args, processes=processes, cpu=cpu, timeout=timeout,
                       caps=caps, work=work / "r2")
    runs = [first, single, job]
    # The frozen pair only when the original evaluated (else check 5 has nothing to compare),
    # and not after a failed job (check 5 says why; a hang is not waited for twice)
    frozen_pair = [first, job]
    if job.ok and first.records.get(0, {}).get("evaluations", 1):
        frozen_folder = work / "original-frozen"
        copy_folder(original.resolve().parent, frozen_folder)
        frozen_script = frozen_folder / f"{stem}.py"
        frozen_script.write_bytes(original_script.read_bytes())
        runs.append(run_single("the original on 1 process, frozen weights", frozen_script,
                               frozen_folder, args, cpu=cpu, timeout=timeout,
                               caps=caps.spread(1, processes), work=work / "r3"))
        runs.append(run_parallel(f"the conversion on {processes} processes, frozen weights",
                                 folders[2] / converted_name, folders[2], args,
                                 processes=processes, cpu=cpu, timeout=timeout,
                                 caps=caps.spread(processes, processes), work=work / "r4"))
        frozen_pair = runs[3:]
    shown_name = converted.name if converted is not None else converted_name
    found = (checks.world_size_1(first, single), checks.replicas(job, shown_name),
             checks.distinct_data(job, shown_name, first), checks.one_writer(job),
             checks.eval_metrics(*frozen_pair), checks.no_hang(runs, timeout),
             checks.throughput(first, job))
    notebook = converted if converted is not None else original
    if notebook.suffix == ".ipynb":
        for name in {shown_name, converted_name}:  # checks 4 and 6 name the run's file
            found = tuple(_in_cells(check, name, converted_text, notebook.name,
                                    converted is None) for check in found)
    return Outcome(str(original), shown, tuple(runs), found)


def _in_cells(check: Check, script: str, text: str, notebook: str, converted_here: bool) -> Check:
    """``nb_dist.py:41`` in a check's evidence as ``nb.ipynb cell 7, line 3``: the conversion
    keeps the notebook's cell markers, so a line of it is a line of a cell (of the conversion
    of that cell, when verify converted the notebook itself)."""
    import dataclasses
    import re

    from distify.notebook import cell_of

    def cell(match: re.Match) -> str:
        found = cell_of(text, int(match.group(1)))
        if found is None:
            return match.group(0)
        return f"{notebook} cell {found[0]}, line {found[1]}" + (
            " of its conversion" if converted_here else "")

    return dataclasses.replace(check, evidence=re.sub(rf"{re.escape(script)}:(\d+)", cell,
                                                      check.evidence))


def _script_text(path: Path) -> str:
    """The script's source; a notebook's code cells as a script."""
    from distify.notebook import is_notebook

    if is_notebook(path):
        from distify.notebook import read_notebook, to_script

        return to_script(read_notebook(path)).text
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read the script: {err}", path=str(path)) from None


def _convert(source: str, path: str) -> str:
    from distify.convert.engine import convert_source
    from distify.lint.config import load_config
    from distify.rules import load_rules

    rules = load_rules(list(load_config(start=Path(path).resolve().parent).rules))
    result = convert_source(source.encode("utf-8"), path, rules)
    if not result.changed:
        why = f": {result.reason}" if result.reason else ""
        raise UserError(f"the conversion changes nothing{why}; nothing to verify", path=path)
    return result.output.decode("utf-8")
