"""Rewrites of single-device code: every process uses its own device, ``rt.device()``.

``torch.device("cuda" ...)``, ``"cuda" if ... else "cpu"``,
``torch.accelerator.current_accelerator()``
→ ``rt.device()``; ``x.cuda()`` and ``x.to("cuda:0")`` → ``x.to(rt.device())``; device pinning
(``torch.cuda.set_device``) is removed, with an ``if`` that held nothing else. ``"cpu"`` stays.
"""

from __future__ import annotations

import libcst as cst

from distify.analysis.names import dotted_name
from distify.convert.base import TransformerBase
from distify.convert.syntax import _is_cpu, _is_device_string, _literal_args, _selects_accelerator


class DeviceMixin(TransformerBase):
    def _rewrite_device(self, original: cst.Call, updated: cst.Call,
                        qual: str) -> cst.BaseExpression | None:
        if not self.rules.match("device_selectors", qual):
            return None
        if _selects_accelerator(original, qual):
            new = self._rt_call("device")
            self._edit(new, "device", "each process uses its own device")
            return new
        if qual.endswith(".device") and original.args and not _literal_args(original):
            self._edit(updated, "device", "the device comes from a setting: under distify every "
                       f"process must use its own, `{self.rt}.device()` (a setting such as "
                       "'cuda' would put every process on the first GPU)", human=True)
        return None

    def _rewrite_device_method(self, updated: cst.Call, func: cst.Attribute,
                               method: str) -> cst.BaseExpression | None:
        if method == "cuda":
            new = updated.with_changes(func=func.with_changes(attr=cst.Name("to")),
                                       args=[cst.Arg(self._rt_call("device"))])
            self._edit(new, "device", ".cuda() → .to(device): each process uses its own device")
            return new
        if method == "to" and updated.args and _is_device_string(updated.args[0].value):
            first = updated.args[0].with_changes(value=self._rt_call("device"))
            new = updated.with_changes(args=[first, *updated.args[1:]])
            self._edit(new, "device", "each process uses its own device")
            return new
        return None

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        """``torch.zeros(3, device="cuda:0")`` → ``device=rt.device()``."""
        if updated.keyword is not None and updated.keyword.value == "device" \
                and _is_device_string(updated.value):
            new = updated.with_changes(value=self._rt_call("device"))
            self._edit(new.value, "device", "each process uses its own device")
            return new
        return updated

    def _is_pinning(self, call: cst.BaseExpression) -> bool:
        return isinstance(call, cst.Call) and \
            self.rules.match("device_pinning", self._qual(call.func)) is not None

    def _edit_removed(self, call: cst.Call) -> None:
        self._removed.append(dotted_name(call.func) or "device pinning")

    def _attach_removals(self, anchor: cst.CSTNode) -> None:
        """Report removed statements at the statement that now follows them."""
        for name in self._removed:
            self._edit(anchor, "device", f"removed {name}(...) just above: each process uses "
                       "its own device")
        self._removed = []

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.BaseExpression:
        """``"cuda" if cond else "cpu"`` → ``rt.device()``."""
        branches = (original.body, original.orelse)
        if any(_is_device_string(b) for b in branches) and any(_is_cpu(b) for b in branches):
            new = self._rt_call("device")
            self._edit(new, "device", "each process uses its own device")
            return new
        return updated
