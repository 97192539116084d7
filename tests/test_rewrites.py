"""The converter's registered rewrites (issue 23 item 1): each one named, documented and with
examples; each one runs alone and in the full set; each one can be turned off (``--skip``,
``[tool.distify.convert] skip``), and then leaves its places as written and says so."""

from __future__ import annotations

import ast
import difflib
import json
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from distify.cli import main
from distify.convert.engine import convert_source
from distify.convert.rewrites import REGISTRY, explain_rewrite, rewrite_table, select_skips
from distify.errors import UserError
from tests.helpers import FIXTURES

ALL = frozenset(REGISTRY)
#: change kinds more than one rewrite makes (``reduce``: metrics, the accumulated loss's mean,
#: the losses of batches each process draws)
SHARED_KINDS = {"reduce"}
EXAMPLES = [pytest.param(cls, index, id=f"{name}-{index}")
            for name, cls in REGISTRY.items() for index in range(len(cls.EXAMPLES))]
#: fixtures that between them make every kind of change line (a greedy cover of the committed
#: fixtures' reports); the per-rewrite skip tests run on them
COVER = ["models/hf_grouped_params.in.py", "convert/no_dataloader.in.py", "bptt/word_lm.in.py",
         "project_tail/classifier/predict.py", "batch_shapes/gan.in.py",
         "idioms/downloads_trackers.in.py", "idioms/logging_progress.in.py",
         "rl/reinforce_env.in.py", "full_batch/gcn.in.py", "idioms/dataparallel.in.py"]


@cache
def _convert(relative: str, skip: frozenset[str] = frozenset()):
    path = FIXTURES / relative
    return convert_source(path.read_bytes(), str(path), skip=skip)


def test_every_rewrite_is_named_documented_and_has_examples():
    assert len(REGISTRY) >= 20
    for name, cls in REGISTRY.items():
        assert name == cls.NAME and name == name.lower() and " " not in name
        assert cls.summary() and cls.SKIPPED and cls.KINDS and cls.NODES, name
        assert cls.EXAMPLES, f"{name} has no example"
        assert not cls.SKIPPED.endswith("."), name  # it ends a sentence of the report
    kinds = [kind for cls in REGISTRY.values() for kind in cls.KINDS]
    shared = {kind for kind in kinds if kinds.count(kind) > 1}
    assert shared == SHARED_KINDS, "a change kind claimed by two rewrites"


def test_what_each_rewrite_declares_exists():
    """Its facts are fields of the file's facts, and the driver's table dispatches its node
    types (the declarations are read by --explain and by people, so they must not rot)."""
    import dataclasses

    import libcst as cst

    from distify.analysis.facts import FileFacts
    from distify.convert.transformer import DistifyTransformer

    fields = {field.name for field in dataclasses.fields(FileFacts)}
    for name, cls in REGISTRY.items():
        assert set(cls.FACTS) <= fields, (name, set(cls.FACTS) - fields)
        for node in cls.NODES:
            assert isinstance(getattr(cst, node, None), type), (name, node)
            hooks = [f"{prefix}_{node}" for prefix in ("visit", "leave")]
            # the driver dispatches that node type (LibCST's own hooks exist for every type)
            assert any(hook in DistifyTransformer.HANDLERS for hook in hooks), (name, node)


@pytest.mark.parametrize(("cls", "index"), EXAMPLES)
def test_each_example_alone_and_in_the_full_set(cls, index):
    example = cls.EXAMPLES[index]
    alone = convert_source(example.before.encode(), "example.py", skip=ALL - {cls.NAME})
    assert not any(note.kind == "skipped" and f"`{cls.NAME}`" in note.message
                   for note in alone.notes)
    full = convert_source(example.before.encode(), "example.py")
    ast.parse(full.output)
    if example.note is not None:
        for result in (alone, full):
            lines = [item.line for item in (*result.changes, *result.notes)
                     if example.note in item.message]
            assert lines, [item.message for item in (*result.changes, *result.notes)]
            if example.line is not None and result is alone:  # the line in its output
                assert example.line in lines
        return
    assert alone.output.decode() == example.after
    assert alone.status == "converted"
    assert {change.kind for change in alone.changes} <= set(cls.KINDS)
    # what the rewrite adds alone is in the full conversion too
    added = [line[2:] for line in difflib.ndiff(example.before.splitlines(),
                                                example.after.splitlines())
             if line.startswith("+ ")]
    full_lines = full.output.decode().splitlines()
    for line in added:
        assert line in full_lines, f"{line!r} not in the full conversion:\n{full.output.decode()}"


def test_with_every_rewrite_skipped_no_fixture_changes():
    """The skip gates are complete: no rewrite reaches the code but through one (the cover
    makes every kind of change; a sweep over every committed fixture found none either)."""
    converted = []
    for path in (FIXTURES / relative for relative in COVER):
        result = convert_source(path.read_bytes(), str(path), skip=ALL)
        assert result.output == result.source or result.status != "converted", path
        if result.status == "converted":
            converted.append(str(path))
        assert not result.changes, (path, result.changes[:3])
    assert not converted


def _cover_kinds() -> dict[str, set[str]]:
    return {relative: {change.kind for change in _convert(relative).changes}
            for relative in COVER}


