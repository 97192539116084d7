"""Random draws that feed training, found over the whole module before the rewrite.

Every rank of a job runs the script's seed, so a draw that picks the batches or the noise comes
out the same on all of them. The rewrite (:mod:`distify.convert.randomness`) gives such draws a
generator of their own process; this pass says which draws those are:

- **batch draws**: every draw (``torch.randint/randperm/rand/randn/multinomial/normal``,
  ``np.random.*``, ``random.*``) in a *batch function*: a function that draws and is called in a
  loop that trains (one with a ``backward``), or in a loop of a function that evaluates (under
  ``no_grad``/``inference_mode`` or after ``.eval()``), or by another batch function
  (nanoGPT's ``get_batch``);
- **loop draws**: ``torch.randn/rand/randint/normal`` drawn in a training loop itself (the
  innermost loop around them trains): a GAN's latent noise. Not the draws before the loop (model
  initialisation, a ``fixed_noise`` for pictures), not a draw in an ``if``/``while`` test (a
  branch every process must take alike);
- **fed backwards**: the ``backward`` calls of loops that call a batch function, or that make
  loop draws themselves (an episode's random start): their data is drawn per process, so they
  need no note about a missing DataLoader;
- **evaluation means**: ``losses.mean()`` (or ``np.mean(losses)``) after a loop of an evaluating
  function that draws its batches and fills ``losses[k] = ...`` (or appends to it): each
  process's mean of its own random batches, to be averaged over the processes.

Nodes are the *original* LibCST nodes, by identity (the module stays alive during the rewrite).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from distify.analysis.draws import TORCH_LOOP_DRAWS, draw_family
from distify.analysis.names import ImportMap, dotted_name
from distify.analysis.walk import walk

#: the runtime helpers a converted draw goes through (so a second conversion sees it)
_CONVERTED = {"numpy_random": "numpy", "python_random": "python"}


@dataclass
class DrawFlow:
    #: id of a draw call in a batch function → its family (``torch``, ``numpy``, ``python``)
    batch_draws: dict[int, str] = field(default_factory=dict)
    #: ids of torch draws in a training loop
    loop_draws: set[int] = field(default_factory=set)
    #: ids of the backward calls of loops whose batches a batch function draws
    fed_backwards: set[int] = field(default_factory=set)
    #: ids of ``losses.mean()`` calls to average over the processes
    eval_means: set[int] = field(default_factory=set)
    #: the batch functions' names
    batch_functions: set[str] = field(default_factory=set)


@dataclass
class _LoopInfo:
    node: cst.CSTNode
    has_backward: bool = False
    calls: set[str] = field(default_factory=set)
    fills: set[str] = field(default_factory=set)  # `losses[k] = ...`, `losses.append(...)`


@dataclass
class _ScopeInfo:
    name: str | None
    draws: list[tuple[cst.Call, str]] = field(default_factory=list)
    loop_draws: list[tuple[cst.Call, list[_LoopInfo]]] = field(default_factory=list)
    calls: list[tuple[str, list[_LoopInfo]]] = field(default_factory=list)
    backwards: list[tuple[cst.Call, list[_LoopInfo]]] = field(default_factory=list)
    means: list[tuple[cst.Call, str, list[_LoopInfo]]] = field(default_factory=list)
    loops: list[_LoopInfo] = field(default_factory=list)
    evaluates: bool = False
    has_backward: bool = False


def find_draw_flow(module: cst.Module, imports: ImportMap) -> DrawFlow:
    finder = _Finder(imports)
    walk(module, finder)
    return finder.result()


class _Finder(cst.CSTVisitor):
    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.scopes: list[_ScopeInfo] = [_ScopeInfo(None)]
        self.done: list[_ScopeInfo] = []
        self.open_loops: list[list[_LoopInfo]] = [[]]
        self.tests = 0
        self.reduced: set[int] = set()

    # ------------------------------------------------------------ scopes and loops
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        scope = _ScopeInfo(node.name.value)
        scope.evaluates = any(
            (dotted_name(d.decorator.func if type(d.decorator) is cst.Call else d.decorator)
             or "").rsplit(".", 1)[-1] in ("no_grad", "inference_mode")
            for d in node.decorators)
        self.scopes.append(scope)
        self.open_loops.append([])

    def leave_FunctionDef(self, original: cst.FunctionDef) -> None:
        self.done.append(self.scopes.pop())
        self.open_loops.pop()

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def _enter_loop(self, node: cst.CSTNode) -> None:
        loop = _LoopInfo(node)
        self.open_loops[-1].append(loop)
        self.scopes[-1].loops.append(loop)

    def _leave_loop(self) -> None:
        self.open_loops[-1].pop()

    def visit_For(self, node: cst.For) -> None:
        self._enter_loop(node)

    def leave_For(self, original: cst.For) -> None:
        self._leave_loop()

    def visit_While(self, node: cst.While) -> None:
        self._enter_loop(node)

    def leave_While(self, original: cst.While) -> None:
        self._leave_loop()

    # the tests of branches: a draw there decides what every process does
    def visit_If_test(self, node: cst.If) -> None:
        self.tests += 1

    def leave_If_test(self, node: cst.If) -> None:
        self.tests -= 1

    def visit_While_test(self, node: cst.While) -> None:
        self.tests += 1

    def leave_While_test(self, node: cst.While) -> None:
        self.tests -= 1

    def visit_IfExp_test(self, node: cst.IfExp) -> None:
        self.tests += 1

    def leave_IfExp_test(self, node: cst.IfExp) -> None:
        self.tests -= 1

    def visit_WithItem(self, node: cst.WithItem) -> None:
        callee = node.item.func if type(node.item) is cst.Call else node.item
        if (dotted_name(callee) or "").rsplit(".", 1)[-1] in ("no_grad", "inference_mode"):
            self.scopes[-1].evaluates = True

    # ------------------------------------------------------------ what is called
    def visit_Assign(self, node: cst.Assign) -> None:
        loops = self.open_loops[-1]
        for target in node.targets:
            if type(target.target) is cst.Subscript and type(target.target.value) is cst.Name:
                for loop in loops:
                    loop.fills.add(target.target.value.value)

    def visit_Call(self, node: cst.Call) -> None:
        scope, loops = self.scopes[-1], list(self.open_loops[-1])
        func = node.func
        name = dotted_name(func)
        last = name.rsplit(".", 1)[-1] if name else None
        if type(func) is cst.Attribute and func.attr.value == "backward":
            scope.has_backward = True
            for loop in loops:
                loop.has_backward = True
            scope.backwards.append((node, loops))
            return
        if type(func) is cst.Attribute and func.attr.value == "eval" and not node.args:
            scope.evaluates = True
        if last == "reduce":  # already averaged (a converted script)
            self.reduced.update(id(arg.value) for arg in node.args)
        family = self._family(node, name)
        if family is not None and not any(a.keyword and a.keyword.value == "generator"
                                          for a in node.args):
            scope.draws.append((node, family))
            qual = self.imports.resolve(name)
            if qual in TORCH_LOOP_DRAWS and loops and not self.tests:
                scope.loop_draws.append((node, loops))
        if type(func) is cst.Name or (type(func) is cst.Attribute
                                      and type(func.value) is cst.Name
                                      and func.value.value in ("self", "cls")):
            callee = func.value if type(func) is cst.Name else func.attr.value
            scope.calls.append((callee, loops))
            for loop in loops:
                loop.calls.add(callee)
        if type(func) is cst.Attribute and type(func.value) is cst.Name \
                and func.attr.value == "append" and len(node.args) == 1:
            for loop in loops:
                loop.fills.add(func.value.value)
        mean_of = self._mean_of(node, name)
        if mean_of is not None:
            scope.means.append((node, mean_of, loops))

    def _family(self, node: cst.Call, name: str | None) -> str | None:
        func = node.func
        if type(func) is cst.Attribute and type(func.value) is cst.Call:
            helper = dotted_name(func.value.func) or ""
            kind = _CONVERTED.get(helper.rsplit(".", 1)[-1])
            if kind is not None:  # `distify.numpy_random().randint(...)`, converted already
                return kind
        return draw_family(self.imports.resolve(name))

    def _mean_of(self, node: cst.Call, name: str | None) -> str | None:
        """``losses`` in ``losses.mean()`` / ``np.mean(losses)`` / ``torch.mean(losses)``."""
        func = node.func
        if type(func) is cst.Attribute and func.attr.value == "mean" and not node.args \
                and type(func.value) is cst.Name:
            return func.value.value
        qual = self.imports.resolve(name)
        if qual in ("numpy.mean", "statistics.mean") and len(node.args) == 1 \
                and type(node.args[0].value) is cst.Name:
            return node.args[0].value.value
        return None

    # ------------------------------------------------------------ the answer
    def result(self) -> DrawFlow:
        scopes = [*self.done, *self.scopes]
        drawing = {s.name for s in scopes if s.name is not None and s.draws}
        batch: set[str] = set()
        changed = True
        while changed:
            changed = False
            for scope in scopes:
                for callee, loops in scope.calls:
                    if callee not in drawing or callee in batch:
                        continue
                    trains = any(loop.has_backward for loop in loops)
                    evaluates = bool(loops) and scope.evaluates and not scope.has_backward
                    if trains or evaluates or scope.name in batch:
                        batch.add(callee)
                        changed = True
        flow = DrawFlow(batch_functions=batch)
        for scope in scopes:
            if scope.name in batch:
                flow.batch_draws.update((id(call), family) for call, family in scope.draws)
            drawing_loops = set()
            for call, loops in scope.loop_draws:
                if loops[-1].has_backward and id(call) not in flow.batch_draws:
                    flow.loop_draws.add(id(call))
                    drawing_loops.add(id(loops[-1]))
            for call, loops in scope.backwards:
                if any(loop.calls & batch or id(loop) in drawing_loops for loop in loops):
                    flow.fed_backwards.add(id(call))
            if scope.evaluates and not scope.has_backward:
                for call, name, loops in scope.means:
                    inside = {id(loop) for loop in loops}
                    if id(call) not in self.reduced and any(
                            id(loop) not in inside and name in loop.fills and loop.calls & batch
                            for loop in scope.loops):
                        flow.eval_means.add(id(call))
        return flow
