"""Full-batch training: a training loop whose every step sees the whole data set (issue 12 item 5).

Graph scripts train that way: one forward over all nodes (``out = model(x, adj)``), a loss on the
training nodes (``F.nll_loss(out[train_mask], y[train_mask])``), no DataLoader and no batches.
Every process then computes the same loss on the same data with the same weights, so their
gradients are equal, DDP's average is that gradient, and N processes train exactly like one.
Nothing needs sharding, and the "not fed by a DataLoader" alarm would be false.

A loop nest (not over a DataLoader) trains full-batch when its model's inputs do not change from
step to step:

- it calls a model (a name an optimizer or a backward pass trains) at least once, and every such
  call's arguments read only names the nest never assigns (nor iterates over), through
  attributes, subscripts and method or library calls (``x.to(device)``, ``data.x``), not
  through a function of the file (which may hand out a new batch each call);
- nothing in the nest is indexed by a name the nest assigns or iterates over (``data[i:i+bs]``,
  ``X[idx]``): no slicing by the loop variable, no batch assembled from per-step indices;
- nothing is read with ``next()`` and nothing is drawn (``torch.randint``, ``np.random.*``,
  ``random.*``), since each process would draw its own.

Random draws inside the model (dropout) come from the generator every process seeded alike, so
they agree too. What it does not do: follow the model's inputs into other functions, or tell a
loop over a list of whole graphs (every process iterating the same list: also equal gradients)
from one over batches; those keep the note.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from distify.analysis.draws import draw_family
from distify.analysis.names import dotted_name, read_names
from distify.analysis.stops import bound_names
from distify.analysis.walk import walk


def is_full_batch(loop: cst.For | cst.While, models: set[str],
                  qual: Callable[[cst.BaseExpression], str | None]) -> bool:
    """Does the nest rooted at ``loop`` train full-batch?

    Args:
        loop: the outermost loop around the backward pass, as written.
        models: dotted names of the models that train (``model``, ``self.net``).
        qual: the qualified name of a callee, imports resolved (``torch.randint``).
    """
    finder = _Finder(models, qual)
    walk(loop, finder)
    if not finder.forwards or finder.fed:
        return False
    changing = finder.assigned
    for call in finder.forwards:
        for arg in call.args:
            if read_names(arg.value) & changing or _calls_a_local_function(arg.value):
                return False
    return not any(read_names(index) & changing for index in finder.indices)


class _Finder(cst.CSTVisitor):
    def __init__(self, models: set[str], qual: Callable[[cst.BaseExpression], str | None]):
        super().__init__()
        self.models, self.qual = models, qual
        self.forwards: list[cst.Call] = []
        self.assigned: set[str] = set()
        self.indices: list[cst.CSTNode] = []  # what subscripts read with
        self.fed = False  # a next() or a draw
        self._targets: set[int] = set()  # subscripts written to (``losses[k] = ...``)

    def visit_For(self, node: cst.For) -> None:
        self.assigned |= bound_names(node.target)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._assign(target.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._assign(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._assign(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._assign(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self.assigned |= bound_names(node.name)

    def _assign(self, target: cst.BaseExpression) -> None:
        self.assigned |= bound_names(target)
        root = target
        while type(root) in (cst.Attribute, cst.Subscript):
            if type(root) is cst.Subscript:
                self._targets.add(id(root))
            root = root.value
        if type(root) is cst.Name and root is not target:
            self.assigned.add(root.value)  # `x[mask] = ...` changes x

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if id(node) not in self._targets:
            self.indices.extend(node.slice)

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted_name(node.func)
        if name in self.models:
            self.forwards.append(node)
        reads = name == "next" or (type(node.func) is cst.Attribute
                                   and node.func.attr.value == "__next__")
        self.fed = self.fed or reads or draw_family(self.qual(node.func)) is not None

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


class _LocalCalls(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found = False

    def visit_Call(self, node: cst.Call) -> None:
        self.found = self.found or type(node.func) is cst.Name


def _calls_a_local_function(node: cst.CSTNode) -> bool:
    """``model(next_graph())``: a plain function call may hand out new data each time (a method
    of a value or a module's function, ``x.to(device)``, ``F.dropout(x)``, does not)."""
    finder = _LocalCalls()
    walk(node, finder)
    return finder.found
