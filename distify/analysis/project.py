"""Which files of a project run inside an already-distributed job: the local modules that a
distributed (or Hogwild) entry point imports, directly or through other local modules.

nanoGPT's ``model.py`` or a ``utils.py`` beside a DDP ``train.py`` read no rank themselves, but
they run in every process of that job. ``convert`` leaves them as written (converting them would
put a second runtime under a script that already has one) and ``check`` checks them as
distributed code. A module that a script being converted also imports is converted with it.

Imports are resolved the way ``python train.py`` resolves them: from the importer's folder (the
script's folder is ``sys.path[0]``) and its parents up to the project root, ``a.b`` as ``a/b.py``
or ``a/b/__init__.py``, relative imports from the importer's package.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Mapping
from pathlib import Path


def module_names(modules: Iterable[str], aliases: Iterable[str]) -> tuple[str, ...]:
    """The names an import table may refer to local files by (``model``, ``.utils``,
    ``pkg.mod``), deduplicated; see :class:`distify.analysis.names.ImportMap`."""
    return tuple(dict.fromkeys([*modules, *aliases]))


def resolve(name: str, importer: Path, root: Path,
            listings: dict[str, dict[str, tuple[bool, bool]]] | None = None) -> Path | None:
    """The local file ``name`` (as imported by ``importer``) is, or None.

    ``listings``: each folder's entries (is a file, is a folder), filled as folders are read;
    pass one dict to many calls on the same files: a name is looked for in every folder from
    the importer's up to the root, as a module and as a package, for each of its prefixes,
    and one read of a folder answers them all (names match as the import system matches
    them: case and all)."""
    level = len(name) - len(name.lstrip("."))
    dotted = name[level:]
    if level:
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
        bases = [base]
    else:
        bases = []
        folder = importer.parent
        while True:
            bases.append(folder)
            if folder == root or folder == folder.parent or root not in folder.parents:
                break
            folder = folder.parent
    parts = dotted.split(".") if dotted else []
    if not all(part.isidentifier() for part in parts):  # not an import name: ask the disk
        for base in bases:
            for count in range(len(parts), 0, -1):
                stem = base.joinpath(*parts[:count])
                for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
                    if candidate.is_file():
                        return candidate
        return None
    listings = {} if listings is None else listings
    for base in bases:
        for count in range(len(parts), 0, -1):  # `from pkg.mod import f`: pkg/mod.py, not f
            folder = os.path.join(base, *parts[:count - 1])
            last = parts[count - 1]
            entries = _listing(folder, listings)
            if entries.get(f"{last}.py", (False,))[0]:
                return Path(folder, f"{last}.py")
            if entries.get(last, (False, False))[1] and \
                    _listing(os.path.join(folder, last), listings).get("__init__.py", (False,))[0]:
                return Path(folder, last, "__init__.py")
    return None


def _listing(folder: str, listings: dict[str, dict[str, tuple[bool, bool]]],
             ) -> dict[str, tuple[bool, bool]]:
    """``folder``'s entries: name → (a file, a folder), links followed; empty if unreadable."""
    found = listings.get(folder)
    if found is None:
        try:
            with os.scandir(folder) as entries:
                found = {entry.name: (entry.is_file(), entry.is_dir()) for entry in entries}
        except OSError:
            found = {}
        listings[folder] = found
    return found


def imported_by_parallel(imports: Mapping[Path, tuple[str, ...]], parallel: Iterable[Path],
                         converted: Iterable[Path], root: Path, *,
                         real: dict[Path, Path] | None = None) -> dict[Path, Path]:
    """The local modules a parallel entry point reaches, with that entry point, leaving out any
    that a converted file also reaches.

    Args:
        imports: every project file's import names (:func:`module_names`).
        parallel: the files that are already distributed or multi-process.
        converted: the files being converted; those a parallel file reaches count as its
            helpers, the others as scripts whose helpers are converted with them.
        root: the project's root folder.
        real: each path's ``resolve()``, filled as they are met (pass one dict to calls on the
            same files: resolving a path is an ``lstat`` per folder of it).
    """
    by_parallel, by_converted = _reached_by_both(imports, parallel, converted, root, real)
    return {path: entry for path, entry in by_parallel.items() if path not in by_converted}


