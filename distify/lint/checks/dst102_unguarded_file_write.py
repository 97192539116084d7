"""DST102: a file written by every rank."""

from __future__ import annotations

import ast

from distify.analysis.effects import HANDLE_KEYWORDS, is_open_call
from distify.analysis.names import ast_dotted_name
from distify.lint.checks._side_effects import SideEffectRule
from distify.lint.rule import Invalid, Valid
from distify.rules import Entry


class UnguardedFileWrite(SideEffectRule):
    """A file is written by every rank.

    ``open(path, "w")`` (also ``"a"``, ``"x"``, ``"+"``), ``Path.write_text``, ``json.dump`` /
    ``yaml.dump`` / ``pickle.dump``, ``numpy.save*``, ``plt.savefig``, ``DataFrame.to_csv``, a
    ``logging.FileHandler`` (``kind: write`` in ``rules/side_effects.yaml``): in a distributed
    job every process writes the same file, interleaving or clobbering each other. Write on the
    main process only.

    What is written into a handle opened in the file (``f.write``, ``json.dump(obj, f)``) is
    reported once, at its ``open``; the fix wraps the whole ``with open(...)`` block, unless the
    block binds names that code after it might use.
    """

    CODE = "DST102"
    KIND = "write"
    MESSAGE = "`{name}` writes a file on every rank; write on the main process only"

    VALID = (
        Valid("""
            import json
            import torch.distributed as dist

            if dist.get_rank() == 0:
                with open("metrics.json", "w") as f:
                    json.dump(metrics, f)
        """),
        Valid("""
            import torch.distributed as dist

            with open("config.json") as f:
                config = f.read()
        """),
        Valid("""
            import os
            import numpy as np
            import torch.distributed as dist

            if int(os.environ["RANK"]) != 0:
                pass
            else:
                np.save("embeddings.npy", embeddings)
        """),
    )
    INVALID = (
        Invalid("""
            import json
            import torch.distributed as dist

            def main(rank):
                if rank == 0:
                    print("start")
                with open("metrics.json", "w") as f:
                    json.dump(metrics, f)
        """, line=7, fixed="""
            import json
            import torch.distributed as dist

            def main(rank):
                if rank == 0:
                    print("start")
                if rank == 0:
                    with open("metrics.json", "w") as f:
                        json.dump(metrics, f)
        """),
        Invalid("""
            import matplotlib.pyplot as plt
            from accelerate import Accelerator

            accelerator = Accelerator()
            plt.savefig("loss.png")
        """, line=5, fixed="""
            import matplotlib.pyplot as plt
            from accelerate import Accelerator

            accelerator = Accelerator()
            if accelerator.is_main_process:
                plt.savefig("loss.png")
        """),
        Invalid("""
            import pickle
            import torch.distributed as dist

            def dump(obj, handle):
                pickle.dump(obj, handle)
        """, line=5),
        Invalid("""
            import torch.distributed as dist

            log = open("train.log", mode="a")
        """, line=3),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.handles: set[str] = set()

    def keep(self, node: ast.Call, entry: Entry) -> bool:
        if entry.get("handle_arg") is None:
            return True
        handle = _argument(node, entry.get("handle_arg"), HANDLE_KEYWORDS)
        return not (self._is_open(handle) or ast_dotted_name(handle) in self.handles)

    def visit_withitem(self, node: ast.withitem) -> None:
        if node.optional_vars is not None and self._is_open(node.context_expr):
            self.handles.add(ast_dotted_name(node.optional_vars))

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and self._is_open(node.value):
            self.handles.add(ast_dotted_name(node.targets[0]))

    def _is_open(self, node: ast.AST | None) -> bool:
        if not isinstance(node, ast.Call):
            return False
        return is_open_call(self.ctx.matcher, self.ctx.callee(node))


def _argument(node: ast.Call, index: int, keywords: tuple[str, ...]) -> ast.expr | None:
    if len(node.args) > index and not any(isinstance(arg, ast.Starred)
                                          for arg in node.args[:index + 1]):
        return node.args[index]
    for keyword in node.keywords:
        if keyword.arg in keywords:
            return keyword.value
    return None

