"""What counts as evaluation code, for ``convert`` (which reduces its metrics) and ``check``
(which reports unreduced ones).

A loop evaluates when it runs under a context of the ``eval_contexts`` pack (``torch.no_grad()``,
``torch.inference_mode()``, also as a decorator of its function) or after ``model.eval()`` /
``model.train(False)`` in its function. These are also what switch distify's prepared loaders to
their exact evaluation mode (no repeated samples), so a metric summed there and reduced equals
the single-process value. A function *named* like evaluation (``evaluate``, ``test_epoch``,
``validate``) is a weaker sign: ``check`` counts it, ``convert`` reports it when nothing else
says the model is evaluating, since its loaders then still pad like training ones.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

EVAL_FUNCTION_NAME = re.compile(r"eval|test|valid|(^|_)val(_|$)", re.IGNORECASE)


class _Matches(Protocol):
    def match(self, category: str, name: str | None) -> Any: ...


def is_eval_context(rules: _Matches, qualname: str | None) -> bool:
    """Is ``qualname`` (a ``with`` item's or decorator's callee) a no-gradient context?"""
    return rules.match("eval_contexts", qualname) is not None


def switches_to_eval(method: str, args: list[Any]) -> bool:
    """``model.eval()`` or ``model.train(False)`` (``args``: the call's argument values, with
    ``False`` for a literal False)."""
    if method == "eval":
        return not args
    return method == "train" and len(args) == 1 and args[0] is False
