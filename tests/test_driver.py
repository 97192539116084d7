"""The converter's driver (:mod:`distify.convert.driver`): one table says which family handlers
each LibCST hook runs and in what order; no family defines a hook of its own."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import libcst as cst
import pytest

import distify.convert
from distify.analysis.facts import gather_facts, parse_ast
from distify.convert.base import TransformerBase
from distify.convert.context import ConvertContext
from distify.convert.driver import handles, install
from distify.convert.transformer import DistifyTransformer
from distify.rules import default_rules

# The download units' bookkeeping: first into and last out of every statement.
_ON_STATEMENT = "SideEffectMixin._side_effects_on_statement"
_AFTER_STATEMENT = "SideEffectMixin._side_effects_after_statement"
# The order each hook runs its handlers in. The chained hooks are the order the mixins' chained
# ``super()`` calls ran them in before the driver (the deepest base's code first on the way in,
# the outermost mixin's code last on the way out); changing it changes conversions.
ORDER = {
    "visit_Module": (
        "TransformerBase._base_on_module", "DeviceMixin._devices_on_module",
        "MeterMixin._meters_on_module",
        "StreamShardMixin._bptt_on_module", "RandomnessMixin._randomness_on_module",
        "SideEffectMixin._side_effects_on_module", "FullBatchMixin._full_batch_on_module",
        "StopMixin._stops_on_module", "BatchShapeMixin._batch_shapes_on_module",
        "AccumulationMixin._accumulation_on_module"),
    "leave_Module": (
        "StopMixin._stops_after_module", "AccumulationMixin._accumulation_after_module",
        "DistifyTransformer._driver_after_module"),
    "visit_ClassDef": (_ON_STATEMENT, "TransformerBase._base_on_class_def"),
    "leave_ClassDef": ("TransformerBase._base_after_class_def", _AFTER_STATEMENT),
    "visit_FunctionDef": (
        _ON_STATEMENT, "TransformerBase._base_on_function_def",
        "MeterMixin._meters_on_function_def"),
    "leave_FunctionDef": (
        "StopMixin._stops_after_function_def", "TransformerBase._base_after_function_def",
        "StopMixin._stops_move_function_tests", _AFTER_STATEMENT),
    "visit_Lambda": ("BatchShapeMixin._batch_shapes_on_lambda",),
    "leave_Lambda": ("BatchShapeMixin._batch_shapes_after_lambda",),
    "visit_IndentedBlock": ("TransformerBase._base_on_indented_block",),
    "leave_IndentedBlock": ("DistifyTransformer._driver_after_indented_block",),
    "visit_For": (
        _ON_STATEMENT, "LoopMixin._loops_on_for", "FullBatchMixin._full_batch_on_for",
        "StopMixin._stops_on_for", "CollectedMixin._collected_on_for",
        "BatchShapeMixin._batch_shapes_on_for", "AccumulationMixin._accumulation_on_for"),
    "leave_For": (
        "BatchShapeMixin._batch_shapes_after_for", "StopMixin._stops_after_for",
        "FullBatchMixin._full_batch_after_for", "LoopMixin._loops_after_for",
        "AccumulationMixin._accumulation_after_for", _AFTER_STATEMENT),
    "visit_While": (
        _ON_STATEMENT, "LoopMixin._loops_on_while", "FullBatchMixin._full_batch_on_while",
        "StopMixin._stops_on_while"),
    "leave_While": (
        "StopMixin._stops_after_while", "FullBatchMixin._full_batch_after_while",
        "LoopMixin._loops_after_while", _AFTER_STATEMENT),
    "visit_If": (_ON_STATEMENT, "LoopMixin._loops_on_if", "StopMixin._stops_on_if"),
    "leave_If": ("DistifyTransformer._driver_after_if", _AFTER_STATEMENT),
    "visit_Try": (_ON_STATEMENT, "SideEffectMixin._side_effects_on_try"),
    "leave_Try": (_AFTER_STATEMENT,),
    "visit_TryStar": (_ON_STATEMENT,),
    "leave_TryStar": (_AFTER_STATEMENT,),
    "visit_Match": (_ON_STATEMENT,),
    "leave_Match": (_AFTER_STATEMENT,),
    "visit_ExceptHandler": ("StopMixin._stops_on_except_handler",),
    "leave_ExceptHandler": ("StopMixin._stops_after_except_handler",),
    "visit_MatchCase": ("StopMixin._stops_on_match_case",),
    "leave_MatchCase": ("StopMixin._stops_after_match_case",),
    "visit_With": (_ON_STATEMENT, "SideEffectMixin._side_effects_on_with"),
    "leave_With": ("SideEffectMixin._side_effects_after_with", _AFTER_STATEMENT),
    "visit_WithItem": ("LoopMixin._loops_on_with_item",),
    "visit_SimpleStatementLine": (
        _ON_STATEMENT, "DistifyTransformer._driver_on_simple_statement_line"),
    "leave_SimpleStatementLine": (
        "DistifyTransformer._driver_after_simple_statement_line", _AFTER_STATEMENT),
    "visit_SimpleStatementSuite": ("DistifyTransformer._driver_on_simple_statement_suite",),
    "leave_SimpleStatementSuite": ("DistifyTransformer._driver_after_simple_statement_suite",),
    "visit_Expr": ("DistifyTransformer._driver_on_expr",),
    "leave_Expr": ("DistifyTransformer._driver_after_expr",),
    "visit_Assign": (
        "TransformerBase._base_on_assign", "MeterMixin._meters_on_assign",
        "LoopMixin._loops_on_assign", "CollectedMixin._collected_on_assign"),
    "leave_Assign": (
        "BatchShapeMixin._batch_shapes_after_assign", "CollectedMixin._collected_after_assign",
        "DeviceMixin._devices_after_assign", "AccumulationMixin._accumulation_after_assign"),
    "visit_AugAssign": (
        "LoopMixin._loops_on_aug_assign", "CollectedMixin._collected_on_aug_assign"),
    "leave_AugAssign": ("LoopMixin._loops_after_aug_assign",),
    "visit_AnnAssign": ("ModelMixin._models_on_ann_assign",),
    "leave_AnnAssign": (
        "BatchShapeMixin._batch_shapes_after_ann_assign", "DeviceMixin._devices_after_ann_assign"),
    "visit_Call": ("DistifyTransformer._driver_on_call",),
    "leave_Call": ("DistifyTransformer._driver_after_call",),
    "visit_Attribute": ("BatchShapeMixin._batch_shapes_on_attribute",),
    "leave_Arg": ("DeviceMixin._devices_after_arg",),
    "leave_DictElement": ("DeviceMixin._devices_after_dict_element",),
    "leave_IfExp": ("DeviceMixin._devices_after_if_exp",),
    "leave_BinaryOperation": (
        "LoopMixin._loops_after_binary_operation",
        "AccumulationMixin._accumulation_after_binary_operation"),
    "leave_FormattedStringExpression": (
        "SideEffectMixin._side_effects_after_formatted_string_expression",),
}


def _families() -> list[type]:
    """Every rewrite family in distify.convert (the subclasses of TransformerBase, and it)."""
    for info in pkgutil.iter_modules(distify.convert.__path__, "distify.convert."):
        importlib.import_module(info.name)
    found: list[type] = []
    stack = [TransformerBase]
    while stack:
        cls = stack.pop()
        if cls.__module__.startswith("distify.convert.") and cls not in found:
            found.append(cls)
        stack.extend(cls.__subclasses__())
    return found


def _is_libcst_hook(name: str) -> bool:
    kind, _, node = name.partition("_")
    return kind in ("visit", "leave") and isinstance(getattr(cst, node.split("_")[0], None), type)


def test_the_table_lists_each_hooks_handlers_in_order():
    table = {hook: tuple(h.__qualname__ for h in handlers)
             for hook, handlers in DistifyTransformer.HANDLERS.items()}
    assert table == ORDER


def test_no_family_defines_a_libcst_hook():
    families = _families()
    assert len(families) >= 15  # the mixins, the base and the driver were all found
    defining = {f"{cls.__qualname__}.{name}" for cls in families for name in vars(cls)
                if _is_libcst_hook(name) and cls is not DistifyTransformer}
    assert defining == set()


def test_only_the_driver_and_its_base_define_the_generic_hooks():
    generic = ("on_visit", "on_leave", "on_visit_attribute", "on_leave_attribute")
    defining = {f"{cls.__qualname__}.{name}" for cls in _families() for name in generic
                if name in vars(cls) and cls not in (DistifyTransformer, TransformerBase)}
    assert defining == set()


def test_every_handler_is_in_the_table_under_the_hooks_it_handles():
    listed = {(h, hook) for hook, handlers in DistifyTransformer.HANDLERS.items()
              for h in handlers}
    marked = {(value, hook) for cls in _families() for value in vars(cls).values()
              if inspect.isfunction(value) and hasattr(value, "handles")
              for hook in value.handles}
    assert len(marked) == sum(len(h) for h in ORDER.values())
    assert marked == listed


def test_the_driver_hooks_are_the_tables():
    for hook, handlers in DistifyTransformer.HANDLERS.items():
        if len(handlers) == 1:  # no call in between
            assert getattr(DistifyTransformer, hook) is handlers[0], hook
        else:
            assert getattr(DistifyTransformer, hook) not in handlers, hook


def test_install_refuses_a_handler_listed_under_another_hook():
    class Wrong(cst.CSTTransformer):
        @handles("visit_Name")
        def _on_name(self, node):
            return None

    with pytest.raises(TypeError, match="handles 'visit_Name'"):
        install(Wrong, {"visit_Call": (Wrong._on_name,)})
    with pytest.raises(TypeError, match="not a LibCST hook"):
        install(Wrong, {"visit_Nothing": (Wrong._on_name,)})
    with pytest.raises(TypeError, match="twice"):
        install(Wrong, {"visit_Name": (Wrong._on_name, Wrong._on_name)})


class _Toy(cst.CSTTransformer):
    """Two families' handlers on one hook: a log of their calls, and names rewritten in turn."""

    def __init__(self, answer: bool | None) -> None:
        super().__init__()
        self.answer = answer
        self.log: list[str] = []

    @handles("visit_Call")
    def _first_on_call(self, node):
        self.log.append("first")
        return False  # not the last handler: its answer is not the hook's

    @handles("visit_Call")
    def _second_on_call(self, node):
        self.log.append("second")
        return self.answer

    @handles("leave_Name")
    def _first_after_name(self, original, updated):
        return updated.with_changes(value=updated.value + "_a")

    @handles("leave_Name")
    def _second_after_name(self, original, updated):
        assert original.value + "_a" == updated.value  # handed the first one's result
        return updated.with_changes(value=updated.value + "_b")


