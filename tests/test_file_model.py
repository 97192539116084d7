"""One model of a file: the converter and the lints read the analysis' answers
(``distify/analysis/``) instead of deriving them again (issue 23, item 2)."""

from __future__ import annotations

import ast
import textwrap

from distify.analysis import facts as facts_module
from distify.analysis import wrapping
from distify.analysis.names import ImportMap
from distify.rules import default_rules


def test_model_classes_is_one_public_answer_for_facts_and_wrapping() -> None:
    tree = ast.parse("import torch.nn as nn\n"
                     "class Big(Small):\n    pass\n"
                     "class Small(nn.Module):\n    pass\n"
                     "class Config:\n    pass\n")
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    found = facts_module.model_classes(classes, ImportMap.from_ast(tree), default_rules())
    assert found == {"Big", "Small"}  # a subclass of a local model, defined before its base
    assert wrapping.model_classes is facts_module.model_classes


_COUNTED = """\
import torch
from torch.utils.data import DataLoader

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(torch.randn(64, 4), batch_size=8)
{counter} = 0
for x in loader:
    loss = model(x).sum()
    loss.backward()
    optimizer.step()
    {counter} += x.numel()
"""


def _counter_walks(monkeypatch, source: str) -> tuple[list[str], list[str]]:
    """The throughput notes of ``source``'s conversion, and the counter walks it made."""
    from distify.convert import accumulation
    from distify.convert.engine import convert_source

    walks: list[str] = []
    real = accumulation.counter_lines

    def counting(*args, **kwargs):
        walks.append("walk")
        return real(*args, **kwargs)

    monkeypatch.setattr(accumulation, "counter_lines", counting)
    result = convert_source(source.encode(), "train.py")
    return [c.message for c in result.changes if c.kind == "throughput"], walks


def test_the_counter_walk_runs_only_when_the_file_binds_a_counters_name(monkeypatch) -> None:
    notes, walks = _counter_walks(monkeypatch, _COUNTED.format(counter="num_tokens"))
    assert walks == ["walk"] and len(notes) == 1 and "`num_tokens`" in notes[0]
    notes, walks = _counter_walks(monkeypatch, _COUNTED.format(counter="total"))
    assert walks == [] and notes == []  # `total` names no counter: nothing to find, no walk


def _training(source: str):
    from distify.analysis.facts import gather_facts, parse_ast

    data = textwrap.dedent(source).encode()
    return gather_facts(parse_ast(data, "t.py"), data, default_rules()).training


def test_the_analysis_keys_plain_tensor_backwards_by_scope_and_ordinal() -> None:
    training = _training("""\
        import torch
        import torch.nn as nn

        def train(model, x):
            model(x).sum().backward()
            w = torch.randn(3, requires_grad=True)
            (w * w).sum().backward()

        class Policy(nn.Module):
            def finish(self):
                losses = []
                losses.append(self.saved.pop())
                loss = torch.cat(losses).sum()
                loss.backward()

        a = torch.tensor(2., requires_grad=True)
        (a ** 2).backward()
        """)
    assert training.tensor_only == {("train",): {1}, (): {0}}
    assert sorted(training.tensor_only_backwards) == [7, 17]  # the loss's line


def test_a_demo_tensor_reassigned_later_in_the_file_is_plain_where_it_is_used() -> None:
    """pytorch-tutorial's pytorch_basics: `x` is a torch tensor above `y.backward()` and a
    NumPy array 60 lines further down; the backward differentiates plain tensors (it was
    rewritten to `distify.backward(y)` when every assignment of `x` in the file counted)."""
    training = _training("""\
        import numpy as np
        import torch

        x = torch.tensor(1., requires_grad=True)
        w = torch.tensor(2., requires_grad=True)
        y = w * x + 3
        y.backward()
        print(x.grad)

        x = np.array([[1, 2], [3, 4]])
        y = torch.from_numpy(x)
        """)
    assert training.tensor_only == {(): {0}}
    assert not _training("""\
        import torch
        x = load_something()
        y = (x * 2).sum()
        y.backward()
        x = torch.tensor(1., requires_grad=True)
        """).tensor_only  # what is above the use decides: not a tensor the file made

