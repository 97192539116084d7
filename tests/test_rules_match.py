"""``RuleSet.match`` finds, by a dict of plain names and a string test per wildcard pattern, the
entry a scan of the category's patterns in order finds: the first whose pattern matches the
whole name. The bundled packs are read from their JSON copy while it is fresh."""

from __future__ import annotations

import ast
from pathlib import Path

from distify.rules import _compile, default_rules, load_rules


def _scan(rules, category: str, name: str):
    return next((entry for entry in rules.entries.get(category, ())
                 if _compile(entry.pattern).fullmatch(name)), None)


def _names(rules) -> set[str]:
    """Every pattern made concrete in a few ways, its neighbours, and every dotted name the
    fixtures use."""
    names: set[str] = set()
    for entries in rules.entries.values():
        for entry in entries:
            for fill in ("x", "", "a.b", "cuda"):
                name = entry.pattern.replace("**", fill).replace("*", fill.split(".")[0])
                names.update({name, f"{name}.attr", f"pre.{name}", name.rsplit(".", 1)[0]})
    for path in sorted((Path(__file__).parent / "fixtures").rglob("*.py"))[::3]:
        try:
            tree = ast.parse(path.read_bytes())
        except SyntaxError:
            continue
        names.update(ast.unparse(node) for node in ast.walk(tree)
                     if isinstance(node, ast.Attribute))
    return names


def test_the_first_entry_that_matches_as_a_scan_finds_it(tmp_path: Path) -> None:
    pack = tmp_path / "mine.yaml"  # overlapping patterns: the earlier entry must win
    pack.write_text("collectives:\n  - name: mylib.*\n    kind: first\n"
                    "  - name: mylib.reduce\n    kind: second\n  - mylib.**\n")
    for rules in (default_rules(), load_rules([pack])):
        names = _names(rules) | {"mylib.reduce", "mylib.a.b", "mylib"}
        for category in rules.entries:
            for name in names:
                assert rules.match(category, name) == _scan(rules, category, name), \
                    (category, name)
    mine = load_rules([pack]).match("collectives", "mylib.reduce")
    assert mine is not None and mine.pattern != "mylib.reduce"  # an earlier entry won


def test_bundled_packs_read_the_same_without_their_folder(monkeypatch, tmp_path):
    """A plain install reads the packs from the package's folder (no ``importlib.resources``
    import at start-up); a zipped one, whose folder is not on disk, through
    ``importlib.resources``: the same packs, in the same order."""
    import distify.rules as rules_module

    from_folder = rules_module._bundled_packs()
    assert [name for name, _ in from_folder] == sorted(name for name, _ in from_folder)
    assert "rules/torch.yaml" in [name for name, _ in from_folder]
    monkeypatch.setattr(rules_module, "__file__", str(tmp_path / "rules.py"))
    assert rules_module._bundled_packs() == from_folder


def test_the_bundled_packs_json_copy_is_made_from_their_yaml_as_they_are_now() -> None:
    """``rules/_packs.json`` spares every process PyYAML (its import and parse): it must be a
    copy of the packs as committed. After editing a pack, write it again with
    ``python -c "import distify.rules as r; r.write_bundled_json()"``."""
    import yaml

    import distify.rules as rules_module

    folder = rules_module._bundled_folder()
    assert (folder / rules_module._JSON_COPY).read_text(encoding="utf-8") == \
        rules_module.bundled_json(), "rules/_packs.json is stale: write it again (see above)"
    assert rules_module._bundled_data() == [
        (name, yaml.safe_load(text)) for name, text in rules_module._bundled_packs()]


def test_a_pack_edited_after_its_json_copy_is_read_from_its_yaml(monkeypatch, tmp_path):
    import shutil

    import distify.rules as rules_module

    folder = tmp_path / "bundled_rules"
    shutil.copytree(rules_module._bundled_folder(), folder)
    monkeypatch.setattr(rules_module, "__file__", str(tmp_path / "rules.py"))
    assert load_rules().entries == default_rules().entries  # the copy, still fresh
    torch = folder / "torch.yaml"
    torch.write_text(torch.read_text().replace("  - torch.nn.Linear\n",
                                               "  - torch.nn.Linear\n  - mylib.Net\n"))
    edited = load_rules()
    assert edited.match("models", "mylib.Net") is not None
    assert default_rules().match("models", "mylib.Net") is None
    (folder / rules_module._JSON_COPY).write_text("{not json")
    assert load_rules().entries == edited.entries
