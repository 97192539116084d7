"""The runtime's errors: one line each, naming what is wrong and how to fix it."""

from __future__ import annotations


class DistifyError(RuntimeError):
    """A misconfiguration the user can fix (bad launcher variables, wrong usage of the runtime)."""


class DistifyTypeError(DistifyError, TypeError):
    """An object of a type the runtime cannot prepare."""
