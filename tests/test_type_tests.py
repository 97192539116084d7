"""distify tests LibCST nodes as ``type(x) is cst.Name`` (``in (cst.List, cst.Tuple)``), not
with ``isinstance``: a failing ``isinstance`` on a LibCST class runs ``ABCMeta.__instancecheck__``
in Python, a measurable part of a conversion. The two agree only for classes nothing derives
from: this pins that for every class so tested, with the LibCST installed."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import libcst as cst

PACKAGE = Path(__file__).parent.parent / "distify"


def _tested_classes() -> dict[str, list[str]]:
    """LibCST class name → where distify tests a node's exact type against it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Call)
                    and isinstance(node.left.func, ast.Name) and node.left.func.id == "type"):
                continue
            for op, right in zip(node.ops, node.comparators):
                if not isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
                    continue
                for item in right.elts if isinstance(right, ast.Tuple) else [right]:
                    if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                            and item.value.id == "cst":
                        found.setdefault(item.attr, []).append(
                            f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_every_class_tested_by_exact_type_has_no_subclass() -> None:
    tested = _tested_classes()
    assert len(tested) > 40  # the convert and analysis packages use the form throughout
    for name, where in tested.items():
        kind = getattr(cst, name)
        assert issubclass(kind, cst.CSTNode), (name, where[0])
        assert not inspect.isabstract(kind), (name, where[0])
        assert not kind.__subclasses__(), f"cst.{name} has subclasses: {where}"
