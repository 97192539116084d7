"""What every rewrite family builds on: the inputs (facts, rules, the runtime's name), the edits
made, the helpers that read the shared bookkeeping (``self.ctx``, :mod:`.context`), the scope
handlers the driver runs first, and what each walk does at each node type
(:meth:`TransformerBase.traversal_step`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import libcst as cst

from distify.analysis.effects import MEMORY_FILES
from distify.analysis.evaluation import is_eval_context
from distify.analysis.facts import FileFacts
from distify.analysis.loaders import is_loaderish, is_loop_wrapper, unwrapped
from distify.analysis.names import dotted_name
from distify.analysis.walk import PUNCTUATION, is_a, own_hook, walk
from distify.convert import traverse
from distify.convert.context import ConvertContext, _Scope
from distify.convert.driver import handles, install
from distify.convert.rewrites import REGISTRY
from distify.convert.starts import StatementStarts
from distify.convert.syntax import _callee, _code, _is_zero, _spans_lines
from distify.rules import RuleSet


@dataclass(frozen=True)
class Edit:
    """One change or one note, attached to a node of the *output* tree (its line comes later)."""

    node: cst.CSTNode
    kind: str
    message: str
    needs_human: bool = False


#: what preparing a model does on several processes (the report's words)
DISTRIBUTED = ("wrapped in DDP when running on several processes (or sharded, when the launch "
               "config says FSDP)")


def _is_count_up(value: cst.BaseExpression, names: list[str]) -> bool:
    """``step = step + 1``: a counter, equal on every process (not data-dependent)."""
    return (len(names) == 1 and type(value) is cst.BinaryOperation
            and type(value.operator) in (cst.Add, cst.Subtract)
            and type(value.left) is cst.Name and value.left.value == names[0]
            and type(value.right) in (cst.Integer, cst.Float))


#: Whitespace, comments and the nodes that hold nothing else: a comma, a dot, an operator, a
#: bracket. No rewrite looks inside them, so the traversal does not descend into them: they are
#: about a third of a module's nodes, and LibCST would rebuild each one unchanged (for speed:
#: ``benchmarks/results/convert.md``). A rewrite may still replace one as a whole.
_PUNCTUATION = PUNCTUATION  # (the same list the read-only walk skips)
#: Names, numbers, strings and bare keywords: they hold nothing but their parentheses (or a
#: semicolon), so the traversal does not descend into them either (a fifth of a module's nodes
#: are names). Their own hooks still run, and a rewrite may replace one as a whole.
_LEAVES = (cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString,
           cst.FormattedStringText, cst.Ellipsis, cst.Pass, cst.Break, cst.Continue)
#: the node types found inside those: hooks for them would never run
_INSIDE_PUNCTUATION = (cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace,
                       cst.EmptyLine, cst.Newline, cst.Comment, cst.LeftParen, cst.RightParen,
                       cst.Semicolon)


class TransformerBase(cst.CSTTransformer):
    """The inputs, results and helpers shared by the rewrite families; ``rt`` is the runtime's
    local name. A subclass with a ``HANDLERS`` table is a driver: its hooks are made from it."""

    # The conversion walks with :func:`distify.convert.traverse.rewrite`, which asks
    # :meth:`traversal_step` what to do at each node type. LibCST's own ``visit`` (the tests
    # compare both walks) goes through :meth:`on_visit` and :meth:`on_leave`, which read the
    # same steps: one decision per node type for both walks.
    #: node type → its :meth:`traversal_step`, made on first use
    _steps: ClassVar[dict[type, tuple]] = {}
    #: the node types whose fields ``on_visit_attribute``/``on_leave_attribute`` must see (the
    #: only ones those hooks act on): the rewriting walk calls them there only
    FIELD_HOOKS: ClassVar[tuple[type, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._steps = {}
        if "HANDLERS" in vars(cls):  # the driver: its hooks come from its table
            install(cls, cls.HANDLERS)
        inside = [f"{prefix}_{kind.__name__}" for kind in _INSIDE_PUNCTUATION
                  for prefix in ("visit", "leave")]
        hooked = [name for name in inside if own_hook(cls, name) is not None]
        if hooked:  # no walk would call them
            raise TypeError(f"{cls.__name__} defines {', '.join(hooked)}: the traversal does not "
                            "descend into punctuation or leaves (see _PUNCTUATION, _LEAVES)")

    def on_visit(self, node: cst.CSTNode) -> bool:
        visit, _, what, _ = self._step(type(node))
        if visit is not None and visit(self, node) is False:
            return False
        return what >= traverse.CHILDREN  # not into punctuation and leaves

    @classmethod
    def _step(cls, kind: type) -> tuple:
        step = cls._steps.get(kind)
        if step is None:
            step = cls._steps[kind] = cls.traversal_step(kind)
        return step

    @classmethod
    def traversal_step(cls, kind: type) -> tuple[Callable | None, Callable | None, int]:
        """What a walk does at a node of type ``kind`` (:func:`distify.convert.traverse.rewrite`
        asks it; :meth:`on_visit` and :meth:`on_leave` read it for LibCST's own ``visit``)."""
        visit = own_hook(cls, f"visit_{kind.__name__}")
        leave = own_hook(cls, f"leave_{kind.__name__}")
        if is_a(kind, (cst.BaseStatement,)):  # may be one of the module's own statements
            hook = visit

            def visit(self: TransformerBase, node: cst.CSTNode) -> bool | None:
                top = self.ctx.top_level.get(id(node))
                if top is not None:
                    self.ctx.current_top = top
                return None if hook is None else hook(self, node)

        inert = traverse.inert_fields(kind, _PUNCTUATION + _LEAVES, cls._hooked_types())
        if not is_a(kind, _PUNCTUATION + _LEAVES):
            what = traverse.FIELDS if kind in cls.FIELD_HOOKS else traverse.CHILDREN
        else:
            what = traverse.SKIP if visit is None and leave is None else traverse.HOOKS_ONLY
        return visit, leave, what, inert

    @classmethod
    def _hooked_types(cls) -> tuple[type, ...]:
        """The node types this class has a visit or leave hook for."""
        found = cls.__dict__.get("_hooked")
        if found is None:
            found = tuple(kind for name in dir(cls) if name.startswith(("visit_", "leave_"))
                          and own_hook(cls, name) is not None
                          for kind in [getattr(cst, name.split("_", 1)[1], None)]
                          if isinstance(kind, type))
            cls._hooked = found
        return found

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):
        leave = self._step(type(original_node))[1]
        return updated_node if leave is None else leave(self, original_node, updated_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None

    def __init__(self, facts: FileFacts, rules: RuleSet, rt: str,
                 skip: frozenset[str] = frozenset(), *,
                 starts: StatementStarts | None = None) -> None:
        super().__init__()
        self.facts = facts
        self.rules = rules
        self.rt = rt
        #: the rewrites turned off (``--skip``; names of :mod:`distify.convert.rewrites`)
        self.skip = skip
        #: the bookkeeping of the module being converted (made anew for each module)
        #: where the parsed module's statement lines start in the source (None: not known)
        self.starts = starts
        self.ctx = ConvertContext()
        self.edits: list[Edit] = []
        #: index of the first top-level statement that runs at import time and uses the
        #: runtime (where its import must already be done); len(body) when there is none
        self.first_touched = sys.maxsize
        self.batch_sizes: list[str] = []
        #: the script manages its own mixed precision (a GradScaler)
        self.own_mixed_precision = False

    def _qual(self, node: cst.BaseExpression) -> str | None:
        quals = self.ctx.quals
        try:
            return quals[node]
        except KeyError:
            found = quals[node] = self.facts.imports.qualname(node)
            return found

    def _rt_attr(self, name: str) -> cst.Attribute:
        return cst.Attribute(value=cst.Name(self.rt), attr=cst.Name(name))

    def _rt_call(self, name: str, *args: cst.BaseExpression) -> cst.Call:
        return cst.Call(func=self._rt_attr(name), args=[cst.Arg(value=a) for a in args])

    def _too_long(self, growth: int) -> bool:
        """Would the statement being rewritten exceed the file's line length if its first line
        grew by ``growth`` characters?"""
        statement = self.ctx.statements[-1] if self.ctx.statements else None
        if type(statement) is not cst.SimpleStatementLine or len(statement.body) > 1:
            # none, a one-line suite, or `a = f(); b = g()`: a break there would read worse
            return False
        if id(statement) not in self.ctx.first_lines:
            # each leading comment or blank line is one line of the code: the statement's own
            # first line comes after them (no copy of the statement without them is made)
            leading = statement.leading_lines
            known = self.starts.first_line(statement) if self.starts else None
            if known is not None:  # as written (the code of an unchanged statement is that)
                self.ctx.first_lines[id(statement)] = known
            elif all(line.newline.value != "\r" for line in leading):
                code = _code(statement).split("\n", len(leading) + 1)[len(leading)]
                self.ctx.first_lines[id(statement)] = len(code)
            else:  # an old Mac line end is no "\n"
                code = _code(statement.with_changes(leading_lines=())).split("\n", 1)[0]
                self.ctx.first_lines[id(statement)] = len(code)
        width = len(self.ctx.indent_unit) * self.ctx.depth + self.ctx.first_lines[id(statement)]
        return width + growth > max(self.facts.longest_line, 79)

    def _holds_line_break(self, node: cst.CSTNode, original: cst.CSTNode | None) -> bool:
        """Does ``node``'s code hold a line break? Without a walk of its nodes when ``node`` is
        ``original``, the node being left, unchanged (a node of the parsed module, inside the
        statement line being left), and that line is written on one line."""
        if node is original and self.starts is not None and self.ctx.statements \
                and self.starts.one_line(self.ctx.statements[-1]):
            return False
        return _spans_lines(node)

    def _hanging(self, call: cst.Call) -> cst.Call:
        """The call with its arguments on the next line, one indent deeper (hanging indent)."""
        return call.with_changes(whitespace_before_args=cst.ParenthesizedWhitespace(
            indent=True, last_line=cst.SimpleWhitespace(self.ctx.indent_unit)))

    def _skipped(self, name: str, node: cst.CSTNode) -> bool:
        """Is rewrite ``name`` turned off? Asked where it would change ``node`` (which stays as
        written): the report then says so on that line, with what the place keeps doing."""
        if name not in self.skip:
            return False
        statement = self.ctx.statements[-1] if self.ctx.statements else node
        if (name, id(statement)) not in self.ctx.skip_sites:  # said once a statement
            self.ctx.skip_sites[name, id(statement)] = statement
            self.edits.append(Edit(node, "skipped", f"rewrite `{name}` skipped: left as "
                                   f"written, so {REGISTRY[name].SKIPPED}", True))
        return True

    def _unless_skipped(self, name: str, node: cst.CSTNode, rewrite: Callable[[], Any]):
        """What ``rewrite()`` (rewrite ``name``) makes of ``node``; or, when that rewrite is
        skipped and it changed something, ``node`` as it was, with the report lines it recorded
        dropped (None, for "nothing changed", is passed on). For rewrites whose only other
        state is bookkeeping about their own output."""
        mark = len(self.edits)
        rewritten = rewrite()
        if rewritten is None or rewritten is node or name not in self.skip:
            return rewritten
        del self.edits[mark:]
        self._skipped(name, node)
        return node

    def _edit(self, node: cst.CSTNode, kind: str, message: str, human: bool = False) -> None:
        self.edits.append(Edit(node, kind, message, human))
        if not human:
            self._touch()

    def _collective_placed(self, call: cst.CSTNode | None = None) -> None:
        """A collective is in the output here (``call``, when given, or a statement the rewrite
        adds): see :class:`~distify.convert.stops.StopMixin`, which may have to decide the test
        of an ``if`` around it."""

    def _touch(self) -> None:
        """The top-level statement being visited now uses the runtime when the module is
        imported (a def or class body runs later): the runtime's import must come first."""
        index, deferred = self.ctx.current_top
        if not deferred:
            self.first_touched = min(self.first_touched, index)

    @handles("visit_IndentedBlock")
    def _base_on_indented_block(self, node: cst.IndentedBlock) -> None:
        self.ctx.depth += 1

    @handles("visit_Module")
    def _base_on_module(self, node: cst.Module) -> None:
        self.ctx = ConvertContext(indent_unit=node.default_indent, top_level={
            id(stmt): (index, type(stmt) in (cst.FunctionDef, cst.ClassDef))
            for index, stmt in enumerate(node.body)})

    @property
    def _scope(self) -> _Scope:
        return self.ctx.scopes[-1]

    def _in_eval(self) -> bool:
        return self.ctx.no_grad_depth > 0 or self._scope.saw_eval or self._scope.no_grad

    def _is_loader_name(self, name: str) -> bool:
        if name in self._scope.loaders or (name in self._scope.params
                                           and self.facts.builds_loaders
                                           and self._may_get_a_loader(name)):
            return True
        return any(name in scope.loaders for scope in self.ctx.scopes[:-1])

    def _may_get_a_loader(self, param: str) -> bool:
        """Can the current function's parameter ``param`` hold a DataLoader? Not where every
        call of the function in this file passes something else there (``corpus_bleu(refs,
        hyps)`` called with lists); yes where one passes a loader, or no call here binds it."""
        function = self.ctx.path[-1] if self.ctx.path else ""
        filled = self.facts.loader_params.get(function)
        return filled is None or param in filled

    def _loaderish(self, node: cst.BaseExpression) -> bool:
        """Is ``node`` a DataLoader, or ``enumerate``/``tqdm``/``zip`` over one? (see
        :func:`~distify.analysis.loaders.is_loaderish`; names bound here are known)"""
        return is_loaderish(node, self._qual, known=self._is_loader_name,
                            builds=self._builds_loader)

    def _builds_loader(self, callee: str | None) -> bool:
        return self.rules.match("dataloaders", callee) is not None

    def _note_loader_view(self, names: list[str] | set[str], value: cst.BaseExpression) -> None:
        """``bar = tqdm(train_loader)``, ``it = iter(loader)``, ``with tqdm(loader) as bar``: the
        names are views of the loader, and a loop over one is a loop over the loader."""
        if type(value) is cst.Call and is_loop_wrapper(self._qual(value.func)) \
                and self._loaderish(value):
            source = dotted_name(unwrapped(value, self._qual))
            self._scope.loaders.update(names)
            if source is not None:
                self._scope.loader_views.update(dict.fromkeys(names, source))

    def _loader_behind(self, name: str | None) -> str | None:
        """The loader a view (``bar = tqdm(train_loader)``) shows, else ``name``."""
        for _ in range(8):  # views of views: `it = iter(enumerate(bar))`
            source = next((scope.loader_views[name] for scope in reversed(self.ctx.scopes)
                           if name in scope.loader_views), None)
            if source is None:
                return name
            name = source
        return name

    def _iterates_a_loader(self, node: cst.BaseExpression) -> bool:
        """``iter(train_loader)``: an iterator over a DataLoader."""
        return (type(node) is cst.Call and dotted_name(node.func) == "iter"
                and len(node.args) == 1 and self._loaderish(node.args[0].value))

    def _draws_from_a_loader(self, call: cst.Call) -> bool:
        """``next(batches)`` of an iterator over a DataLoader, or ``next(iter(loader))``."""
        if dotted_name(call.func) != "next" or not call.args:
            return False
        source = call.args[0].value
        if type(source) is cst.Name:
            return any(source.value in scope.loader_iters for scope in self.ctx.scopes)
        return self._iterates_a_loader(source)

    @handles("visit_ClassDef")
    def _base_on_class_def(self, node: cst.ClassDef) -> None:
        self.ctx.classes.append(node.name.value in self.facts.model_classes)
        self.ctx.path.append(node.name.value)

    @handles("leave_ClassDef")
    def _base_after_class_def(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
        self.ctx.classes.pop()
        self.ctx.path.pop()
        return updated

    @handles("visit_FunctionDef")
    def _base_on_function_def(self, node: cst.FunctionDef) -> None:
        scope = _Scope()
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            scope.params.add(param.name.value)
        scope.no_grad = any(is_eval_context(self.rules, self._qual(_callee(d.decorator)))
                            for d in node.decorators)
        self.ctx.scopes.append(scope)
        self.ctx.path.append(node.name.value)
        self.ctx.loops_saved.append(self.ctx.loops)
        self.ctx.loops = []

    @handles("leave_FunctionDef")
    def _base_after_function_def(self, original: cst.FunctionDef,
                                 updated: cst.FunctionDef) -> cst.FunctionDef:
        self.ctx.scopes.pop()
        self.ctx.path.pop()
        self.ctx.loops = self.ctx.loops_saved.pop()
        return updated

    def _holds_optimizer_state(self, node: cst.BaseExpression) -> bool:
        """Does ``node`` hold an optimizer's ``state_dict()`` (a training-state checkpoint:
        ``{"model": ..., "optimizer": optimizer.state_dict(), "epoch": epoch}``)?"""
        if type(node) is cst.Name:
            return node.value in self._scope.training_states
        optimizers = {name for by_scope in self.facts.training.optimizer_models.values()
                      for name in by_scope}
        finder = _StateDictReceivers()
        walk(node, finder)
        return bool(finder.receivers & optimizers)

    @handles("visit_Assign")
    def _base_on_assign(self, node: cst.Assign) -> None:
        value = node.value
        names = [t.target.value for t in node.targets if type(t.target) is cst.Name]
        # a name bound anew (`model = torch.load(f)`) holds an object nobody prepared yet
        self._scope.prepared_models.difference_update(names)
        if type(value) is cst.Call and self.rules.match("dataloaders", self._qual(value.func)):
            self._scope.loaders.update(names)
        if type(value) is cst.Call and self.rules.match("samplers", self._qual(value.func)):
            self._scope.samplers.update(names)
        if _is_zero(value):
            self._scope.zero_inits.update(names)
            for loop in self.ctx.loops:
                loop.resets.update(names)
        if type(value) is cst.List and not value.elements:
            self._scope.lists.update(names)
        if type(value) is cst.Dict and self._holds_optimizer_state(value):
            self._scope.training_states.update(names)
        if self._iterates_a_loader(value):
            self._scope.loader_iters.update(names)
        self._note_loader_view(names, value)
        if type(value) is cst.Call and self._qual(value.func) in MEMORY_FILES:
            self._scope.buffers.update(names)
        if type(value) is cst.Call and (dotted_name(value.func) or "").endswith("Meter"):
            self._scope.meters.update(names)
        for target in node.targets:
            if type(target.target) is cst.Tuple and type(value) is cst.Tuple:
                for elem, val in zip(target.target.elements, value.elements):
                    if type(elem.value) is cst.Name and _is_zero(val.value):
                        self._scope.zero_inits.add(elem.value.value)
                    if type(elem.value) is cst.Name and type(val.value) is cst.List \
                            and not val.value.elements:
                        self._scope.lists.add(elem.value.value)
        if self.ctx.loops and not _is_count_up(value, names):
            for name in names:
                self.ctx.loops[-1].assigned.add(name)
        for target in node.targets:
            self._count_assignment(target.target)

    def _count_assignment(self, target: cst.BaseExpression) -> None:
        """Defined by the model rewrites (:mod:`.models`)."""

    def _in_model_class(self) -> bool:
        return bool(self.ctx.classes) and self.ctx.classes[-1]


class _StateDictReceivers(cst.CSTVisitor):
    """The dotted names whose ``.state_dict()`` an expression calls."""

    def __init__(self) -> None:
        self.receivers: set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Attribute and func.attr.value == "state_dict":
            name = dotted_name(func.value)
            if name is not None:
                self.receivers.add(name)
