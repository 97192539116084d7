"""The guard and backward edits ``convert`` and ``check --fix`` share
(``distify/analysis/codemods.py``): the same shapes from both commands, and the one place where
they differ on purpose (convert keeps a guard with a comment above it on its own).
"""

from __future__ import annotations

import libcst as cst
import pytest

from distify.analysis.codemods import backward_through, guarded, merge_guards
from distify.convert.engine import convert_source
from distify.lint.fixer import apply_fixes
from distify.lint.model import Fix

_BLOCK = """\
a = 1
# save it
save(a)
log(a)

report(a)
b = 2
"""


def _guard_calls(across_comments: bool) -> str:
    """Each call but ``log`` guarded, then the adjacent guards merged."""
    module = cst.parse_module(_BLOCK)
    tests: dict[int, str] = {}
    body = []
    for stmt in module.body:
        if "save" in module.code_for_node(stmt) or "report" in module.code_for_node(stmt) \
                or "log" in module.code_for_node(stmt):
            stmt = guarded([stmt], cst.parse_expression("main()"))
            tests[id(stmt)] = "main()"
        body.append(stmt)
    merged = merge_guards(body, lambda s: tests.get(id(s)), across_comments=across_comments)
    return module.with_changes(body=merged).code


def test_guards_merge_across_comments_where_asked() -> None:
    """The blank line moves inside as an empty line (the fixer left indentation on it)."""
    assert _guard_calls(across_comments=True) == (
        "a = 1\n# save it\nif main():\n    save(a)\n    log(a)\n\n    report(a)\nb = 2\n")


def test_guards_keep_a_blank_line_or_comment_between_them_where_asked() -> None:
    assert _guard_calls(across_comments=False) == (
        "a = 1\n# save it\nif main():\n    save(a)\n    log(a)\n\nif main():\n    report(a)\n"
        "b = 2\n")


def test_guards_with_different_tests_stay_apart() -> None:
    module = cst.parse_module("save(a)\nsave(b)\n")
    first, second = (guarded([s], cst.parse_expression(t))
                     for s, t in zip(module.body, ("rank == 0", "master")))
    tests = {id(first): "rank == 0", id(second): "master"}
    merged = merge_guards([first, second], lambda s: tests.get(id(s)), across_comments=True)
    assert module.with_changes(body=merged).code == (
        "if rank == 0:\n    save(a)\nif master:\n    save(b)\n")


@pytest.mark.parametrize(("before", "after"), [
    ("loss.backward()", "rt.backward(loss)"),
    ("(loss / accum).backward()", "rt.backward(loss / accum)"),
    ("out.loss.backward(retain_graph=True)", "rt.backward(out.loss, retain_graph=True)"),
    ("(a, b).backward()", "rt.backward((a, b))"),  # a tuple's parentheses are its own
])
def test_backward_through_the_runtime(before: str, after: str) -> None:
    call = cst.parse_expression(before)
    assert cst.Module([]).code_for_node(backward_through(call, cst.Name("rt"))) == after


_SCRIPT = """\
import matplotlib.pyplot as plt
import numpy as np
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(data)
for x, y in loader:
    loss = model(x).sum()
    (loss / 2).backward()
    optimizer.step()
    # keep the figure
    plt.savefig("a.png")
    np.save("a.npy", x)
"""


def test_convert_and_fix_write_the_same_backward_and_guard() -> None:
    """Improvement in convert: ``(loss / 2).backward()`` → ``distify.backward(loss / 2)``, the
    fixer's spelling (it wrote ``distify.backward((loss / 2))``). Both guard the two writes
    under one ``if``, the comment above it."""
    converted = convert_source(_SCRIPT.encode(), "train.py").output.decode()
    assert "    distify.backward(loss / 2)\n" in converted
    guard = ("    # keep the figure\n    if distify.is_main_process():\n"
             "        plt.savefig(\"a.png\")\n        np.save(\"a.npy\", x)\n")
    assert guard in converted, converted
    fixes = [Fix("backward", 11, 4, receiver="distify"),
             Fix("guard", 14, 4, guard="distify.is_main_process()"),
             Fix("guard", 15, 4, guard="distify.is_main_process()")]
    fixed = apply_fixes(_SCRIPT, fixes)
    assert "    distify.backward(loss / 2)\n" in fixed
    assert guard in fixed, fixed
