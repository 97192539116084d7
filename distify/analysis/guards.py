"""Recognising main-process guards: which ranks see a condition true (used by ``check``; a file
``convert`` rewrites has no guards of its own, since any rank test makes it distributed).

A guard is any test whose truth depends on the process's rank. People write them in many shapes,
all recognised here from the stdlib ``ast`` (no LibCST metadata), with names resolved through the
file's imports and the ``rank_values``, ``rank_env_vars`` and ``guards`` rule-pack categories:

- a rank compared with 0: ``rank == 0``, ``dist.get_rank() == 0``, ``args.local_rank in [-1, 0]``,
  ``int(os.environ["RANK"]) == 0``, ``args.rank % ngpus_per_node == 0``, ``local_rank <= 0``;
- a truth value that means "main process": ``accelerator.is_main_process``,
  ``trainer.is_global_zero``, ``distify.is_main_process()``, ``xm.is_master_ordinal()``;
- a variable or a one-line helper holding either (``is_master = rank == 0``,
  ``def is_main(): return get_rank() == 0``);
- ``not``, ``and`` and ``or`` of those. A condition that is the same on every rank
  (``args.distributed``, ``local_rank == -1``) does not change who passes, so the idioms
  ``not distributed or rank == 0`` and ``rank == 0 and step % 100 == 0`` are main-only tests.

What it deliberately does not do: follow values across files, or through containers and
attributes set outside the file; a rank that reaches a comparison that way is not recognised.
"""

from __future__ import annotations

import ast
import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

from distify.analysis.names import ImportMap, ast_dotted_name


class Matcher(Protocol):
    """The rule packs, or ``distify check``'s cached look-ups in them."""

    def match(self, category: str, name: str | None) -> Any: ...


class Reach(enum.Enum):
    """Which ranks execute some code (or see a condition true)."""

    ALL = "every rank"
    MAIN = "the main process only"
    NOT_MAIN = "every rank but the main process"
    SOME = "only some ranks"


ALL, MAIN, NOT_MAIN, SOME = Reach.ALL, Reach.MAIN, Reach.NOT_MAIN, Reach.SOME


def meet(a: Reach, b: Reach) -> Reach:
    """The ranks in both ``a`` and ``b`` (``ALL`` is neutral; a part of main is still main)."""
    if a is ALL or a is b:
        return b
    if b is ALL:
        return a
    if MAIN in (a, b):
        return MAIN
    return NOT_MAIN if NOT_MAIN in (a, b) else SOME


def join(a: Reach, b: Reach) -> Reach:
    """The ranks in ``a`` or ``b``; a rank-independent condition (``ALL``) is neutral here too."""
    if a is ALL or a is b:
        return b
    if b is ALL:
        return a
    return ALL if {a, b} == {MAIN, NOT_MAIN} else SOME


def complement(a: Reach) -> Reach:
    return {MAIN: NOT_MAIN, NOT_MAIN: MAIN}.get(a, a)


@dataclass(frozen=True)
class Test:
    """Who sees a condition true and who sees it false."""

    true: Reach
    false: Reach

    def negated(self) -> Test:
        return Test(self.false, self.true)


MAIN_TEST = Test(MAIN, NOT_MAIN)
SOME_TEST = Test(SOME, SOME)
_MIRROR = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}
_CASTS = frozenset({"int", "str", "bool"})
_ENV_GETTERS = frozenset({"os.environ.get", "os.getenv"})


