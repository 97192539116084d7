"""Token streams laid out in columns and sliced along time (batchify/BPTT): the cheap test.

A batchify function reshapes its data parameter with another parameter as a dimension
(``data.view(bsz, -1).t()``). :mod:`.facts` looks for that shape in its one walk of the stdlib
``ast`` tree (``FileFacts.may_batchify``): a function parameter among the two dimensions of a
``.view``/``.reshape`` call. Only then does :func:`~.bptt_flow.find_streams` run its LibCST pass
over the module. Kept free of LibCST, which ``distify check`` never loads.
"""

from __future__ import annotations

import ast

#: the methods that lay a stream out in columns
RESHAPES = frozenset({"view", "reshape"})


def reshape_dim_names(args: list[ast.expr]) -> list[str]:
    """The plain names among the two dimensions of ``x.view(a, b)`` / ``x.view((a, b))``."""
    if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
        args = args[0].elts
    if len(args) != 2:
        return []
    return [arg.id for arg in args if isinstance(arg, ast.Name)]
