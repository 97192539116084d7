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

from collections.abc import Iterable, Mapping
from pathlib import Path


def module_names(modules: Iterable[str], aliases: Iterable[str]) -> tuple[str, ...]:
    """The names an import table may refer to local files by (``model``, ``.utils``,
    ``pkg.mod``), deduplicated; see :class:`distify.analysis.names.ImportMap`."""
    return tuple(dict.fromkeys([*modules, *aliases]))


def resolve(name: str, importer: Path, root: Path) -> Path | None:
    """The local file ``name`` (as imported by ``importer``) is, or None."""
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
    for base in bases:
        for count in range(len(parts), 0, -1):  # `from pkg.mod import f`: pkg/mod.py, not f
            stem = base.joinpath(*parts[:count])
            for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
                if candidate.is_file():
                    return candidate
    return None


def imported_by_parallel(imports: Mapping[Path, tuple[str, ...]], parallel: Iterable[Path],
                         converted: Iterable[Path], root: Path) -> dict[Path, Path]:
    """The local modules a parallel entry point reaches, with that entry point, leaving out any
    that a converted file also reaches.

    Args:
        imports: every project file's import names (:func:`module_names`).
        parallel: the files that are already distributed or multi-process.
        converted: the files being converted; those a parallel file reaches count as its
            helpers, the others as scripts whose helpers are converted with them.
        root: the project's root folder.
    """
    files = {path.resolve(): path for path in imports}

    def reach(starts: Iterable[Path]) -> dict[Path, Path]:
        found: dict[Path, Path] = {}
        for start in starts:
            pending = [start]
            while pending:
                path = pending.pop()
                for name in imports.get(path, ()):
                    target = resolve(name, path.resolve(), root.resolve())
                    local = files.get(target) if target is not None else None
                    if local is None or local in found or local == start:
                        continue
                    found[local] = start
                    pending.append(local)
        return found

    parallel = list(parallel)
    by_parallel = {path: entry for path, entry in reach(parallel).items()
                   if path not in parallel}
    entries = [path for path in converted if path not in by_parallel]  # scripts, not helpers
    by_converted = reach(entries)
    return {path: entry for path, entry in by_parallel.items() if path not in by_converted}
