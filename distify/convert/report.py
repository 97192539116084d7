"""Render conversion results: the human report, JSON, and unified diffs."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable

import click

from distify.convert.engine import FileResult
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


def text_report(result: FileResult, output_name: str, *, launch_hint: str | None) -> str:
    """The report printed after a conversion: changes, places to check, batch, launch."""
    lines: list[str] = []
    if result.status != "converted":
        lines.append(f"{result.path}: unchanged ({result.reason})")
    else:
        lines.append(f"{result.path} → {output_name}: {len(result.changes)} change(s)")
        for item in result.changes:
            lines.append(f"  {output_name}:{item.line}: {item.message}")
    if result.notes:
        lines.append("Needs a human look:")
        for item in result.notes:
            lines.append(f"  {output_name}:{item.line}: {item.message}")
    if result.batch_sizes:
        sizes = ", ".join(result.batch_sizes)
        lines.append(f"Batch size: {sizes} is now per process; on N processes the global batch "
                     "is N × that (scale the learning rate if you need to).")
    if launch_hint and result.status == "converted":
        if result.ready:
            lines.append(f"Launch: {launch_hint}")
        else:
            lines.append("Not ready to launch: a model that trains may not be prepared (see the "
                         f"notes above). Once it is: {launch_hint}")
    return "\n".join(lines)


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


def json_report(results: Iterable[tuple[FileResult, str]], *, launch_hint: str | None,
                launch_config: str | None = None) -> str:
    files = []
    for result, output_name in results:
        files.append({
            "path": result.path,
            "output": output_name,
            "status": result.status,
            "reason": result.reason,
            "changes": [_item(i) for i in result.changes],
            "needs_human": [_item(i) for i in result.notes],
            "batch_sizes": list(result.batch_sizes),
            "ready": result.ready,
        })
    ready = all(f["ready"] for f in files)
    return json.dumps({"files": files, "ready": ready, "launch": launch_hint if ready else None,
                       "launch_config": launch_config}, indent=2)


def _item(item) -> dict:
    return {"line": item.line, "kind": item.kind, "message": item.message}
