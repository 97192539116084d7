"""DST203: a test on a per-process value that decides whether a collective runs, or when a
training loop ends."""

from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from distify.analysis.loaders import is_loaderish
from distify.analysis.names import dotted_name
from distify.analysis.stops import FileFunctions, NestContext, Stop, find_stops
from distify.lint.rule import Invalid, LintRule, Valid


class DataDependentCollective(LintRule):
    """A test on a value that differs between processes decides whether a collective runs, or
    when a training loop ends: the processes decide differently and the job hangs.

    In a script that runs on the distify runtime, each process computes its own losses and
    rewards from its own batches. ``if loss.item() < 0.5: accuracy = evaluate(...)``, where
    ``evaluate`` reduces its sums over the processes, runs the reduce on the processes whose loss
    is under 0.5 only, and they wait for the others forever; ``if loss.item() < 1e-3: break``
    leaves the training loop on some processes while the others wait in DDP's next gradient
    all-reduce. So does ``if not math.isfinite(loss.item()): continue`` before the backward (the
    process that skips it leaves the others in the all-reduce), and ``sys.exit`` in a function
    the training loop calls (``sanity_check(batch)``): the test there is reported at its line.
    The same holds for a collective after a ``continue`` only some processes take, or in an
    exception handler. An ``if`` on such a value whose branch changes the optimizer's work
    (``optimizer.step()``, ``zero_grad()``, an in-place change of the weights or of
    ``param_groups``) does not hang, but the processes that take it train their replicas
    apart: it is reported too.

    This is the analysis ``distify convert`` uses to place its collectives (the values that
    differ between processes are followed through the loop: batches, model outputs, losses,
    what is computed from them; not step counters, settings, or what ``distify.reduce`` or a
    reduced ``evaluate()`` returns). The fix is the one ``convert`` makes: decide the test on a
    value every process agrees on, ``if distify.reduce(loss.item(), op="mean") < 0.5:`` (``op=
    "max"`` for a batch's largest value), or ``distify.any_process(...)`` for a test that is not
    one comparison, a ``continue`` and a ``sys.exit``. Checked in files that import the distify
    runtime; no automatic fix.
    """

    CODE = "DST203"
    MESSAGE = "a test on a per-process value decides a collective or an exit: the job can hang"

    VALID = (
        Valid("""
            import distify.runtime as distify

            for epoch in range(10):
                for x, y in train_loader:
                    loss = model(x).sum()
                    distify.backward(loss)
                if distify.reduce(loss.item(), op="mean") < 0.5:
                    print(distify.reduce(correct))
                if epoch % 5 == 0:
                    total = distify.reduce(total)
        """),
        Valid("""
            import distify.runtime as distify

            for x, y in train_loader:
                loss = model(x).sum()
                distify.backward(loss)
                if loss.item() > 10:
                    print("large loss", loss.item())
        """),
        Valid("""
            import math
            import sys
            import torch
            import distify.runtime as distify

            def sanity_check(batch):
                if distify.any_process(torch.isnan(batch).any()):
                    sys.exit(0)

            for x, y in train_loader:
                sanity_check(x)
                if distify.reduce(x.abs().max(), op="max") > 100:
                    sys.exit("input out of range")
                loss = model(x).sum()
                if distify.any_process(not math.isfinite(loss.item())):
                    continue
                distify.backward(loss)
                if loss.item() > 10:
                    continue
        """),
    )
    INVALID = (
        Invalid("""
            import distify.runtime as distify

            def evaluate():
                correct = 0
                return distify.reduce(correct)

            for epoch in range(10):
                for x, y in train_loader:
                    loss = model(x).sum()
                    distify.backward(loss)
                if loss.item() < 0.5:
                    accuracy = evaluate()
        """, line=11),
        Invalid("""
            import distify.runtime as distify

            for x, y in train_loader:
                loss = model(x).sum()
                distify.backward(loss)
                if loss.item() < 1e-3:
                    break
        """, line=6),
        Invalid("""
            import torch
            import distify.runtime as distify

            for step, (x, y) in enumerate(train_loader):
                loss = model(x).sum()
                try:
                    check(loss)
                except ValueError:
                    continue
                distify.backward(loss)
                if step % 100 == 0:
                    distify.wait_for_everyone()
        """, line=12),
        Invalid("""
            import math
            import distify.runtime as distify

            for x, y in train_loader:
                loss = model(x).sum()
                if not math.isfinite(loss.item()):
                    continue
                distify.backward(loss)
        """, line=6),
        Invalid("""
            import sys
            import torch
            import distify.runtime as distify

            def sanity_check(batch):
                if torch.isnan(batch).any():
                    print("bad batch")
                    sys.exit(0)

            for x, y in train_loader:
                sanity_check(x)
                distify.backward(model(x).sum())
        """, line=6),
        Invalid("""
            import sys
            import distify.runtime as distify

            for x, y in train_loader:
                if x.abs().max() > 100:
                    sys.exit("input out of range")
                distify.backward(model(x).sum())
        """, line=5),
    )

    def finish(self) -> None:
        rt = self.ctx.runtime_alias()
        if rt is None or b"if" not in self.ctx.source:
            return
        try:
            wrapper = MetadataWrapper(cst.parse_module(self.ctx.source))
        except cst.ParserSyntaxError:
            return  # `ast` read it; a LibCST parser gap is not the user's problem
        positions = wrapper.resolve(PositionProvider)
        module = wrapper.module
        shapes = _Shapes()
        module.visit(shapes)
        context = _Context(self, rt, shapes)
        statements = {}
        for node in ast.walk(self.ctx.tree):
            if isinstance(node, ast.stmt):
                statements.setdefault(node.lineno, node)
        reported = set()
        for loop in shapes.nests:
            for stop in find_stops(loop, context.nest):
                line = positions[stop.node].start.line
                node = statements.get(line)
                if node is not None and line not in reported:  # a helper's, once
                    reported.add(line)
                    self.report(node, context.message(stop))


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
        backward = (isinstance(func, cst.Attribute) and func.attr.value == "backward") or (
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
            call = " ".join(cst.Module([]).code_for_node(stop.collective).split()) \
                if stop.collective is not None else "a collective"
            return (f"`if {test}:` {reads}, and its branch leads to `{call}`, which every "
                    f"process must join: the processes that skip it leave the others waiting "
                    f"(a hang); {fix}" + (f" where all of them reach it ({stop.why})"
                                           if stop.action == "note" else ""))
        where = f" (in `{stop.function}`, which a training loop calls)" if stop.function \
            else ""
        if stop.kind == "work":
            what = " ".join(cst.Module([]).code_for_node(stop.collective).split()) \
                if stop.collective is not None else "a step"
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
