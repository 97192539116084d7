"""Rewrites of single-device code: every process uses its own device, ``rt.device()``.

``torch.device("cuda" ...)``, ``torch.accelerator.current_accelerator()`` → ``rt.device()``;
``x.cuda()``, ``x.to("cuda:0")``, ``x.to(0)`` and ``x.to(gpu_id)`` → ``x.to(rt.device())``; an
int GPU index kept in a setting (``device = 0``, ``gpu_id = 0``, ``0 if ... else "cpu"``) →
``rt.device_index()`` (this process's GPU's index: at world size 1 it prints as the script's
did); device pinning (``torch.cuda.set_device``) is removed, with an ``if`` that held nothing
else. ``"cpu"`` stays.

A device *name* stays a name: ``"cuda" if ... else "cpu"``, ``device = "cuda:0"`` in module-level
settings, a config field or dict entry ``"device": "cuda"`` → ``rt.device().type``. The runtime
makes this process's GPU the current one, so ``"cuda"`` means it for ``.to()``, ``torch.device``
and ``device=``; and what the script does with the string keeps its meaning on every process:
``if device == "cuda":`` (DataParallel, ``cudnn.benchmark``) is still true on a GPU, ``"cuda" in
device`` still works, ``torch.autocast(device_type=device)`` still gets a string.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import libcst as cst

from distify.analysis.literals import literal_value
from distify.analysis.loaders import unwrapped
from distify.analysis.names import dotted_name
from distify.analysis.walk import walk
from distify.convert.base import Edit, TransformerBase
from distify.convert.driver import handles
from distify.convert.syntax import (
    _is_cpu,
    _is_device_string,
    _literal_args,
    _selects_accelerator,
)

#: names that hold a device (a name, or an int GPU index) in real scripts' settings
_DEVICE_SETTINGS = {"device", "dev", "device_name", "device_type_name"}
_GPU_INDEXES = {"gpu", "gpu_id", "gpuid", "device_id", "gpu_index", "device_index", "cuda_id",
                "cuda_device", "gpu_num"}


#: a comment that speaks of one fixed GPU (``# shorthand for cuda:0``, ``# use GPU 0``)
_NAMES_A_GPU = re.compile(r"cuda|gpu", re.IGNORECASE)


#: a word in a name, an attribute or a string that shows the script uses, or may use, an
#: accelerator (``use_cuda``, ``x.cuda()``, ``"cuda:0"``, ``"--gpus"``, ``torch.accelerator``)
_ACCELERATOR = re.compile(r"(?<![A-Za-z])(cuda|cudnn|mps|xpu|hpu|xla|tpu|npu|gpus?|"
                          r"accelerat(e|or|ors)|nccl|device_ids)(?![A-Za-z])", re.IGNORECASE)
#: a name or attribute that holds a device: ``device``, ``dev``, ``self.device``, ``eval_device``
_HOLDS_DEVICE = re.compile(r"(^|_)(device|dev)$", re.IGNORECASE)

CPU_MESSAGE = ("this script never uses an accelerator: its model stays on the CPU with the "
               "tensors the script builds there ({rt}.init(cpu=True)); to train on GPUs, move "
               "those tensors to {rt}.device() and delete this line")


def stays_on_cpu(module: cst.Module) -> bool:
    """The script computes on the CPU by its own choice: no name, attribute or string in it
    names an accelerator (comments do not count), and every device it sets, makes, passes as
    ``device=`` or moves to is ``"cpu"`` (or a name only ever set to ``"cpu"``). Its conversion
    must keep it there: ``prepare`` would put the model on the GPU while
    ``torch.from_numpy(state)`` or ``torch.zeros(n)`` stay on the CPU. When in doubt (a device
    from a setting, a function or a flag), it is not CPU-only."""
    finder = _DeviceFinder()
    try:
        walk(module, finder)
    except _Accelerator:  # one word that names an accelerator settles it: the walk stops
        return False
    cpu_names = {name for name, values in finder.assigned.items() if all(map(_is_cpu, values))}

    def cpu(node: cst.BaseExpression) -> bool:
        return _is_cpu(node) or type(node) is cst.Name and node.value in cpu_names

    return all(cpu(value) for value in finder.devices)


class _Accelerator(Exception):
    """Raised by :class:`_DeviceFinder` at the first word that names an accelerator."""


class _DeviceFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.assigned: dict[str, list[cst.BaseExpression]] = {}
        self.devices: list[cst.BaseExpression] = []

    def _word(self, text: str) -> None:
        if _ACCELERATOR.search(text):
            raise _Accelerator

    def visit_Name(self, node: cst.Name) -> None:
        self._word(node.value)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        self._word(node.value)

    def visit_FormattedStringText(self, node: cst.FormattedStringText) -> None:
        self._word(node.value)

    def _target(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if type(target) is cst.Name:
            self.assigned.setdefault(target.value, []).append(value or target)
        name = target.value if type(target) is cst.Name else \
            target.attr.value if type(target) is cst.Attribute else ""
        if _HOLDS_DEVICE.search(name):
            self.devices.append(value or target)
        elif type(target) not in (cst.Name, cst.Attribute):
            for sub in (target.elements if type(target) in (cst.Tuple, cst.List) else ()):
                self._target(sub.value, None)  # unpacked: a value of its own

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._target(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._target(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._target(node.target, None)

    def visit_For(self, node: cst.For) -> None:
        self._target(node.target, None)

    def visit_Param(self, node: cst.Param) -> None:
        # a parameter gets its value from its callers, which pass the script's own values
        # (``train(model, device)``); only a default is a value of its own. A name that is
        # never assigned but as a parameter is in doubt: not a CPU name.
        if node.default is not None:
            self._target(node.name, node.default)

    @staticmethod
    def _dtype_only(call: cst.Call) -> bool:
        """``.to(torch.float16)``, ``.to(dtype=x.dtype)``: no device given."""
        return all(arg.keyword is not None and arg.keyword.value in ("dtype", "non_blocking",
                                                                     "copy")
                   or arg.keyword is None and _is_dtype(arg.value) for arg in call.args)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        last = func.attr.value if type(func) is cst.Attribute else \
            func.value if type(func) is cst.Name else ""
        if last == "device":  # torch.device(x)
            self.devices.append(node)
        for arg in node.args:
            if arg.keyword is not None and _HOLDS_DEVICE.search(arg.keyword.value):
                self.devices.append(arg.value)
        if last == "to" and node.args and node.args[0].keyword is None:
            moved = node.args[0].value  # .to(device), .to(args.device); not .to(torch.float16)
            name = moved.value if type(moved) is cst.Name else \
                moved.attr.value if type(moved) is cst.Attribute else ""
            if _HOLDS_DEVICE.search(name) or type(moved) in (cst.SimpleString, cst.Call):
                self.devices.append(moved)


#: torch functions that make a tensor on the CPU unless they get ``device=``
_FACTORIES = {f"torch.{name}" for name in (
    "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "eye", "rand", "randn",
    "randint", "randperm", "tensor", "as_tensor", "from_numpy")}
_MOVES = {"to", "cuda", "type_as"}

FORWARD_MESSAGE = ("`{call}(...)` in {cls}.forward has no device=: it is made on the CPU while "
                   "the prepared model and its inputs are on {rt}.device() (a device error on a "
                   "GPU machine); pass device= an input's device, e.g. device=x.device")


def forward_factories(module: cst.Module, model_classes: set[str],
                      qual: Callable[[cst.BaseExpression], str | None], rt: str) -> list[Edit]:
    """Tensors made without ``device=`` inside ``forward`` of the script's own modules (any
    of them may be the prepared model or one of its parts): notes for a script that is not
    CPU-only, whose model ``prepare`` puts on the accelerator."""
    if not model_classes:
        return []
    forwards = _Forwards(model_classes)
    walk(module, forwards)  # statements only: the few ``forward`` methods to read
    found: list[Edit] = []
    for node, classes in forwards.found:
        finder = _ForwardFactories(model_classes, qual, rt)
        finder.classes = classes
        walk(node, finder)
        found += finder.found
    return found


class _InModelClasses(cst.CSTVisitor):
    """Keeps the classes around the walk, to tell the ``forward`` of the script's own model
    classes."""

    def __init__(self, model_classes: set[str]) -> None:
        self.model_classes = model_classes
        self.classes: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.classes.pop()

    def _model_forward(self, node: cst.FunctionDef) -> bool:
        return node.name.value == "forward" and bool(self.classes) and \
            self.classes[-1] in self.model_classes


class _Forwards(_InModelClasses):
    """The ``forward`` methods of the script's own model classes (a statement-level walk, which
    skips every expression), each with the classes around it: all of a module where
    :class:`_ForwardFactories` can find something. A ``.to()`` that moves a factory's tensor is
    around that factory's call, so inside the same method."""

    def __init__(self, model_classes: set[str]) -> None:
        super().__init__(model_classes)
        self.found: list[tuple[cst.FunctionDef, list[str]]] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if self._model_forward(node):
            self.found.append((node, list(self.classes)))
            return False  # read whole by _ForwardFactories, nested methods included
        return True


