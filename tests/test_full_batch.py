"""Full-batch training (issue 12 item 5): a graph model trained on all its nodes at every step.

Such a loop is fed by no DataLoader and needs none: every process computes the same forward on
the same data, so the gradients DDP averages are equal and N processes train exactly like one.
The report says so in a change line (not a note, so the job stays ready to launch), where loops
fed some other way keep the "not fed by a DataLoader" note.

``tests/fixtures/full_batch/gcn.in.py`` is a GCN in pygcn's style on a synthetic graph (dense
normalised adjacency, ``randperm`` split into node masks, evaluation on the validation nodes
every epoch, the best model checkpointed and reloaded). World size 1: the conversion prints and
saves exactly what the original does. Two processes: the same metrics, exactly, as one process,
and bit-identical replicas.

Set ``DISTIFY_UPDATE_GOLDEN=1`` to rewrite the golden file after an intended change.
"""

from __future__ import annotations

import os
import textwrap

import pytest

from distify.convert.engine import convert_source
from tests.fixture_runs import Plan, run_side_by_side
from tests.helpers import FIXTURES, compare_state, flatten, result_line

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

HERE = FIXTURES / "full_batch"
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))
# the same data on every process: nothing to shard, the ranks' batches are alike by design
PLANS = {"gcn": Plan(args=("--epochs", "60"), distinct_data=False)}

_HEAD = """\
import torch
import torch.nn.functional as F

x, adj, y = torch.randn(50, 8), torch.eye(50), torch.randint(0, 3, (50,))
train_mask = torch.rand(50) < 0.5
model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
"""


def _convert(body: str):
    return convert_source((_HEAD + textwrap.dedent(body)).encode(), "train.py")


def _kinds(result) -> tuple[list[str], list[str]]:
    """The messages of the full-batch report lines and of the data notes."""
    return ([c.message for c in result.changes if c.kind == "full-batch"],
            [n.message for n in result.notes if n.kind == "data"])


FULL_BATCH = [
    pytest.param("""\
        for epoch in range(200):
            model.train()
            optimizer.zero_grad()
            out = model(x, adj)
            loss = F.nll_loss(out[train_mask], y[train_mask])
            loss.backward()
            optimizer.step()
        """, id="gcn-inline"),
    pytest.param("""\
        data = Graph(x, adj, y)
        for epoch in range(1, 201):
            optimizer.zero_grad()
            out = model(data.x, data.edge_index)
            loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                pred = model(data.x, data.edge_index).argmax(dim=-1)
            acc = int((pred[data.val_mask] == data.y[data.val_mask]).sum()) / len(data.y)
        """, id="pyg-style-with-evaluation"),
    pytest.param("""\
        for epoch in range(200):
            optimizer.zero_grad()
            loss = F.nll_loss(model(x.to(device), F.dropout(adj, 0.1))[train_mask], y[train_mask])
            loss.backward()
            optimizer.step()
            for group in optimizer.param_groups:
                group["lr"] = 0.01 * 0.99 ** epoch
        """, id="inputs-through-methods-and-library-calls"),
]


@pytest.mark.parametrize("loop", FULL_BATCH)
def test_full_batch_training_is_reported_as_such(loop: str) -> None:
    result = _convert(loop)
    changes, notes = _kinds(result)
    assert notes == []
    assert len(changes) == 1 and changes[0].startswith("full-batch training")
    assert "equals one process's" in changes[0]
    assert result.ready


FED_OTHERWISE = [
    pytest.param("""\
        for epoch in range(10):
            for i in range(0, 50, 10):
                loss = F.nll_loss(model(x[i:i + 10], adj), y[i:i + 10])
                loss.backward()
                optimizer.step()
        """, id="sliced-by-the-loop-variable"),
    pytest.param("""\
        for step in range(100):
            idx = perm[step % 5]
            loss = F.nll_loss(model(x, adj)[idx], y[idx])
            loss.backward()
            optimizer.step()
        """, id="indices-picked-per-step"),
    pytest.param("""\
        for step in range(100):
            xb, yb = next(batches)
            loss = F.nll_loss(model(xb, adj), yb)
            loss.backward()
            optimizer.step()
        """, id="read-with-next"),
    pytest.param("""\
        for step in range(100):
            loss = F.nll_loss(model(load_graph(step), adj), y)
            loss.backward()
            optimizer.step()
        """, id="a-function-hands-out-the-input"),
    pytest.param("""\
        state = x
        for step in range(100):
            out = model(state, adj)
            state = out.detach()
            loss = out.sum()
            loss.backward()
            optimizer.step()
        """, id="input-changed-in-the-loop"),
]


@pytest.mark.parametrize("loop", FED_OTHERWISE)
def test_loops_fed_some_other_way_keep_the_note(loop: str) -> None:
    changes, notes = _kinds(_convert(loop))
    assert changes == []
    assert len(notes) == 1 and "not fed by a DataLoader" in notes[0]


# ------------------------------------------------------------------ the fixture


def test_golden_output_idempotence_and_report() -> None:
    source = HERE / "gcn.in.py"
    result = convert_source(source.read_bytes(), str(source))
    if UPDATE:
        (HERE / "gcn.out.py").write_bytes(result.output)
    assert result.output.decode() == (HERE / "gcn.out.py").read_text()
    assert convert_source(result.output).output == result.output
    assert not result.notes and result.ready
    changes, _ = _kinds(result)
    assert len(changes) == 1 and changes[0].startswith("full-batch training")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("full_batch")
    return root, run_side_by_side(root, HERE, PLANS)


def test_one_process_is_bit_identical_to_the_original(runs) -> None:
    import torch

    root, procs = runs
    assert procs["gcn", "one"].stdout == procs["gcn", "original"].stdout
    compare_state(flatten(torch.load(root / "gcn-one" / "gcn_best.pt", weights_only=True)),
                  flatten(torch.load(root / "gcn-original" / "gcn_best.pt", weights_only=True)),
                  exact=True)


def test_two_processes_give_one_processs_metrics_exactly(runs) -> None:
    _, procs = runs
    one, two = result_line(procs["gcn", "one"].stdout), result_line(procs["gcn", "two"].stdout)
    assert len(two["history"]) == 60
    assert two == one  # every epoch's losses and accuracies, the best one, the test accuracy
    assert procs["gcn", "two"].stdout == procs["gcn", "one"].stdout
