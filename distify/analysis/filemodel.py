"""One model of a file, built once per file, that ``convert`` and ``check`` both read.

A :class:`FileModel` is made from the file's stdlib ``ast`` tree, its bytes and the rule packs.
Every part is computed the first time something reads it, and kept:

- :attr:`~FileModel.statements`: one walk of the statement blocks (never into expressions)
  gives every statement in source order and, among them, the assignments, the function and
  class definitions and the imports;
- :attr:`~FileModel.imports`: the import table (:class:`~.names.ImportMap`), from those imports;
- :attr:`~FileModel.module_names`: the names module-level statements and imports bind;
- :attr:`~FileModel.parallel`: whether the file is already distributed or multi-process;
- :attr:`~FileModel.guards`: its rank and guard vocabulary (:class:`~.guards.GuardFacts`);
- :attr:`~FileModel.facts`: the whole-file facts a conversion reads
  (:class:`~.facts.FileFacts`: names bound and read, loaders, seeds, the training flow of
  :mod:`~.training`, the evaluation flow, ...), in one walk of every node.

``check`` reads the statements, the import table, the module names, the guards and the
parallelism, and never pays for the whole-node walk; ``convert`` reads the facts, whose walk
reuses the statements and the import table (and finds the parallelism on the way when nothing
asked for it before). :attr:`FileModel.computed` lists the parts computed so far, in order;
:func:`observe` calls a function with every model built while it is active (tests count them).

What it does not hold yet: DST305's model flow (:func:`~.wrapping.model_flow`, its own walk
with the import table of this model), the random-draw pre-test of the facts
(:func:`~.draws.may_draw_batches`, a walk that keeps a loop stack) and the project-level
analyses (:mod:`~.project`, which parse the files a project's imports reach on their own).
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from distify.analysis import parallelism
from distify.analysis.astwalk import iter_preorder, iter_walk
from distify.analysis.names import ImportMap, statements

if TYPE_CHECKING:
    from distify.analysis.facts import FileFacts
    from distify.analysis.guards import GuardFacts
    from distify.analysis.training import Training
    from distify.rules import RuleSet

_FUNCTION_TYPES = (ast.FunctionDef, ast.AsyncFunctionDef)
#: a file whose bytes hold none of these trains nothing; the walk of every node goes depth
#: first in source order through a file that may train (the training analysis needs that
#: order), breadth first through any other
_TRAINING_WORDS = (b"backward", b"optim", b".step(")

_observers: list[Callable[[FileModel], None]] = []


class _Matches(Protocol):
    def match(self, category: str, name: str | None) -> Any: ...


@dataclass
class Statements:
    """The file's statements, from one walk of its statement blocks, each list in source
    order."""

    #: every statement, and every except handler and match case (nodes holding a block)
    all: list[ast.AST] = field(default_factory=list)
    #: ``Assign`` and ``AnnAssign`` statements
    assignments: list[ast.Assign | ast.AnnAssign] = field(default_factory=list)
    functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=list)
    classes: list[ast.ClassDef] = field(default_factory=list)
    #: ``Import`` and ``ImportFrom`` statements
    imports: list[ast.Import | ast.ImportFrom] = field(default_factory=list)


def _part(method: Callable[[FileModel], Any]) -> cached_property:
    """A part of the model: computed on first read (recorded in :attr:`FileModel.computed`),
    then kept."""
    name = method.__name__

    def compute(self: FileModel) -> Any:
        self.computed.append(name)
        return method(self)

    compute.__name__, compute.__doc__ = name, method.__doc__
    return cached_property(compute)


class FileModel:
    """The analysis of one file (see the module's documentation).

    Args:
        tree: the file's ``ast`` (:func:`~.facts.parse_ast`).
        source: its bytes.
        rules: the rule packs.
        matcher: what answers ``match`` questions (``check``'s cached
            :class:`~distify.lint.matcher.Matcher`); the rule packs by default.
    """

    def __init__(self, tree: ast.Module, source: bytes, rules: RuleSet,
                 matcher: _Matches | None = None) -> None:
        self.tree = tree
        self.source = source
        self.rules = rules
        self.matcher: _Matches = matcher if matcher is not None else rules
        #: the parts computed so far, in the order they were first asked for
        self.computed: list[str] = []
        for observer in _observers:
            observer(self)

    @cached_property
    def may_train(self) -> bool:
        """The bytes hold a word every training step spells (a cheap test before any walk)."""
        return any(word in self.source for word in _TRAINING_WORDS)

    @_part
    def statements(self) -> Statements:
        """See :class:`Statements`: statements nest only in statement blocks, so their walk
        (:func:`~.names.statements`) never enters an expression (several times cheaper than a
        walk of every node)."""
        found = Statements(statements(self.tree))
        assignments, functions = found.assignments, found.functions
        classes, imports = found.classes, found.imports
        for node in found.all:
            kind = type(node)
            if kind is ast.Assign or kind is ast.AnnAssign:
                assignments.append(node)
            elif kind is ast.Import or kind is ast.ImportFrom:
                imports.append(node)
            elif kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
                functions.append(node)
            elif kind is ast.ClassDef:
                classes.append(node)
        return found

    @_part
    def imports(self) -> ImportMap:
        """The import table, from every import statement of the file."""
        return ImportMap.from_imports(self.statements.imports)

    @property
    def assignments(self) -> list[ast.Assign | ast.AnnAssign]:
        return self.statements.assignments

    @property
    def functions(self) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
        return self.statements.functions

    @_part
    def module_names(self) -> frozenset[str]:
        """Names bound at module level: by module-level statements (not inside functions or
        classes defined there) and by every import."""
        names: set[str] = set()
        store = ast.Store
        for stmt in self.tree.body:
            if isinstance(stmt, (*_FUNCTION_TYPES, ast.ClassDef)):
                names.add(stmt.name)
                continue
            for node in iter_walk(stmt):
                if type(node) is ast.Name and type(node.ctx) is store:
                    names.add(node.id)
        names.update(self.imports.aliases)
        return frozenset(names)

    @_part
    def parallel(self) -> parallelism.Parallelism | None:
        """Whether (and why) the file is already distributed or multi-process, or None.

        The nodes are searched in the order of the whole-file walk of :attr:`facts` (which
        finds it on the way when it runs first): the same answer, line and all, whichever
        part is read first."""
        if not any(hint in self.source for hint in parallelism.HINTS):
            return None
        finder = parallelism.Finder(self.imports, self.matcher)
        seen = parallelism.SEEN  # the markers read a few node types: not the rest
        for node in (iter_preorder if self.may_train else iter_walk)(self.tree):
            if type(node) in seen:
                finder.see(node)
                if finder.done:
                    break
        return finder.result()

    @_part
    def guards(self) -> GuardFacts:
        """The file's rank variables, guard variables and guard helpers."""
        from distify.analysis.guards import GuardFacts

        return GuardFacts.collect(self.assignments, self.functions, self.imports, self.matcher)

    @_part
    def facts(self) -> FileFacts:
        """The whole-file facts a conversion reads (one walk of every node)."""
        from distify.analysis.facts import convert_facts

        return convert_facts(self)

    @property
    def training(self) -> Training:
        """What the file's optimizers and backward passes train (part of :attr:`facts`)."""
        return self.facts.training

    def knows(self, part: str) -> bool:
        """Whether ``part`` has been computed already."""
        return part in self.__dict__

    def give(self, part: str, value: Any) -> None:
        """Record ``part`` as computed (by another part's walk that found it on the way)."""
        self.computed.append(part)
        self.__dict__[part] = value


@contextlib.contextmanager
def observe(callback: Callable[[FileModel], None]) -> Iterator[None]:
    """Call ``callback`` with every :class:`FileModel` built inside the ``with`` block."""
    _observers.append(callback)
    try:
        yield
    finally:
        _observers.remove(callback)