def reach(imports: Mapping[Path, tuple[str, ...]], starts: Iterable[Path],
          root: Path, real: dict[Path, Path] | None = None) -> dict[Path, Path]:
    """The project files that ``starts`` import, directly or through other project files, each
    with the start that reaches it first (a start itself only when another start imports it).

    Args:
        imports: every project file's import names (:func:`module_names`), by path.
        starts: where to begin.
        root: the project's root folder.
        real: as :func:`imported_by_parallel`'s.
    """
    real = {} if real is None else real

    def resolved(path: Path) -> Path:
        found = real.get(path)
        if found is None:
            found = real[path] = path.resolve()
        return found

    files = {resolved(path): path for path in imports}
    root = root.resolve()
    found: dict[Path, Path] = {}
    # the files of one folder import the same names (`torch`, `os`, `utils`): each name is
    # looked for once per folder, not once per import (each look is several `stat` calls)
    targets: dict[tuple[str, Path], Path | None] = {}
    listings: dict[str, dict[str, tuple[bool, bool]]] = {}
    for start in starts:
        pending = [start]
        while pending:
            path = pending.pop()
            importer = resolved(path)
            for name in imports.get(path, ()):
                key = (name, importer.parent)
                if key in targets:
                    target = targets[key]
                else:
                    target = targets[key] = resolve(name, importer, root, listings)
                local = files.get(target) if target is not None else None
                if local is None or local in found or local == start:
                    continue
                found[local] = start
                pending.append(local)
    return found


def shared_with_parallel(imports: Mapping[Path, tuple[str, ...]], parallel: Iterable[Path],
                         converted: Iterable[Path], root: Path) -> dict[Path, tuple[Path, Path]]:
    """The local modules that both a parallel entry point and a script being converted reach,
    with that parallel entry point and that script: code that runs in both jobs.

    Args: as :func:`imported_by_parallel`.
    """
    by_parallel, by_converted = _reached_by_both(imports, parallel, converted, root)
    return {path: (entry, by_converted[path]) for path, entry in by_parallel.items()
            if path in by_converted}


def _reached_by_both(imports: Mapping[Path, tuple[str, ...]], parallel: Iterable[Path],
                     converted: Iterable[Path], root: Path,
                     real: dict[Path, Path] | None = None,
                     ) -> tuple[dict[Path, Path], dict[Path, Path]]:
    """What the parallel files reach (each with its parallel file), and what the converted
    files that are scripts, not helpers of a parallel file, reach (each with its script)."""
    parallel = list(parallel)
    real = {} if real is None else real
    by_parallel = {path: entry for path, entry in reach(imports, parallel, root, real).items()
                   if path not in parallel}
    entries = [path for path in converted if path not in by_parallel]  # scripts, not helpers
    return by_parallel, reach(imports, entries, root, real)


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":``, either way round."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    return len(sides) == 2 and {ast.unparse(side) for side in sides} == {
        "__name__", "'__main__'"}