def test_the_converter_reads_the_analysis_answer_for_a_long_plain_chain() -> None:
    """The autograd tutorial's chain (`x` → `y` → `z` → `out`, seven steps back to
    `torch.ones`) trained by an optimizer: the engine and the rewrite used to answer apart
    (the rewrite followed six steps and sent the plain loss through the runtime, which refuses
    it at two processes); now both read the analysis: the backward stays plain, and no note
    asks which model computes a loss that no model computes."""
    from distify.convert.engine import convert_source

    source = textwrap.dedent("""\
        import torch

        x = torch.ones(2, 2, requires_grad=True)
        y = x + 2
        z = y * y * 3
        out = z.mean()
        out.backward()
        opt = torch.optim.SGD([x], lr=0.1)
        opt.step()
        """)
    result = convert_source(source.encode(), "t.py")
    out = result.output.decode()
    assert result.status == "converted" and "\nout.backward()\n" in out
    assert [c.line for c in result.changes if "plain tensors" in c.message] == \
        [out.splitlines().index("out.backward()") + 1]
    assert not [n for n in result.notes if n.kind == "model"]


def test_the_rewrite_counts_backwards_per_scope_as_the_analysis_does() -> None:
    """A plain backward after a model's in one function, and before one in another: the k-th
    `.backward(` of each scope is the analysis' k-th."""
    from distify.convert.engine import convert_source

    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn

        def train(model, opt, x):
            model(x).sum().backward()
            opt.step()
            w = torch.randn(3, requires_grad=True)
            (w * w).sum().backward()

        def demo(model, opt, x):
            v = torch.zeros(2, requires_grad=True)
            v.exp().sum().backward()
            model(x).sum().backward()
            opt.step()

        net = nn.Linear(3, 1)
        train(net, torch.optim.SGD(net.parameters(), lr=0.1), torch.randn(4, 3))
        """)
    out = convert_source(source.encode(), "t.py").output.decode()
    assert "distify.backward(model(x).sum())" in out
    assert out.count("distify.backward(model(x).sum())") == 2
    assert "\n    (w * w).sum().backward()\n" in out and "\n    v.exp().sum().backward()\n" in out


def test_a_leaf_updated_from_its_own_gradient_stays_a_plain_tensor() -> None:
    """The polynomial-fit tutorial: `a -= learning_rate * a.grad` under no_grad updates the
    leaf in place; the script trains no model and is left alone. A loss that adds a model's
    output in place (`loss += model(x).sum()`) is no plain tensor."""
    from distify.convert.engine import convert_source

    source = textwrap.dedent("""\
        import math
        import torch

        x = torch.linspace(-math.pi, math.pi, 2000)
        y = torch.sin(x)
        a = torch.randn((), requires_grad=True)
        b = torch.randn((), requires_grad=True)
        learning_rate = 1e-6
        for t in range(2000):
            y_pred = a + b * x
            loss = (y_pred - y).pow(2).sum()
            loss.backward()
            with torch.no_grad():
                a -= learning_rate * a.grad
                b -= learning_rate * b.grad
                a.grad = None
                b.grad = None
        """)
    result = convert_source(source.encode(), "fit.py")
    assert result.status == "unchanged" and "plain tensors" in result.reason
    assert _training(source).tensor_only == {(): {0}}
    assert _training("""\
        import torch
        model = torch.nn.Linear(2, 1)
        loss = torch.zeros(1)
        loss += model(torch.randn(3, 2)).sum()
        loss.backward()
        """).tensor_only == {}


def test_the_loss_of_torch_autograd_backward_is_its_argument() -> None:
    plain = _training("""\
        import torch
        w = torch.tensor(2., requires_grad=True)
        torch.autograd.backward(w * w)
        """)
    assert plain.tensor_only == {(): {0}} and plain.trains_no_model
    model = _training("""\
        import torch
        model = torch.nn.Linear(2, 1)
        torch.autograd.backward(model(torch.ones(2)).sum())
        """)
    assert model.tensor_only == {} and model.build_sites  # `model` is found from its loss


def test_a_name_about_loaders_is_one_test_for_both_trees() -> None:
    import libcst as cst

    from distify.analysis.loaders import is_loaderish, names_a_loader

    spellings = ["train_loader", "self.val_DataLoader", "loaders", "self.dl", "loader_cfg.x",
                 "batches", "self.loader.dataset"]
    for spelling in spellings:
        says = names_a_loader(spelling)
        assert is_loaderish(ast.parse(spelling, mode="eval").body, lambda f: None) == says
        assert is_loaderish(cst.parse_expression(spelling), lambda f: None) == says, spelling
    assert [s for s in spellings if names_a_loader(s)] == [
        "train_loader", "self.val_DataLoader", "loaders"]


def test_the_facts_name_the_loaders_and_their_iterators_in_source_order() -> None:
    """What accumulation's micro-steps and the throughput counters read (they walked the
    module for it themselves). No backward here: the facts' walk is breadth first, and
    `it = iter(train_loader)` at the top level is met before the function that builds
    `train_loader` above it."""
    from distify.analysis.facts import gather_facts, parse_ast

    data = textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader as DL

        def build(ds):
            global train_loader
            train_loader = DL(ds, batch_size=4)

        class Trainer:
            def __init__(self, ds):
                self.val = DL(ds)

        it = iter(train_loader)
        early = iter(late)
        late = DL(torch.arange(8))
        other = iter(range(3))
        """).encode()
    facts = gather_facts(parse_ast(data, "t.py"), data, default_rules())
    assert facts.loader_targets == {"train_loader", "self.val", "late"}
    assert facts.loader_iterators == {"it"}