def _is_dtype(node: cst.BaseExpression) -> bool:
    """``torch.float16``, ``x.dtype``, ``dtype``: a dtype, not a device."""
    name = (dotted_name(node) or "").lower()
    last = name.rsplit(".", 1)[-1]
    return "dtype" in last or name.startswith("torch.") and last.startswith(
        ("float", "half", "double", "bfloat", "int", "long", "short", "bool", "uint", "complex"))


class _ForwardFactories(_InModelClasses):
    def __init__(self, model_classes: set[str],
                 qual: Callable[[cst.BaseExpression], str | None], rt: str) -> None:
        super().__init__(model_classes)
        self.qual, self.rt = qual, rt
        self.in_forward = 0
        self.moved: set[int] = set()
        self.found: list[Edit] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self._model_forward(node):
            self.in_forward += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        if self._model_forward(original_node):
            self.in_forward -= 1

    @staticmethod
    def _dtype_only(call: cst.Call) -> bool:
        """``.to(torch.float16)``, ``.to(dtype=x.dtype)``: no device given."""
        return all(arg.keyword is not None and arg.keyword.value in ("dtype", "non_blocking",
                                                                     "copy")
                   or arg.keyword is None and _is_dtype(arg.value) for arg in call.args)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if type(func) is cst.Attribute and func.attr.value in _MOVES and \
                not (func.attr.value == "to" and self._dtype_only(node)):
            self.moved.add(id(func.value))  # torch.zeros(n).to(x.device): moved where made
        if not self.in_forward or id(node) in self.moved:
            return
        name = self.qual(func)
        if name not in _FACTORIES:
            return
        if any(arg.keyword is not None and arg.keyword.value == "device" for arg in node.args):
            return
        shown = dotted_name(func) or name
        self.found.append(Edit(node, "device", FORWARD_MESSAGE.format(
            call=shown, cls=self.classes[-1], rt=self.rt), needs_human=True))


