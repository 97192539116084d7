"""DST203's reading of a file with LibCST (:mod:`distify.analysis.stops`, the analysis
``distify convert`` places its collectives with), apart from the rule's module so that
``distify check`` imports LibCST only for a file that runs on the distify runtime."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from distify.analysis.loaders import is_loaderish
from distify.analysis.names import dotted_name
from distify.analysis.stops import FileFunctions, NestContext, Stop, find_stops

if TYPE_CHECKING:
    from distify.lint.checks.dst203_data_dependent_collective import DataDependentCollective


def report_stops(rule: DataDependentCollective, rt: str) -> None:
    """Report each test on a per-process value that decides a collective or an exit."""
    try:
        wrapper = MetadataWrapper(cst.parse_module(rule.ctx.source))
    except cst.ParserSyntaxError:
        return  # `ast` read it; a LibCST parser gap is not the user's problem
    positions = wrapper.resolve(PositionProvider)
    module = wrapper.module
    shapes = _Shapes()
    module.visit(shapes)
    context = _Context(rule, rt, shapes)
    statements = {}  # line → the first statement on it (the file's model has them in order)
    for node in rule.ctx.model.statements.all:
        if isinstance(node, ast.stmt):
            statements.setdefault(node.lineno, node)
    reported = set()
    try:
        for loop in shapes.nests:
            for stop in find_stops(loop, context.nest):
                line = positions[stop.node].start.line
                node = statements.get(line)
                if node is not None and line not in reported:  # a helper's, once
                    reported.add(line)
                    rule.report(node, context.message(stop))
    finally:
        # the questions refer back to the context (its own methods): without them, it and
        # the file's LibCST tree are freed now, not left in a cycle for the garbage collector
        context.nest = None


class _Shapes(cst.CSTVisitor):
    """The module's functions (by name; ``None`` for a name defined twice), the outermost loop
    of each function and of the module, and the loops that iterate a loader."""

    def __init__(self) -> None:
        super().__init__()
        self.functions: dict[str, cst.FunctionDef | None] = {}
        self.nests: list[cst.For | cst.While] = []
        self.trainers: set[str] = set()
        self._depth = [0]
        self._function: list[str] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        name = node.name.value
        self.functions[name] = None if name in self.functions else node
        self._depth.append(0)
        self._function.append(name)

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._depth.pop()
        self._function.pop()

    def _enter(self, node: cst.For | cst.While) -> None:
        if self._depth[-1] == 0:
            self.nests.append(node)
        self._depth[-1] += 1

    def _leave(self) -> None:
        self._depth[-1] -= 1

    def visit_For(self, node: cst.For) -> None:
        self._enter(node)

    def leave_For(self, node: cst.For) -> None:
        self._leave()

    def visit_While(self, node: cst.While) -> None:
        self._enter(node)

    def leave_While(self, node: cst.While) -> None:
        self._leave()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        backward = (type(func) is cst.Attribute and func.attr.value == "backward") or (
            (dotted_name(func) or "").endswith(".backward"))
        if backward and self._function:
            self.trainers.add(self._function[-1])


class _Context:
    """What :func:`find_stops` asks about the file, answered from the file alone."""

    def __init__(self, rule: DataDependentCollective, rt: str, shapes: _Shapes) -> None:
        self.rule = rule
        self.rt = rt
        functions = FileFunctions(rt, shapes.functions)
        ctx = rule.ctx
        self.nest = NestContext(
            rt=rt, qual=lambda node: ctx.imports.cst_loose_qualname(node),
            is_loader=self.is_loader, is_exit=self.is_exit,
            is_imported=ctx.imports.aliases.__contains__,
            training_functions=frozenset(shapes.trainers),
            agrees=lambda name: functions.agrees(name, self.nest),
            collective=functions.collective,
            exiting=lambda name: functions.exiting(name, self.is_exit),
            ends=lambda call: functions.ends(call, self.is_exit))

    def is_loader(self, node: cst.BaseExpression) -> bool:
        """:func:`~distify.analysis.loaders.is_loaderish`, as convert asks it (without the
        names its scopes bind)."""
        ctx = self.rule.ctx
        return is_loaderish(node, lambda func: ctx.imports.resolve(dotted_name(func)),
                            builds=lambda callee: ctx.match("dataloaders", callee) is not None)

    def is_exit(self, call: cst.Call) -> bool:
        name = self.rule.ctx.imports.cst_loose_qualname(call.func)
        return self.rule.ctx.match("process_exits", name) is not None

    def message(self, stop: Stop) -> str:
        test = " ".join(cst.Module([]).code_for_node(stop.test).split())
        verb = "differ" if len(stop.names) > 1 else "differs"
        reads = (f"reads {', '.join(f'`{n}`' for n in stop.names)}, which {verb} between "
                 "processes" if stop.names else "differs between processes")
        fix = (f"decide it on a value every process agrees on (`{self.rt}.reduce(x, "
               f"op=\"mean\")`, `{self.rt}.any_process(...)`)")
        if stop.action == "reduce" and stop.operand is not None:
            operand = " ".join(cst.Module([]).code_for_node(stop.operand).split())
            fix = (f"decide it on a value every process agrees on, as `distify convert` "
                   f"does: `{self.rt}.reduce({operand}, op=\"{stop.op}\")` in the test")
        elif stop.action in ("any", "all"):
            helper = "any_process" if stop.action == "any" else "all_processes"
            fix = (f"decide it on a value every process agrees on, as `distify convert` does: "
                   f"`{self.rt}.{helper}({test})`")
        if stop.kind == "site":
            return (f"`{test}` needs every process (a collective) but only some may reach it: "
                    f"{stop.why}; the others never join it and the job hangs")
        if stop.kind == "gate":
            call = _one_line(stop.collective, "a collective")
            return (f"`if {test}:` {reads}, and its branch leads to `{call}`, which every "
                    f"process must join: the processes that skip it leave the others waiting "
                    f"(a hang); {fix}" + (f" where all of them reach it ({stop.why})"
                                           if stop.action == "note" else ""))
        where = f" (in `{stop.function}`, which a training loop calls)" if stop.function \
            else ""
        if stop.kind == "work":
            what = _one_line(stop.collective, "a step")
            return (f"`if {test}:` {reads}, and a branch of it changes the optimizer's work "
                    f"(`{what}`): processes that decide differently train their replicas "
                    f"apart; {fix}" + (f" where all of them reach it ({stop.why})"
                                       if stop.action == "note" else ""))
        if stop.how == "continue":
            return (f"`{test}` {reads}, and its `continue` skips the rest of a training step: a "
                    f"process that skips alone leaves the others waiting in the gradient "
                    f"all-reduce (a hang); {fix}"
                    + (f" where all of them reach it ({stop.why})" if stop.action == "note"
                       else ""))
        ends = "ends the process" if stop.how == "exit" else "ends a training loop"
        return (f"`{test}`{where} {reads}, and it {ends}: a process that leaves alone "
                f"leaves the others waiting in the next gradient all-reduce (a hang); {fix}"
                + (f" where all of them reach it ({stop.why})" if stop.action == "note"
                   else ""))


def _one_line(node: cst.CSTNode | None, default: str) -> str:
    """``node``'s code on one line (runs of white space made one space), or ``default``."""
    return " ".join(cst.Module([]).code_for_node(node).split()) if node is not None else default