def test_a_tangle_of_reassigned_names_is_followed_within_a_budget() -> None:
    """Four names reassigned from each other 40 times: following every assignment of every
    name took 93 s on it; the step budget answers at once (not plain: too tangled to tell)."""
    import time

    lines = ["import torch", "a = torch.ones(2, requires_grad=True)", "b = a * 2",
             "c = b * 2", "d = c * 2"]
    for _ in range(40):
        lines += ["a = b * c + d", "b = c * d + a", "c = d * a + b", "d = a * b + c"]
    lines += ["loss = (a * b * c * d).sum()", "loss.backward()"]
    start = time.perf_counter()
    training = _training("\n".join(lines) + "\n")
    assert time.perf_counter() - start < 10
    assert training.tensor_only == {} and training.backward_count == 1



_NESTED = """\
import torch
import torch.nn as nn

net = nn.Linear(2, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1)


class Runner:
    def run(self):
        def inner():
            w = torch.ones(2, requires_grad=True)
            (w * 3).sum().backward()
            net(torch.ones(2)).sum().backward()
        inner()
        net(torch.ones(2)).sum().backward()
        v = torch.zeros(1, requires_grad=True)
        (v + 1).sum().backward()

    async def arun(self):
        net(torch.ones(2)).sum().backward()
        u = torch.ones(1, requires_grad=True)
        go = lambda: (u * 2).sum().backward()
        go()


q = torch.ones(1, requires_grad=True)
for step in range(2):
    [(q * k).sum().backward() for k in range(2)]
    net(torch.ones(2)).sum().backward()
    opt.step()
"""


