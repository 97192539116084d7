"""Convert a Jupyter notebook: its code cells, as one script, go through the usual conversion;
the result is written as a script (``-o nb_dist.py``) or as a notebook (``-o nb_dist.ipynb``).

The report names places as "cell N, line L" (see :mod:`distify.notebook`). A notebook is never
parsed as Python: its JSON is read and validated first.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from distify.convert.engine import FileResult, Item, convert_source
from distify.convert.project import read_source
from distify.errors import UserError
from distify.fsutil import on_deep_stack, too_deep
from distify.notebook import (
    Notebook,
    cell_diff,
    cell_of,
    cell_sources,
    in_cells,
    is_notebook,
    line_map,
    notebook_bytes,
    parse_notebook,
    to_script,
)
from distify.rules import RuleSet


@dataclass(frozen=True)
class NotebookResult(FileResult):
    """A notebook's conversion: ``source`` is the notebook's bytes, ``output`` what is written
    (the script, or the notebook); item lines are lines of ``script_after``."""

    script_before: str = ""
    script_after: str = ""
    #: the output is a notebook (else a script)
    to_notebook: bool = True
    notebook: Notebook | None = None
    #: each code cell's converted code, by cell number
    cells: dict = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether the code changes (outputs cleared alone do not count, so ``--check`` passes
        on a converted notebook saved with its outputs)."""
        return self.script_after != self.script_before

    def cell_diff(self, new_name: str) -> str:
        return cell_diff(self.notebook, self.cells, new_name)

    def comparable(self, old: bytes) -> bytes:
        """An existing output, as the script it holds (to tell an earlier output from a file
        that must not be overwritten)."""
        if not self.to_notebook:
            return old
        try:
            return to_script(parse_notebook(old, self.path)).text.encode()
        except UserError:
            return old


def convert_notebook(path: Path, target: Path, rules: RuleSet, runtime_module: str, *,
                     skip: frozenset[str] = frozenset()) -> NotebookResult:
    """Convert the notebook at ``path`` for the output ``target`` (a notebook when it ends in
    ``.ipynb``, else a script).

    Raises:
        UserError: not an nbformat 4 notebook, or code that does not parse (``cell N, line L``).
    """
    source = read_source(path)
    notebook = parse_notebook(source, str(path))
    to_nb = is_notebook(target)
    script = to_script(notebook, "notebook" if to_nb else "script")
    result = _convert(script.text, str(path), rules, runtime_module, skip)
    after = result.output.decode("utf-8")
    mapped = line_map(script.text, after)
    ours = [Item(mapped(n.line), "notebook", n.message, n.needs_human) for n in script.notes]
    changes = sorted([*result.changes, *(i for i in ours if not i.needs_human)],
                     key=lambda item: item.line)
    notes = sorted([*result.notes, *(i for i in ours if i.needs_human)],
                   key=lambda item: item.line)
    try:
        cells = cell_sources(notebook, script.text, after, script.restore)
    except ValueError as err:
        raise UserError(f"the conversion moved a cell boundary ({err}); convert to a script "
                        "instead: -o NAME.py", path=str(path)) from None
    output = notebook_bytes(notebook, cells) if to_nb else after.encode("utf-8")
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(FileResult)}
    fields.update(source=source, output=output, changes=tuple(changes),
                  notes=tuple(notes), reason=_in_cells(result.reason, after))
    return NotebookResult(**fields, script_before=script.text, script_after=after,
                          to_notebook=to_nb, notebook=notebook, cells=cells)


def _convert(script: str, path: str, rules: RuleSet, runtime_module: str,
             skip: frozenset[str]) -> FileResult:
    source = script.encode("utf-8")
    try:
        try:
            return convert_source(source, path, rules, runtime_module, skip=skip)
        except RecursionError:
            pass
        try:
            return on_deep_stack(convert_source, source, path, rules, runtime_module, skip=skip)
        except RecursionError:
            raise too_deep(source, path) from None
    except UserError as err:
        raise in_cells(err, script) from None


def _in_cells(text: str, script: str) -> str:
    """``line 12`` of the script, in a message, as ``cell 2, line 4``."""
    def cell(match: re.Match) -> str:
        found = cell_of(script, int(match.group(1)))
        return f"cell {found[0]}, line {found[1]}" if found else match.group(0)
    return re.sub(r"\bline (\d+)", cell, text)
