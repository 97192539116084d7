"""The two LibCST edits ``convert`` and ``check --fix`` both make, written once.

- :func:`guarded`: ``if <main process>:`` around statements, the comments and blank lines above
  the first staying above the ``if``; :func:`merge_guards`: adjacent guards with the same test
  share one ``if``.
- :func:`backward_through`: ``loss.backward(...)`` → ``<runtime>.backward(loss, ...)``.

Each command decides *where* (convert from its analysis, the fixer from a finding's line and
column) and *what* the test says (``distify.is_main_process()``, ``accelerator.is_main_process``);
the shape of the edit is the same. What it deliberately does not do: decide whether a guard is
safe (a collective inside, a value read after it): the callers have, before asking.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import libcst as cst


def guarded(stmts: Sequence[cst.BaseStatement], test: cst.BaseExpression) -> cst.If:
    """``if <test>:`` with ``stmts`` as its body; the first statement's leading comments and
    blank lines go above the ``if``.

    Args:
        stmts: the statements to guard (one at least), as they are in the output.
        test: the guard's test, in the file's own spelling.
    """
    first = stmts[0]
    body = [first.with_changes(leading_lines=()), *stmts[1:]]
    return cst.If(test=test, body=cst.IndentedBlock(body=body), leading_lines=first.leading_lines)


def merge_guards(body: Sequence[cst.BaseStatement],
                 guard_of: Callable[[cst.BaseStatement], Hashable | None], *,
                 across_comments: bool,
                 merged: Callable[[cst.If], None] | None = None) -> list[cst.BaseStatement]:
    """``body`` with each run of adjacent guards that have the same test joined into one ``if``.

    Args:
        body: a block's statements.
        guard_of: for a guard the caller added, its test (any key that compares equal for the
            same test); None for any other statement.
        across_comments: whether a guard with comments or blank lines above it joins the one
            before (they move inside, above its first statement; a blank line stays empty);
            convert keeps such a guard on its own, the fixer joins it.
        merged: called with each joined ``if`` (so the caller can mark it as its own).
    """
    out: list[cst.BaseStatement] = []
    last = None  # the key of out[-1], when it is a guard
    for stmt in body:
        key = guard_of(stmt)
        if key is not None and key == last and (across_comments or not stmt.leading_lines):
            previous = out[-1]
            first, *rest = stmt.body.body
            inner = [*previous.body.body,
                     first.with_changes(leading_lines=_moved_in(stmt.leading_lines)), *rest]
            out[-1] = previous.with_changes(body=previous.body.with_changes(body=inner))
            if merged is not None:
                merged(out[-1])
            continue
        out.append(stmt)
        last = key
    return out


def _moved_in(lines: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
    """Lines above a statement moved one block deeper: a comment takes the block's indentation,
    a blank line stays empty (no trailing whitespace)."""
    return [line.with_changes(indent=False, whitespace=cst.SimpleWhitespace(""))
            if line.comment is None else line for line in lines]


def backward_through(call: cst.Call, runtime: cst.BaseExpression) -> cst.Call:
    """``loss.backward(...)`` → ``runtime.backward(loss, ...)``, the call's other arguments and
    layout kept; parentheses the receiver needed (``(loss / accum).backward()``) are dropped.

    Args:
        call: the ``X.backward(...)`` call (its callee an attribute).
        runtime: what owns the new ``backward`` (``distify``, ``accelerator``).
    """
    loss = call.func.value
    if type(loss) not in (cst.Tuple, cst.GeneratorExp):  # their parentheses are theirs
        loss = loss.with_changes(lpar=[], rpar=[])
    return call.with_changes(func=cst.Attribute(value=runtime, attr=cst.Name("backward")),
                             args=[cst.Arg(loss), *call.args])
