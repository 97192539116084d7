"""The runtime's layering (issue 23 item 3): no import cycles between its modules, strategies
looked up by name, and no strategy tested by name outside its own module."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from tests.helpers import REPO

RUNTIME = REPO / "distify" / "runtime"


def _imports() -> dict[str, set[str]]:
    """Each runtime module's top-level imports of its sibling modules (function-level imports
    are deliberate late bindings and are not edges of the layering)."""
    modules = {path.stem for path in RUNTIME.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in RUNTIME.glob("*.py"):
        found: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found.update([node.module] if node.module else [a.name for a in node.names])
            elif isinstance(node, ast.ImportFrom) and node.module == "distify.runtime":
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "distify.runtime."):
                found.add(node.module.split(".")[2])
        graph[path.stem] = found & modules - {path.stem}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for other in sorted(graph[module]):
            if state.get(other) == 1:
                return path[path.index(other):] + [other]
            if other not in state and (found := visit(other)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_runtime_modules_import_each_other_without_a_cycle() -> None:
    graph = _imports()
    assert {"_strategy", "_model", "_precision", "_step"} <= set(graph)
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or ())
    # The layers the issue names: collectives and objects below the models, strategies
    # registered lazily (the seam imports no strategy), the training step above the models.
    assert not graph["_strategy"] & {"_ddp", "_fsdp"}
    assert "_model" not in graph["_precision"] and "_step" not in graph["_model"]


def test_no_strategy_is_tested_by_name_outside_its_own_module() -> None:
    test = re.compile(r"""[!=]=\s*["'](ddp|fsdp)["']|["'](ddp|fsdp)["']\s*[!=]=""")
    found = [f"{path.name}:{number}: {line.strip()}"
             for path in sorted(RUNTIME.glob("*.py")) if path.stem not in ("_ddp", "_fsdp")
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if test.search(line)]
    assert found == []


def test_a_ddp_job_never_imports_fsdp() -> None:
    code = ("import sys, distify.runtime as distify, distify.runtime._strategy as s\n"
            "assert 'distify.runtime._fsdp' not in sys.modules, 'imported at start'\n"
            "print(s.names(), s.from_environment('ddp')[0])\n"
            "assert 'distify.runtime._fsdp' not in sys.modules, 'imported by the ddp lookup'\n"
            "s.from_environment('fsdp')\n"
            "assert 'distify.runtime._fsdp' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "('ddp', 'fsdp') ddp"
