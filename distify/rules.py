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
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

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
    #: category → one regex for all its patterns (see :meth:`_first`)
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
        """The first entry whose pattern matches, by one ``fullmatch`` of the alternation of
        the category's patterns, each its own group: the regex engine tries them in order
        and the first that matches the whole name wins, as a scan of the entries would (a
        name missed by every pattern, the usual case, was one ``fullmatch`` per entry)."""
        entries = self.entries.get(category, ())
        if not entries:
            return None
        alternatives = self._alternatives.get(category)
        if alternatives is None:
            alternatives = self._alternatives[category] = re.compile("|".join(
                f"(?P<_{index}>{_compile(entry.pattern).pattern})"
                for index, entry in enumerate(entries)))
        found = alternatives.fullmatch(qualname)
        return entries[int(found.lastgroup[1:])] if found is not None else None

    def names(self, category: str) -> tuple[str, ...]:
        return tuple(entry.pattern for entry in self.entries.get(category, ()))


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
    for name, text in _bundled_packs():
        _merge(merged, _parse(text, name))
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


def _bundled_packs() -> list[tuple[str, str]]:
    folder = Path(__file__).with_name(_BUNDLED.rpartition(".")[2])
    if not folder.is_dir():  # a zipped install: through importlib.resources, whose import
        from importlib import resources  # (~4 ms, with zipfile) a plain install skips

        folder = resources.files(_BUNDLED)
    packs = [item for item in folder.iterdir() if item.name.endswith(".yaml")]
    return [(f"rules/{item.name}", item.read_text(encoding="utf-8"))
            for item in sorted(packs, key=lambda item: item.name)]


def _merge(into: dict[str, list[Entry]], pack: dict[str, list[Entry]]) -> None:
    for category, entries in pack.items():
        into[category].extend(entries)


def _parse(text: str, source: str) -> dict[str, list[Entry]]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserError(f"rule pack is not valid YAML: {problem}", path=source, line=line,
                        col=col) from None
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
