"""Jupyter notebooks (``.ipynb``) for convert, check and launch: code cells as one script.

A notebook is read as plain JSON against the nbformat 4 schema (``nbformat``, ``cells``, each
cell's ``cell_type`` and ``source``): that is all distify needs, and it keeps ``convert`` and
``check`` free of Jupyter's dependencies (nbformat pulls in jsonschema and traitlets).

The script keeps every cell in order behind a ``# %% cell N`` comment (jupytext's percent
format; markdown and raw cells become comments), so a line of the script is always "cell N,
line L" of the notebook. IPython syntax a script cannot run (magics, shell lines, ``x?``) is
commented out, ``display(...)`` becomes ``print(...)``, and a cell's bare trailing expression
(which the notebook shows and a script does not) is kept as it is; each gets one report line.
Written back as a notebook, the commented IPython lines are restored, outputs are cleared and
markdown, raw cells and metadata are kept.

What it deliberately does not do: run anything, translate ``%env``/``%cd``/``!cmd`` into Python
(they are reported for a human to decide), or convert notebooks inside a project folder.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import io
import json
import re
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from distify.errors import UserError

SUFFIX = ".ipynb"
#: a cell boundary in the script: ``# %% cell 3``, ``# %% [markdown] cell 4``
MARKER = re.compile(r"^# %%(?: \[(markdown|raw)\])? cell (\d+)$")

Target = Literal["script", "notebook"]


def is_notebook(path: str | Path) -> bool:
    return str(path).lower().endswith(SUFFIX)


@dataclass(frozen=True)
class Cell:
    number: int  # 1-based, over all cells (markdown included), as the notebook shows them
    kind: str  # code, markdown or raw
    source: str


@dataclass(frozen=True)
class Notebook:
    path: str
    data: dict
    cells: tuple[Cell, ...]


# -- reading ---------------------------------------------------------------------------------

def read_notebook(path: str | Path) -> Notebook:
    """Read and validate a notebook file.

    Raises:
        UserError: unreadable, not JSON, or not an nbformat 4 notebook (with ``path:line:col``).
    """
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError("no such file", path=str(path)) from None
    except OSError as err:
        raise UserError(f"cannot read: {err.strerror}", path=str(path)) from None
    return parse_notebook(raw, str(path))


def parse_notebook(raw: bytes, path: str) -> Notebook:
    """A notebook from its bytes (see :func:`read_notebook`)."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise UserError("not a notebook: not UTF-8 text", path=path, line=line) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"not a notebook: invalid JSON ({err.msg})", path=path,
                        line=err.lineno, col=err.colno) from None
    if not isinstance(data, dict):
        raise UserError("not a notebook: the JSON is not an object", path=path, line=1, col=1)
    version = data.get("nbformat")
    if version != 4:
        line = _line_of(text, r'"nbformat"\s*:')
        hint = ("; upgrade it with: jupyter nbconvert --to notebook --nbformat 4"
                if isinstance(version, int) else "")
        raise UserError(f"not an nbformat 4 notebook (nbformat: {json.dumps(version)}){hint}",
                        path=path, line=line or 1)
    cells = data.get("cells")
    if not isinstance(cells, list):
        raise UserError("not an nbformat 4 notebook: no 'cells' list", path=path,
                        line=_line_of(text, r'"cells"\s*:') or 1)
    starts = _cell_lines(text, len(cells))
    return Notebook(path, data, tuple(_cell(cell, i, path, starts[i])
                                      for i, cell in enumerate(cells)))


def _cell(cell: object, index: int, path: str, line: int | None) -> Cell:
    where = f"cell {index + 1}: "
    if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
        raise UserError(f"{where}not an nbformat 4 cell (cell_type must be code, markdown or "
                        "raw)", path=path, line=line)
    source = cell.get("source")
    if isinstance(source, list) and all(isinstance(part, str) for part in source):
        source = "".join(source)
    if not isinstance(source, str):
        raise UserError(f"{where}'source' must be a string or a list of strings", path=path,
                        line=line)
    return Cell(index + 1, cell["cell_type"], source)


def _line_of(text: str, pattern: str) -> int | None:
    found = re.search(pattern, text)
    return text.count("\n", 0, found.start()) + 1 if found else None


