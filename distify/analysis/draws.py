"""Random draws: those every process must make alike (the ``random_splits`` rule category), and
those that pick batches or noise, which each process must make on its own (found by
:mod:`.draws_flow`, after the cheap test :func:`may_draw_batches`).

Shared by ``distify convert``, which rewrites or reports them, and ``distify check`` (DST304),
which reports them; each side looks at its own syntax tree and asks the same questions here.
"""

from __future__ import annotations

import ast
import re

from distify.analysis.astwalk import child_nodes, walk
from distify.analysis.names import ImportMap
from distify.rules import Entry

#: torch draws that take ``generator=``: in a batch function, and in a training loop
TORCH_BATCH_DRAWS = frozenset({"torch.randint", "torch.randperm", "torch.rand", "torch.randn",
                               "torch.multinomial", "torch.normal"})
TORCH_LOOP_DRAWS = frozenset({"torch.randn", "torch.rand", "torch.randint", "torch.normal"})
#: the methods of ``numpy.random.RandomState`` and ``random.Random`` a batch function may call
NUMPY_DRAWS = frozenset({"randint", "rand", "randn", "random", "random_sample", "choice",
                         "permutation", "shuffle", "normal", "uniform"})
PYTHON_DRAWS = frozenset({"sample", "choice", "choices", "randint", "randrange", "random",
                          "shuffle", "uniform", "gauss"})


def seeds_itself(entry: Entry, keywords: set[str], positional: int) -> bool:
    """Does a call of ``entry`` pass its own seed (``generator=``, ``random_state=``, or the
    seed's position among the positional arguments)?"""
    seed_arg, seed_pos = entry.get("seed_arg"), entry.get("seed_pos")
    return seed_arg in keywords or (isinstance(seed_pos, int) and positional > seed_pos)


def must_agree(name: str, first_arg_is_length: bool) -> bool:
    """Must every process draw alike? A ``randperm`` of a length permutes the data set; any
    other ``randperm`` (a batch's ``size(0)``, as mixup does) need not agree."""
    return name != "randperm" or first_arg_is_length


#: a size that is a batch's, not the data set's
_PER_BATCH = re.compile(r"\.size\(|\.shape\b|batch", re.IGNORECASE)
_SIZE_NAME = re.compile(r"[A-Za-z_][\w.]*|\d+")


def counts_the_data(argument: str) -> bool:
    """Is a ``randperm``'s argument (its source) the size of the data set, whose permutation
    every process must draw alike: ``len(ds)``, or a plain name or number (``num_nodes``,
    ``data.num_nodes``, ``N``), not a batch's size (``x.size(0)``, ``x.shape[0]``,
    ``batch_size``)?"""
    argument = argument.strip()
    if "len(" in argument:
        return True
    return bool(_SIZE_NAME.fullmatch(argument)) and not _PER_BATCH.search(argument)


def how_to_seed(entry: Entry) -> str:
    """The advice for an unseeded call of ``entry``."""
    seed_arg = entry.get("seed_arg")
    if seed_arg == "generator":
        return ("pass generator=torch.Generator().manual_seed(<n>) (or "
                "distify.shared_generator())")
    if seed_arg:
        return f"pass {seed_arg}=<a fixed number>"
    return "seed every process with the same number first"


def draw_family(qual: str | None) -> str | None:
    """``"torch"``, ``"numpy"`` or ``"python"`` for a draw a batch function may make, else None."""
    if qual in TORCH_BATCH_DRAWS:
        return "torch"
    if qual is None:
        return None
    module, _, name = qual.rpartition(".")
    if module == "numpy.random" and name in NUMPY_DRAWS:
        return "numpy"
    if module == "random" and name in PYTHON_DRAWS:
        return "python"
    return None


def may_draw_batches(tree: ast.Module, imports: ImportMap) -> bool:
    """A cheap test on the stdlib ``ast`` tree, before the LibCST pass of
    :func:`~.draws_flow.find_draw_flow` (which costs most of a conversion's analysis): False when
    no loop calls a function that draws (directly or through other functions of the file) and no
    loop with a ``backward`` draws itself, so that pass could find nothing. True is only a maybe.
    One walk of the tree."""
    calls_of: dict[str | None, set[str | None]] = {}
    drawing: set[str | None] = set()
    loops: list[list] = []  # per loop: [names it calls, draws itself, has a backward]
    # Only statements open a function or a loop: the walk carries its context through them,
    # and an expression (or an argument list, a keyword, a comprehension: what holds no
    # statement) is read as a whole, its calls in the context of the statement that holds it.
    stack: list[tuple[ast.AST, str | None, tuple[int, ...]]] = [(tree, None, ())]
    while stack:
        node, function, inside = stack.pop()
        kind = type(node)
        if kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
            function, inside = node.name, ()
        elif kind is ast.For or kind is ast.AsyncFor or kind is ast.While:
            loops.append([set(), False, False])
            inside = (*inside, len(loops) - 1)
        for child in child_nodes(node):
            if isinstance(child, _HOLDS_STATEMENTS):
                stack.append((child, function, inside))
                continue
            for sub in walk(child):
                if type(sub) is not ast.Call:
                    continue
                func = sub.func
                name = _last_name(func)
                calls_of.setdefault(function, set()).add(name)
                # a method's last name is its qualified name's: no draw unless it is one's
                qual = None if type(func) is ast.Attribute and name not in _DRAW_NAMES \
                    else imports.ast_qualname(func)
                if draw_family(qual) is not None:
                    drawing.add(function)
                for index in inside:
                    loop = loops[index]
                    loop[0].add(name)
                    loop[2] = loop[2] or name == "backward"
                    loop[1] = loop[1] or qual in TORCH_LOOP_DRAWS
    drawing.discard(None)
    changed = bool(drawing)
    while changed:  # a function calling a drawing function draws too
        grown = {name for name, called in calls_of.items() if called & drawing} - {None}
        changed = not grown <= drawing
        drawing |= grown
    return any(called & drawing or (draws and backward) for called, draws, backward in loops)


#: the last names of every draw :func:`draw_family` or ``TORCH_LOOP_DRAWS`` knows
_DRAW_NAMES = frozenset({qual.rsplit(".", 1)[-1] for qual in TORCH_BATCH_DRAWS | TORCH_LOOP_DRAWS}
                        | NUMPY_DRAWS | PYTHON_DRAWS)
#: the nodes that may hold statements (and so open a function or a loop below them)
_HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case, ast.mod)


def _last_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None