install(_Toy, {"visit_Call": (_Toy._first_on_call, _Toy._second_on_call),
               "leave_Name": (_Toy._first_after_name, _Toy._second_after_name)})


@pytest.mark.parametrize(("answer", "code"), [
    pytest.param(None, "f_a_b(x_a_b)\n", id="last-answer-None-visits-children"),
    pytest.param(False, "f(x)\n", id="last-answer-False-skips-children"),
])
def test_a_hook_runs_its_handlers_in_order_and_threads_the_node(answer, code):
    toy = _Toy(answer)
    assert cst.parse_module("f(x)\n").visit(toy).code == code
    assert toy.log == ["first", "second"]


def _convert_with(driver: type, source: str) -> str:
    rules = default_rules()
    data = source.encode()
    facts = gather_facts(parse_ast(data, "t.py"), data, rules)
    return cst.parse_module(data).visit(driver(facts, rules, "rt")).code


_SETUP = {"visit_Module", "leave_Module", "visit_SimpleStatementLine",
          "leave_SimpleStatementLine", "visit_IndentedBlock", "leave_IndentedBlock"}


def _driver_with(families: tuple[str, ...]) -> type:
    """The driver with the module and statement bookkeeping, and only ``families``' other
    handlers (family: the prefix of its handlers' names, ``devices``)."""
    table = {hook: tuple(h for h in handlers if hook in _SETUP
                         or h.__name__.startswith(tuple(f"_{f}_" for f in families)))
             for hook, handlers in DistifyTransformer.HANDLERS.items()}
    table = {hook: handlers for hook, handlers in table.items() if handlers}
    return type("PartialDriver", (DistifyTransformer,), {"HANDLERS": table})


