"""Token streams laid out in columns and sliced along time (batchify/BPTT), found over the
whole module before the rewrite (after the cheap test of :mod:`.bptt`).

pytorch/examples' word_language_model trains without a DataLoader: ``batchify(data, bsz)``
reshapes one long token stream into ``bsz`` columns (``data.view(bsz, -1).t()``), and the
training loop slices windows along the time axis (``source[i:i+seq_len]``, usually through a
``get_batch(source, i)`` helper). Every rank would train on the same windows. This pass says
which streams the rewrite (:mod:`distify.convert.bptt`) may split over the processes:

- a **batchify function**: one that reshapes a parameter (or a local computed from it, such as
  ``data = data.narrow(0, 0, n)``) with another parameter as one of two dimensions:
  ``.view(bsz, -1)``, ``.reshape(bsz, n)``, ``.view(-1, bsz)``;
- a **training stream**: a plain name assigned a batchify call's result
  (``train_data = batchify(corpus.train, args.batch_size)``, maybe moved: ``.to(device)``)
  whose every use is a length (``len(x)``, ``x.size(0)``, ``x.shape``) or feeds training:
  sliced in a loop with a ``backward``, handed in such a loop to a function that only slices
  that parameter (``get_batch``), or handed to a function whose parameter is used that way
  (``train(train_data)``). Its batchify call's data argument is to be sharded
  (:attr:`StreamFlow.shard`);
- a stream that feeds training but is **also used otherwise** (``evaluate(train_data)``, a
  method called on it, a lambda reading it): not sharded, since that use may want the whole
  stream; reported (:attr:`StreamFlow.mixed`);
- the other batchify results (validation and test streams): left whole on every process
  (:attr:`StreamFlow.whole`), so whatever is computed from them is the single-process value;
- the **fed backwards**: the ``backward`` calls of loops that slice a sharded stream.

What it deliberately does not follow: a stream stored on an attribute (``self.train_data``), a
batchify call whose result is not assigned to a plain name or whose arguments are starred, a
batchify defined in another module or more than once, methods (``self.get_batch``). Those
streams stay as written, and a training loop fed by one keeps the converter's note that it is
not fed by a DataLoader. Names are resolved by scope (parameters, local assignments,
``global``), not by flow: a name assigned twice in one scope is one variable.

Nodes are the *original* LibCST nodes, by identity (the module stays alive during the rewrite).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from distify.analysis.bptt import RESHAPES
from distify.analysis.names import dotted_name
from distify.analysis.walk import walk

#: what a use may read of a stream without taking its data: its length, shape, place
_LENGTH_ATTRS = frozenset({"size", "shape", "ndim", "dim", "numel", "dtype", "device"})
#: methods that move a stream without changing what it holds (``x = x.to(device)``)
_MOVES = frozenset({"to", "cuda", "cpu", "contiguous", "long", "int", "pin_memory"})
#: the runtime call a converted data argument goes through
SHARD_CALL = "shard_stream"

# what a use of a name does with it, and what a parameter's uses add up to
_NEUTRAL, _SLICE, _TRAIN, _OTHER, _ARG = "neutral", "slice", "train", "other", "arg"


@dataclass
class StreamFlow:
    #: id of a batchify call whose data argument is to be sharded → (the indexes in the call
    #: of that argument and of the batch size)
    shard: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: ids of batchify calls whose data argument is sharded already → the batch size's code
    sharded: dict[int, str] = field(default_factory=dict)
    #: id of a batchify call feeding training that is not sharded → (the stream's name, the
    #: code of a use that is not training)
    mixed: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: the names of the batchify results that are not trained on (kept whole), in source order
    whole: list[str] = field(default_factory=list)
    #: ids of the backward calls of loops that slice a sharded stream
    fed_backwards: set[int] = field(default_factory=set)


def find_streams(module: cst.Module) -> StreamFlow:
    finder = _Finder()
    walk(module, finder)
    return _Answer(finder).result()


@dataclass(eq=False)
class _Loop:
    has_backward: bool = False


@dataclass(eq=False)
class _Scope:
    name: str | None
    parent: _Scope | None
    params: list[str] = field(default_factory=list)  # the positional ones, in order
    bound: set[str] = field(default_factory=set)
    declared_global: set[str] = field(default_factory=set)
    #: local name → the name its value was computed from (``trimmed = data[:n]``)
    derived: dict[str, str] = field(default_factory=dict)
    #: (the reshaped value's root name, the parameter used as a dimension)
    reshapes: list[tuple[str, str]] = field(default_factory=list)
    loops: list[_Loop] = field(default_factory=list)

    def binding(self, name: str) -> _Scope:
        """The scope whose variable ``name`` is, seen from here (the module's by default)."""
        scope: _Scope | None = self
        while scope is not None and name not in scope.declared_global:
            if name in scope.bound or scope.parent is None:
                return scope
            scope = scope.parent
        top = self
        while top.parent is not None:
            top = top.parent
        return top


@dataclass(eq=False)
class _Use:
    name: str
    scope: _Scope
    loops: tuple[_Loop, ...]
    kind: str  # _NEUTRAL (a length), _SLICE, _OTHER, or _ARG
    node: cst.CSTNode  # what to quote in a report
    callee: str | None = None  # for _ARG: the function it is handed to
    position: int | str | None = None  # and its index there, or keyword


class _Finder(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.scope = _Scope(None, None)
        self.functions: dict[str, list[_Scope]] = {}
        self.uses: list[_Use] = []
        #: (target name, the call whose result it holds, the scope) for ``name = f(...)``
        self.assigned: list[tuple[str, cst.Call, _Scope]] = []
        self.backwards: list[tuple[cst.Call, tuple[_Loop, ...]]] = []
        self._skip: set[int] = set()  # Name nodes that are not reads (targets, attributes)
        self._kinds: dict[int, tuple] = {}  # Name node → how its parent uses it
        self._context: cst.CSTNode | None = None  # the statement (or header) being read
        self._in_class: list[bool] = [False]  # is the innermost def or class a class?
        self._lambdas: list[cst.Lambda] = []  # the lambdas being read

    # ------------------------------------------------------------ scopes and bindings
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._bind(node.name)
        scope = _Scope(node.name.value, self.scope)
        params = node.params
        scope.params = [p.name.value for p in (*params.posonly_params, *params.params)]
        for param in (*params.posonly_params, *params.params, *params.kwonly_params,
                      params.star_arg, params.star_kwarg):
            if type(param) is cst.Param:
                scope.bound.add(param.name.value)
                self._skip.add(id(param.name))
        if not self._in_class[-1]:  # a method is called on its object: not followed
            self.functions.setdefault(node.name.value, []).append(scope)
        self.scope = scope
        self._in_class.append(False)

    def leave_FunctionDef(self, original: cst.FunctionDef) -> None:
        assert self.scope.parent is not None
        self.scope = self.scope.parent
        self._in_class.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._bind(node.name)
        self._in_class.append(True)

    def leave_ClassDef(self, original: cst.ClassDef) -> None:
        self._in_class.pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        # it runs later, maybe elsewhere: whatever it reads is used otherwise
        self._lambdas.append(node)
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params,
                      params.star_arg, params.star_kwarg):
            if type(param) is cst.Param:
                self._skip.add(id(param.name))

    def leave_Lambda(self, original: cst.Lambda) -> None:
        self._lambdas.pop()

    def visit_Import(self, node: cst.Import) -> bool:
        for alias in node.names:
            name = alias.asname.name if alias.asname else alias.name
            while type(name) is cst.Attribute:
                name = name.value
            if type(name) is cst.Name:
                self.scope.bound.add(name.value)
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if type(node.names) is not cst.ImportStar:
            for alias in node.names:
                name = alias.asname.name if alias.asname else alias.name
                if type(name) is cst.Name:
                    self.scope.bound.add(name.value)
        return False

    def visit_Global(self, node: cst.Global) -> bool:
        self.scope.declared_global.update(item.name.value for item in node.names)
        return False

    def visit_Nonlocal(self, node: cst.Nonlocal) -> bool:
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._bind_target(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if type(node.target) is cst.Name:  # read and written: not a plain use
            self._use(node.target.value, _OTHER, node)
            self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind_target(node.target)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind_target(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind_target(node.name)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind_target(node.target, bind=False)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._skip.add(id(node.attr))
        if type(node.value) is cst.Name and node.attr.value in _LENGTH_ATTRS:
            self._kinds[id(node.value)] = (_NEUTRAL, node)

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._skip.add(id(node.keyword))

    def _bind(self, name: cst.Name) -> None:
        self.scope.bound.add(name.value)
        self._skip.add(id(name))

    def _bind_target(self, target: cst.BaseExpression, bind: bool = True) -> None:
        if type(target) is cst.Name:
            if bind:
                self.scope.bound.add(target.value)
            self._skip.add(id(target))
        elif type(target) in (cst.Tuple, cst.List):
            for element in target.elements:
                self._bind_target(element.value, bind)
        elif type(target) is cst.StarredElement:
            self._bind_target(target.value, bind)

    # ------------------------------------------------------------ statements and loops
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._context = node

    def visit_For(self, node: cst.For) -> None:
        self._context = node.iter
        self._bind_target(node.target)
        self.scope.loops.append(_Loop())

    def leave_For(self, original: cst.For) -> None:
        self.scope.loops.pop()

    def visit_While(self, node: cst.While) -> None:
        self._context = node.test
        self.scope.loops.append(_Loop())

    def leave_While(self, original: cst.While) -> None:
        self.scope.loops.pop()

    def visit_If(self, node: cst.If) -> None:
        self._context = node.test

    # ------------------------------------------------------------ what is done with names
    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1 or type(node.targets[0].target) is not cst.Name:
            return
        name = node.targets[0].target.value
        value = node.value
        moved = _moved(value)
        if type(moved) is cst.Name and moved.value == name:
            self._kinds[id(moved)] = (_NEUTRAL, node)  # `x = x.to(device)`: still the stream
        root = _root_name(value)
        if root is not None and root != name:
            self.scope.derived[name] = root
        if type(moved) is cst.Call and type(moved.func) is cst.Name:
            self.assigned.append((name, moved, self.scope))
            for arg in moved.args:  # `train_data = batchify(train_data, n)`: the old value
                if type(arg.value) is cst.Name and arg.value.value == name:
                    self._kinds[id(arg.value)] = (_NEUTRAL, node)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if type(node.value) is cst.Name and any(
                type(element.slice) is cst.Slice for element in node.slice):
            self._kinds[id(node.value)] = (_SLICE, node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Attribute:
            if func.attr.value == "backward":
                loops = tuple(self.scope.loops)
                for loop in loops:
                    loop.has_backward = True
                self.backwards.append((node, loops))
            elif func.attr.value in RESHAPES:
                self._reshape(node, func)
            return
        if type(func) is not cst.Name:
            return
        if func.value == "len" and len(node.args) == 1:
            self._kinds[id(node.args[0].value)] = (_NEUTRAL, node)
            return
        for index, arg in enumerate(node.args):
            if type(arg.value) is cst.Name and not arg.star:
                position = arg.keyword.value if arg.keyword is not None else index
                self._kinds.setdefault(id(arg.value), (_ARG, node, func.value, position))

    def _reshape(self, node: cst.Call, func: cst.Attribute) -> None:
        values = [arg.value for arg in node.args]
        if len(values) == 1 and type(values[0]) in (cst.Tuple, cst.List):
            dims = [element.value for element in values[0].elements]
        elif all(arg.keyword is None and not arg.star for arg in node.args):
            dims = values
        else:
            return
        root = _root_name(func.value)
        if len(dims) != 2 or root is None:
            return
        for dim in dims:
            if type(dim) is cst.Name and dim.value in self.scope.params \
                    and dim.value != root:
                self.scope.reshapes.append((root, dim.value))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) in self._skip:
            return
        kind = self._kinds.get(id(node))
        if kind is None:
            self._use(node.value, _OTHER, self._context or node)
        elif kind[0] == _ARG:
            _, call, callee, position = kind
            self._use(node.value, _ARG, call, callee, position)
        else:
            self._use(node.value, kind[0], kind[1])

    def _use(self, name: str, kind: str, node: cst.CSTNode, callee: str | None = None,
             position: int | str | None = None) -> None:
        if self._lambdas:
            kind, node = _OTHER, self._lambdas[0]
        self.uses.append(_Use(name, self.scope, tuple(self.scope.loops), kind, node, callee,
                              position))


class _Answer:
    """What the uses add up to, once the whole module was seen."""

    def __init__(self, finder: _Finder) -> None:
        self.finder = finder
        #: functions defined once (which one runs is then no guess)
        self.functions = {name: scopes[0] for name, scopes in finder.functions.items()
                          if len(scopes) == 1}
        #: (id of the binding scope, name) → its uses
        self.uses: dict[tuple[int, str], list[_Use]] = {}
        for use in finder.uses:
            self.uses.setdefault((id(use.scope.binding(use.name)), use.name), []).append(use)
        self.param_kinds = self._param_kinds()

    def _callee_param(self, use: _Use) -> tuple[_Scope, str] | None:
        callee = self.functions.get(use.callee or "") if use.kind == _ARG else None
        if callee is None:
            return None
        position = use.position
        if isinstance(position, int):
            param = callee.params[position] if position < len(callee.params) else None
        else:
            param = position if position in callee.params else None
        return (callee, param) if param is not None else None

    def _site_kind(self, use: _Use, kinds: dict[tuple[int, str], str]) -> str:
        """What one use does: a length, a slice, training, or something else."""
        kind = use.kind
        if kind == _ARG:
            target = self._callee_param(use)
            kind = _OTHER if target is None else kinds.get(
                (id(target[0]), target[1]), _NEUTRAL)
        if kind == _SLICE and any(loop.has_backward for loop in use.loops):
            return _TRAIN
        return kind

    def _combined(self, uses: list[_Use], kinds: dict[tuple[int, str], str]) -> str:
        found = {self._site_kind(use, kinds) for use in uses} - {_NEUTRAL}
        if not found:
            return _NEUTRAL
        return found.pop() if len(found) == 1 else _OTHER

    def _param_kinds(self) -> dict[tuple[int, str], str]:
        """What each function does with each positional parameter over all its uses: only
        slices it (``get_batch``), trains on it (``train``), only reads its length, or else."""
        kinds: dict[tuple[int, str], str] = {}
        for _ in range(len(self.functions) + 1):  # helpers calling helpers: until it settles
            new = {(id(scope), param): self._combined(self.uses.get((id(scope), param), []),
                                                      kinds)
                   for scope in self.functions.values() for param in scope.params}
            if new == kinds:
                break
            kinds = new
        return kinds

    def _batchify_functions(self) -> dict[str, tuple[int, int]]:
        """Function name → (its data parameter's index, its batch size parameter's index)."""
        found = {}
        for name, scope in self.functions.items():
            for root, dim in scope.reshapes:
                seen = set()
                while root not in scope.params and root in scope.derived and root not in seen:
                    seen.add(root)
                    root = scope.derived[root]
                if root in scope.params and root != dim:
                    found[name] = (scope.params.index(root), scope.params.index(dim))
                    break
        return found

    def result(self) -> StreamFlow:
        flow = StreamFlow()
        batchify = self._batchify_functions()
        fed: set[tuple[int, str]] = set()
        for name, call, scope in self.finder.assigned:
            where = batchify.get(call.func.value)  # type: ignore[attr-defined]
            if where is None:
                continue
            definition = self.functions[call.func.value]  # type: ignore[attr-defined]
            data, size = (_argument(call, definition, index) for index in where)
            if data is None or size is None:
                continue
            key = (id(scope), name)
            uses = self.uses.get(key, [])
            kinds = [self._site_kind(use, self.param_kinds) for use in uses]
            if _TRAIN not in kinds:
                if name not in flow.whole:
                    flow.whole.append(name)
                continue
            if _is_shard_call(data.value):
                flow.sharded[id(call)] = _code(size.value)
            elif _OTHER in kinds or _SLICE in kinds:
                other = next(use for use, kind in zip(uses, kinds) if kind in (_OTHER, _SLICE))
                flow.mixed[id(call)] = (name, _quote(other.node))
                continue
            else:
                flow.shard[id(call)] = (_index(call, data), _index(call, size))
            fed.add(key)
        flow.fed_backwards = self._fed_backwards(fed)
        return flow

    def _fed_backwards(self, fed: set[tuple[int, str]]) -> set[int]:
        """The backward calls of loops that slice a sharded stream, directly or through the
        functions it is handed to (``train(train_data)`` → ``get_batch(source, i)``)."""
        loops: set[int] = set()
        todo = list(fed)
        while todo:
            for use in self.uses.get(todo.pop(), []):
                if self._site_kind(use, self.param_kinds) != _TRAIN:
                    continue
                target = self._callee_param(use)
                passed = (id(target[0]), target[1]) if target is not None else None
                if passed is not None and self.param_kinds.get(passed) == _TRAIN:
                    if passed not in fed:  # trained on in there
                        fed.add(passed)
                        todo.append(passed)
                else:  # sliced here, in a loop that trains
                    loops.update(id(loop) for loop in use.loops if loop.has_backward)
        return {id(call) for call, around in self.finder.backwards
                if any(id(loop) in loops for loop in around)}


def _argument(call: cst.Call, definition: _Scope, index: int) -> cst.Arg | None:
    """The argument of ``call`` bound to the definition's ``index``-th parameter (None when
    missing or behind a star)."""
    if any(arg.star for arg in call.args):
        return None
    positional = [arg for arg in call.args if arg.keyword is None]
    if index < len(positional):
        return positional[index]
    name = definition.params[index]
    return next((arg for arg in call.args if arg.keyword and arg.keyword.value == name), None)


def _index(call: cst.Call, arg: cst.Arg) -> int:
    return next(index for index, each in enumerate(call.args) if each is arg)


def _moved(node: cst.BaseExpression) -> cst.BaseExpression:
    """``batchify(x, n)`` for ``batchify(x, n).to(device).contiguous()``."""
    while type(node) is cst.Call and type(node.func) is cst.Attribute \
            and node.func.attr.value in _MOVES:
        node = node.func.value
    return node


def _is_shard_call(node: cst.BaseExpression) -> bool:
    return type(node) is cst.Call and \
        (dotted_name(node.func) or "").rsplit(".", 1)[-1] == SHARD_CALL


def _root_name(node: cst.BaseExpression) -> str | None:
    """``data`` in ``data``, ``data[:n]``, ``data.narrow(0, 0, n).view(bsz, -1)``."""
    while type(node) in (cst.Call, cst.Attribute, cst.Subscript):
        node = node.func if type(node) is cst.Call else node.value
    return node.value if type(node) is cst.Name else None


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _quote(node: cst.CSTNode) -> str:
    """The first line of ``node``'s code, shortened for a report."""
    code = _code(node).strip()
    first = code.split("\n", 1)[0]
    return first if len(first) <= 60 and first == code else first[:57].rstrip() + "..."
