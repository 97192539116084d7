"""``[tool.distify]`` in ``pyproject.toml``: the project's settings for ``check`` and
``convert``.

::

    [tool.distify]
    rules = ["ci/extra_rules.yaml"]      # extra rule packs, shared with `distify convert`

    [tool.distify.check]
    select = ["DST1", "DST201"]          # codes or prefixes; default: every rule
    ignore = ["DST303"]
    exclude = ["legacy/", "*_pb2.py"]    # globs, relative to this pyproject.toml
    all = false                          # check files that are not distributed too

    [tool.distify.convert]
    skip = ["progress-bars"]             # rewrites to leave out (`distify convert --list-rewrites`)

The nearest ``pyproject.toml`` with a ``[tool.distify]`` table, from the current folder up, is
used (or the file ``--config`` names). Reading TOML needs Python 3.11's ``tomllib`` (or the
``tomli`` package); without either the config is skipped with a note, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from distify.errors import UserError

_KEYS = {"select": list, "ignore": list, "extend-select": list, "exclude": list, "all": bool}


@dataclass(frozen=True)
class CheckConfig:
    """Settings from a pyproject.toml (all empty when there is none)."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    check_all: bool = False
    rules: tuple[Path, ...] = ()
    root: Path | None = None
    source: Path | None = None
    note: str = ""
    #: ``[tool.distify.convert] skip``: rewrites ``distify convert`` leaves out (names unchecked)
    convert_skip: tuple[str, ...] = ()


def load_config(explicit: Path | None = None, start: Path | None = None) -> CheckConfig:
    """Read the config ``explicit`` names, or the nearest one above ``start`` (default: cwd).

    Raises:
        UserError: the file cannot be read, is not TOML, or has unknown keys or wrong types.
    """
    path = explicit or _find(start or Path.cwd())
    if path is None:
        return CheckConfig()
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            return CheckConfig(note=f"{path}: [tool.distify] skipped: reading it needs "
                                    "Python 3.11+ or the tomli package")
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"cannot read config: {err.strerror}", path=str(path)) from None
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"config is not valid TOML: {err}", path=str(path)) from None
    return _parse(data.get("tool", {}).get("distify", {}), Path(path))


def _find(start: Path) -> Path | None:
    for folder in (start.resolve(), *start.resolve().parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                text = candidate.read_text(encoding="utf-8")
            except OSError:
                continue
            if "[tool.distify" in text:
                return candidate
    return None


def _parse(table: dict, path: Path) -> CheckConfig:
    root = path.parent
    rules = table.get("rules", [])
    if not isinstance(rules, list) or not all(isinstance(item, str) for item in rules):
        raise UserError("[tool.distify] rules: expected a list of paths", path=str(path))
    check = table.get("check", {})
    if not isinstance(check, dict):
        raise UserError("[tool.distify] check: expected a table", path=str(path))
    convert = table.get("convert", {})
    if not isinstance(convert, dict):
        raise UserError("[tool.distify] convert: expected a table", path=str(path))
    for key, value in convert.items():
        if key != "skip":
            raise UserError(f"[tool.distify.convert] unknown key {key!r} (known: skip)",
                            path=str(path))
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError("[tool.distify.convert] skip: expected a list of strings",
                            path=str(path))
    for key, value in check.items():
        kind = _KEYS.get(key)
        if kind is None:
            raise UserError(f"[tool.distify.check] unknown key {key!r} "
                            f"(known: {', '.join(_KEYS)})", path=str(path))
        if not isinstance(value, kind) or (kind is list
                                           and not all(isinstance(v, str) for v in value)):
            expected = "true or false" if kind is bool else "a list of strings"
            raise UserError(f"[tool.distify.check] {key}: expected {expected}", path=str(path))
    return CheckConfig(
        select=tuple(check.get("select", ())), ignore=tuple(check.get("ignore", ())),
        extend_select=tuple(check.get("extend-select", ())),
        exclude=tuple(check.get("exclude", ())), check_all=check.get("all", False),
        rules=tuple(root / item for item in rules), root=root, source=path,
        convert_skip=tuple(convert.get("skip", ())))
