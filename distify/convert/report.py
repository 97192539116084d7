"""Render conversion results: the human report, JSON, and unified diffs."""

from __future__ import annotations

import ast
import difflib
import json
from collections.abc import Callable, Iterable

import click

from distify.convert.engine import FileResult, Item
from distify.convert.project import ConfigOutcome


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def unified_diff(result: FileResult, new_name: str) -> str:
    """A unified diff from the input to the converted output ('' when unchanged)."""
    if not result.changed:
        return ""
    lines = difflib.unified_diff(
        _decode(result.source).splitlines(keepends=True),
        _decode(result.output).splitlines(keepends=True),
        fromfile=result.path, tofile=new_name)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)


def _decode(data: bytes) -> str:
    for encoding in ("utf-8-sig", "latin-1"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    return _text(data)  # pragma: no cover - latin-1 decodes anything


def colour_diff(diff: str) -> str:
    """ANSI colours for a diff; click strips them when stdout is not a terminal."""
    out = []
    for line in diff.splitlines(keepends=True):
        if line.startswith(("+++", "---")):
            out.append(click.style(line, bold=True))
        elif line.startswith("@@"):
            out.append(click.style(line, fg="cyan"))
        elif line.startswith("+"):
            out.append(click.style(line, fg="green"))
        elif line.startswith("-"):
            out.append(click.style(line, fg="red"))
        else:
            out.append(line)
    return "".join(out)


#: identical changes from this many on are reported as one line (``--verbose`` lists them all)
SUMMARY_MIN = 3
#: line numbers shown in such a line
SUMMARY_LINES = 5


def text_report(result: FileResult, output_name: str, *, launch_hint: str | None,
                verbose: bool = False, not_written: str | None = None,
                place: Callable[[int], str] | None = None) -> str:
    """The report printed after a conversion: changes, places to check, batch, launch.

    Args:
        result: the conversion.
        output_name: the converted file's name, which the line numbers refer to.
        launch_hint: the command that launches it (None: no ``Launch:`` line).
        verbose: one line per change, even for many identical ones.
        not_written: why an unchanged file's output was not written (None: it was, or it is
            the input).
        place: names a line of the output (a notebook's ``nb_dist.ipynb: cell 7, line 3``);
            by default ``output_name:line``.
    """
    lines: list[str] = []
    if result.status != "converted":
        lines.append(f"{result.path}: unchanged ({result.reason})")
        if not_written:
            lines[-1] += f"; {output_name} not written ({not_written})"
            output_name = result.path
    else:
        arrow = f" → {output_name}" if output_name != result.path else ""
        lines.append(f"{result.path}{arrow}: {len(result.changes)} change(s)")
        lines.extend(_change_lines(result.changes, output_name, verbose, place))
    lines.extend(_skipped_line(result))
    where = place or (lambda line: f"{output_name}:{line}")
    if result.notes:  # never summarised: each one needs a look
        lines.append("Needs a human look:")
        for item in result.notes:
            lines.append(f"  {where(item.line)}: {item.message}")
    if result.batch_sizes:
        sizes = ", ".join(result.batch_sizes)
        lines.append(f"Batch size: {sizes} is now per process; on N processes the global batch "
                     "is N × that (scale the learning rate if you need to).")
        lines.extend(_progress_note(result, output_name, where))
    if launch_hint and result.status == "converted":
        lines.append(launch_line(launch_hint, ready=result.ready))
    return "\n".join(lines)


def _skipped_line(result: FileResult) -> list[str]:
    """``Skipped rewrites: print (3 places left as written), ...``, when any were asked for."""
    if not result.skipped:
        return []
    places = {name: 0 for name in result.skipped}
    for note in result.notes:
        if note.kind == "skipped":
            name = note.message.split("`", 2)[1]
            places[name] = places.get(name, 0) + 1
    listed = ", ".join(f"{name} ({count} place{'s' if count != 1 else ''} left as written)"
                       if count else f"{name} (nothing to skip here)"
                       for name, count in places.items())
    return [f"Skipped rewrites: {listed}"]


def launch_line(launch_hint: str, *, ready: bool) -> str:
    """``Launch: <command>``, or why it is not ready yet."""
    if ready:
        return f"Launch: {launch_hint}"
    return ("Not ready to launch: a model that trains may not be prepared (see the notes "
            f"above). Once it is: {launch_hint}")


def _change_lines(changes: tuple[Item, ...], output_name: str, verbose: bool,
                  place: Callable[[int], str] | None = None) -> list[str]:
    """One line per change; the same change on many lines (300 prints) as one line with the
    first few line numbers."""
    by_message: dict[str, list[int]] = {}
    for item in changes:
        numbers = by_message.setdefault(item.message, [])
        if item.line not in numbers:
            numbers.append(item.line)
    lines, done, hidden = [], set(), False
    where = place or (lambda line: f"{output_name}:{line}")
    for item in changes:
        numbers = by_message[item.message]
        if verbose or len(numbers) < SUMMARY_MIN:
            lines.append(f"  {where(item.line)}: {item.message}")
        elif item.message not in done:
            done.add(item.message)
            more = len(numbers) > SUMMARY_LINES
            hidden = hidden or more
            shown = (", ".join(map(str, numbers[:SUMMARY_LINES])) if place is None else
                     "; ".join(place(n) for n in numbers[:SUMMARY_LINES])) + \
                (", ..." if more else "")
            lines.append(f"  {output_name}: {item.message}: {len(numbers)} lines ({shown})")
    if hidden:
        lines.append("  (--verbose lists every line)")
    return lines


def _progress_note(result: FileResult, output_name: str,
                   where: Callable[[int], str]) -> list[str]:
    """Progress lines like ``Train Epoch: 1 [640/60000]``: printed by the main process inside
    ``for i, batch in enumerate(loader)``, they count that process's share of the data set."""
    script = getattr(result, "script_after", None)  # a notebook's converted cells
    output = result.output if script is None else script.encode()
    printing = f"{result.runtime_name}.print(".encode()
    if printing not in output:
        return []
    found: dict[int, bool] = {}  # line → counts samples (the counter is multiplied)
    for loop in ast.walk(ast.parse(output)):
        counter, loader = _enumerated(loop)
        if counter is None:
            continue
        for node in ast.walk(loop):
            if _is_main_print(node, result.runtime_name) and \
                    _mentions(node, counter) and _mentions_dataset_of(node, loader):
                found[node.lineno] = found.get(node.lineno, False) or _multiplied(node, counter)
    if not found:
        return []
    places = ", ".join(where(line) for line in sorted(found))
    what = "samples" if all(found.values()) else "batches"
    return [f"Progress lines ({places}) count the main process's own {what}; on N processes "
            "the global count is N × that."]


def _enumerated(loop: ast.AST) -> tuple[str | None, str | None]:
    """``for i, batch in enumerate(loader)``: ("i", "loader")."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or not isinstance(loop.iter, ast.Call):
        return None, None
    call, target = loop.iter, loop.target
    if not (isinstance(call.func, ast.Name) and call.func.id == "enumerate" and call.args
            and isinstance(call.args[0], ast.Name) and isinstance(target, ast.Tuple)
            and target.elts and isinstance(target.elts[0], ast.Name)):
        return None, None
    return target.elts[0].id, call.args[0].id


def _is_main_print(node: ast.AST, runtime: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "print" and isinstance(node.func.value, ast.Name)
            and node.func.value.id == runtime)


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _mentions_dataset_of(node: ast.AST, loader: str) -> bool:
    """``loader.dataset`` in the call: the total printed is the whole data set's."""
    return any(isinstance(n, ast.Attribute) and n.attr == "dataset"
               and isinstance(n.value, ast.Name) and n.value.id == loader
               for n in ast.walk(node))


def _multiplied(node: ast.AST, counter: str) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and _mentions(n, counter)
               for n in ast.walk(node))


