"""What ``distify check`` does, apart from parsing options: a testable function over a request."""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from distify.errors import UserError
from distify.lint.config import load_config
from distify.lint.discovery import discover, prefilter
from distify.lint.engine import LintOptions
from distify.lint.matcher import Matcher
from distify.lint.model import PARSE_ERROR, FileResult, Finding
from distify.lint.output import concise_line, render
from distify.lint.registry import REGISTRY, select_codes
from distify.lint.runner import check_files, fix_file
from distify.rules import load_rules


@dataclass(frozen=True)
class CheckRequest:
    """The command line, parsed."""

    paths: tuple[str, ...] = (".",)
    fix: bool = False
    diff: bool = False
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    output_format: str = "concise"
    check_all: bool = False
    jobs: int = 0
    rule_packs: tuple[Path, ...] = ()
    config_path: Path | None = None


def run_check(request: CheckRequest, *, out: Callable[[str], None],
              err: Callable[[str], None]) -> int:
    """Run the check; print findings with ``out`` and the summary with ``err``.

    Returns:
        The exit status: 0 clean, 1 findings (parse errors included).

    Raises:
        UserError: bad options, config, rule pack or path (exit status 2).
    """
    config = load_config(request.config_path)
    if config.note:
        err(f"distify: note: {config.note}\n")
    if request.select:  # the command line's selection replaces the config's, as in ruff
        codes = select_codes(request.select, request.ignore)
    else:
        codes = select_codes(config.select, (*config.ignore, *request.ignore),
                             config.extend_select)
    rules = load_rules((*config.rules, *request.rule_packs))
    options = LintOptions(Matcher(rules), codes, request.check_all or config.check_all,
                          prefilter(rules))
    files = discover(request.paths, config.exclude, config.root)
    results = check_files(files, options, request.jobs)
    diffs: list[str] = []
    fixed = 0
    if request.fix or request.diff:
        results, diffs, fixed = _fix(results, options, write=request.fix and not request.diff)
    findings = sorted((finding for result in results for finding in result.findings),
                      key=Finding.sort_key)
    if request.diff:
        out("".join(diffs))
        err("".join(concise_line(finding) + "\n" for finding in findings))
    else:
        out(render(findings, request.output_format))
    err(_summary(results, findings, fixed, request) + "\n")
    return 1 if findings or (request.diff and fixed) else 0


def _fix(results: list[FileResult], options: LintOptions, *,
         write: bool) -> tuple[list[FileResult], list[str], int]:
    new_results, diffs, fixed = [], [], 0
    for result in results:
        if any(finding.fix for finding in result.findings):
            outcome = fix_file(result, options, write=write)
            new_results.append(outcome.result)
            fixed += outcome.fixed
            if outcome.diff:
                diffs.append(outcome.diff)
        else:
            new_results.append(result)
    return new_results, diffs, fixed


def _summary(results: list[FileResult], findings: list[Finding], fixed: int,
             request: CheckRequest) -> str:
    checked = sum(1 for result in results if not result.skipped)
    skipped = len(results) - checked
    scope = f"{checked} file{'s' if checked != 1 else ''} checked"
    if skipped:
        hint = "" if request.check_all else "; --all checks non-distributed ones"
        why = "no torch or not distributed"
        if any(result.skipped.startswith("multi-process") for result in results):
            why = "no torch, not distributed, or multi-process without torch.distributed"
        scope += f", {skipped} skipped ({why}{hint})"
    parts = []
    if request.diff or request.fix:
        parts.append(f"{'would fix' if request.diff else 'fixed'} {_plural(fixed, 'finding')}")
    errors = sum(1 for finding in findings if finding.code == PARSE_ERROR)
    count = len(findings) - errors
    if not findings and not (request.diff and fixed):
        parts.append("all checks passed")
    elif request.diff or request.fix:
        parts.append(f"{count} remaining")
    else:
        fixable = sum(1 for finding in findings if finding.fix)
        parts.append(_plural(count, "finding")
                     + (f" ({fixable} fixable with --fix)" if fixable else ""))
    if errors:
        parts.append(f"{_plural(errors, 'file')} could not be parsed")
    return f"distify check: {', '.join(parts)}; {scope}."


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def rule_table() -> str:
    """One line per rule: code and summary (``--list-rules``)."""
    return "\n".join(f"{code}  {REGISTRY[code].summary()}" for code in sorted(REGISTRY))


def explain_rule(code: str) -> str:
    """A rule's full documentation (``--explain``): its docstring, message and examples.

    Raises:
        UserError: no rule has that code (the message lists the known ones).
    """
    rule = REGISTRY.get(code.strip().upper())
    if rule is None:
        raise UserError(f"unknown rule code {code!r} (known: {', '.join(sorted(REGISTRY))})")
    title, _, body = inspect.cleandoc(rule.__doc__ or rule.MESSAGE).partition("\n\n")
    parts = [f"{rule.CODE}: {' '.join(title.split())}"]
    if body:
        parts.append(body)
    parts.append(f"Message: {rule.MESSAGE}")
    for example in rule.VALID:
        parts.append("VALID (not reported):\n" + _indented(example.code))
    for example in rule.INVALID:
        where = f" at line {example.line}" if example.line else ""
        parts.append(f"INVALID (reported{where}):\n" + _indented(example.code))
        if example.fixed is not None:
            parts.append("  after --fix:\n" + _indented(example.fixed))
    return "\n\n".join(parts) + "\n"


def _indented(code: str) -> str:
    return textwrap.indent(code.rstrip("\n"), "    ")