def _cell_lines(text: str, count: int) -> list[int | None]:
    """The line each cell starts on in the file (None where the layout is unusual)."""
    found = re.search(r'"cells"\s*:\s*\[', text)
    lines: list[int | None] = []
    pos = found.end() if found else len(text)
    decoder = json.JSONDecoder()
    while found and len(lines) < count:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            _, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        lines.append(text.count("\n", 0, pos) + 1)
        pos = end
    return lines + [None] * (count - len(lines))


# -- notebook → script -----------------------------------------------------------------------

@dataclass(frozen=True)
class Note:
    """One report line about IPython syntax, at a line of the script."""

    line: int
    message: str
    needs_human: bool = False


@dataclass(frozen=True)
class Script:
    text: str
    notes: tuple[Note, ...]
    #: script line → the notebook's own line, put back when the script becomes a notebook again
    restore: dict[int, str]


def to_script(notebook: Notebook, target: Target = "script") -> Script:
    """The notebook's cells as one script (see the module docstring); ``target`` only words
    the report lines (a notebook keeps its IPython lines, a script comments them out)."""
    chunks, notes, restore = [], [], {}
    line = 1
    own = any(_OWN_DISPLAY.search(c.source) for c in notebook.cells if c.kind == "code")
    for cell in notebook.cells:
        kind = "" if cell.kind == "code" else f" [{cell.kind}]"
        body, cell_notes, cell_restore = _code(cell.source, target, own) if cell.kind == "code" \
            else ("".join(f"# {text}".rstrip() + "\n" for text in _lines(cell.source)), [], {})
        chunks.append(f"# %%{kind} cell {cell.number}\n{body}")
        # the cell's first line comes after its marker line
        notes += [dataclasses.replace(n, line=n.line + line + 1) for n in cell_notes]
        restore.update({k + line + 1: v for k, v in cell_restore.items()})
        line += 2 + body.count("\n")
    return Script("\n".join(chunks), tuple(notes), restore)


def _lines(source: str) -> list[str]:
    return source.splitlines() if source else []


#: magics that only set up the notebook's display or the kernel: nothing for a script to do
_NOTEBOOK_ONLY = {"matplotlib", "config", "load_ext", "reload_ext", "unload_ext", "autoreload",
                  "aimport", "precision", "xmode", "pdb", "pprint", "who", "whos", "lsmagic",
                  "history", "notebook", "autosave", "colors", "pylab", "tensorboard",
                  "watermark", "env", "pwd", "ls"}
_INSTALLS = {"pip", "conda", "mamba", "uv"}
#: shell commands that only show something (the GPU, files, versions)
_SHOW_ONLY = {"nvidia-smi", "ls", "pwd", "cat", "head", "tail", "echo", "which", "free", "df",
              "du", "nproc", "lscpu", "wc", "date", "hostname", "uname", "tree", "whoami"}
#: cell magics whose body is Python: the body runs, the magic line goes
_PYTHON_BODY = {"time", "capture"}
_DISPLAY_CELLS = {"html", "javascript", "js", "latex", "markdown", "svg", "timeit"}
_SHELL_ASSIGN = re.compile(r"^\s*[\w.]+(?:\s*,\s*[\w.]+)*\s*=\s*[!%]")
_HELP = re.compile(r"^\s*(?:\?{1,2}[\w.]+|[\w.]+\?{1,2})\s*$")
#: the notebook has a ``display`` of its own (not IPython's): its calls stay as they are
_OWN_DISPLAY = re.compile(r"^[ \t]*(?:def display\b|display\s*=[^=]|from (?!IPython)[\w.]+ "
                          r"import .*\bdisplay\b|import .*\bas display\b)", re.MULTILINE)