def config_report(outcome: ConfigOutcome) -> str:
    """What became of the launch config, and of the YAML files that were in its way."""
    lines = [f"Left {path} alone: not a launch config ({why})"
             for path, why in outcome.passed_over]
    if outcome.own_scaler:  # the flag asked for fp16/bf16; the script's own GradScaler won
        mixed = (f"mixed_precision '{outcome.mixed_precision}' (not '{outcome.asked}': the "
                 "script scales its own loss)")
    else:
        mixed = f"mixed_precision {outcome.mixed_precision}"
    if outcome.action == "wrote":
        lines.append(f"Wrote the launch config {outcome.path}"
                     + (f" with {mixed}" if outcome.own_scaler else ""))
    elif outcome.action == "updated":
        lines.append(f"Updated the launch config {outcome.path}: {mixed}")
    elif outcome.asked is None:
        lines.append(f"Kept the existing launch config {outcome.path}")
    else:
        lines.append(f"Kept the existing launch config {outcome.path}: it already has {mixed}")
    return "\n".join(lines)


def json_report(results: Iterable[tuple[FileResult, str | None]], *, launch_hint: str | None,
                launch_config: str | None = None) -> str:
    """The report as JSON; an output of None is one that was not written (unchanged)."""
    files = []
    for result, output_name in results:
        script = getattr(result, "script_after", None)  # a notebook: items name their cell too
        files.append({
            "path": result.path,
            "output": output_name,
            "status": result.status,
            "reason": result.reason,
            "changes": [_item(i, script) for i in result.changes],
            "needs_human": [_item(i, script) for i in result.notes],
            "batch_sizes": list(result.batch_sizes),
            "skipped_rewrites": list(result.skipped),
            "ready": result.ready,
        })
    ready = all(f["ready"] for f in files)
    return json.dumps({"files": files, "ready": ready, "launch": launch_hint if ready else None,
                       "launch_config": launch_config}, indent=2)


def _item(item, script: str | None = None) -> dict:
    """One change or note; for a notebook, ``line`` is a line of its code cells as one script
    (``-o nb.py``), and ``cell`` / ``cell_line`` place it in the notebook."""
    if script is not None:
        from distify.notebook import cell_of  # a notebook's report only

        found = cell_of(script, item.line)
    else:
        found = None
    where = {"cell": found[0], "cell_line": found[1]} if found else {}
    return {"line": item.line, **where, "kind": item.kind, "message": item.message}