@dataclass
class GuardFacts:
    """The guard vocabulary of one file: its rank variables, guard variables and helpers.

    Build it with :meth:`collect`, then ask :meth:`test` about any condition.
    """

    imports: ImportMap
    matcher: Matcher
    rank_names: set[str] = field(default_factory=set)
    guard_names: dict[str, Test] = field(default_factory=dict)
    rank_funcs: set[str] = field(default_factory=set)
    guard_funcs: dict[str, Test] = field(default_factory=dict)

    @classmethod
    def collect(cls, assigns: list[ast.AST], functions: list[ast.AST], imports: ImportMap,
                matcher: Matcher) -> GuardFacts:
        """Learn the file's rank and guard variables (two rounds, so ``a = rank; b = a == 0``).

        Args:
            assigns: the file's ``Assign``/``AnnAssign`` nodes.
            functions: its function definitions (one-line helpers returning a guard count).
            imports: its import table.
            matcher: the rule packs.
        """
        facts = cls(imports, matcher)
        for _ in range(2):
            for node in assigns:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if len(targets) != 1 or node.value is None:
                    continue
                name = ast_dotted_name(targets[0])
                if name:
                    facts._learn(name, node.value, facts.rank_names, facts.guard_names)
            for func in functions:
                last = func.body[-1]
                if isinstance(last, ast.Return) and last.value is not None:
                    facts._learn(func.name, last.value, facts.rank_funcs, facts.guard_funcs)
        return facts

    def _learn(self, name: str, value: ast.expr, ranks: set, guards: dict) -> None:
        if self.is_rank(value):
            ranks.add(name)
            return
        test = self.test(value)
        if test is not None:
            guards[name] = test

    # --- what a value is -------------------------------------------------------------------

    def is_rank(self, expr: ast.expr) -> bool:
        """Whether ``expr`` evaluates to this process's rank (0 on the main process)."""
        expr = _uncast(expr)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            dotted = ast_dotted_name(expr)
            return dotted is not None and (
                dotted in self.rank_names
                or self.matcher.match("rank_values", self.imports.resolve(dotted)) is not None)
        if isinstance(expr, ast.Call):
            dotted = ast_dotted_name(expr.func)
            if dotted is None:
                return False
            if dotted in self.rank_funcs:
                return True
            qualname = self.imports.resolve(dotted)
            if qualname in _ENV_GETTERS:
                return bool(expr.args) and self._is_rank_env(expr.args[0])
            return self.matcher.match("rank_values", qualname) is not None
        if isinstance(expr, ast.Subscript):
            return (self.imports.ast_qualname(expr.value) == "os.environ"
                    and self._is_rank_env(expr.slice))
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
            return self.is_rank(expr.left)
        return False

    def _is_rank_env(self, key: ast.expr) -> bool:
        return (isinstance(key, ast.Constant) and isinstance(key.value, str)
                and self.matcher.match("rank_env_vars", key.value) is not None)

    def test(self, expr: ast.expr) -> Test | None:
        """Who sees ``expr`` true, or None when it does not depend on the rank."""
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            inner = self.test(expr.operand)
            return inner.negated() if inner else None
        if isinstance(expr, ast.BoolOp):
            return self._bool_op(expr)
        if isinstance(expr, ast.Compare):
            return self._compare(expr)
        if self.is_rank(expr):
            return Test(NOT_MAIN, MAIN)  # a non-zero rank is truthy
        return self._guard_value(expr)

    def _bool_op(self, expr: ast.BoolOp) -> Test | None:
        tests = [self.test(value) for value in expr.values]
        if not any(tests):
            return None
        true, false = ALL, ALL
        for test in tests:
            if test is None:
                continue
            if isinstance(expr.op, ast.And):
                true, false = meet(true, test.true), join(false, test.false)
            else:
                true, false = join(true, test.true), meet(false, test.false)
        return Test(true, false) if (true, false) != (ALL, ALL) else None

    def _compare(self, expr: ast.Compare) -> Test | None:
        if len(expr.ops) != 1:
            return None
        left, op, right = expr.left, expr.ops[0], expr.comparators[0]
        if not self.is_rank(left):
            if not self.is_rank(right) or isinstance(op, (ast.In, ast.NotIn)):
                return None
            left, right = right, left
            op = _MIRROR.get(type(op), type(op))()
        if isinstance(op, (ast.In, ast.NotIn)):
            values = _constants(right)
            if values is None:
                return None
            test = _set_test(values)
            return test.negated() if test and isinstance(op, ast.NotIn) else test
        value = _constant(right)
        return None if value is None else _order_test(op, value)

    def _guard_value(self, expr: ast.expr) -> Test | None:
        node = expr.func if isinstance(expr, ast.Call) else expr
        dotted = ast_dotted_name(node)
        if dotted is None:
            return None
        known = (self.guard_funcs if isinstance(expr, ast.Call) else self.guard_names).get(dotted)
        if known is not None:
            return known
        if self.matcher.match("guards", self.imports.resolve(dotted)) is not None:
            return MAIN_TEST
        return None

    def main_operand(self, expr: ast.expr) -> ast.expr | None:
        """The smallest part of a main-only condition that is itself main-only.

        ``rank == 0 and step % 10 == 0`` gives ``rank == 0``: the guard a fix can reuse.
        """
        test = self.test(expr)
        if test is None or test.true is not MAIN:
            return None
        if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.And):
            for value in expr.values:
                inner = self.test(value)
                if inner is not None and inner.true is MAIN:
                    return self.main_operand(value)
        return expr


def _uncast(expr: ast.expr) -> ast.expr:
    while (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name)
           and expr.func.id in _CASTS and len(expr.args) == 1 and not expr.keywords):
        expr = expr.args[0]
    return expr


def _constant(expr: ast.expr) -> int | None:
    """An integer literal, also spelled ``"0"`` (environment values) or ``-1``."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
        inner = _constant(expr.operand)
        return -inner if inner is not None else None
    if isinstance(expr, ast.Constant):
        value = expr.value
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def _constants(expr: ast.expr) -> list[int] | None:
    if not isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
        return None
    values = [_constant(item) for item in expr.elts]
    return None if any(value is None for value in values) else values


def _set_test(values: list[int]) -> Test | None:
    ranks = {value for value in values if value >= 0}  # -1 means "not distributed"
    if not ranks:
        return None
    return MAIN_TEST if ranks == {0} else SOME_TEST


def _order_test(op: ast.cmpop, value: int) -> Test | None:
    """``rank <op> value`` as a test; comparisons with negative numbers are rank-independent."""
    if isinstance(op, (ast.Eq, ast.Is)):
        return None if value < 0 else (MAIN_TEST if value == 0 else SOME_TEST)
    if isinstance(op, (ast.NotEq, ast.IsNot)):
        return None if value < 0 else (MAIN_TEST.negated() if value == 0 else SOME_TEST)
    # Normalise to "rank < bound" (true for ranks below bound) or its negation.
    if isinstance(op, ast.LtE):
        op, value = ast.Lt(), value + 1
    elif isinstance(op, ast.Gt):
        op, value = ast.GtE(), value + 1
    if value <= 0:
        return None
    below = MAIN_TEST if value == 1 else SOME_TEST
    return below if isinstance(op, ast.Lt) else below.negated()
