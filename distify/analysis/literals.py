"""The value of a LibCST literal, as LibCST's ``evaluated_value`` gives it, without its cost.

``evaluated_value`` runs ``ast.literal_eval`` on the token: a parse, and four nested functions
that refer to each other, so every call leaves a reference cycle for the garbage collector. The
converter reads hundreds of literals on a large file (is this ``0``? is this ``"cpu"``?), and
those cycles were most of what a conversion left to the collector. The common literals are
read here directly; the rest (escapes, bytes, imaginary numbers) still go through
``evaluated_value``. ``tests/test_literals.py`` compares both on every literal of the fixtures.
"""

from __future__ import annotations

from typing import Any

import libcst as cst


def literal_value(node: cst.BaseExpression) -> Any:
    """``node.evaluated_value`` of an ``Integer``, ``Float``, ``Imaginary``, ``SimpleString``
    or ``ConcatenatedString``."""
    kind = type(node)
    if kind is cst.Integer:
        try:
            return int(node.value, 0)  # `0x1F`, `1_000`: Python's own spellings
        except ValueError:
            pass
    elif kind is cst.Float:
        try:
            return float(node.value)
        except ValueError:
            pass
    elif kind is cst.SimpleString:
        prefix = node.prefix.lower()
        raw = node.raw_value
        # no escape to read (a raw string keeps its backslashes), and no line end that the
        # tokenizer would translate
        if "\r" not in raw and (prefix == "r" or prefix in ("", "u") and "\\" not in raw):
            return raw
    return node.evaluated_value