def test_nested_defs_async_defs_lambdas_and_comprehensions_count_alike() -> None:
    """The rewrite's scope path and ordinal meet the analysis' everywhere a backward can be:
    the plain ones (nested def, method, lambda) stay as written, the model's go through the
    runtime, a comprehension's `(q * k)` (k is no tensor the file makes) too; and no plain
    one is noted as a loss whose model cannot be found."""
    from distify.convert.engine import convert_source

    result = convert_source(_NESTED.encode(), "t.py")
    out = result.output.decode().splitlines()
    plain = [c.line for c in result.changes if "plain tensors" in c.message]
    assert [out[n - 1].strip() for n in plain] == [
        "(w * 3).sum().backward()", "(v + 1).sum().backward()",
        "go = lambda: (u * 2).sum().backward()"]
    assert sum("distify.backward(" in line for line in out) == 5
    assert not [n for n in result.notes if n.kind == "model"]


# --- one model per file, read by both commands ------------------------------------------------

_CHECKED = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

rank = dist.get_rank()
is_main = rank == 0
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(torch.randn(64, 4), batch_size=8)
for x in loader:
    model(x).sum().backward()
    optimizer.step()
if is_main:
    torch.save(model.state_dict(), "m.pt")
torch.save(model.state_dict(), "every.pt")
"""


def _fixture_sources() -> list[tuple[str, bytes]]:
    from tests.helpers import FIXTURES

    found = []
    for path in sorted(FIXTURES.rglob("*.py")):
        data = path.read_bytes()
        try:
            ast.parse(data)
        except (SyntaxError, ValueError):
            continue  # a fixture of a parse error
        found.append((str(path.relative_to(FIXTURES)), data))
    return found


def _lint_options(check_all: bool = True):
    from distify.lint.engine import LintOptions
    from distify.lint.matcher import Matcher
    from distify.lint.registry import all_codes

    return LintOptions(Matcher(default_rules()), tuple(all_codes()), check_all)


def test_each_command_builds_one_model_per_file_and_computes_each_part_once() -> None:
    from distify.analysis.filemodel import observe
    from distify.convert.engine import convert_source
    from distify.lint.engine import lint_source

    source = _CHECKED.replace("import torch.distributed as dist\n", "").replace(
        "rank = dist.get_rank()\nis_main = rank == 0\n", "").replace("if is_main:\n    ", "")
    converted = []
    with observe(converted.append):
        result = convert_source(source.encode(), "train.py")
    assert result.status == "converted"
    assert len(converted) == 1
    parts = converted[0].computed
    assert len(parts) == len(set(parts)), parts  # nothing computed twice
    assert {"statements", "imports", "facts"} <= set(parts)

    checked = []
    with observe(checked.append):
        found = lint_source(_CHECKED.encode(), "train.py", _lint_options(check_all=False))
    assert ("DST101", 15) in [(f.code, f.line) for f in found.findings]
    assert len(checked) == 1
    parts = checked[0].computed
    assert len(parts) == len(set(parts)), parts
    assert {"statements", "imports", "parallel", "guards"} <= set(parts)


def test_check_does_not_compute_the_conversions_facts_nor_convert_the_guards() -> None:
    """Laziness: each command pays only for the parts it reads (check never walks every
    node for the training flow; convert never learns guards or module-level names)."""
    from distify.analysis.filemodel import observe
    from distify.convert.engine import convert_source
    from distify.lint.engine import lint_source

    models = []
    with observe(models.append):
        lint_source(_CHECKED.encode(), "train.py", _lint_options())
    assert not models[0].knows("facts") and "facts" not in models[0].computed
    models.clear()
    with observe(models.append):
        convert_source(_CHECKED.encode(), "train.py")
    assert models[0].knows("facts") and models[0].training.backward_count == 1
    assert not models[0].knows("guards") and not models[0].knows("module_names")


def test_both_commands_read_the_same_tables_of_one_model() -> None:
    from distify.analysis.facts import parse_ast
    from distify.analysis.filemodel import FileModel
    from distify.lint.engine import FileContext

    data = _CHECKED.encode()
    tree = parse_ast(data, "train.py")
    options = _lint_options()
    model = FileModel(tree, data, default_rules(), options.matcher)
    facts = model.facts
    ctx = FileContext("train.py", data, tree, options, model=model)
    assert ctx.imports is facts.imports is model.imports
    assert ctx.functions is model.functions and ctx.parallel is facts.parallel
    assert ctx.facts is model.guards and "rank" in ctx.facts.rank_names
    assert "is_main" in ctx.facts.guard_names  # learnt from the assignments facts read too
    assert facts.loader_targets == {"loader"}
    assert model.computed.count("statements") == 1 and model.computed.count("imports") == 1


def test_the_statements_are_every_statement_in_source_order() -> None:
    """The one statement walk gives what a walk of every node finds, in source order."""
    from distify.analysis.filemodel import FileModel

    def position(node):
        return node.lineno, node.col_offset

    for name, data in _fixture_sources():
        tree = ast.parse(data)
        model = FileModel(tree, data, default_rules())
        nodes = list(ast.walk(tree))
        for part, types in (("assignments", (ast.Assign, ast.AnnAssign)),
                            ("functions", (ast.FunctionDef, ast.AsyncFunctionDef)),
                            ("classes", (ast.ClassDef,)),
                            ("imports", (ast.Import, ast.ImportFrom))):
            want = sorted((n for n in nodes if isinstance(n, types)), key=position)
            assert getattr(model.statements, part) == want, (name, part)
        statements = [n for n in model.statements.all if isinstance(n, ast.stmt)]
        assert statements == sorted((n for n in nodes if isinstance(n, ast.stmt)),
                                    key=position), name
        assert model.imports == ImportMap.from_ast(tree), name


def test_parallelism_is_one_answer_whichever_part_reads_it_first() -> None:
    """check reads the parallelism alone (a search that stops at the first marker); convert
    finds it in the walk of its facts: the same answer, line included."""
    from distify.analysis.filemodel import FileModel

    answers = 0
    for name, data in _fixture_sources():
        tree = ast.parse(data)
        alone = FileModel(tree, data, default_rules())
        first = alone.parallel
        walked = FileModel(tree, data, default_rules())
        assert walked.facts.parallel == first, name
        assert walked.parallel is walked.facts.parallel and "parallel" in walked.computed
        assert alone.facts.parallel is first  # read before: the walk does not search again
        answers += first is not None
    assert answers >= 20


def test_one_import_table_binds_a_name_imported_twice_as_the_later_import_does() -> None:
    """A name imported in both branches of a ``try`` (or ``if``) resolves to the import later
    in the file, for both commands (convert's table visited ``except`` before ``try`` before;
    check's sorted its imports into source order)."""
    from distify.analysis.filemodel import FileModel
    from distify.lint.engine import FileContext

    data = textwrap.dedent("""\
        try:
            from apex import amp
        except ImportError:
            from torch.cuda import amp
        if USE_NUMPY:
            import numpy as xp
        else:
            import cupy as xp
        """).encode()
    tree = ast.parse(data)
    model = FileModel(tree, data, default_rules())
    assert model.imports.aliases == {"amp": "torch.cuda.amp", "xp": "cupy"}
    assert ImportMap.from_ast(tree) == model.imports
    ctx = FileContext("t.py", data, tree, _lint_options(), model=model)
    assert ctx.imports is model.facts.imports is model.imports


def test_check_computes_only_the_parts_a_file_needs() -> None:
    """A file check skips as not distributed costs its statements, imports and parallelism
    only; the guard facts wait for the walk that reads them."""
    from distify.analysis.filemodel import observe
    from distify.lint.engine import lint_source

    single = _CHECKED.replace("import torch.distributed as dist\n", "").replace(
        "rank = dist.get_rank()", "rank = 0") + "# torch.distributed comes later\n"
    models = []
    with observe(models.append):
        result = lint_source(single.encode(), "train.py", _lint_options(check_all=False))
    assert result.skipped == "not distributed"
    assert sorted(models[0].computed) == ["imports", "parallel", "statements"]
