"""One answer to "is this a DataLoader?" (``distify/analysis/loaders.py``) wherever it is asked.

- the table: every site that asks (convert's transformer, the evaluation flow, the file facts'
  loader parameters, DST203's stop analysis, the wrapper-stripping of the loop rewrites) gives
  the same answer for the same iterable, in both trees;
- the conversions that changed when the copies became one (each a named improvement), with
  their no-op neighbours.
"""

from __future__ import annotations

import ast
import textwrap

import libcst as cst
import pytest

from distify.analysis.evaluation import FlowFinder
from distify.analysis.facts import gather_facts, parse_ast
from distify.analysis.loaders import LOOP_WRAPPERS, is_loaderish, is_loop_wrapper, unwrapped
from distify.analysis.names import ImportMap, dotted_name
from distify.convert.engine import convert_source
from distify.convert.transformer import DistifyTransformer
from distify.lint.checks._dst203_flow import _Context, _Shapes
from distify.lint.checks.dst203_data_dependent_collective import DataDependentCollective
from distify.lint.engine import FileContext, LintOptions
from distify.lint.matcher import Matcher
from distify.lint.registry import all_codes
from distify.rules import default_rules
from tests.test_devices import _FRESH as _DEVICES_FRESH

IMPORTS = """\
import torch
import tqdm.auto
from torch.utils.data import DataLoader as DL
from tqdm.std import tqdm as progress
"""

#: (iterable, is it a DataLoader?, the iterable behind its loop wrappers)
TABLE = [
    ("train_loader", True, "train_loader"),
    ("self.val_loader", True, "self.val_loader"),
    ("dataloaders['train']", True, "dataloaders['train']"),
    ("DL(dataset, batch_size=8)", True, "DL(dataset, batch_size=8)"),
    ("enumerate(train_loader)", True, "train_loader"),
    ("enumerate(tqdm.tqdm(train_loader), 1)", True, "train_loader"),
    ("tqdm.auto.tqdm(self.val_loader)", True, "self.val_loader"),
    ("progress(train_loader)", True, "train_loader"),
    ("iter(DL(dataset))", True, "DL(dataset)"),
    ("zip(images, train_loader)", True, "images"),
    ("zip(*loaders)", True, "zip(*loaders)"),
    ("range(10)", False, "range(10)"),
    ("batches", False, "batches"),
    ("enumerate(batches)", False, "batches"),
    ("map(str, train_loader)", False, "map(str, train_loader)"),
    ("mine.tqdm(train_loader)", False, "mine.tqdm(train_loader)"),
    ("reversed(batches)", False, "reversed(batches)"),
]
IDS = [row[0] for row in TABLE]


def _source(iterable: str) -> str:
    return IMPORTS + textwrap.dedent(f"""\
        def evaluate(model, data):
            for x in data:
                model(x)


        for x in {iterable}:
            model(x)
        evaluate(model, {iterable})
        """)


def _iterables(source: str) -> tuple[ast.expr, cst.BaseExpression]:
    tree = ast.parse(source)
    module = cst.parse_module(source)
    loop = next(n for n in tree.body if isinstance(n, ast.For))
    cst_loop = next(n for n in module.body if isinstance(n, cst.For))
    return loop.iter, cst_loop.iter


def _answers(source: str) -> dict[str, bool]:
    """Each site's answer for the module-level loop's iterable of ``source``."""
    rules = default_rules()
    tree = ast.parse(source)
    imports = ImportMap.from_ast(tree)
    node, cst_node = _iterables(source)
    facts = gather_facts(parse_ast(source.encode(), "t.py"), source.encode(), rules)
    transformer = DistifyTransformer(facts, rules, "distify")
    flow = FlowFinder(imports, rules)
    options = LintOptions(Matcher(rules), tuple(all_codes()))
    rule = DataDependentCollective(FileContext("t.py", source.encode(), tree, options))
    return {
        "analysis (ast)": is_loaderish(
            node, imports.ast_qualname,
            builds=lambda callee: rules.match("dataloaders", callee) is not None),
        "analysis (libcst)": is_loaderish(
            cst_node, imports.qualname,
            builds=lambda callee: rules.match("dataloaders", callee) is not None),
        "convert": transformer._loaderish(cst_node),
        "evaluation flow": flow._loaderish(node),
        "facts.loader_params": "data" in facts.loader_params.get("evaluate", set()),
        "check DST203": _Context(rule, "distify", _Shapes()).is_loader(cst_node),
    }


@pytest.mark.parametrize(("iterable", "loader", "behind"), TABLE, ids=IDS)
def test_every_site_gives_the_same_answer(iterable: str, loader: bool, behind: str) -> None:
    answers = _answers(_source(iterable))
    assert answers == dict.fromkeys(answers, loader)