FRESH_MESSAGE = ("`{name}` is a fresh {cls}, neither prepared nor moved to {rt}.device(), and it "
                 "is called on the batches of a prepared loader, which are on {rt}.device(): on "
                 "a GPU machine the weights stay on the CPU (a device error); move it: "
                 "`{name}.to({rt}.device())`")


def fresh_models(module: cst.Module, model_classes: set[str], rt: str,
                 source: bytes | None = None) -> list[Edit]:
    """``net = Net()`` then ``net.load_state_dict(torch.load(...))``: a model the script makes
    again (to evaluate a checkpoint) that is not prepared and not moved (``.to``, ``.cuda``),
    called inside a loop over a prepared loader, whose batches are on the device. One note at
    the line that makes it. Names are matched over the whole script (not scope by scope), in
    source order: a prepared ``net`` made again by ``net = Net()`` is fresh from there on.

    ``source``, the script's own text, when given: a script that never says
    ``load_state_dict`` loads no model (no rewrite writes that name:
    ``tests/test_device_notes_scope.py`` checks), and the walk is skipped."""
    if not model_classes or source is not None and b"load_state_dict" not in source:
        return []
    made = _MadeModels(model_classes)
    walk(module, made)  # statements only: is a model made at all?
    if not made.found:
        return []
    finder = _FreshModels(model_classes, rt)
    walk(module, finder)
    return [Edit(node, "device", FRESH_MESSAGE.format(name=name, cls=cls, rt=rt),
                 needs_human=True)
            for name, (node, cls) in finder.made.items()
            if name in finder.loaded and name in finder.called_on_batches
            and name not in finder.prepared and name not in finder.moved]


class _MadeModels(cst.CSTVisitor):
    """Is there a ``net = Net()`` of one of the script's model classes (what
    :meth:`_FreshModels.visit_Assign` records as made)? A statement-level walk: without one,
    no model is fresh."""

    def __init__(self, model_classes: set[str]) -> None:
        self.model_classes = model_classes
        self.found = False

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if type(value) is cst.Call and type(value.func) is cst.Name and \
                value.func.value in self.model_classes:
            self.found = True