def runs_as_script(tree: ast.Module) -> bool:
    """The file does work when run: a ``__main__`` block, a loop, or a call at its top level
    (an assignment from a call counts: ``model = Net()``)."""
    for node in tree.body:
        if _is_main_guard(node) or isinstance(node, (ast.For, ast.While, ast.With, ast.Try)):
            return True
        if isinstance(node, (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
                isinstance(sub, ast.Call) for sub in ast.walk(node)):
            return True
    return False


def has_main_guard(tree: ast.Module) -> bool:
    return any(_is_main_guard(node) for node in tree.body)


def _trains(func: ast.expr) -> bool:
    """A call that back-propagates (``x.backward()``, ``distify.backward(loss)``,
    ``torch.autograd.grad(...)``, ``grad(...)``), or may do it inside a library
    (``trainer.fit(...)``, ``trainer.train()``; ``model.train()`` too, which inference code
    rarely calls)."""
    if isinstance(func, ast.Name):
        return func.id == "grad"
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "grad":
        return ast.unparse(func.value).split(".")[-1] == "autograd"
    return func.attr in ("backward", "fit", "train")


class BackwardReach:
    """Whether running a project file can reach a backward pass (``x.backward(...)``,
    ``distify.backward(loss)``, ``autograd.grad``, or a library's ``fit``/``train`` that may
    run one): in the file itself, or in the project code it calls.

    A file as a whole reaches what it holds and every project module it imports (a whole module
    for ``import utils``; for ``from utils import evaluate`` only ``evaluate`` and the module's
    functions and classes that it names, as far as they go). Code outside the project (an
    installed package) never counts. What it deliberately does not do: follow calls through
    objects (``trainer.fit()`` of a class from another module counts only when the class is
    named), or tell a dead branch from a live one: a backward anywhere in a reached function
    counts.
    """

    def __init__(self, sources: Mapping[Path, bytes], root: Path) -> None:
        self.root = root.resolve()
        self.sources = {path.resolve(): source for path, source in sources.items()}
        self.trees: dict[Path, ast.Module | None] = {}

    def tree(self, path: Path) -> ast.Module | None:
        path = path.resolve()
        if path not in self.trees:
            source = self.sources.get(path)
            try:
                self.trees[path] = ast.parse(source) if source is not None else None
            except (SyntaxError, ValueError):
                self.trees[path] = None
        return self.trees[path]

    def reaches_backward(self, path: Path) -> bool:
        """The file as a script (everything in it) reaches a backward pass."""
        seen: set[tuple[Path, str | None]] = set()
        pending: list[tuple[Path, str | None]] = [(path.resolve(), None)]
        while pending:
            key = pending.pop()
            if key in seen:
                continue
            seen.add(key)
            found, more = self._look(*key)
            if found:
                return True
            pending.extend(more)
        return False

    def _look(self, path: Path, name: str | None) -> tuple[bool, list[tuple[Path, str | None]]]:
        """Whether ``name`` of ``path`` (the whole file for None) holds a backward itself, and
        what else it names: (file, name) pairs to look at next."""
        tree = self.tree(path)
        if tree is None:
            return False, []
        defs = {node.name: node for node in tree.body if isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        imported = self._imports(tree, path)
        if name is None:
            node: ast.AST = tree
        elif name in defs:
            node = defs[name]
        else:
            return False, [imported[key] for key in (name, "*") if key in imported]
        if any(isinstance(sub, ast.Call) and _trains(sub.func) for sub in ast.walk(node)):
            return True, []
        if name is None:
            return False, list(imported.values())
        named = {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name)}
        named.add("*")  # a name from a star import may be any of them
        return False, [(path, other) for other in named & defs.keys() if other != name] + [
            imported[other] for other in named & imported.keys()]

    def _imports(self, tree: ast.Module, path: Path) -> dict[str, tuple[Path, str | None]]:
        """The names bound by imports of project files anywhere in ``tree``: what each one is
        (a file, and a name in it or None for the whole file); a star import binds ``*``."""
        bound: dict[str, tuple[Path, str | None]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = resolve(alias.name, path, self.root)
                    if target is not None:
                        bound[alias.asname or alias.name.split(".")[0]] = (target, None)
            elif isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                base = resolve(module, path, self.root)
                for alias in node.names:
                    whole = resolve(f"{module.rstrip('.')}.{alias.name}" if node.module else
                                    f"{module}{alias.name}", path, self.root)
                    if whole is not None and whole != base:  # a submodule
                        bound[alias.asname or alias.name] = (whole, None)
                    elif base is not None:
                        bound[alias.asname or alias.name] = (
                            base, None if alias.name == "*" else alias.name)
        return bound
