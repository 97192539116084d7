"""What counts as evaluation code, for ``convert`` (which reduces its metrics) and ``check``
(which reports unreduced ones).

A loop evaluates when it runs under a context of the ``eval_contexts`` pack (``torch.no_grad()``,
``torch.inference_mode()``, also as a decorator of its function) or after ``model.eval()`` /
``model.train(False)`` in its function. These are also what switch distify's prepared loaders to
their exact evaluation mode (no repeated samples), so a metric summed there and reduced equals
the single-process value. A function *named* like evaluation (``evaluate``, ``test_epoch``,
``validate``) is a weaker sign: ``check`` counts it, ``convert`` reports it when nothing else
says the model is evaluating, since its loaders then still pad like training ones.

:class:`EvalFlow` reads the same across a whole file: a function evaluates when every call of it
runs under such a context or after ``model.eval()`` in its caller; a function called once per
batch with the batch's values (a top-k ``accuracy()`` helper) returns one process's values, so
nothing in it is gathered; and which losses reduce by a mean (a sum of them adds one mean per
batch, not per-sample values).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from distify.analysis.astwalk import child_nodes, walk
from distify.analysis.loaders import is_loaderish, is_loop_wrapper
from distify.analysis.names import ast_dotted_name

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


# ---------------------------------------------------------------- whole-file evaluation flow
#: ``torch.nn.functional`` losses: each reduces by its mean unless ``reduction=`` says otherwise
FUNCTIONAL_LOSSES = frozenset({
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "cosine_embedding_loss",
    "cross_entropy", "ctc_loss", "gaussian_nll_loss", "hinge_embedding_loss", "huber_loss",
    "kl_div", "l1_loss", "margin_ranking_loss", "mse_loss", "multi_margin_loss",
    "multilabel_margin_loss", "multilabel_soft_margin_loss", "nll_loss", "poisson_nll_loss",
    "smooth_l1_loss", "soft_margin_loss", "triplet_margin_loss"})
#: methods that return the same criterion (``nn.CrossEntropyLoss().cuda(args.gpu)``)
_MOVES = frozenset({"cuda", "to", "cpu"})


def _may_be_loss(short: str) -> bool:
    """Can a callee whose qualified name ends in ``short`` be a loss :func:`loss_reduction`
    knows?"""
    return short.endswith("Loss") or short in FUNCTIONAL_LOSSES


def loss_reduction(qualname: str | None, keywords: dict[str, Any]) -> str | None:
    """How a loss reduces its per-sample values: ``"mean"``, ``"sum"`` or ``"none"``, for a
    criterion's constructor (``torch.nn.CrossEntropyLoss``) or a functional loss
    (``torch.nn.functional.cross_entropy``); None when ``qualname`` is neither, or when the
    reduction is not a literal (``reduction=args.reduction``, the legacy ``size_average=``).

    Args:
        qualname: the callee's qualified name.
        keywords: the call's keyword arguments: the string for a literal, else any other
            object.
    """
    if not qualname or not qualname.startswith("torch.nn."):
        return None
    if not _may_be_loss(qualname.rsplit(".", 1)[-1]):
        return None
    if "size_average" in keywords or "reduce" in keywords:
        return None
    reduction = keywords.get("reduction", "mean")
    if not isinstance(reduction, str):
        return None
    return reduction if reduction in ("sum", "none") else "mean"  # "batchmean" is a mean too


@dataclass
class EvalFlow:
    """What evaluation looks like across one file's functions (one ``ast`` walk).

    Attributes:
        criteria: names bound to a loss criterion (``criterion = nn.CrossEntropyLoss()``) →
            its reduction (see :func:`loss_reduction`); a name bound to criteria of different
            reductions maps to None.
        batch_losses: names bound only to a mean-reducing loss of a batch (``loss =
            criterion(out, y)``): one mean per batch.
        sum_losses: names bound only to a summing loss of a batch (``reduction="sum"``).
        per_batch: functions (and methods, by name) called inside a loop over a loader with
            that batch's values (``acc1, acc5 = accuracy(output, target, topk=(1, 5))``): what
            they return is one process's, for one batch.
        evaluating: functions every call of which runs under a no-gradient context or after
            ``model.eval()`` in its caller: their loops are evaluation loops.
        meters: function name → the meters its body binds (``top1 = AverageMeter(...)``), for
            a function nested in it that updates them (the ImageNet example's
            ``run_validate``).
    """

    criteria: dict[str, str | None] = field(default_factory=dict)
    batch_losses: set[str] = field(default_factory=set)
    sum_losses: set[str] = field(default_factory=set)
    per_batch: set[str] = field(default_factory=set)
    evaluating: set[str] = field(default_factory=set)
    meters: dict[str, set[str]] = field(default_factory=dict)


def eval_flow(tree: ast.Module, imports: Any, rules: _Matches) -> EvalFlow:
    """The :class:`EvalFlow` of ``tree`` (``imports``: the file's ImportMap)."""
    finder = FlowFinder(imports, rules)
    for node in ast.walk(tree):
        finder.see(node)
    return finder.result(tree)


class FlowFinder:
    """Builds an :class:`EvalFlow`: :meth:`see` every statement of the tree (in any order,
    so a walk made for other facts serves; it looks at nothing else), then :meth:`result`."""

    #: the node types :meth:`see` reads (it passes over any other)
    SEEN = frozenset({ast.Assign, ast.For, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef})

    def __init__(self, imports: Any, rules: _Matches) -> None:
        self.imports, self.rules = imports, rules
        self.flow = EvalFlow()
        self.loaders: set[str] = set()
        self.loops: list[ast.For | ast.AsyncFor] = []
        self.calls: dict[str, set[bool]] = {}  # callee → was each call evaluating?
        self.losses: dict[str, set[str]] = {}  # loss name → the reduction of each binding
        self.assigns: list[ast.Assign] = []

    def see(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            self.assigns.append(node)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.loops.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            off = any(is_eval_context(self.rules, self.imports.ast_qualname(_callee(d)))
                      for d in node.decorator_list)
            self._block(node.body, [off, False])
            meters = {t.id for stmt in node.body if isinstance(stmt, ast.Assign)
                      and isinstance(stmt.value, ast.Call)
                      and (ast_dotted_name(stmt.value.func) or "").endswith("Meter")
                      for t in stmt.targets if isinstance(t, ast.Name)}
            if meters:
                self.flow.meters.setdefault(node.name, set()).update(meters)

    def result(self, tree: ast.Module) -> EvalFlow:
        self._block(tree.body, [False, False])
        flow = self.flow
        for node in self.assigns:  # criteria and loaders first: the losses are built from them
            self._bind(node)
        losses = self.losses
        for node in self.assigns:
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if not names or any(name in flow.criteria for name in names):
                continue  # no name to tell of, or the criterion itself
            if all(_settled(losses.get(name)) for name in names):
                continue  # whatever this value reduces by, none of them is a batch's loss
            reduction = self.reduction_of(node.value)
            for name in names:
                losses.setdefault(name, set()).add(reduction or "?")
        for loop in self.loops:
            if self._loaderish(loop.iter):
                flow.per_batch.update(_per_batch_callees(loop))
        flow.evaluating = {name for name, states in self.calls.items() if states == {True}}
        flow.batch_losses = {name for name, seen in self.losses.items() if seen == {"mean"}}
        flow.sum_losses = {name for name, seen in self.losses.items() if seen == {"sum"}}
        return flow

    # ------------------------------------------------------------ bindings
    def _bind(self, node: ast.Assign) -> None:
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if not names:
            return
        core = node.value
        while isinstance(core, ast.Call) and isinstance(core.func, ast.Attribute) \
                and core.func.attr in _MOVES:
            core = core.func.value
        if isinstance(core, ast.Call):
            qual = self.imports.ast_qualname(core.func)
            if qual and qual.startswith("torch.nn.") and _short(qual).endswith("Loss"):
                reduction = loss_reduction(qual, _keywords(core))
                for name in names:
                    known = self.flow.criteria.get(name, reduction)
                    self.flow.criteria[name] = reduction if known == reduction else None
                return
            if self.rules.match("dataloaders", qual) is not None \
                    or (is_loop_wrapper(qual) and self._loaderish(core)):
                self.loaders.update(names)

    def reduction_of(self, value: ast.expr) -> str | None:
        """The reduction of the loss ``value`` computes (see :func:`loss_reduction`), None
        for no loss known here."""
        nodes = walk(value)
        if any(_is_count(node) for node in nodes if type(node) in _COUNTS):
            return None  # a mean times its count: a sum, whatever the reduction
        for node in nodes:
            if type(node) is ast.Call:
                callee = node.func
                if isinstance(callee, ast.Name) and callee.id in self.flow.criteria:
                    return self.flow.criteria[callee.id]
                if type(callee) is ast.Attribute and not _may_be_loss(callee.attr):
                    continue  # a method's last name is its qualified name's: no loss
                reduction = loss_reduction(self.imports.ast_qualname(callee), _keywords(node))
                if reduction is not None:
                    return reduction
        return None

    def _loaderish(self, node: ast.expr) -> bool:
        return is_loaderish(node, self.imports.ast_qualname, known=self.loaders.__contains__,
                            builds=lambda callee: self.rules.match("dataloaders", callee)
                            is not None)

    # ------------------------------------------------------------ calls, in order
    def _block(self, body: list[ast.stmt], state: list[bool]) -> None:
        """Walk statements in order; ``state``: [gradients off, a model switched to eval]."""
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue  # a def runs when called: walked on its own
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    self._calls(item.context_expr, state)
                off = any(is_eval_context(self.rules, self.imports.ast_qualname(
                    _callee(item.context_expr))) for item in stmt.items)
                inner = [state[0] or off, state[1]]
                self._block(stmt.body, inner)
                state[1] = inner[1]
                continue
            kind = type(stmt)
            if kind in _SIMPLE:
                self._calls(stmt, state)
                continue
            headers = [getattr(stmt, name) for name in ("test", "iter", "subject")
                       if isinstance(getattr(stmt, name, None), ast.expr)]
            bodies = [getattr(stmt, name) for name in ("body", "orelse", "finalbody")
                      if isinstance(getattr(stmt, name, None), list)]
            bodies += [handler.body for handler in getattr(stmt, "handlers", ())]
            bodies += [case.body for case in getattr(stmt, "cases", ())]
            if not bodies:
                self._calls(stmt, state)
                continue
            for header in headers:
                self._calls(header, state)
            for block in bodies:
                self._block(block, state)

    def _calls(self, node: ast.AST, state: list[bool]) -> None:
        for sub in walk(node):
            if type(sub) is not ast.Call:
                continue
            func = sub.func
            if isinstance(func, ast.Attribute) and func.attr in ("eval", "train"):
                values = [False if isinstance(a, ast.Constant) and a.value is False else a
                          for a in sub.args]
                if switches_to_eval(func.attr, values):
                    state[1] = True
                elif func.attr == "train" and (not sub.args or isinstance(
                        sub.args[0], ast.Constant) and sub.args[0].value is True):
                    state[1] = False
                continue
            name = _own_callee(func)
            if name is not None:
                self.calls.setdefault(name, set()).add(state[0] or state[1])


#: statements that hold no statements (no body, handlers or cases): their calls are read whole
_SIMPLE = frozenset(kind for kind in vars(ast).values()
                    if isinstance(kind, type) and issubclass(kind, ast.stmt)
                    and not {"body", "orelse", "finalbody", "handlers", "cases"} & set(
                        kind._fields))


def _settled(reductions: set[str] | None) -> bool:
    """Is a name bound to these reductions (``"?"``: none known) neither a mean-reducing nor
    a summing loss, whatever its other bindings reduce by?"""
    return reductions is not None and ("?" in reductions or len(reductions) > 1)


def _per_batch_callees(loop: ast.For | ast.AsyncFor) -> set[str]:
    """Local functions called in ``loop``'s body with a value of its batch as an argument."""
    batch = {n.id for n in walk(loop.target) if isinstance(n, ast.Name)}
    nodes = _body_nodes(loop.body)
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                batch.update(n.id for n in walk(target) if isinstance(n, ast.Name))
    found: set[str] = set()
    for node in nodes:
        if type(node) is ast.Call:
            name = _own_callee(node.func)
            if name is None or name in found:
                continue
            values = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(n, ast.Name) and n.id in batch
                   for value in values for n in walk(value)):
                found.add(name)
    return found


#: what runs in a scope of its own, not as part of the body around it
_OWN_SCOPES = frozenset({ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda})


def _body_nodes(body: list[ast.stmt]) -> list[ast.AST]:
    """Every node of ``body``, not inside a nested def, class or lambda."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if type(node) in _OWN_SCOPES:
            continue
        found.append(node)
        stack.extend(child_nodes(node))
    return found


#: the node types :func:`_is_count` may answer True for
_COUNTS = frozenset({ast.Call, ast.Subscript})


def _is_count(node: ast.AST) -> bool:
    """``x.size(0)``, ``x.numel()``, ``len(y)``, ``x.shape[0]``: a batch's sample count."""
    if isinstance(node, ast.Call):
        func = node.func
        return (isinstance(func, ast.Attribute) and func.attr in ("size", "numel")) or (
            isinstance(func, ast.Name) and func.id == "len")
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
        and node.value.attr == "shape"


def _own_callee(func: ast.expr) -> str | None:
    """``f`` of ``f(...)`` and of ``self.f(...)``: a function or method the file may define."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
            and func.value.id == "self":
        return func.attr
    return None


def _callee(node: ast.expr) -> ast.expr:
    return node.func if isinstance(node, ast.Call) else node


def _keywords(call: ast.Call) -> dict[str, Any]:
    return {k.arg: (k.value.value if isinstance(k.value, ast.Constant) else k.value)
            for k in call.keywords if k.arg is not None}


def _short(qualname: str | None) -> str:
    return (qualname or "").rsplit(".", 1)[-1]