class _FreshModels(cst.CSTVisitor):
    def __init__(self, model_classes: set[str], rt: str) -> None:
        self.model_classes, self.rt = model_classes, rt
        self.made: dict[str, tuple[cst.CSTNode, str]] = {}
        self.prepared: set[str] = set()  # names given to, or bound from, rt.prepare(...)
        self.moved: set[str] = set()
        self.loaded: set[str] = set()
        self.called_on_batches: set[str] = set()
        self.loops = 0  # depth of loops over a prepared loader
        self.over: list[bool] = []

    def _is_prepare(self, node: cst.BaseExpression) -> bool:
        return type(node) is cst.Call and dotted_name(node.func) == f"{self.rt}.prepare"

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        for target in node.targets:
            names = [e.value for e in target.target.elements] \
                if type(target.target) in (cst.Tuple, cst.List) else [target.target]
            for name in names:
                if type(name) is not cst.Name:
                    continue
                if self._is_prepare(value):
                    self.prepared.add(name.value)
                elif type(value) is cst.Call and type(value.func) is cst.Name and \
                        value.func.value in self.model_classes and len(names) == 1:
                    self.made[name.value] = (node, value.func.value)
                    # made again after it was prepared (`net = Net()` to evaluate a saved
                    # checkpoint, the tutorial's way): from here on it is a fresh model
                    for seen in (self.prepared, self.moved, self.loaded, self.called_on_batches):
                        seen.discard(name.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if self._is_prepare(node):
            self.prepared.update(a.value.value for a in node.args
                                 if type(a.value) is cst.Name)
        if type(func) is cst.Attribute and type(func.value) is cst.Name:
            if func.attr.value in ("to", "cuda", "to_empty"):
                self.moved.add(func.value.value)
            elif func.attr.value == "load_state_dict":
                self.loaded.add(func.value.value)
        if type(func) is cst.Name and self.loops:
            self.called_on_batches.add(func.value)

    def _over_prepared(self, node: cst.BaseExpression) -> bool:
        node = unwrapped(node, dotted_name)  # no imports here: the names as written
        return self._is_prepare(node) or type(node) is cst.Name and \
            node.value in self.prepared

    def visit_For(self, node: cst.For) -> None:
        self.over.append(self._over_prepared(node.iter))
        self.loops += self.over[-1]

    def leave_For(self, original_node: cst.For) -> None:
        self.loops -= self.over.pop()


def _last_name(node: cst.BaseExpression) -> str:
    name = dotted_name(node) or ""
    return name.rsplit(".", 1)[-1].lower()


def _is_int(node: cst.BaseExpression) -> bool:
    return type(node) is cst.Integer


@dataclass(slots=True)
class DeviceState:
    """What :class:`DeviceMixin` keeps while it walks one module (``self._devices``)."""

    #: bare names that hold a flag read in place (``cpu = args.cpu``)
    flag_names: set[str] = field(default_factory=set)
    #: ids of the ``x if rt.device_choice(...) else y`` choices the rewrite made
    flag_choices: set[int] = field(default_factory=set)
    #: names that hold this process's own device now (a flag's choice, ``rt.device()``)
    own_devices: set[str] = field(default_factory=set)


class DeviceMixin(TransformerBase):
    _devices: DeviceState

    @handles("visit_Module")
    def _devices_on_module(self, node: cst.Module) -> None:
        self._devices = DeviceState()

    def _devices_may_call(self, qual: str) -> bool:
        """Can :meth:`_rewrite_device` act on a call of ``qual``?"""
        return self.rules.match("device_selectors", qual) is not None

    def _rewrite_device(self, original: cst.Call, updated: cst.Call,
                        qual: str) -> cst.BaseExpression | None:
        if not self._devices_may_call(qual):
            return None
        if updated.args and self._chosen_by_flag(updated.args[0].value):
            return None  # torch.device("cpu" if not rt.device_choice(...) else rt.device().type)
        if _selects_accelerator(original, qual):
            if self._skipped("device", updated):
                return None
            new = self._rt_call("device")
            self._edit(new, "device", "each process uses its own device")
            return new
        if qual.endswith(".device") and original.args and not _literal_args(original) \
                and not (len(original.args) == 1 and type(original.args[0].value) is cst.Name
                         and original.args[0].value.value in self._devices.own_devices):
            self._edit(updated, "device", "the device comes from a setting: under distify every "
                       f"process must use its own, `{self.rt}.device()` (a setting such as "
                       "'cuda' would put every process on the first GPU)", human=True)
        return None

    def _rewrite_device_method(self, updated: cst.Call, func: cst.Attribute,
                               method: str) -> cst.BaseExpression | None:
        if method in ("cuda", "to") and "device" in self.skip:
            if method == "cuda" or (updated.args and _is_gpu(updated.args[0])):
                self._skipped("device", updated)
            return None
        if method == "cuda":
            new = updated.with_changes(func=func.with_changes(attr=cst.Name("to")),
                                       args=[cst.Arg(self._rt_call("device"))])
            self._edit(new, "device", ".cuda() → .to(device): each process uses its own device")
            return new
        if method == "to" and updated.args and _is_gpu(updated.args[0]):
            first = updated.args[0].with_changes(value=self._rt_call("device"))
            new = updated.with_changes(args=[first, *updated.args[1:]])
            self._edit(new, "device", "each process uses its own device")
            return new
        return None

    def _device_name(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
        """A device setting's new value: ``rt.device().type`` for a name (``"cuda:0"``),
        ``rt.device()`` for a GPU index (``0``); None for anything else."""
        if _is_device_string(value):
            new = cst.Attribute(value=self._rt_call("device"), attr=cst.Name("type"))
            self._edit(new, "device", "each process uses its own device: the name stays a "
                       "name ('cuda' is this process's GPU)")
            return new
        return None

    @handles("leave_Assign")
    def _devices_after_assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        """``device = "cuda:0"`` → ``device = rt.device().type``; ``gpu_id = 0`` →
        ``gpu_id = rt.device()`` (a setting read by ``.to(...)`` elsewhere)."""
        if len(updated.targets) != 1:
            return updated
        self._remember_flag(updated.targets[0].target, updated.value)
        new = self._unless_skipped("device", updated, lambda: self._device_assign(updated))
        self._remember_own_device(new.targets[0].target, new.value)
        return new

    def _remember_own_device(self, target: cst.BaseAssignTargetExpression,
                             value: cst.BaseExpression) -> None:
        """``device = "cpu" if not rt.device_choice(...) else rt.device().type`` (a flag's
        choice), ``device = rt.device()``: the name holds this process's own device from here
        on, so ``torch.device(device)`` needs no note; assigned anything else, it may not."""
        if type(target) is not cst.Name:
            return
        names = self._devices.own_devices
        own = self._chosen_by_flag(value) or self._is_rt_device(value) or (
            type(value) is cst.Attribute and value.attr.value == "type"
            and self._is_rt_device(value.value))
        (names.add if own else names.discard)(target.value)

    def _device_assign(self, updated: cst.Assign) -> cst.Assign:
        choice = self._device_choice(updated.value)
        if choice is not None:
            return updated.with_changes(value=choice)
        return self._setting(updated, _last_name(updated.targets[0].target))

    def _device_choice(self, value: cst.BaseExpression) -> cst.BaseExpression | None:
        """``use_cuda = not args.no_cuda and torch.cuda.is_available()`` →
        ``use_cuda = rt.device_choice(not args.no_cuda and ...)``: a flag that chose the CPU
        still does, and ``prepare`` keeps the model there with the script's own tensors."""
        if type(value) is not cst.BooleanOperation:
            return None
        operands = _operands(value)
        checks = [o for o in operands if self._is_availability(o)]
        if not checks or len(checks) == len(operands):
            return None
        new = self._rt_call("device_choice", value)
        self._edit(new, "device", "a flag chooses the device here: where it says CPU, "
                   f"`{self.rt}.device_choice` keeps the process (and the prepared model) on the "
                   "CPU, as the script did")
        return new

    def _remember_flag(self, target: cst.BaseAssignTargetExpression,
                       value: cst.BaseExpression) -> None:
        """``cpu = args.cpu``, ``use_gpu = not opt.no_cuda``: a bare name that holds a setting
        read in place (no availability check: that assignment goes through ``device_choice``
        itself), so ``"cpu" if cpu else "cuda"`` is a flag's choice too."""
        if type(target) is cst.Name and all(_is_flag(o) for o in _operands(value)):
            self._devices.flag_names.add(target.value)

    def _holds_flag(self, node: cst.BaseExpression) -> bool:
        while type(node) is cst.UnaryOperation and type(node.operator) is cst.Not:
            node = node.expression
        return type(node) is cst.Name and node.value in self._devices.flag_names

    def _flag_still_chooses(self, updated: cst.IfExp) -> cst.IfExp:
        """``"cpu" if args.cpu else "cuda"``: the test is a flag (not only a torch availability
        check), so it must still choose the CPU after conversion. The test goes through
        ``rt.device_choice``, which keeps the process (and the prepared model) on the CPU when
        the flag says so, and the accelerator branch becomes this process's device:
        ``"cpu" if not rt.device_choice(not args.cpu) else rt.device().type``.
        ``"cuda" if torch.cuda.is_available() else "cpu"`` is returned as it is, and so is a
        choice between the CPU and a GPU index."""
        test = updated.test
        if not any(_is_flag(o) or self._holds_flag(o) for o in _operands(test)):
            return updated
        cpu_first = _is_cpu(updated.body)
        other = updated.orelse if cpu_first else updated.body
        if _is_device_string(other):
            other = cst.Attribute(value=self._rt_call("device"), attr=cst.Name("type"))
        elif not self._is_rt_device(other):  # rt.device(): torch.device("cuda") rewritten
            return updated
        if cpu_first:  # "cpu" if args.cpu else ...: the accelerator when not test
            if type(test) not in (cst.Name, cst.Attribute, cst.Call):
                test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            chosen = cst.UnaryOperation(operator=cst.Not(), expression=test)
            new_test = cst.UnaryOperation(operator=cst.Not(),
                                          expression=self._rt_call("device_choice", chosen))
            new = updated.with_changes(test=new_test, orelse=other)
        else:
            new_test = self._rt_call("device_choice", test)
            new = updated.with_changes(test=new_test, body=other)
        self._edit(new_test, "device", "a flag chooses the device here: where it says CPU, "
                   f"`{self.rt}.device_choice` keeps the process (and the prepared model) on the "
                   "CPU, as the script did")
        self._devices.flag_choices.add(id(new))
        return new

    def _is_rt_device(self, node: cst.BaseExpression) -> bool:
        return type(node) is cst.Call and dotted_name(node.func) == f"{self.rt}.device" \
            and not node.args

    def _chosen_by_flag(self, node: cst.BaseExpression) -> bool:
        """Is ``node`` an ``x if rt.device_choice(...) else y`` made by _flag_still_chooses?"""
        return id(node) in self._devices.flag_choices

    def _is_availability(self, node: cst.BaseExpression) -> bool:
        while type(node) is cst.UnaryOperation and type(node.operator) is cst.Not:
            node = node.expression
        qual = self._qual(node.func) if type(node) is cst.Call else None
        return bool(qual) and qual.startswith("torch.") and qual.endswith(
            (".is_available", ".device_count"))

    @handles("leave_AnnAssign")
    def _devices_after_ann_assign(self, original: cst.AnnAssign,
                                  updated: cst.AnnAssign) -> cst.AnnAssign:
        """``device: str = "cuda"`` in a config class, as an assignment."""
        if updated.value is None:
            return updated
        return self._unless_skipped(
            "device", updated, lambda: self._setting(updated, _last_name(updated.target)))

    def _setting(self, node, name: str):
        value = node.value
        if name in _DEVICE_SETTINGS and not _is_int(value):
            new = self._device_name(value)
            return node if new is None else node.with_changes(value=new)
        if (name in _GPU_INDEXES or name in _DEVICE_SETTINGS) and _is_int(value):
            new = self._index_call()
            self._edit(new, "device", f"`{name}` was GPU {value.value}: each process uses its "
                       f"own GPU, `{self.rt}.device_index()` (its index, as the script kept it; "
                       "on a machine without GPUs the CPU)")
            return node.with_changes(value=new)
        return node

    @handles("leave_DictElement")
    def _devices_after_dict_element(self, original: cst.DictElement,
                                    updated: cst.DictElement) -> cst.DictElement:
        """``{"device": "cuda:0", ...}`` (a config dict) → ``{"device": rt.device().type}``."""
        key = updated.key
        if type(key) is cst.SimpleString and literal_value(key) in _DEVICE_SETTINGS:
            return self._unless_skipped("device", updated, lambda: self._device_entry(updated))
        return updated

    def _device_entry(self, updated: cst.DictElement) -> cst.DictElement:
        new = self._device_name(updated.value)
        return updated if new is None else updated.with_changes(value=new)

    @handles("leave_Arg")
    def _devices_after_arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        """``torch.zeros(3, device="cuda:0")`` → ``device=rt.device()``."""
        if updated.keyword is not None and updated.keyword.value == "device" \
                and _is_device_string(updated.value):
            if self._skipped("device", updated):
                return updated
            new = updated.with_changes(value=self._rt_call("device"))
            self._edit(new.value, "device", "each process uses its own device")
            return new
        return updated

    def _index_call(self) -> cst.Call:
        """``rt.device_index()``: what replaces a GPU index the script keeps (it prints as
        the script's did at world size 1)."""
        call = self._rt_call("device_index")
        self.ctx.index_calls.add(id(call))
        return call

    def _update_device_comment(self, line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        """``device = 0  # shorthand for cuda:0`` → the comment says what the line holds now."""
        comment = line.trailing_whitespace.comment
        if comment is None or not self.ctx.index_calls or not _NAMES_A_GPU.search(comment.value):
            return line
        if not any(type(s) in (cst.Assign, cst.AnnAssign) and s.value is not None
                   and id(s.value) in self.ctx.index_calls for s in line.body):
            return line
        text = comment.value.lstrip("#").strip()
        new = cst.Comment(f"# this process's GPU (was: {text})")
        return line.with_changes(trailing_whitespace=line.trailing_whitespace.with_changes(
            comment=new))

    def _is_pinning(self, call: cst.BaseExpression) -> bool:
        return type(call) is cst.Call and \
            self.rules.match("device_pinning", self._qual(call.func)) is not None

    def _edit_removed(self, call: cst.Call) -> None:
        self.ctx.removed.append(dotted_name(call.func) or "device pinning")

    def _attach_removals(self, anchor: cst.CSTNode) -> None:
        """Report removed statements at the statement that now follows them."""
        for name in self.ctx.removed:
            self._edit(anchor, "device", f"removed {name}(...) just above: each process uses "
                       "its own device")
        self.ctx.removed = []

    @handles("leave_IfExp")
    def _devices_after_if_exp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.BaseExpression:
        """``"cuda" if cond else "cpu"`` → ``rt.device()``."""
        return self._unless_skipped("device", updated,
                                    lambda: self._device_if_exp(original, updated))

    def _device_if_exp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.BaseExpression:
        branches = (original.body, original.orelse)
        if not any(_is_cpu(b) for b in branches):
            return updated
        flagged = self._flag_still_chooses(updated)
        if flagged is not updated:
            return flagged
        if any(_is_device_string(b) for b in branches):  # a device name: it stays a name
            new = cst.Attribute(value=self._rt_call("device"), attr=cst.Name("type"))
            self._edit(new, "device", "each process uses its own device: the name stays a "
                       "name ('cuda' is this process's GPU)")
            return new
        if any(_is_int(b) for b in branches):  # `0 if torch.cuda.is_available() else "cpu"`
            new = self._index_call()
            self._edit(new, "device", "each process uses its own device: "
                       f"`{self.rt}.device_index()` is its GPU's index where the script had "
                       "one, else the device ('cpu')")
            return new
        return updated


def _operands(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operands of a chain of ``and``/``or``."""
    if type(node) is cst.BooleanOperation:
        return [*_operands(node.left), *_operands(node.right)]
    return [node]


def _is_flag(node: cst.BaseExpression) -> bool:
    """``args.cpu``, ``not opt.cuda``, ``cfg["use_gpu"]``, ``args.device == "cpu"``: a setting
    read in place. A bare name (``use_cuda``) is not: where it holds a flag, its own assignment
    goes through ``device_choice`` (``use_cuda = not args.no_cuda and ...``)."""
    while type(node) is cst.UnaryOperation and type(node.operator) is cst.Not:
        node = node.expression
    return type(node) in (cst.Attribute, cst.Subscript, cst.Comparison)


def _is_gpu(arg: cst.Arg) -> bool:
    """``.to("cuda:0")``, ``.to(0)``, ``.to(gpu_id)``, ``.to(args.gpu)``: one fixed GPU."""
    if arg.keyword is not None or arg.star:
        return False
    value = arg.value
    return _is_device_string(value) or _is_int(value) or (
        type(value) in (cst.Name, cst.Attribute) and _last_name(value) in _GPU_INDEXES)
