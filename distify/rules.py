"""Rule packs: what counts as a model, an optimizer, a DataLoader, a save, a guard, ... as data.

A rule pack is a YAML file (``yaml.safe_load``) mapping a *category* to a list of entries. An entry
is a qualified-name pattern (``torch.optim.*``) or a mapping with a ``name`` pattern and extra
fields for the rule that uses it (``{name: torch.save, kind: save}``). In patterns ``*`` matches
one dotted segment (or part of one) and ``**`` any number of segments, so ``torch.optim.*``
matches ``torch.optim.SGD`` but not ``torch.optim.lr_scheduler.StepLR``.

The packs shipped in ``rules/`` are always loaded; users add their own with ``--rules FILE`` or
``[tool.distify] rules = [...]`` in ``pyproject.toml``. Entries from every pack are merged.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distify.errors import UserError

#: Every category a pack may define, with what it means.
CATEGORIES: dict[str, str] = {
    "models": "callables that build a model (nn.Module) to train",
    "model_bases": "base classes: a local class deriving from one of these is a model class",
    "optimizers": "optimizer constructors",
    "schedulers": "learning-rate scheduler constructors",
    "dataloaders": "DataLoader constructors",
    "samplers": "sampler classes distify knows how to shard",
    "saves": "calls that write a checkpoint; `runtime:` names the distify.runtime replacement",
    "loads": "calls that read a checkpoint; `runtime:` names the distify.runtime replacement",
    "device_selectors": "calls that pick a single device; replaced by the runtime's device",
    "device_pinning": "calls that pin one device for the process; removed by convert",
    "side_effects": "calls that write files, logs or trackers (`kind:` save|write|tracker|fs)",
    "collectives": "calls every rank must reach (barriers, reductions, gathers)",
    "guards": "names whose truth means 'this is the main process'",
    "guard_decorators": "decorators that run a function on the main process only",
    "distributed_markers": "imports or calls that mean a file is already distributed",
    "data_parallel": "single-process multi-GPU wrappers that DDP replaces (the call is dropped)",
    "data_parallel_functions": "functional data parallelism `f(module, inputs)` → `module(inputs)`",
    "grad_scalers": "loss scalers: a script using one manages its own mixed precision",
    "progress_bars": "progress bars shown on the main process only",
    "logging_setup": "logging configuration: other processes log warnings and errors only",
    "grad_clipping": "gradient clipping; `runtime:` names the replacement (unscales fp16 first)",
    "timestamps": "clock readings that name run folders and must agree across processes",
    "rank_values": "expressions holding this process's rank; compared with 0 they make a guard",
    "rank_env_vars": "environment variables that launchers set to the rank",
    "process_exits": "calls that end the process (a rank-dependent one is an early exit)",
    "wrappers": "objects or modules that prepare models and own the backward pass "
                "(`prepare:`, `backward:`, `module:`, `conventional_names:`)",
    "distributed_samplers": "samplers that shard a dataset across ranks (need `set_epoch`)",
    "eval_contexts": "context managers and decorators that mark evaluation code",
    "loggers": "calls that print or log a value",
    "random_splits": "random draws that split or order the data set, which every process must "
                     "make alike (`seed_arg:`, `seed_pos:` the keyword and position that seed "
                     "the call; `generator` ones "
                     "get the runtime's shared generator, others are reported when unseeded)",
    "seeds": "calls that seed a random generator (with a fixed seed every process draws alike)",
    "downloads": "calls that download (`kind:` fetch: a hand-written download, which the main "
                 "process runs with the statements after it that write, extract or remove its "
                 "files while the others wait; dataset: a data set that skips files already "
                 "there, run on the main process first)",
}

_BUNDLED = "distify.bundled_rules"


@dataclass(frozen=True)
class Entry:
    """One rule entry: a qualified-name pattern plus the fields its category uses."""

    pattern: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


@dataclass(frozen=True)
class RuleSet:
    """The merged rule packs. Look entries up with :meth:`match`."""

    entries: Mapping[str, tuple[Entry, ...]]
    #: (category, qualname) → entry: the same names are looked up thousands of times a file
    _memo: dict = field(default_factory=dict, compare=False, repr=False)
    #: category → its patterns indexed for :meth:`_first`
    _alternatives: dict = field(default_factory=dict, compare=False, repr=False)

    def match(self, category: str, qualname: str | None) -> Entry | None:
        """The first entry of ``category`` whose pattern matches ``qualname``, else None."""
        if not qualname:
            return None
        key = (category, qualname)
        try:
            return self._memo[key]
        except KeyError:
            pass
        found = self._memo[key] = self._first(category, qualname)
        return found

    def _first(self, category: str, qualname: str) -> Entry | None:
        """The first entry whose pattern matches. A plain name is looked up in a dict; only
        the wildcard patterns before it are tried, each by a string test (``**.save`` ends
        with ``.save``) or, for a rarer shape, its own regex. One regex for the whole category
        took longer to compile than a small conversion spends matching."""
        entries = self.entries.get(category, ())
        if not entries:
            return None
        index = self._alternatives.get(category)
        if index is None:
            index = self._alternatives[category] = _Index(entries)
        exact = index.exact.get(qualname)
        for position, test in index.wildcards:
            if exact is not None and position > exact:
                break
            if test(qualname):
                return entries[position]
        return entries[exact] if exact is not None else None

    def names(self, category: str) -> tuple[str, ...]:
        return tuple(entry.pattern for entry in self.entries.get(category, ()))


class _Index:
    """A category's patterns: the plain names (each to the position of its first entry), and
    the wildcard patterns in order with a test each."""

    def __init__(self, entries: tuple[Entry, ...]) -> None:
        self.exact: dict[str, int] = {}
        self.wildcards: list[tuple[int, Callable[[str], bool]]] = []
        for position, entry in enumerate(entries):
            pattern = entry.pattern
            if "*" not in pattern:
                self.exact.setdefault(pattern, position)
            else:
                self.wildcards.append((position, _test(pattern)))


def _test(pattern: str) -> Callable[[str], bool]:
    """What ``_compile(pattern).fullmatch`` says of a name (a name holds no newline), by a
    string test for the common shapes: ``**.x``, ``x.**`` and ``x.*``."""
    if pattern.startswith("**.") and "*" not in pattern[2:]:
        return functools.partial(_ends_with, pattern[2:])
    if pattern.endswith(".**") and "*" not in pattern[:-2]:
        return functools.partial(_starts_with, pattern[:-2])
    if pattern.endswith(".*") and "*" not in pattern[:-1]:
        return functools.partial(_one_more, pattern[:-1])
    return lambda name: _compile(pattern).fullmatch(name) is not None


def _ends_with(suffix: str, name: str) -> bool:
    return name.endswith(suffix)


def _starts_with(prefix: str, name: str) -> bool:
    return name.startswith(prefix)


def _one_more(prefix: str, name: str) -> bool:
    """``prefix`` and one more segment (``*`` matches no dot; possibly an empty one)."""
    return name.startswith(prefix) and "." not in name[len(prefix):]


@functools.cache
def _compile(pattern: str) -> re.Pattern[str]:
    parts = []
    for piece in re.split(r"(\*\*|\*)", pattern):
        if piece == "**":
            parts.append(r".*")
        elif piece == "*":
            parts.append(r"[^.]*")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


def load_rules(extra: Iterable[str | Path] = ()) -> RuleSet:
    """Load the bundled packs, then each file in ``extra``, and merge them.

    Args:
        extra: paths of user rule packs.

    Raises:
        UserError: a pack is missing, is not valid YAML, or does not follow the schema.
    """
    merged: dict[str, list[Entry]] = {name: [] for name in CATEGORIES}
    for name, data in _bundled_data():
        _merge(merged, _pack(data, name))
    for path in extra:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise UserError(f"cannot read rule pack: {err.strerror}", path=str(path)) from None
        _merge(merged, _parse(text, str(path)))
    return RuleSet({name: tuple(entries) for name, entries in merged.items()})


@functools.lru_cache(maxsize=1)
def default_rules() -> RuleSet:
    """The bundled packs alone (cached: they never change within a process)."""
    return load_rules()


def _bundled_folder():
    folder = Path(__file__).with_name(_BUNDLED.rpartition(".")[2])
    if not folder.is_dir():  # a zipped install: through importlib.resources, whose import
        from importlib import resources  # (~4 ms, with zipfile) a plain install skips

        folder = resources.files(_BUNDLED)
    return folder


def _bundled_packs(folder=None) -> list[tuple[str, str]]:
    """The bundled packs' names and YAML texts, in order."""
    folder = folder or _bundled_folder()
    packs = [item for item in folder.iterdir() if item.name.endswith(".yaml")]
    return [(f"rules/{item.name}", item.read_text(encoding="utf-8"))
            for item in sorted(packs, key=lambda item: item.name)]