@pytest.mark.parametrize(("iterable", "loader", "behind"), TABLE, ids=IDS)
def test_every_site_strips_the_same_wrappers(iterable: str, loader: bool, behind: str) -> None:
    """convert's rewrites (with or without the file's imports) and the ast readers unwrap
    alike; ``zip`` only where the loop target may pair items."""
    source = _source(iterable)
    node, cst_node = _iterables(source)
    imports = ImportMap.from_ast(ast.parse(source))
    code = cst.Module([]).code_for_node
    assert code(unwrapped(cst_node, imports.qualname)) == behind
    assert ast.unparse(unwrapped(node, imports.ast_qualname)) == ast.unparse(ast.parse(behind))
    if not iterable.startswith("progress("):  # an alias: only the import table knows it
        assert code(unwrapped(cst_node, dotted_name)) == behind
    paired = code(unwrapped(cst_node, imports.qualname, pairing=False))
    assert paired == (iterable if iterable.startswith("zip(") else behind)


def test_the_vocabulary() -> None:
    assert {"enumerate", "iter", "zip", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm",
            "tqdm.notebook.tqdm"} <= LOOP_WRAPPERS
    assert not any(is_loop_wrapper(name) for name in ("map", "filter", "reversed", "range",
                                                      "itertools.islice", "tqdm.trange", None))
    assert is_loop_wrapper("zip") and not is_loop_wrapper("zip", pairing=False)


# ------------------------------------------------------------------ conversions that changed

_SHAPES = """\
import torch
from torch.utils.data import DataLoader
{imports}
loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
model = torch.nn.Linear(64, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for images, labels in {iterable}:
    images = images.reshape(batch_size, -1)
"""


@pytest.mark.parametrize(("imports", "iterable", "rewritten"), [
    pytest.param("from tqdm import tqdm", "tqdm(loader)", True, id="tqdm"),
    pytest.param("from tqdm.std import tqdm", "tqdm(loader)", True, id="tqdm.std-new"),
    pytest.param("import torch.hub", "torch.hub.tqdm(loader)", True, id="torch.hub.tqdm-new"),
    pytest.param("", "zip(loader, loader)", False, id="zip-no-op"),
    pytest.param("", "map(lambda b: b, loader)", False, id="map-no-op"),
])
def test_batch_shapes_see_through_every_progress_bar(imports: str, iterable: str,
                                                     rewritten: bool) -> None:
    """Improvement: the batch-shape rewrite now unwraps every tqdm of the vocabulary (it knew
    tqdm, tqdm.auto and tqdm.notebook only); never ``zip``, whose target pairs items."""
    source = _SHAPES.format(imports=imports, iterable=iterable)
    out = convert_source(source.encode(), "train.py").output.decode()
    assert ("images.reshape(images.size(0), -1)" in out) is rewritten, out


def _fresh(target: str, iterable: str) -> str:
    """test_devices' script, its last loop (a fresh model on prepared batches) over
    ``iterable``."""
    head, last = _DEVICES_FRESH.format(after="best.eval()").rsplit("for x, y in loader:", 1)
    return f"{head}for {target} in {iterable}:{last}"


@pytest.mark.parametrize(("target", "iterable", "reported"), [
    pytest.param("x, y", "loader", True, id="plain"),
    pytest.param("x, y", "tqdm.auto.tqdm(loader)", True, id="tqdm.auto-new"),
    pytest.param("(x, y), i", "zip(loader, range(3))", True, id="zip-new"),
    pytest.param("x", "range(3)", False, id="no-loader"),
])
def test_a_fresh_model_on_batches_through_any_wrapper_is_reported(target: str, iterable: str,
                                                                  reported: bool) -> None:
    """Improvement: the fresh-model note (a model left on the CPU, called on a prepared loader's
    batches, which are on the device) now sees the loader through ``tqdm.auto.tqdm`` and
    ``zip`` too."""
    source = _fresh(target, iterable)
    notes = [n for n in convert_source(source.encode(), "train.py").notes
             if "is a fresh Net" in n.message]
    assert len(notes) == reported, notes


_PHASES = """\
import torch
from torch.utils.data import DataLoader


def evaluate(model, data):
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in data:
            correct += (model(x).argmax(1) == y).sum().item()
    return correct


model = torch.nn.Linear(4, 2)
loaders = {{"train": DataLoader(train_set), "val": DataLoader(val_set)}}
print(evaluate(model, {argument}))
"""


@pytest.mark.parametrize(("argument", "reduced"), [
    pytest.param("loaders['val']", True, id="subscript-new"),
    pytest.param("iter(loaders['val'])", True, id="wrapped-new"),
    pytest.param("[(1, 2)]", False, id="a-list-no-op"),
])
def test_a_loader_passed_by_subscript_makes_its_parameter_a_loader(argument: str,
                                                                   reduced: bool) -> None:
    """Improvement: ``evaluate(model, loaders["val"])`` fills ``data`` with a loader (the file
    facts read subscripts and wrappers now), so the evaluation sum over it is reduced; a call
    passing a list alone still leaves ``data`` a plain iterable."""
    out = convert_source(_PHASES.format(argument=argument).encode(), "eval.py").output.decode()
    assert ("correct = distify.reduce(correct)" in out) is reduced, out