def _code(source: str, target: Target,
          own_display: bool = False) -> tuple[str, list[Note], dict[int, str]]:
    """A code cell's lines for the script, with 0-based line numbers in the notes."""
    lines = _lines(source)
    out, notes, restore = [], [], {}
    if lines and lines[0].startswith("%%"):
        return _cell_magic(lines, target, own_display)
    pending = ""  # a Python statement not yet complete (open bracket, string, backslash)
    for i, text in enumerate(lines):
        if MARKER.match(text):  # a comment of the cell's own that would read as a boundary
            out.append(text.replace("# %%", "# (%%)", 1))
            restore[i] = text
            continue
        if not pending:
            handled = _ipython_line(text, target)
            if handled is not None:
                new, message, human = handled
                out.append(new)
                restore[i] = text
                notes.append(Note(i, message, human))
                continue
        out.append(text)
        pending = pending + text + "\n" if _incomplete(pending + text + "\n") else ""
    notes += _displays(out, target, own_display)
    return "".join(f"{text}\n" for text in out), notes, restore


def _cell_magic(lines: list[str], target: Target,
                own_display: bool) -> tuple[str, list[Note], dict[int, str]]:
    name = lines[0][2:].split(maxsplit=1)[0] if lines[0][2:].strip() else ""
    restore = {0: lines[0]}
    if name in _PYTHON_BODY:
        body, notes, inner = _code("\n".join(lines[1:]), target, own_display)
        message = _said(lines[0], target, "the cell's code runs as written")
        return (f"# {lines[0]}\n{body}", [Note(0, message)]
                + [dataclasses.replace(n, line=n.line + 1) for n in notes],
                {**restore, **{k + 1: v for k, v in inner.items()}})
    restore = dict(enumerate(lines))
    body = "".join(f"# {text}".rstrip() + "\n" for text in lines)
    if name in _DISPLAY_CELLS:
        return body, [Note(0, _said(lines[0], target, "the whole cell; it only shows "
                                    "something in Jupyter"))], restore
    return body, [Note(0, _said(lines[0], target, "the whole cell: a script does not run it; "
                                "do its work in Python or before launching"), True)], restore


def _ipython_line(text: str, target: Target) -> tuple[str, str, bool] | None:
    """(script line, report message, needs a human) for a line of IPython syntax, else None."""
    stripped = text.strip()
    indent = text[:len(text) - len(text.lstrip())]
    if stripped.startswith("%time "):
        return indent + stripped[len("%time "):].strip(), _said(
            stripped, target, "`%time` only; the statement runs as written", kept=True), False
    kind = _kind(text)
    if kind is None:
        return None
    why, human = _WHY[kind]
    commented = f"{indent}pass  # {stripped}" if indent else f"# {stripped}"
    return commented, _said(stripped, target, why), human


#: why each kind of IPython line is left out of a script, and whether a human must act on it
_WHY = {
    "install": ("install it before launching, on every machine", False),
    "show": ("a command that only shows something", False),
    "magic": ("IPython magic, nothing a script needs", False),
    "env": ("set it in the environment before launching", True),
    "other-magic": ("IPython magic a script does not run; do its work in Python or before "
                    "launching", True),
    "shell": ("a shell command a script does not run; run it before launching (on every "
              "machine), or in Python", True),
    "assign": ("a shell or magic result assigned to a variable; the script never sets it: "
               "compute it in Python", True),
    "help": ("IPython help, nothing a script needs", False),
}


def _kind(text: str) -> str | None:
    """Which kind of IPython line ``text`` is (a key of ``_WHY``), or None for Python."""
    stripped = text.strip()
    if stripped.startswith(("%", "!")):
        words = stripped[1:].split() or [""]
        first = words[0]
        if first in _INSTALLS or first.startswith("pip") or first in ("apt", "apt-get") \
                or words[1:3] == ["-m", "pip"]:
            return "install" if "install" in words else "show"
        if stripped.startswith("!"):
            return "show" if first in _SHOW_ONLY else "shell"
        if first == "env" and "=" in stripped:
            return "env"
        return "magic" if first in _NOTEBOOK_ONLY or first == "timeit" else "other-magic"
    if _SHELL_ASSIGN.match(text) and not _parses(stripped):
        return "assign"
    return "help" if _HELP.match(text) else None


