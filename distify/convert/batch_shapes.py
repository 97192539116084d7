"""Shapes tied to the configured batch size, in a loop over a DataLoader.

On N processes a prepared DataLoader's last batch on a process can be smaller than the batch
size (evaluation splits it, training pads each shard but not to a whole batch), so a script
that works on one process (its data set size divides the batch size) breaks at some world
sizes if it writes the batch size into shapes. Rewritten:

- the configured batch size as the leading dimension of a shape (``x.reshape(batch_size, -1)``,
  ``x.view(args.batch_size, 1, 28, 28)``, ``torch.ones(batch_size, 1)``,
  ``torch.full((batch_size,), 1.0)``, ``torch.randn(batch_size, nz, 1, 1)``,
  ``model.init_hidden(batch_size)``) → the batch's own size, ``images.size(0)``.
- a loop over the batch, ``for i in range(batch_size):`` whose body indexes a tensor of the
  batch with ``i`` (``labels[i]``, ``out[i:i + 1]``) → ``range(len(labels))`` (a literal counts
  when it is the loader's own ``batch_size=4``): on one process a short batch would have
  stopped the original at ``labels[i]``, so the two agree wherever it ran.

Only where that is the same value on one process: the loop iterates (directly, or through
``enumerate``/``tqdm``) a DataLoader built in this file with exactly that ``batch_size=`` and
the default collate function, and ``images`` is a tensor of that batch: a name of the loop
target (``for images, labels in loader``, ``for i, (x, y) in enumerate(loader)``), or taken
from it (``x, y = batch``, ``x = batch[0].to(device)``), seen used as a tensor (above the
shape, in source order) and not rebound to anything else since. On one process the two are
equal as long as every batch is full, which a script that writes the batch size into shapes
relies on: a short batch would not fit them (with ``drop_last=True`` none comes). The one
exception is a data set the batch size does not divide, with a tensor sized by the batch size
that never meets the batch (noise for a generator whose output is not compared with it): its
last batch's noise becomes the batch's size.

Reported, not rewritten: the batch size in a shape where that cannot be proved (a loader
passed in as a parameter, a custom ``collate_fn``, no tensor known to be the batch, the batch
size in arithmetic or in another dimension: ``x.view(seq_len, batch_size * 2)``), or as the
bound of a loop that indexes the batch; and a parameter whose leading dimension is the
batch size (``nn.Parameter(torch.randn(batch_size, 1, d))``, a learned token concatenated with
the batch), wherever it is built: it cannot follow a short batch, so the note suggests
``drop_last=True`` (a prepared loader then drops the tail that would leave a process a short
batch) or a size of 1 expanded to the batch.

Deliberately not done: anything else outside a loop over a DataLoader (a buffer sized by the
batch size when it is built), in a ``def`` or ``lambda`` inside one (it may run later), uses
that are not shapes (``loss / batch_size``, a ``range(batch_size)`` whose index never indexes
the batch), and callables not in the tables below (a helper ``sample(batch_size)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from distify.analysis.loaders import is_loop_wrapper
from distify.analysis.names import dotted_name
from distify.analysis.walk import walk
from distify.convert.base import TransformerBase
from distify.convert.driver import handles
from distify.convert.syntax import _code

#: callables whose shape starts at their first argument (positional sizes, or one sequence);
#: the value is the keyword that may hold the shape instead
_SIZED_FUNCTIONS = {
    **dict.fromkeys(("torch.ones", "torch.zeros", "torch.empty", "torch.rand", "torch.randn",
                     "torch.full", "torch.Tensor", "torch.FloatTensor", "torch.LongTensor",
                     "torch.cuda.FloatTensor", "torch.cuda.LongTensor"), "size"),
    **dict.fromkeys(("numpy.zeros", "numpy.ones", "numpy.empty", "numpy.full"), "shape"),
    **dict.fromkeys(("numpy.random.randn", "numpy.random.rand"), None),
}
#: callables whose shape is their ``size=`` argument, or their first tuple argument
_SIZE_KEYWORD_FUNCTIONS = {"torch.randint", "torch.normal", "numpy.random.normal",
                           "numpy.random.uniform", "numpy.random.randint"}
#: methods whose first argument is the leading dimension of what they return
_SIZED_METHODS = {"view", "reshape", "expand", "new_ones", "new_zeros", "new_empty",
                  "new_full", "resize_", "init_hidden", "init_hidden_state"}
#: methods that take sizes, though not the leading dimension: the batch size there is reported
_REPORTED_METHODS = {"repeat", "tile", "unflatten"}
#: tensor methods that keep the leading dimension (``x = x.to(device)`` is still the batch)
_KEEPS_BATCH = {"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "long", "int",
                "bool", "type", "contiguous", "detach", "clone", "requires_grad_", "pin_memory"}
#: attributes only a tensor has here: the name holds a tensor, not a list or dict of them
_TENSOR_ATTRS = _KEEPS_BATCH | {"size", "shape", "view", "reshape", "dim", "numel", "flatten",
                                "unsqueeze", "squeeze", "permute", "transpose", "device",
                                "dtype", "expand", "sum", "mean", "argmax"}
_VARIABLE = {"torch.autograd.Variable", "torch.autograd.variable.Variable"}
_PARAMETERS = {"torch.nn.Parameter", "torch.nn.parameter.Parameter"}
#: a name that holds the configured batch size, whatever the DataLoaders say
_BATCH_NAME = re.compile(r"batch_?size$", re.IGNORECASE)


@dataclass(frozen=True)
class _Built:
    """One ``DataLoader(...)`` construction: its batch size (source), and whether it batches
    with the default collate function (every tensor's leading dimension is the batch)."""

    batch_size: str | None
    default_collate: bool
    scope: tuple[str, ...]


@dataclass
class _BatchLoop:
    """A loop over a DataLoader, as far as it has been read."""

    node: cst.For
    scope: int  # how many function scopes enclose it
    batch_size: str | None  # the configured batch size, when it provably is the loader's
    why: str  # why it is not, for the report
    #: names holding a tensor whose leading dimension is the batch's → seen used as a tensor
    leaves: dict[str, bool] = field(default_factory=dict)
    roots: set[str] = field(default_factory=set)  # `for batch in loader`: a tensor, list or dict
    shadowed: set[str] = field(default_factory=set)  # batch-size names rebound in the loop


@dataclass(slots=True)
class BatchShapeState:
    """What :class:`BatchShapeMixin` keeps while it walks one module (``self._batch_shapes``)."""

    #: the module as written (its DataLoaders are found in it on the first loop over one)
    module: cst.Module
    #: the loops over a DataLoader being visited, innermost last
    loops: list[_BatchLoop] = field(default_factory=list)
    #: (scope, or None for an attribute; dotted name) → the DataLoaders built there; None
    #: until the first loop over one asks
    loaders_built: dict[tuple[tuple[str, ...] | None, str], list[_Built]] | None = None
    #: scope → the names it binds (found with ``loaders_built``)
    assigned_in: dict[tuple[str, ...], set[str]] = field(default_factory=dict)
    #: the scopes that are class bodies (their names are not seen from their methods)
    class_scopes: set[tuple[str, ...]] = field(default_factory=set)
    #: the batch sizes of every DataLoader built in the file (read once, when first asked)
    batch_size_names: set[str] | None = None
    #: the last parts of the rules' DataLoader names (read once, when first asked)
    loader_names: set[str] | None = None
    #: lambdas around the node: a lambda runs later, when its names may hold something else
    lambdas: int = 0
    #: id of a ``for i in range(batch_size)`` loop to rewrite → (the batch it indexes, the
    #: bound), or to report → the note
    ranges: dict[int, tuple[str, str] | str] = field(default_factory=dict)


class BatchShapeMixin(TransformerBase):
    """The batch size in shapes inside loops over a DataLoader (see the module docstring)."""

    _batch_shapes: BatchShapeState

    @handles("visit_Module")
    def _batch_shapes_on_module(self, node: cst.Module) -> None:
        self._batch_shapes = BatchShapeState(module=node)

    # ------------------------------------------------------------ the loop and its batch
    @handles("visit_For")
    def _batch_shapes_on_for(self, node: cst.For) -> None:
        for loop in self._open_batch_loops():  # a loop inside rebinds its target
            self._rebind(loop, _target_names(node.target), None)
        if not self.ctx.loops[-1].loaderish:
            self._note_batch_range(node)
            return
        loader, target = self._unwrap(node.iter, node.target)
        batch_size, why = self._configured_batch_size(loader)
        loop = _BatchLoop(node, len(self.ctx.scopes), batch_size, why)
        if type(target) is cst.Name:
            loop.roots.add(target.value)
        for name in _target_names(target) if target is not None else ():
            loop.leaves[name] = False
        if target is None and batch_size is not None:
            loop.batch_size, loop.why = None, "the loop's target is not the batch"
        self._batch_shapes.loops.append(loop)

    @handles("leave_For")
    def _batch_shapes_after_for(self, original: cst.For, updated: cst.For):
        if self._batch_shapes.loops and self._batch_shapes.loops[-1].node is original:
            self._batch_shapes.loops.pop()
        found = self._batch_shapes.ranges.pop(id(original), None)
        if found is not None and isinstance(found, str):  # reported, not rewritten
            self._edit(updated.iter, "batch-size", found, human=True)
        elif found is not None and not self._skipped("batch-shapes", updated.iter):
            batch, bound = found
            size = cst.Call(func=cst.Name("len"), args=[cst.Arg(cst.Name(batch))])
            updated = updated.with_changes(iter=updated.iter.with_changes(
                args=[updated.iter.args[0].with_changes(value=size)]))
            self._edit(size, "batch-size", f"`{bound}` → `len({batch})`: this loop indexes the "
                       "batch, and the last batch on a process can be smaller than the batch "
                       "size (on one process this is the same value)")
        return updated

    def _note_batch_range(self, node: cst.For) -> None:
        """``for i in range(batch_size): labels[i]`` inside a loop over a DataLoader: the
        range is the batch's own length where that is provably the same value (noted for
        :meth:`_batch_shapes_after_for`), else reported. A range whose index never indexes a
        batch tensor (``for i in range(4): show(images[0])``) is left alone: nothing ties it to
        the batch."""
        loops = self._open_batch_loops()
        it = node.iter
        if not loops or self._batch_shapes.lambdas or type(node.target) is not cst.Name \
                or type(it) is not cst.Call or type(it.func) is not cst.Name \
                or it.func.value != "range" or "range" in self.facts.bound \
                or len(it.args) != 1 or it.args[0].keyword or it.args[0].star:
            return
        loop = loops[-1]
        bound = _code(it.args[0].value)
        batch = _indexed_batch(node.body, node.target.value, loop.leaves)
        if batch is None or bound in loop.shadowed:
            return
        if bound == loop.batch_size:
            self._batch_shapes.ranges[id(node)] = (batch, bound)
        elif self._is_batch_name(bound, loop):
            why = loop.why or f"this loop's DataLoader has batch_size={loop.batch_size}"
            self._batch_shapes.ranges[id(node)] = (
                f"`{bound}` in this range is the configured batch size, and the loop indexes "
                f"the batch (`{batch}[...]`), but on several processes the last batch on a "
                f"process can be smaller: use `range(len({batch}))` (not rewritten: {why})")

    def _open_batch_loops(self) -> list[_BatchLoop]:
        depth = len(self.ctx.scopes)
        return [loop for loop in self._batch_shapes.loops if loop.scope == depth]

    def _unwrap(self, iterated: cst.BaseExpression, target: cst.BaseExpression | None):
        """``enumerate(tqdm(loader))`` with ``i, (x, y)`` → ``loader`` and ``(x, y)``."""
        # not through `zip`: its target is a tuple of several iterables' items
        while type(iterated) is cst.Call and iterated.args \
                and is_loop_wrapper(self._qual(iterated.func), pairing=False):
            if iterated.args[0].keyword or iterated.args[0].star:
                return None, None
            if self._qual(iterated.func) == "enumerate":
                pair = target.elements if type(target) in (cst.Tuple, cst.List) else ()
                target = pair[1].value if len(pair) == 2 else None
            iterated = iterated.args[0].value
        return iterated, target

    @handles("visit_Lambda")
    def _batch_shapes_on_lambda(self, node: cst.Lambda) -> None:
        self._batch_shapes.lambdas += 1

    @handles("leave_Lambda")
    def _batch_shapes_after_lambda(self, original: cst.Lambda, updated: cst.Lambda) -> cst.Lambda:
        self._batch_shapes.lambdas -= 1
        return updated

    @handles("visit_Attribute")
    def _batch_shapes_on_attribute(self, node: cst.Attribute) -> None:
        """``x.to(device)``, ``x.size(0)``: ``x`` holds a tensor."""
        if self._batch_shapes.loops and type(node.value) is cst.Name \
                and node.attr.value in _TENSOR_ATTRS:
            for loop in self._open_batch_loops():
                if node.value.value in loop.leaves:
                    loop.leaves[node.value.value] = True

    @handles("leave_Assign")
    def _batch_shapes_after_assign(self, original: cst.Assign, updated: cst.Assign):
        if self._batch_shapes.loops:
            for target in original.targets:
                self._assigned(target.target, original.value)
        return updated

    @handles("leave_AnnAssign")
    def _batch_shapes_after_ann_assign(self, original: cst.AnnAssign, updated: cst.AnnAssign):
        if self._batch_shapes.loops and original.value is not None:
            self._assigned(original.target, original.value)
        return updated

    def _assigned(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        """``target = value`` in the loop: a batch tensor taken or lost, a batch size rebound."""
        loops = self._open_batch_loops()
        if type(target) in (cst.Tuple, cst.List):
            names = [e.value for e in target.elements]
            if type(value) in (cst.Tuple, cst.List) and len(value.elements) == len(names):
                for name, part in zip(names, value.elements):
                    self._assigned(name, part.value)
                return
            bound = [n for e in names for n in _target_names(e)]
            for loop in loops:  # `x, y = batch`: the parts of a collated batch
                whole = type(value) is cst.Name and value.value in loop.roots \
                    and not loop.leaves.get(value.value)
                loop.shadowed.update(n for n in bound if self._is_batch_name(n, loop))
                self._rebind(loop, bound, False if whole else None)
            return
        code = dotted_name(target)
        for loop in loops:
            if code is not None and self._is_batch_name(code, loop):
                loop.shadowed.add(code)
            if type(target) is cst.Name:
                self._rebind(loop, [target.value], self._derived(value, loop))

    def _rebind(self, loop: _BatchLoop, names: list[str], batch: bool | None) -> None:
        """``names`` now hold the batch (``batch`` says whether seen as a tensor) or, for
        None, something else."""
        for name in names:
            loop.roots.discard(name)
            if batch is None:
                loop.leaves.pop(name, None)
            else:
                loop.leaves.pop(name, None)  # taken anew: it goes after the older ones
                loop.leaves[name] = batch

    def _derived(self, value: cst.BaseExpression, loop: _BatchLoop) -> bool | None:
        """Is ``value`` a tensor of the batch (True when seen as a tensor), or None?"""
        if type(value) is cst.Name:
            return loop.leaves.get(value.value)
        if type(value) is cst.Subscript:  # batch[0], batch["image"] of a collated batch
            root = value.value
            index = value.slice[0].slice if len(value.slice) == 1 else None
            if type(root) is cst.Name and root.value in loop.roots \
                    and not loop.leaves.get(root.value) and type(index) is cst.Index \
                    and type(index.value) in (cst.Integer, cst.SimpleString):
                return False
            return None
        if type(value) is not cst.Call:
            return None
        func = value.func
        if self._qual(func) in _VARIABLE and value.args:
            return self._derived(value.args[0].value, loop)
        if type(func) is not cst.Attribute:
            return None
        keeps = func.attr.value in _KEEPS_BATCH or (
            func.attr.value in ("view", "reshape") and value.args
            and _code(value.args[0].value) == loop.batch_size)
        if keeps and self._derived(func.value, loop) is not None:
            return True
        return None

    def _is_batch_name(self, code: str, loop: _BatchLoop) -> bool:
        return code == loop.batch_size or bool(_BATCH_NAME.search(code)) \
            or code in self._all_batch_sizes()

    # ------------------------------------------------------------ the DataLoader
    def _configured_batch_size(self, loader: cst.BaseExpression | None) -> tuple[str | None, str]:
        """The batch size ``loader`` was built with, when this file shows it; else why not."""
        if type(loader) is cst.Call and self.rules.match("dataloaders",
                                                             self._qual(loader.func)):
            builds = [_built(loader, tuple(self.ctx.path))]
        else:
            builds = self._builds_of(loader)
        if not builds:
            return None, "distify cannot tell which DataLoader this loop iterates"
        sizes = {b.batch_size for b in builds}
        if len(sizes) > 1 or None in sizes:
            return None, "distify cannot tell this loader's batch size"
        if not all(b.default_collate for b in builds):
            return None, "its DataLoader batches with its own collate_fn or batch_sampler"
        size = sizes.pop()
        root = size.split(".")[0].split("[")[0]
        here = tuple(self.ctx.path)
        if any(not self._same_binding(root, b.scope, here) for b in builds):
            return None, f"`{root}` here may not be the one its DataLoader was built with"
        return size, ""

    def _builds_of(self, loader: cst.BaseExpression | None) -> list[_Built]:
        state = self._batch_shapes
        if state.loaders_built is None:
            state.loaders_built = {}
            self._find_loaders(state.module.body, ())
        code = dotted_name(loader) if loader is not None else None
        if code is None:
            return []
        if type(loader) is cst.Attribute:  # self.train_loader: wherever it is built
            return state.loaders_built.get((None, code), [])
        return state.loaders_built.get((self._binding(code, tuple(self.ctx.path)), code), [])

    def _binding(self, name: str, scope: tuple[str, ...]) -> tuple[str, ...]:
        """The scope whose ``name`` a statement in ``scope`` reads (a class body's names are
        not seen from its methods)."""
        for depth in range(len(scope), -1, -1):
            outer = scope[:depth]
            if depth < len(scope) and outer in self._batch_shapes.class_scopes:
                continue
            if name in self._batch_shapes.assigned_in.get(outer, ()):
                return outer
        return ()

    def _same_binding(self, name: str, built: tuple[str, ...], here: tuple[str, ...]) -> bool:
        if built == here:
            return True
        if name == "self":  # two methods of one class
            return len(built) > 1 and built[:-1] == here[:-1] \
                and here[:-1] in self._batch_shapes.class_scopes
        return self._binding(name, built) == self._binding(name, here)

    def _find_loaders(self, body, scope: tuple[str, ...]) -> None:
        """Record every ``name = DataLoader(...)`` by scope (statements only: cheap)."""
        for stmt in body:
            if type(stmt) is cst.SimpleStatementLine:
                for small in stmt.body:
                    if type(small) is cst.Assign:
                        for target in small.targets:
                            self._loader_assignment(target.target, small.value, scope)
                    elif type(small) in (cst.AnnAssign, cst.AugAssign):
                        self._batch_shapes.assigned_in.setdefault(scope, set()).update(
                            _target_names(small.target))
                continue
            inner = scope
            if type(stmt) is cst.ClassDef:
                inner = (*scope, stmt.name.value)
                self._batch_shapes.class_scopes.add(inner)
            elif type(stmt) is cst.FunctionDef:
                inner = (*scope, stmt.name.value)
                params = stmt.params
                self._batch_shapes.assigned_in.setdefault(inner, set()).update(
                    p.name.value for p in (*params.posonly_params, *params.params,
                                           *params.kwonly_params))
                for star in (params.star_arg, params.star_kwarg):
                    if type(star) is cst.Param:
                        self._batch_shapes.assigned_in[inner].add(star.name.value)
            if type(stmt) is cst.For:
                self._batch_shapes.assigned_in.setdefault(scope, set()).update(
                    _target_names(stmt.target))
            for suite in _suites(stmt):
                self._find_loaders(suite, inner)

    def _loader_assignment(self, target: cst.BaseExpression, value: cst.BaseExpression,
                           scope: tuple[str, ...]) -> None:
        if type(target) in (cst.Tuple, cst.List) and type(value) in (cst.Tuple, cst.List) \
                and len(target.elements) == len(value.elements):
            for part, val in zip(target.elements, value.elements):
                self._loader_assignment(part.value, val.value, scope)
            return
        self._batch_shapes.assigned_in.setdefault(scope, set()).update(_target_names(target))
        code = dotted_name(target)
        if code is None or type(value) is not cst.Call or not self._may_be_loader(value) \
                or not self.rules.match("dataloaders", self._qual(value.func)):
            return
        key = (None, code) if type(target) is cst.Attribute else (scope, code)
        self._batch_shapes.loaders_built.setdefault(key, []).append(_built(value, scope))

    def _may_be_loader(self, call: cst.Call) -> bool:
        """A cheap test before the qualified name: is the callee named like a DataLoader?"""
        state = self._batch_shapes
        if state.loader_names is None:
            state.loader_names = {n.rsplit(".", 1)[-1] for n in self.rules.names("dataloaders")}
        if any(not n.isidentifier() for n in state.loader_names):  # a pattern: no shortcut
            return True
        func = call.func
        name = func.attr if type(func) is cst.Attribute else func
        return type(name) is cst.Name and name.value in state.loader_names

    def _all_batch_sizes(self) -> set[str]:
        """The batch sizes of every DataLoader built in the file."""
        state = self._batch_shapes
        if state.batch_size_names is None:
            self._builds_of(None)
            state.batch_size_names = {b.batch_size for builds in state.loaders_built.values()
                                      for b in builds if b.batch_size is not None}
        return state.batch_size_names

    # ------------------------------------------------------------ the shapes
    def _batch_shape_call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """Called for every call left: ``torch.ones(batch_size, 1)`` in a loop over a
        DataLoader → ``torch.ones(images.size(0), 1)``, or a note when not provable."""
        if self._qual(original.func) in _PARAMETERS and original.args:
            self._report_sized_parameter(original, updated)
        state = self._batch_shapes
        if not state.loops or state.loops[-1].scope != len(self.ctx.scopes) or state.lambdas:
            return updated
        loop = state.loops[-1]
        shape = self._shape_of(original)
        if shape is None:
            return updated
        path, reported_only = shape
        lead = _at(original, path) if path is not None else None
        lead_code = _code(lead) if lead is not None else None
        if lead_code is not None and lead_code == loop.batch_size \
                and lead_code not in loop.shadowed and not reported_only:
            batch = self._batch_tensor(original, loop)
            replaced = _replace_at(updated, path, _size_of(batch)) if batch else None
            if replaced is not None and self._skipped("batch-shapes", updated):
                return updated
            if replaced is not None:
                self._edit(_at(replaced, path), "batch-size", f"`{lead_code}` → "
                           f"`{batch}.size(0)`: the last batch on a process can be smaller "
                           "than the batch size (on one process this is the same value)")
                return replaced
            return self._report_batch_size(updated, lead_code, loop, "distify cannot tell "
                                           "which tensor in this loop is the batch")
        mentioned = self._batch_names_in(original, loop)
        if not mentioned:
            return updated
        name = mentioned[0]
        if name == lead_code:
            why = loop.why or f"this loop's DataLoader has batch_size={loop.batch_size}"
        elif lead is not None and name in _chains_in(lead):
            why = "the leading dimension is computed from it"
        else:
            why = "it is not the leading dimension"
        return self._report_batch_size(updated, name, loop, why)

    def _report_sized_parameter(self, call: cst.Call, anchor: cst.Call) -> None:
        """``nn.Parameter(torch.randn(batch_size, 1, d))``: a learned tensor sized by the
        configured batch size (a token concatenated with the batch) cannot follow the batch."""
        inner = call.args[0].value
        shape = self._shape_of(inner) if type(inner) is cst.Call else None
        if shape is None or shape[0] is None or shape[1]:
            return
        name = _code(_at(inner, shape[0]))
        if name.isdigit() or not (_BATCH_NAME.search(name) or name in self._all_batch_sizes()):
            return
        self._edit(anchor, "batch-size", f"`{name}` sizes this parameter: a parameter cannot "
                   "follow the batch, so on several processes a process's last batch, which "
                   "can be smaller than the batch size, will not fit it (on one process only "
                   "a data set that the batch size divides does). Pass `drop_last=True` to the "
                   "DataLoaders it meets (the prepared loader then drops the tail that would "
                   "leave a process a short batch), or size it 1 and expand it to the batch "
                   "(`.expand(x.size(0), -1, -1)`)", human=True)

    def _report_batch_size(self, call: cst.Call, name: str, loop: _BatchLoop,
                           why: str) -> cst.Call:
        batch = next((n for n, tensor in loop.leaves.items() if tensor), "x")
        self._edit(call, "batch-size", f"`{name}` in this shape is the configured batch size, "
                   "but on several processes the last batch on a process can be smaller: use "
                   f"the batch's own size, e.g. `{batch}.size(0)` (not rewritten: {why})",
                   human=True)
        return call

    def _shape_of(self, call: cst.Call) -> tuple[tuple[int, int | None] | None, bool] | None:
        """Where the leading dimension is in a call that takes a shape: (argument index,
        element index or None), None when there is none to prove; and whether a batch size in
        it is only to be reported. None for a call that takes no shape."""
        qual = self._qual(call.func)
        args = call.args
        if qual in _SIZED_FUNCTIONS or qual in _SIZE_KEYWORD_FUNCTIONS:
            keyword = _SIZED_FUNCTIONS.get(qual, "size")
            sized = next((i for i, a in enumerate(args)
                          if a.keyword is not None and a.keyword.value == keyword), None)
            if sized is None and qual in _SIZED_FUNCTIONS:
                sized = 0 if args and not args[0].keyword else None
            elif sized is None:
                sized = next((i for i, a in enumerate(args) if not a.keyword
                              and type(a.value) in (cst.Tuple, cst.List)), None)
        elif type(call.func) is cst.Attribute and not (qual or "").startswith(
                ("torch.", "numpy.")) and call.func.attr.value in _SIZED_METHODS:
            sized = 0 if args and not args[0].keyword else None
        elif type(call.func) is cst.Attribute and call.func.attr.value in _REPORTED_METHODS:
            return None, True
        else:
            return None
        if sized is None or any(a.star for a in args[:sized + 1]):
            return None, True
        return _first_of(args[sized], sized), False

    def _batch_tensor(self, call: cst.Call, loop: _BatchLoop) -> str | None:
        """The name of a tensor whose leading dimension is this loop's batch."""
        receiver = call.func.value if type(call.func) is cst.Attribute else None
        if type(receiver) is cst.Name and receiver.value in loop.leaves \
                and call.func.attr.value in ("view", "reshape", "expand"):
            return receiver.value  # `x.view(batch_size, -1)`: x is a tensor
        return next((name for name, tensor in loop.leaves.items() if tensor), None)

    def _batch_names_in(self, call: cst.Call, loop: _BatchLoop) -> list[str]:
        """Batch-size names in the call's arguments."""
        found: list[str] = []
        for arg in call.args:
            for code in _chains_in(arg.value):
                if self._is_batch_name(code, loop) and code not in loop.shadowed \
                        and code not in found:
                    found.append(code)
        return found


def _indexed_batch(body: cst.BaseSuite, index: str, leaves: dict[str, bool]) -> str | None:
    """The batch tensor that ``body`` indexes with ``index`` (``labels[i]``, ``out[i:i + 1]``),
    when the body does not rebind it; else None."""
    found = _Indexed(index, leaves)
    walk(body, found)
    batch = next((name for name in found.indexed if name not in found.bound), None)
    return batch


class _Indexed(cst.CSTVisitor):
    def __init__(self, index: str, leaves: dict[str, bool]) -> None:
        super().__init__()
        self.index, self.leaves = index, leaves
        self.indexed: list[str] = []
        self.bound: set[str] = set()

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if type(node.value) is not cst.Name or node.value.value not in self.leaves \
                or not node.slice:
            return
        first = node.slice[0].slice
        key = first.value if type(first) is cst.Index else \
            first.lower if type(first) is cst.Slice else None
        if type(key) is cst.Name and key.value == self.index:
            self.indexed.append(node.value.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.bound.update(_target_names(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.bound.update(_target_names(node.target))


def _built(call: cst.Call, scope: tuple[str, ...]) -> _Built:
    positional = [a for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    size = keywords.get("batch_size", positional[1].value if len(positional) > 1 else None)
    unknown = any(a.star for a in call.args)
    default = not unknown and not ({"collate_fn", "batch_sampler"} & keywords.keys()) \
        and len(positional) <= 4  # dataset, batch_size, shuffle, sampler
    return _Built(None if size is None or unknown else _code(size), default, scope)


def _size_of(name: str) -> cst.Call:
    return cst.Call(func=cst.Attribute(cst.Name(name), cst.Name("size")),
                    args=[cst.Arg(cst.Integer("0"))])


def _first_of(arg: cst.Arg, index: int) -> tuple[int, int | None] | None:
    """The leading dimension of a shape given as ``arg``: itself, or a sequence's first."""
    if type(arg.value) in (cst.Tuple, cst.List):
        elements = arg.value.elements
        return (index, 0) if elements and type(elements[0]) is cst.Element else None
    return index, None


def _at(call: cst.Call, path: tuple[int, int | None]) -> cst.BaseExpression:
    index, element = path
    value = call.args[index].value
    return value.elements[element].value if element is not None else value


def _replace_at(call: cst.Call, path: tuple[int, int | None],
                new: cst.BaseExpression) -> cst.Call | None:
    index, element = path
    args = list(call.args)
    arg = args[index]
    if element is None:
        args[index] = arg.with_changes(value=new)
    elif type(arg.value) in (cst.Tuple, cst.List):
        elements = list(arg.value.elements)
        elements[element] = elements[element].with_changes(value=new)
        args[index] = arg.with_changes(value=arg.value.with_changes(elements=elements))
    else:
        return None
    return call.with_changes(args=args)


def _target_names(target: cst.BaseExpression) -> list[str]:
    """The plain names a target binds, in order (``i, (x, y)`` → i, x, y)."""
    if type(target) is cst.Name:
        return [target.value]
    if type(target) in (cst.Tuple, cst.List):
        return [n for e in target.elements for n in _target_names(e.value)]
    if type(target) is cst.StarredElement:
        return _target_names(target.value)
    return []


def _suites(stmt: cst.CSTNode):
    """The statement lists directly inside a compound statement."""
    for name in ("body", "orelse", "finalbody"):
        part = getattr(stmt, name, None)
        if type(part) is cst.SimpleStatementSuite:  # `if cond: loader = DataLoader(...)`
            yield [cst.SimpleStatementLine(body=part.body)]
        elif isinstance(part, cst.BaseSuite):
            yield part.body
        elif type(part) in (cst.If, cst.Else, cst.Finally):
            yield from _suites(part) if type(part) is cst.If else (part.body.body,)
    for handler in getattr(stmt, "handlers", ()):
        yield handler.body.body


class _Chains(cst.CSTVisitor):
    """The ``a.b.c`` chains and names an expression reads (``f(a.b)`` reads ``f`` and ``a.b``)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        code = dotted_name(node)
        if code is not None:
            self.found.append(code)
            return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append(node.value)


def _chains_in(node: cst.CSTNode) -> list[str]:
    chains = _Chains()
    walk(node, chains)
    return chains.found