#: the bundled packs' data as JSON (:func:`bundled_json`), beside them: parsing their YAML
#: (with the import of PyYAML) was about a tenth of a small conversion's whole process
_JSON_COPY = "_packs.json"


def _bundled_data() -> list[tuple[str, Any]]:
    """The bundled packs' names and data: from their JSON copy when it was made from these
    very texts (it holds their fingerprint), else from their YAML."""
    folder = _bundled_folder()
    packs = _bundled_packs(folder)
    try:
        copy = json.loads((folder / _JSON_COPY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        copy = None
    if isinstance(copy, dict) and copy.get("fingerprint") == _fingerprint(packs):
        return [(name, data) for name, data in copy["packs"]]
    return [(name, _load_yaml(text, name)) for name, text in packs]


def _fingerprint(packs: list[tuple[str, str]]) -> str:
    text = "\0".join(f"{name}\0{body}" for name, body in packs).encode("utf-8")
    return f"{zlib.crc32(text):08x}-{len(text)}"


def bundled_json() -> str:
    """The JSON copy of the bundled packs (``rules/_packs.json``), made from their YAML. Write
    it again after editing a pack (until then the YAML is read, as before)::

        python -c "import distify.rules as r; r.write_bundled_json()"
    """
    packs = _bundled_packs()
    data = [[name, _load_yaml(text, name)] for name, text in packs]
    if json.loads(json.dumps(data)) != data:  # a date, a set, a key that is not a string
        raise ValueError("a bundled pack holds a value JSON does not keep")
    return json.dumps({"fingerprint": _fingerprint(packs), "packs": data}, indent=1) + "\n"


def write_bundled_json() -> None:
    (Path(__file__).with_name(_BUNDLED.rpartition(".")[2]) / _JSON_COPY).write_text(
        bundled_json(), encoding="utf-8")


def _merge(into: dict[str, list[Entry]], pack: dict[str, list[Entry]]) -> None:
    for category, entries in pack.items():
        into[category].extend(entries)


def _parse(text: str, source: str) -> dict[str, list[Entry]]:
    return _pack(_load_yaml(text, source), source)


def _load_yaml(text: str, source: str) -> Any:
    import yaml  # a user's pack, or a bundled one edited since its JSON copy was made

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserError(f"rule pack is not valid YAML: {problem}", path=source, line=line,
                        col=col) from None


def _pack(data: Any, source: str) -> dict[str, list[Entry]]:
    """The entries of a pack's data, by category (the schema checked)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError("rule pack must be a mapping of category to list", path=source)
    pack: dict[str, list[Entry]] = {}
    for category, items in data.items():
        if category in ("pack", "description"):
            continue
        if category not in CATEGORIES:
            known = ", ".join(sorted(CATEGORIES))
            raise UserError(f"unknown rule category {category!r} (known: {known})", path=source)
        if not isinstance(items, list):
            raise UserError(f"{category}: expected a list of entries", path=source)
        pack[category] = [_entry(category, item, source) for item in items]
    return pack


def _entry(category: str, item: Any, source: str) -> Entry:
    if isinstance(item, str) and item.strip():
        return Entry(item.strip(), {}, source)
    if isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"].strip():
        fields = {key: value for key, value in item.items() if key != "name"}
        return Entry(item["name"].strip(), fields, source)
    raise UserError(f"{category}: each entry must be a name or a mapping with a 'name' "
                    f"(got {item!r})", path=source)