def _said(code: str, target: Target, why: str, *, kept: bool = False) -> str:
    shown = code if len(code) <= 60 else code[:57] + "..."
    if target == "notebook":
        return f"`{shown}` kept for Jupyter; run as a script (distify launch) it is skipped: {why}"
    return f"`{shown}` {'dropped' if kept else 'commented out'}: {why}"


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def _incomplete(code: str) -> bool:
    """Does ``code`` end inside a statement (an open bracket or string, a backslash)?"""
    try:
        for _ in tokenize.generate_tokens(io.StringIO(code).readline):
            pass
    except tokenize.TokenError:
        return True
    except (SyntaxError, IndentationError):
        return False  # the conversion reports it, with its position
    return False


#: calls whose value a notebook does not show (None), or that are called for their effect
_EFFECTS = {"print", "display", "show", "savefig", "close", "step", "zero_grad", "backward",
            "save", "manual_seed", "seed", "set_seed", "plot", "imshow", "legend", "title",
            "xlabel", "ylabel", "tight_layout", "grid", "figure", "subplot", "subplots",
            "hist", "scatter", "bar", "axis", "clf", "cla", "xlim", "ylim", "suptitle",
            "set_title", "use_deterministic_algorithms"}


def _displays(lines: list[str], target: Target, own_display: bool) -> list[Note]:
    """``display(x)`` becomes ``print(x)`` (in ``lines``); a bare trailing expression is kept
    and reported. Notes with 0-based lines."""
    try:
        tree = ast.parse("".join(f"{text}\n" for text in lines))
    except SyntaxError:
        return []  # the conversion reports it, with its position
    notes = []
    for node in ast.walk(tree) if not own_display else ():
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "display" \
                and not node.value.keywords:
            row, col = node.value.func.lineno - 1, node.value.func.col_offset
            text = lines[row]
            if text[col:col + 7] == "display":
                lines[row] = f"{text[:col]}print{text[col + 7:]}"
                notes.append(Note(row, "display(...) → print(...): a script has no rich "
                                       "display; the value is printed"))
    last = tree.body[-1] if tree.body else None
    if isinstance(last, ast.Expr) and _shown(last, lines):
        code = ast.get_source_segment("".join(f"{t}\n" for t in lines), last.value) or ""
        code = code if len(code) <= 40 and "\n" not in code else code[:37].split("\n")[0] + "..."
        where = "the notebook" if target == "script" else "Jupyter"
        notes.append(Note(last.lineno - 1, f"`{code}` kept: {where} shows this last value of "
                                           "the cell, a script does not (wrap it in print() to "
                                           "see it)"))
    return notes


def _shown(stmt: ast.Expr, lines: list[str]) -> bool:
    value = stmt.value
    rest = lines[stmt.end_lineno - 1][stmt.end_col_offset:].lstrip()
    if rest.startswith(";"):
        return False  # a trailing semicolon hides it in Jupyter too
    if isinstance(value, ast.Constant) and value.value is None or \
            isinstance(value, (ast.Await, ast.Yield, ast.YieldFrom)):
        return False
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name not in _EFFECTS
    return True


# -- script → positions, notebook ----------------------------------------------------------

def cell_of(script: str, line: int) -> tuple[int, int] | None:
    """(cell, line in the cell) of a 1-based line of the script; None before the first cell."""
    found = None
    for number, text in enumerate(script.splitlines()[:line], start=1):
        match = MARKER.match(text)
        if match:
            found = (int(match.group(2)), number)
    if found is None or found[1] == line:
        return None if found is None else (found[0], 1)
    return found[0], line - found[1]


def line_map(before: str, after: str) -> Callable[[int], int]:
    """Map a 1-based line of ``before`` to its line in ``after`` (a line the conversion
    changed maps to where its replacement starts)."""
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(),
                                      autojunk=False)
    blocks = matcher.get_opcodes()

    def mapped(line: int) -> int:
        for _, i1, i2, j1, j2 in blocks:
            if i1 < line <= i2 or (i1 == i2 == line - 1):
                return j1 + min(line - 1 - i1, max(j2 - j1 - 1, 0)) + 1
        return line
    return mapped


