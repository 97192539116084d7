"""Is a file already parallel? One answer for ``convert`` (which leaves such files alone) and
``check`` (which checks only distributed ones).

Two kinds:

- **distributed**: its processes are ranks of one job. It uses a name of the
  ``distributed_markers`` pack (``torch.distributed``, DDP, ``DistributedSampler``, Accelerate,
  Lightning, DeepSpeed, Horovod, ``mp.spawn``, the distify runtime, ...) or reads the launcher's
  rank variables (``"RANK"``, ``"LOCAL_RANK"``, ``"WORLD_SIZE"``, ``--local_rank``). A file that
  only imports such a name is ``imported_only``: ``check`` lints it as distributed code, and
  ``convert`` converts it (a single-process script may import ``torch.distributed`` unused).
- **multi-process**: Hogwild. Processes started with ``torch.multiprocessing`` /
  ``multiprocessing`` train one model in shared memory (``model.share_memory()``) and no
  ``torch.distributed`` is involved. Its parent is one process: a save after ``join()`` is not
  repeated by any rank, so ``check`` has nothing to say about it, and ``convert`` must not wrap
  the model of every worker in DDP.

The walk is fed node by node (:class:`Finder`): the file model's search
(:attr:`distify.analysis.filemodel.FileModel.parallel`) uses it, or the whole-file walk of the
conversion's facts feeds it on the way.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from distify.analysis.names import ImportMap

#: cheap substring test before walking a tree for markers (every marker contains one of these)
HINTS = (b"distributed", b"Distributed", b"accelerate", b"lightning", b"deepspeed", b"horovod",
         b"import ray", b"from ray", b"ray.train", b"spawn", b"local_rank", b"local-rank",
         b"RANK", b"WORLD_SIZE", b"distify", b"Process", b"multiprocessing")
#: the runtime's modules: importing one marks a conversion's output, whatever it uses
_OWN_RUNTIME = ("distify", "distify_runtime")
_RANK_ENV = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE"})
_RANK_FLAGS = frozenset({"--local_rank", "--local-rank"})
#: what starts Hogwild workers (with ``share_memory()`` and no ``torch.distributed``)
_PROCESS_STARTERS = ("torch.multiprocessing.", "multiprocessing.")


#: the node types :meth:`Finder.see` reads (it passes over any other)
SEEN = frozenset({ast.Call, ast.Name, ast.Import, ast.ImportFrom, ast.Attribute, ast.Constant})


class _Matches(Protocol):
    def match(self, category: str, name: str | None) -> Any: ...


@dataclass(frozen=True)
class Parallelism:
    kind: Literal["distributed", "multi-process"]
    line: int
    why: str
    #: the file imports a distributed API and never uses it: ``check`` lints it as distributed
    #: code, ``convert`` converts it (a single-process script may import ``torch.distributed``)
    imported_only: bool = False

    @property
    def reason(self) -> str:
        """``already distributed (line 3 reads 'LOCAL_RANK')``."""
        if self.kind == "multi-process":
            return (f"already multi-process (line {self.line} {self.why}, and the model is "
                    "shared in memory: Hogwild training, not torch.distributed)")
        return f"already distributed (line {self.line} {self.why})"


class Finder:
    """Collects markers from the nodes it is shown; :meth:`result` gives the answer."""

    def __init__(self, imports: ImportMap, rules: _Matches) -> None:
        self.imports = imports
        self.rules = rules
        self.distributed: tuple[int, str] | None = None
        self.processes: tuple[int, str] | None = None  # a process starter (maybe Hogwild)
        self.shares_memory = False
        # An import alone is no marker: `import torch.distributed as dist` left unused by a
        # single-process script. The names it binds count once the file reads them.
        self._imported: dict[str, tuple[int, str, str]] = {}
        self._read: set[str] = set()
        self._first_import: tuple[int, str, str] | None = None

    @property
    def done(self) -> bool:
        return self.distributed is not None

    def see(self, node: ast.AST) -> None:
        if self.distributed is not None:
            return
        kind = type(node)
        if kind is ast.Name:  # the commonest first
            if isinstance(node.ctx, ast.Load):
                self._read.add(node.id)
            return
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("share_memory", "share_memory_"):
                self.shares_memory = True
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self._imports(node)
            return
        found = self._marker(node)
        if found is not None:
            self._found(*found)

    def _found(self, line: int, why: str, name: str | None) -> None:
        if name is not None and name.startswith(_PROCESS_STARTERS):
            if self.processes is None:
                self.processes = (line, why)
        else:
            self.distributed = (line, why)

    def _imports(self, node: ast.Import | ast.ImportFrom) -> None:
        """Remember the marker names an import binds; a dotted import without ``as`` binds its
        top package, whose uses the attribute test sees (``torch.distributed.get_rank()``)."""
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [f"{node.module}.{alias.name}" for alias in node.names] + [node.module])
        for name in names:
            if name and self.rules.match("distributed_markers", name):
                if name.split(".")[0] in _OWN_RUNTIME:  # distify's own output, used or not
                    self.distributed = (node.lineno, f"imports {name}")
                    return
                self._first_import = self._first_import or (node.lineno, f"imports {name}", name)
                break
        for alias in node.names:
            if isinstance(node, ast.Import):
                name = alias.name
                if alias.asname is None and "." in name:
                    continue
            elif node.module is None or alias.name == "*":
                continue
            else:
                name = f"{node.module}.{alias.name}"
            if self.rules.match("distributed_markers", name) or (
                    isinstance(node, ast.ImportFrom)
                    and self.rules.match("distributed_markers", node.module)):
                bound = alias.asname or alias.name.split(".", 1)[0]
                self._imported.setdefault(bound, (node.lineno, f"uses {name}", name))

    def result(self) -> Parallelism | None:
        if self.distributed is None:
            for bound, found in sorted(self._imported.items(), key=lambda item: item[1][0]):
                if bound in self._read:
                    self._found(*found)
                    if self.distributed is not None:
                        break
        if self.distributed is not None:
            return Parallelism("distributed", *self.distributed)
        if self.processes is not None:
            kind = "multi-process" if self.shares_memory else "distributed"
            return Parallelism(kind, *self.processes)
        if self._first_import is not None:
            line, why, name = self._first_import
            if not name.startswith(_PROCESS_STARTERS):
                return Parallelism("distributed", line, why, imported_only=True)
        return None

    def _marker(self, node: ast.AST) -> tuple[int, str, str | None] | None:
        if isinstance(node, ast.Attribute):
            qualname = self.imports.ast_qualname(node)
            if qualname and self.rules.match("distributed_markers", qualname):
                return node.lineno, f"uses {qualname}", qualname
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and (node.value in _RANK_FLAGS or node.value in _RANK_ENV):
            return node.lineno, f"reads {node.value!r}", None
        return None