DEVICE_SETTING = 'import torch\ndevice = "cuda:0"\nmodel = torch.nn.Linear(2, 2).to(device)\n'


def test_one_familys_handlers_run_alone():
    full = _convert_with(DistifyTransformer, DEVICE_SETTING)
    alone = _convert_with(_driver_with(("devices", "base")), DEVICE_SETTING)
    without = _convert_with(_driver_with(("base",)), DEVICE_SETTING)
    assert 'device = rt.device().type' in full
    assert 'device = rt.device().type' in alone
    assert 'device = "cuda:0"' in without  # the table, not the class, runs the family


def _transformer(source: str) -> tuple[DistifyTransformer, cst.Module]:
    rules = default_rules()
    data = source.encode()
    facts = gather_facts(parse_ast(data, "t.py"), data, rules)
    return DistifyTransformer(facts, rules, "rt"), cst.parse_module(data)


def test_the_bookkeeping_is_in_the_context_not_on_the_transformer():
    transformer, _ = _transformer("import torch\n")
    # the inputs and the results the engine reads; everything else is the context's
    own = set(vars(transformer)) - set(vars(cst.CSTTransformer()))  # LibCST's `metadata`
    assert own == {"facts", "rules", "rt", "skip", "starts", "ctx", "edits", "first_touched",
                   "batch_sizes", "own_mixed_precision"}
    assert isinstance(transformer.ctx, ConvertContext)


TRAINING = """\
import torch
model = torch.nn.Linear(2, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(range(8), batch_size=2)

def train(epochs):
    class Inner:
        pass
    for epoch in range(epochs):
        for batch in loader:
            loss = model(batch).sum(); loss.backward()
            optimizer.step()
        if epoch % 2 == 0: print(epoch)
"""