def split_cells(script: str, back: dict[int, str] | None = None) -> dict[int, str]:
    """The code of each cell in a script written by :func:`to_script` (and converted since);
    ``back``: 0-based lines of the script to put back as the notebook had them.

    Raises:
        ValueError: a cell marker is missing or out of order (the conversion moved one).
    """
    cells: dict[int, list[str]] = {}
    head: list[str] = []
    current = head
    back = back or {}
    for i, text in enumerate(script.splitlines(keepends=True)):
        if i in back:
            current.append(back[i])
            continue
        match = MARKER.match(text.rstrip("\r\n"))
        if match:
            number = int(match.group(2))
            if cells and number <= max(cells):
                raise ValueError(f"cell {number} out of order")
            current = cells.setdefault(number, [])
            continue
        current.append(text)
    if head and "".join(head).strip():
        first = min(cells) if cells else None
        if first is None:
            raise ValueError("no cell markers")
        cells[first] = head + cells[first]
    bodies = {}
    last = max(cells) if cells else 0
    for number, parts in cells.items():
        body = "".join(parts)
        if number != last and body.endswith("\n\n"):
            body = body[:-1]  # the blank line between cells
        elif number != last and body == "\n":
            body = ""
        bodies[number] = body
    return bodies


def notebook_bytes(notebook: Notebook, code: dict[int, str]) -> bytes:
    """The notebook with code cells replaced by ``code`` (by cell number), outputs and execution
    counts cleared, everything else kept; written as nbformat writes it (indent 1, sorted keys,
    UTF-8, a final newline), so writing it again gives the same bytes."""
    data = copy.deepcopy(notebook.data)
    for cell, raw in zip(notebook.cells, data["cells"]):
        if cell.kind != "code":
            continue
        raw["outputs"] = []
        raw["execution_count"] = None
        new = code.get(cell.number, cell.source)
        if new != cell.source:
            raw["source"] = new.splitlines(keepends=True)
    return (json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()


def cell_sources(notebook: Notebook, before: str, after: str,
                 restore: dict[int, str]) -> dict[int, str]:
    """Each code cell's converted code, with the notebook's IPython lines put back and a cell's
    own final newline (or its absence) kept."""
    back = {}
    mapped = line_map(before, after)
    before_lines = before.splitlines()
    after_lines = after.splitlines(keepends=True)
    for line, original in restore.items():
        target = mapped(line)
        if 0 < target <= len(after_lines) and \
                after_lines[target - 1].rstrip("\r\n") == before_lines[line - 1]:
            ending = after_lines[target - 1][len(after_lines[target - 1].rstrip("\r\n")):]
            back[target - 1] = original + ending
    bodies = split_cells(after, back)
    result = {}
    for cell in notebook.cells:
        if cell.kind == "code":
            body = bodies.get(cell.number, "")
            if not cell.source.endswith("\n") and body.endswith("\n"):
                body = body[:-1]
            result[cell.number] = body
    return result


def cell_diff(notebook: Notebook, code: dict[int, str], new_name: str) -> str:
    """A unified diff per changed code cell (``--- nb.ipynb: cell 3``)."""
    out = []
    for cell in notebook.cells:
        new = code.get(cell.number, cell.source)
        if cell.kind != "code" or new == cell.source:
            continue
        lines = difflib.unified_diff(
            _with_newline(cell.source).splitlines(keepends=True),
            _with_newline(new).splitlines(keepends=True),
            fromfile=f"{notebook.path}: cell {cell.number}",
            tofile=f"{new_name}: cell {cell.number}")
        out.append("".join(lines))
    return "".join(out)


def _with_newline(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def place(output_name: str, script: str, *, notebook: bool) -> Callable[[int], str]:
    """How a report names a line of the converted script: ``nb_dist.py:45 (cell 7, line 3)``,
    or ``nb_dist.ipynb: cell 7, line 3`` when the output is a notebook."""
    def where(line: int) -> str:
        found = cell_of(script, line)
        cell = f"cell {found[0]}, line {found[1]}" if found else "before the first cell"
        return f"{output_name}: {cell}" if notebook else f"{output_name}:{line} ({cell})"
    return where


def in_cells(err: UserError, script: str) -> UserError:
    """An error at a line of the script, placed at its cell and line instead."""
    found = cell_of(script, err.line) if err.line else None
    if found is None:
        return err
    col = f", column {err.col}" if err.col else ""
    return UserError(f"cell {found[0]}, line {found[1]}{col}: {err.message}", path=err.path)
