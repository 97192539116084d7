"""Rendering findings: concise text (ruff-style), JSON, GitHub annotations, SARIF 2.1.0."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from distify import __version__
from distify.lint.model import PARSE_ERROR, Finding

FORMATS = ("concise", "json", "github", "sarif")


def render(findings: Sequence[Finding], fmt: str) -> str:
    """``findings`` (already sorted) in format ``fmt``; '' for none in the text formats."""
    return {"concise": _concise, "json": _json, "github": _github, "sarif": _sarif}[fmt](findings)


def concise_line(finding: Finding) -> str:
    mark = " [*]" if finding.fixable else ""
    cell = f"cell {finding.cell}:" if finding.cell else ""  # as ruff names a notebook's cells
    return (f"{finding.path}:{cell}{finding.line}:{finding.col}: {finding.code}{mark} "
            f"{finding.message}")


def _message(finding: Finding) -> str:
    """The message, led by its notebook cell where the format has no place for one."""
    return f"cell {finding.cell}: {finding.message}" if finding.cell else finding.message


def _concise(findings: Sequence[Finding]) -> str:
    return "".join(concise_line(finding) + "\n" for finding in findings)


def _json(findings: Sequence[Finding]) -> str:
    rows = [{
        "code": finding.code, "message": finding.message, "filename": finding.path,
        **({"cell": finding.cell} if finding.cell else {}),
        "location": {"row": finding.line, "column": finding.col},
        "end_location": {"row": finding.end_line, "column": finding.end_col},
        "fixable": finding.fixable,
    } for finding in findings]
    return json.dumps(rows, indent=2) + "\n"


def _github(findings: Sequence[Finding]) -> str:
    lines = []
    for finding in findings:
        message = _message(finding).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        lines.append(
            f"::error title=distify ({finding.code}),file={finding.path},line={finding.line},"
            f"col={finding.col},endLine={finding.end_line},endColumn={finding.end_col}"
            f"::{finding.code} {message}\n")
    return "".join(lines)


def _sarif(findings: Sequence[Finding]) -> str:
    from distify.lint.registry import REGISTRY

    rules = [{"id": PARSE_ERROR, "shortDescription": {"text": "The file could not be parsed."}}]
    for code in sorted(REGISTRY):
        cls = REGISTRY[code]
        rules.append({
            "id": code, "name": cls.__name__,
            "shortDescription": {"text": cls.summary()},
            "fullDescription": {"text": " ".join((cls.__doc__ or "").split())},
        })
    results = [{
        "ruleId": finding.code, "level": "error", "message": {"text": _message(finding)},
        "locations": [{"physicalLocation": {
            "artifactLocation": {"uri": Path(finding.path).as_posix()},
            "region": {"startLine": finding.line, "startColumn": finding.col,
                       "endLine": finding.end_line, "endColumn": finding.end_col},
        }}],
    } for finding in findings]
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "distify", "version": __version__,
                                      "informationUri": "https://pypi.org/project/distify/",
                                      "rules": rules}},
                  "results": results}],
    }
    return json.dumps(log, indent=2) + "\n"
