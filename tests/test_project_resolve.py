"""``analysis.project.resolve`` reads each folder once (``listings``) and answers as asking the
disk for each candidate file would: the first of ``a/b.py``, ``a/b/__init__.py`` that is a
file, for the longest prefix of the name first, from the importer's folder up to the root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distify.analysis.project import resolve

_FILES = ["train.py", "model.py", "utils/__init__.py", "utils/data.py", "pkg/sub.py",
          "weird.py/__init__.py", "sub/helpers.py", "sub/inner/script.py", "sub/inner/model.py",
          "nested/pkg/__init__.py", "nested/pkg/mod.py", "nopkg/mod.py"]
_NAMES = ["model", "utils", "utils.data", "utils.data.load", "pkg.sub", "pkg", "weird", "link",
          "broken", "torch", "os.path", ".helpers", "..model", "...model", ".", "sub.helpers",
          "nested.pkg.mod", "nested.pkg", "nopkg", "nopkg.mod", "inner.model", "helpers"]


def _asking_the_disk(name: str, importer: Path, root: Path) -> Path | None:
    level = len(name) - len(name.lstrip("."))
    parts = name[level:].split(".") if name[level:] else []
    if level:
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
        bases = [base]
    else:
        bases, folder = [], importer.parent
        while True:
            bases.append(folder)
            if folder == root or folder == folder.parent or root not in folder.parents:
                break
            folder = folder.parent
    for base in bases:
        for count in range(len(parts), 0, -1):
            stem = base.joinpath(*parts[:count])
            for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
                if candidate.is_file():
                    return candidate
    return None


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in _FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    os.symlink(tmp_path / "model.py", tmp_path / "link.py")
    os.symlink(tmp_path / "missing.py", tmp_path / "broken.py")
    return tmp_path


@pytest.mark.parametrize("importer", ["train.py", "sub/helpers.py", "sub/inner/script.py",
                                      "nested/pkg/mod.py"])
def test_the_same_answer_as_asking_the_disk(project: Path, importer: str) -> None:
    listings: dict = {}
    for name in _NAMES:
        expected = _asking_the_disk(name, project / importer, project)
        assert resolve(name, project / importer, project, listings) == expected, name
        assert resolve(name, project / importer, project) == expected, name
    # the cases are not all misses: modules, packages and a link are found
    found = {name: resolve(name, project / "train.py", project) for name in _NAMES}
    assert found["utils.data.load"] == project / "utils" / "data.py"
    assert found["utils"] == project / "utils" / "__init__.py"
    assert found["weird"] is None  # a folder named weird.py is no module
    assert found["link"] == project / "link.py" and found["broken"] is None
