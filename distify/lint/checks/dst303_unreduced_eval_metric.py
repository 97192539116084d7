"""DST303: an evaluation metric from one rank's shard, printed or logged as if it were global."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from distify.analysis.evaluation import EVAL_FUNCTION_NAME, is_eval_context, switches_to_eval
from distify.analysis.names import ast_dotted_name
from distify.lint.checks._wrappers import Wrappers
from distify.lint.rule import Invalid, LintRule, Valid


@dataclass
class _Loop:
    node: ast.For
    function: ast.AST | None
    accumulators: set[str] = field(default_factory=set)
    gathers: bool = False


class UnreducedEvalMetric(LintRule):
    """An evaluation metric accumulated over a sharded loader is printed or logged unreduced.

    A DataLoader with a ``DistributedSampler`` (or prepared by ``accelerator.prepare`` /
    ``distify.prepare``) gives each rank its own shard, so ``correct += ...`` in the evaluation
    loop counts one shard: the printed accuracy is rank 0's, not the model's. Reduce it first
    (``dist.all_reduce``, ``accelerator.reduce``, ``distify.reduce``) or gather the predictions
    (``accelerator.gather_for_metrics``, ``distify.gather_for_metrics``) inside the loop.

    An evaluation loop is a ``for`` over a sharded loader (directly, through ``enumerate`` /
    ``tqdm``, or as a parameter that some call in the file passes one to) inside
    ``torch.no_grad()`` / ``inference_mode()``, after ``model.eval()``, or in a function named
    like ``evaluate`` / ``test`` / ``validate``. It is not reported when the loop gathers, or
    when any collective follows the loop in the same function. No fix.
    """

    CODE = "DST303"
    MESSAGE = ("`{name}` is accumulated over the sharded loader at line {line} and {verb} "
               "without a reduce or gather: each rank reports its own shard's value")

    VALID = (
        Valid("""
            import torch
            import torch.distributed as dist

            @torch.no_grad()
            def evaluate(model, loader):
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                t = torch.tensor(correct)
                dist.all_reduce(t)
                print(f"accuracy {t.item() / len(loader.dataset):.3f}")

            sampler = torch.utils.data.DistributedSampler(val_set, shuffle=False)
            evaluate(model, torch.utils.data.DataLoader(val_set, sampler=sampler))
        """),
        Valid("""
            from accelerate import Accelerator

            accelerator = Accelerator()
            model, eval_loader = accelerator.prepare(model, eval_loader)
            model.eval()
            correct = 0
            for batch in eval_loader:
                preds, labels = accelerator.gather_for_metrics((model(batch).argmax(-1), batch.y))
                correct += (preds == labels).sum().item()
            accelerator.print(correct / len(eval_loader.dataset))
        """),
    )
    INVALID = (
        Invalid("""
            import torch
            from torch.utils.data import DataLoader, DistributedSampler

            test_loader = DataLoader(test_set, sampler=DistributedSampler(test_set))

            def test(model, loader):
                model.eval()
                correct = 0
                with torch.no_grad():
                    for data, target in loader:
                        correct += model(data).argmax(1).eq(target).sum().item()
                accuracy = 100.0 * correct / len(loader.dataset)
                print(f"Test accuracy: {accuracy:.1f}%")

            test(model, test_loader)
        """, line=13),
        Invalid("""
            import distify.runtime as distify

            model, val_loader = distify.prepare(model, val_loader)
            model.eval()
            total_loss = 0.0
            for batch in val_loader:
                total_loss += model(batch).loss.item()
            distify.print("val loss", total_loss / len(val_loader))
        """, line=8),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.wrappers = Wrappers(ctx)
        self.samplers: set[str] = set()
        self.sharded: set[str] = set()
        self.loops: list[_Loop] = []
        self.active: list[_Loop] = []
        self.eval_depth = 0
        self.eval_lines: dict[ast.AST | None, list[int]] = {}
        self.collectives: dict[ast.AST | None, list[int]] = {}
        self.logs: list[tuple[ast.Call, ast.AST | None]] = []
        self.derived: list[tuple[ast.AST | None, str, ast.expr]] = []
        self.calls: dict[str, list[ast.Call]] = {}

    # --- what is sharded ------------------------------------------------------------------

    def visit_Assign(self, node: ast.Assign) -> None:
        self.wrappers.learn(node)
        if len(node.targets) != 1:
            return
        target, value = node.targets[0], node.value
        name = ast_dotted_name(target)
        if name:
            self.derived.append((self.ctx.function, name, value))
        if not isinstance(value, ast.Call):
            return
        callee = self.ctx.callee(value)
        if self.ctx.match("distributed_samplers", callee) and name:
            self.samplers.add(name)
        elif self.ctx.match("dataloaders", callee) and name and self._sharding(value):
            self.sharded.add(name)
        elif self.wrappers.prepare_receiver(value) is not None:
            targets = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
            self.sharded.update(filter(None, map(ast_dotted_name, targets)))

    def _sharding(self, call: ast.Call) -> bool:
        for keyword in call.keywords:
            if keyword.arg == "sampler":
                value = keyword.value
                return (ast_dotted_name(value) in self.samplers or (
                    isinstance(value, ast.Call)
                    and self.ctx.match("distributed_samplers", self.ctx.callee(value))))
        return False

    # --- evaluation loops -----------------------------------------------------------------

    def visit_With(self, node: ast.With) -> None:
        if any(self._eval_context(item.context_expr) for item in node.items):
            self.eval_depth += 1

    def leave_With(self, node: ast.With) -> None:
        if any(self._eval_context(item.context_expr) for item in node.items):
            self.eval_depth -= 1

    def _eval_context(self, expr: ast.expr) -> bool:
        target = expr.func if isinstance(expr, ast.Call) else expr
        return is_eval_context(self.ctx.matcher, self.ctx.loose_qualname(target))

    def visit_For(self, node: ast.For) -> None:
        function = self.ctx.function
        if self.active and self.active[-1].function is function:
            return  # only the outermost evaluation loop of a function accumulates
        if self._in_eval(node, function):
            loop = _Loop(node, function)
            self.loops.append(loop)
            self.active.append(loop)

    def leave_For(self, node: ast.For) -> None:
        if self.active and self.active[-1].node is node:
            self.active.pop()

    def _in_eval(self, node: ast.For, function: ast.AST | None) -> bool:
        if self.eval_depth:
            return True
        if function is not None:
            if EVAL_FUNCTION_NAME.search(function.name):
                return True
            for decorator in function.decorator_list:
                if self._eval_context(decorator):
                    return True
        return any(line < node.lineno for line in self.eval_lines.get(function, ()))

    def _iterates_sharded(self, expr: ast.expr, function: ast.AST | None) -> bool:
        # through any call, not only analysis.loaders' wrappers: a sum over
        # `islice(val_loader, n)` or `map(f, val_loader)` is still one shard's
        while isinstance(expr, ast.Call) and expr.args:
            expr = expr.args[0]  # enumerate(tqdm(loader))
        name = ast_dotted_name(expr)
        if name in self.sharded:
            return True
        return function is not None and self._sharded_parameter(name, function)

    def _sharded_parameter(self, name: str | None, function: ast.AST) -> bool:
        params = [arg.arg for arg in function.args.args]
        if name not in params:
            return False
        index = params.index(name)
        for call in self.calls.get(function.name, ()):
            offset = 1 if isinstance(call.func, ast.Attribute) and params[:1] == ["self"] else 0
            args = {index - offset: arg for index, arg in enumerate(call.args)}
            args.update({params.index(kw.arg): kw.value for kw in call.keywords
                         if kw.arg in params})
            if ast_dotted_name(args.get(index)) in self.sharded:
                return True
        return False

    # --- accumulation, reduction, logging -------------------------------------------------

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if self.active and self.active[-1].function is self.ctx.function and isinstance(
                node.op, (ast.Add, ast.Sub)):
            name = ast_dotted_name(node.target)
            if name:
                self.active[-1].accumulators.add(name)

    def visit_Call(self, node: ast.Call) -> None:
        ctx, function = self.ctx, self.ctx.function
        callee = ctx.callee(node)
        func = node.func
        if isinstance(func, (ast.Name, ast.Attribute)):
            short = func.id if isinstance(func, ast.Name) else func.attr
            if short in ctx.function_names:
                self.calls.setdefault(short, []).append(node)
            values = [arg.value if isinstance(arg, ast.Constant) else arg for arg in node.args]
            if isinstance(func, ast.Attribute) and switches_to_eval(short, values):
                self.eval_lines.setdefault(function, []).append(node.lineno)
        if ctx.match("collectives", callee):
            if self.active and self.active[-1].function is function:
                self.active[-1].gathers = True
            else:
                self.collectives.setdefault(function, []).append(node.lineno)
        elif ctx.match("loggers", callee) and not (self.active
                                                    and self.active[-1].function is function):
            self.logs.append((node, function))

    def finish(self) -> None:
        for loop in self.loops:
            if loop.gathers or not loop.accumulators:
                continue
            if not self._iterates_sharded(loop.node.iter, loop.function):
                continue
            end = loop.node.end_lineno
            if any(line > end for line in self.collectives.get(loop.function, ())):
                continue
            tainted = {name: name for name in loop.accumulators}
            for function, target, value in self.derived:
                if function is loop.function and value.lineno > end:
                    used = _names(value)
                    source = next((tainted[name] for name in used if name in tainted), None)
                    if source is not None:
                        tainted.setdefault(target, source)
            for call, function in self.logs:
                if function is not loop.function or call.lineno <= end:
                    continue
                hit = sorted(tainted[name] for name in _names(call) if name in tainted)
                if hit:
                    verb = "printed" if "print" in (self.ctx.callee(call) or "") else "logged"
                    self.report(call, self.MESSAGE.format(name=hit[0], line=loop.node.lineno,
                                                          verb=verb))


def _names(node: ast.AST) -> dict[str, None]:
    """The dotted names in ``node``, in a fixed order (the walk's), as the keys of a dict: the
    finding names the first tainted one, and a set's order would change with the hash seed."""
    found: dict[str, None] = {}
    for child in ast.walk(node):
        if isinstance(child, (ast.Name, ast.Attribute)):
            name = ast_dotted_name(child)
            if name:
                found[name] = None
    return found
