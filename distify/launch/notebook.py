"""`distify launch nb.ipynb`: the notebook's code cells, written as a script to run.

The script is the one ``distify convert nb.ipynb -o nb.py`` would start from (cells in order,
IPython lines commented out). It is written beside the notebook, hidden, so the notebook's
folder is first on ``sys.path`` as it is in Jupyter (local modules import the same way), and
removed when the launch ends. Messages that name one of its lines name the cell instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from distify.errors import UserError
from distify.fsutil import atomic_write_text
from distify.notebook import cell_of, in_cells, read_notebook, to_script


def write_script(notebook: str) -> str:
    """Write the notebook's code cells as a script beside it and return its path.

    Raises:
        UserError: not an nbformat 4 notebook, or its code does not compile (by cell and line);
            nothing is written then.
    """
    script = to_script(read_notebook(notebook)).text
    try:
        compile(script, notebook, "exec", dont_inherit=True)
    except SyntaxError as err:
        col = err.offset if err.offset and err.offset > 0 else None
        raise in_cells(UserError(f"{type(err).__name__}: {err.msg}; nothing was launched",
                                 path=notebook, line=err.lineno, col=col), script) from None
    path = Path(notebook)
    target = path.with_name(f".{path.stem}.distify-launch-{os.getpid()}.py")
    atomic_write_text(target, script)
    return str(target)


def in_notebook(line: str, script: str, notebook: str) -> str:
    """``script:41`` in a message, as ``notebook cell 7, line 3``."""
    text = Path(script).read_text(encoding="utf-8") if Path(script).is_file() else ""

    def cell(match: re.Match) -> str:
        found = cell_of(text, int(match.group(1)))
        return f"{notebook} cell {found[0]}, line {found[1]}" if found else match.group(0)
    return re.sub(rf"{re.escape(script)}:(\d+)", cell, line)