#: each rewrite family's own state after a walk: its one attribute on the transformer → the
#: dataclass (in the family's module) that holds it
FAMILY_STATES = {
    "_accumulation": "distify.convert.accumulation.AccumulationState",
    "_batch_shapes": "distify.convert.batch_shapes.BatchShapeState",
    "_devices": "distify.convert.devices.DeviceState",
    "_full_batch": "distify.convert.full_batch.FullBatchState",
    "_meters": "distify.convert.meters.MeterState",
    "_side_effects": "distify.convert.side_effects.SideEffectState",
    "_stops": "distify.convert.stops.StopState",
}
#: a download unit run on the main process only: the statements' download bookkeeping runs
DOWNLOADING = TRAINING + """\
import urllib.request
urllib.request.urlretrieve("https://example.com/d.tgz", "d.tgz")
"""

#: a device chosen by a flag (``device_choice``) and read by ``torch.device(device)``: the
#: devices family's flag bookkeeping runs (it once kept it in loose instance fields)
DEVICE_FLAG = TRAINING.replace("import torch\n", """import argparse
import torch
args = argparse.ArgumentParser().parse_args()
cpu = args.cpu
device = torch.device("cpu" if cpu else "cuda")
""", 1)


@pytest.mark.parametrize("source", [TRAINING, DOWNLOADING, DEVICE_FLAG],
                         ids=["training", "download-unit", "device-flag"])
def test_after_a_walk_the_transformer_holds_no_familys_loose_fields(source):
    """Its inputs, the results the engine reads, the context, and one state object per family;
    no family's fields, and no hook a family put on the instance."""
    transformer, module = _transformer(source)
    output = module.visit(transformer).code
    assert "rt.backward(loss)" in output
    assert ("main_process_first" in output) == (source is DOWNLOADING)
    own = set(vars(transformer)) - set(vars(cst.CSTTransformer()))  # LibCST's `metadata`
    assert own == {"facts", "rules", "rt", "skip", "starts", "ctx", "edits", "first_touched",
                   "batch_sizes", "own_mixed_precision", *FAMILY_STATES}
    first = {}
    for attr, name in FAMILY_STATES.items():
        state = first[attr] = getattr(transformer, attr)
        assert f"{type(state).__module__}.{type(state).__qualname__}" == name
        assert dataclasses.is_dataclass(state)
        assert not hasattr(state, "__dict__"), name  # slots: a misspelt field cannot be set
    module.visit(transformer)
    assert [a for a in FAMILY_STATES if getattr(transformer, a) is first[a]] == []  # made anew


def test_a_walk_leaves_a_fresh_context_balanced():
    transformer, module = _transformer(TRAINING)
    before = transformer.ctx
    output = module.visit(transformer).code
    assert "rt.prepare(" in output and "rt.backward(loss)" in output  # it did convert
    ctx = transformer.ctx
    assert ctx is not before  # made anew for the module
    # every stack pushed on the way in was popped on the way out
    assert (ctx.statements, ctx.pending_models, ctx.built, ctx.downloads, ctx.after) == \
        ([], [], [], [], [])
    assert (ctx.loops, ctx.loops_saved, ctx.path, ctx.classes, ctx.if_frames) == \
        ([], [], [], [], [])
    assert len(ctx.scopes) == 1
    assert (ctx.depth, ctx.no_grad_depth, ctx.main_only_depth, ctx.expr_depth) == (0, 0, 0, 0)


def _self_fields(path) -> tuple[set[str], set[str]]:
    """The private ``self._<name>`` the rewrite families of a module assign, and those they read
    (in the families' own methods: not in the helper visitors beside or inside them)."""
    import ast

    stored: set[str] = set()
    read: set[str] = set()

    def scan(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                continue  # a helper class: its `self` is not the transformer
            if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name) \
                    and child.value.id == "self" and child.attr.startswith("_"):
                (stored if isinstance(child.ctx, ast.Store) else read).add(child.attr)
            scan(child)

    families = {cls.__name__ for cls in _families()}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name in families:
            scan(node)
    return stored, read


def test_a_familys_own_state_is_read_by_that_family_only():
    """What more than one family reads is in the context; what one family keeps (its whole-file
    analyses, its own stacks) is in its one state object, set in and read by its module only."""
    from pathlib import Path

    folder = Path(distify.convert.__file__).parent
    fields = {path.name: _self_fields(path) for path in folder.glob("*.py")}
    stored = {name: own for name, (own, _) in fields.items() if own}
    assert stored == {f"{name.split('.')[-2]}.py": {attr}
                      for attr, name in FAMILY_STATES.items()}
    crossing = {(name, owner, reader) for owner, (stored, _) in fields.items() for name in stored
                for reader, (_, read) in fields.items() if reader != owner and name in read}
    assert crossing == set()
    # nor through a name in a string
    assert not [path.name for path in folder.glob("*.py") if 'getattr(self, "_' in path.read_text()]
