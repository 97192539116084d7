"""``RuleSet.match`` finds, with one regex per category, the entry a scan of the category's
patterns in order finds: the first whose pattern matches the whole name."""

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
