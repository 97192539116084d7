"""Every process training on the same data: said by the runtime at the job's first step, and by
``convert`` where the data comes from somewhere it cannot see.

A DataLoader built in a module that was not converted is never prepared: each process iterates
all of it, in the same order when the script seeds itself, and N processes do one's work while
the replicas stay identical (nothing fails). The runtime compares the processes' first training
inputs once and warns when they are identical (2 real processes, Gloo); ``convert`` says where a
training loop's DataLoader is built elsewhere, or where it iterates a name it cannot see.
"""

from __future__ import annotations

import textwrap

import pytest

from distify.convert.engine import convert_source
from tests.helpers import REPO, clean_env, run_torchrun

pytestmark = pytest.mark.pool

SCRIPT = REPO / "tests" / "runtime_scripts" / "same_data.py"
WARNING = "first training batches are identical"


@pytest.mark.parametrize("mode, env, warned", [
    ("unprepared", {}, True),
    ("prepared", {}, False),
    ("unprepared", {"DISTIFY_SAME_DATA": "ok"}, False),  # full-batch training: expected
    # a sparse input (gcn's adjacency matrix) is left out of the fingerprint; it raised
    # "reshape is not implemented for sparse tensors" on every rank
    ("sparse", {}, True),
])
def test_the_runtime_warns_once_when_every_process_trains_on_the_same_data(
        tmp_path, mode: str, env: dict, warned: bool) -> None:
    proc = run_torchrun(SCRIPT, mode, nproc=2, cwd=tmp_path,
                        env=clean_env(PYTHONPATH=str(REPO), **env), replicas=True,
                        distinct_data=mode == "prepared")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(WARNING) == (1 if warned else 0), proc.stderr[-3000:]
    if warned:  # from the main process, naming the cause and the fix
        assert "A DataLoader built in a file that was not converted" in proc.stderr
        assert "DISTIFY_SAME_DATA=ok" in proc.stderr


def _notes(head: str, depth: int) -> list[tuple[str, str]]:
    """The data notes on ``head`` followed by a training step ``depth`` indents deep."""
    source = textwrap.dedent(head) + textwrap.indent(_TRAIN, "    " * (depth - 1))
    result = convert_source(source.encode(), "train.py")
    lines = result.output.decode().splitlines()
    return [(lines[n.line - 1].strip(), n.message) for n in result.notes
            if n.kind in ("data", "data-elsewhere")]


_TRAIN = """\
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
"""


def test_a_loader_built_in_another_module_is_reported_where_it_is_used() -> None:
    notes = _notes("""\
        import torch
        from data import get_loaders

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train_loader, val_loader = get_loaders(32)
        for epoch in range(3):
            for x, y in train_loader:
        """, 2)
    assert len(notes) == 1 and notes[0][0] == "for x, y in train_loader:"
    assert "`train_loader` is built by `get_loaders(...)`, which distify cannot see into" \
        in notes[0][1]
    assert "`train_loader = distify.prepare(train_loader)`" in notes[0][1]


def test_a_loop_over_a_name_it_cannot_see_says_so_not_that_there_is_no_loader() -> None:
    notes = _notes("""\
        import torch
        from tqdm import tqdm

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)


        def train(model, train_dl):
            for x, y in tqdm(train_dl):
        """, 2)
    assert len(notes) == 1 and notes[0][0] == "distify.backward(loss)"
    assert "iterates `train_dl`, which this file does not build as a DataLoader" in notes[0][1]
    assert "not fed by a DataLoader" not in notes[0][1]


def test_a_loader_built_here_gets_no_such_note() -> None:
    notes = _notes("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train_loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)))
        for x, y in train_loader:
        """, 1)
    assert notes == []


def test_a_project_that_prepares_the_loader_next_door_gets_no_such_note(tmp_path) -> None:
    from distify.convert.project import plan_project
    from distify.rules import default_rules

    project = tmp_path / "project"
    project.mkdir()
    (project / "data.py").write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        def get_loaders(batch_size):
            data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
            return DataLoader(data, batch_size=batch_size, shuffle=True), None
        """))
    (project / "train.py").write_text(textwrap.dedent("""\
        import torch
        from data import get_loaders

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        train_loader, val_loader = get_loaders(32)
        for x, y in train_loader:
        """) + _TRAIN)
    planned = {p.source.name: p.result for p in plan_project(project, tmp_path / "out",
                                                             default_rules(), "distify.runtime")}
    assert [c.kind for c in planned["data.py"].changes].count("prepare-dataloader") == 1
    assert planned["train.py"].notes == ()
    # alone, the same file says where its loader must be prepared
    alone = convert_source((project / "train.py").read_bytes(), "train.py")
    assert [n.kind for n in alone.notes] == ["data-elsewhere"]