def test_every_change_kind_of_the_fixtures_belongs_to_a_rewrite():
    claimed = {kind for cls in REGISTRY.values() for kind in cls.KINDS}
    made = set().union(*_cover_kinds().values())
    assert made <= claimed, made - claimed
    # the cover does make nearly every kind (so the skip tests below reach each rewrite)
    assert len(made) >= 25


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_skipped_rewrite_leaves_its_places_as_written_and_says_so(name):
    kinds = set(REGISTRY[name].KINDS) - SHARED_KINDS or set(REGISTRY[name].KINDS)
    cover = [relative for relative, made in _cover_kinds().items() if made & kinds][:2]
    if not cover:
        pytest.skip(f"no fixture of the cover makes a {name} change")
    for relative in cover:
        result = _convert(relative, frozenset({name}))
        ast.parse(result.output)
        left = [change for change in result.changes if change.kind in kinds
                and (change.kind not in SHARED_KINDS or _made_by(change, name))]
        assert not left, left
        said = [note for note in result.notes if note.kind == "skipped"]
        assert said and all(note.message.startswith(f"rewrite `{name}` skipped: left as "
                                                    "written, so ") for note in said)
        assert all(REGISTRY[name].SKIPPED in note.message for note in said)
        # the other rewrites still ran
        others = {c.kind for c in _convert(relative).changes} - kinds
        assert others <= {c.kind for c in result.changes} | _DEPENDENT.get(name, set())


def _made_by(change, name: str) -> bool:
    """Is this line of a shared kind ``name``'s (the metrics' reduce lines are not about an
    accumulated loss's mean or drawn batches' losses)?"""
    others = ("averaged over the processes before it is read", "averaged over all processes")
    return name != "reduce-metrics" or not any(text in change.message for text in others)


#: change kinds that exist only because of another rewrite's change (a device line that
#: comments a prepared model; an accumulation line that rides on the prepared loader)
_DEPENDENT = {"prepare-model": {"device"}, "prepare-dataloader": {"reduce", "gather"}}


def test_select_skips_checks_the_names():
    assert select_skips([" Print ", "device"]) == {"print", "device"}
    with pytest.raises(UserError, match=r"unknown rewrite 'prnt' \(known: prepare-model"):
        select_skips(["prnt"])


def test_list_and_explain():
    table = rewrite_table()
    assert [line.split()[0] for line in table.splitlines()] == list(REGISTRY)
    text = explain_rewrite("reduce-metrics")
    assert text.startswith("reduce-metrics: Sums accumulated")
    assert "BEFORE:" in text and "AFTER (this rewrite alone):" in text
    assert "correct = distify.reduce(correct)" in text
    with pytest.raises(UserError, match="unknown rewrite 'nope'"):
        explain_rewrite("nope")


SCRIPT = """\
import torch
from tqdm import tqdm
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in tqdm(range(3)):
    print(x)
"""


def _invoke(args, folder: Path):
    """``distify convert`` of ``folder/train.py`` (``SCRIPT``): the outcome, the input as it is
    afterwards, and the output (None when none was written)."""
    script, output = folder / "train.py", folder / "train_dist.py"
    script.write_text(SCRIPT)
    outcome = CliRunner().invoke(main, ["convert", *(str(script) if a == "train.py" else a
                                                     for a in args)])
    written = output.read_text() if output.exists() else None
    return outcome, script.read_text(), written


def test_skip_on_the_command_line(tmp_path):
    outcome, source, written = _invoke(["train.py", "--skip", "print,progress-bars",
                                        "--no-config"], tmp_path)
    assert outcome.exit_code == 0, outcome.output
    assert source == SCRIPT
    assert "    print(x)" in written and "tqdm(range(3))" in written
    assert "distify.prepare(model, optimizer)" in written
    assert "Skipped rewrites: print (1 place left as written), progress-bars (1 place left " \
        "as written)" in outcome.output
    assert "train_dist.py:9: rewrite `print` skipped: left as written, so every process " \
        "prints it" in outcome.output


def test_skip_in_pyproject_and_json(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.distify.convert]\nskip = ["print"]\n')
    outcome, _, written = _invoke(["train.py", "--json", "--no-config", "--skip", "logging"],
                                  tmp_path)
    assert outcome.exit_code == 0, outcome.output
    report = json.loads(outcome.output)["files"][0]
    assert report["skipped_rewrites"] == ["logging", "print"]
    assert "    print(x)" in written
    assert [n["kind"] for n in report["needs_human"]] == ["skipped"]


def test_bad_skips_fail_with_one_line(tmp_path):
    outcome, source, written = _invoke(["train.py", "--skip", "prnt"], tmp_path)
    assert outcome.exit_code == 2 and written is None and source == SCRIPT
    assert "--skip: unknown rewrite 'prnt'" in outcome.output
    (tmp_path / "pyproject.toml").write_text('[tool.distify.convert]\nskip = ["nope"]\n')
    outcome, _, written = _invoke(["train.py"], tmp_path)
    assert outcome.exit_code == 2 and written is None
    assert "pyproject.toml: [tool.distify.convert] skip: unknown rewrite 'nope'" in outcome.output
    (tmp_path / "pyproject.toml").write_text('[tool.distify.convert]\nskips = ["print"]\n')
    outcome, _, _ = _invoke(["train.py"], tmp_path)
    assert outcome.exit_code == 2
    assert "[tool.distify.convert] unknown key 'skips' (known: skip)" in outcome.output


def test_list_rewrites_and_explain_need_no_path(tmp_path):
    outcome = CliRunner().invoke(main, ["convert", "--list-rewrites"])
    assert outcome.exit_code == 0 and outcome.output.split()[0] == "prepare-model"
    outcome = CliRunner().invoke(main, ["convert", "--explain", "print"])
    assert outcome.exit_code == 0 and "distify.print(\"epoch\", 1)" in outcome.output
    outcome = CliRunner().invoke(main, ["convert", "--explain", "prnt"])
    assert outcome.exit_code == 2 and "unknown rewrite 'prnt'" in outcome.output
    outcome = CliRunner().invoke(main, ["convert"])
    assert outcome.exit_code == 2 and "Missing argument 'PATH'" in outcome.output
