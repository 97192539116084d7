"""Token streams trained on by BPTT are split over the processes (issue 12 item 2).

``tests/fixtures/bptt/word_lm.in.py`` is word_language_model in small: ``batchify`` lays a
synthetic token stream out in columns, ``get_batch`` slices BPTT windows, the update is a manual
SGD step, the learning rate is annealed on the validation loss, and the best model is pickled
whole and evaluated on the test stream. With ``SHOW_DRAWS=1`` it writes to stderr the first
time step of every training window (``DRAW <pid> [...]``) and, at the end, its validation
history and test loss (``EVAL <pid> ...``).

- single rewrites and their no-op neighbours on small scripts, and the analysis on a converted
  call;
- the golden file (``DISTIFY_UPDATE_GOLDEN=1`` rewrites it; review the diff) and idempotence;
- the runtime's ``shard_stream`` with simulated ranks;
- end to end (one module-scoped set of runs): world size 1 is the original bit for bit; on 2
  processes the ranks train on different columns that together are exactly the columns of one
  process at twice the batch, which trains to the same losses (dropout off, to float rounding);
  the replicas end bit-identical, both ranks report the same evaluation, and that evaluation is
  what one process computes from the saved weights.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import textwrap
import zipfile
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from tests.helpers import (
    FIXTURES,
    REPO,
    clean_env,
    result_line,
    run_python,
    run_torchrun,
)

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

HERE = FIXTURES / "bptt"
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))

_BATCHIFY = """\
import torch

tokens = torch.arange(1000)
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


"""

_TRAIN_LOOP = """\
for epoch in range(2):
    for i in range(0, train_data.size(0) - 1, 8):
        x, y = train_data[i:i + 8], train_data[i + 1:i + 9]
        loss = model(x.float().t()).sum()
        loss.backward()
        optimizer.step()
"""


def _convert(body: str, header: str = _BATCHIFY):
    result = convert_source((header + textwrap.dedent(body)).encode())
    return result, result.output.decode()


def _data_notes(result) -> list[str]:
    return [note.message for note in result.notes if note.kind == "data"]


# ------------------------------------------------------------------ rewrites


@pytest.mark.parametrize("body, want", [
    pytest.param("train_data = batchify(tokens, 4)\n" + _TRAIN_LOOP,
                 "train_data = batchify(distify.shard_stream(tokens, 4), 4)\n",
                 id="sliced-in-the-loop"),
    pytest.param("train_data = batchify(bsz=4, data=tokens)\n" + _TRAIN_LOOP,
                 "train_data = batchify(bsz=4, data=distify.shard_stream(tokens, 4))\n",
                 id="keywords"),
    pytest.param("train_data = batchify(tokens, 4).to('cpu')\n" + _TRAIN_LOOP,
                 "train_data = batchify(distify.shard_stream(tokens, 4), 4).to('cpu')\n",
                 id="moved-after-batchify"),
    pytest.param("train_data = batchify(tokens, 4)\ntrain_data = train_data.contiguous()\n"
                 + _TRAIN_LOOP,
                 "train_data = batchify(distify.shard_stream(tokens, 4), 4)\n",
                 id="moved-on-its-own-line"),
    pytest.param("""
        def get_batch(source, i):
            seq_len = min(8, len(source) - 1 - i)
            return source[i:i + seq_len], source[i + 1:i + 1 + seq_len]


        def train(stream):
            for i in range(0, stream.size(0) - 1, 8):
                x, y = get_batch(stream, i)
                loss = model(x.float().t()).sum()
                loss.backward()
                optimizer.step()


        def main():
            train_data = batchify(tokens, 4)
            for epoch in range(2):
                train(train_data)
        """, "    train_data = batchify(distify.shard_stream(tokens, 4), 4)\n",
                 id="handed-to-train-then-get_batch"),
])
def test_a_training_stream_is_sharded_before_batchify(body: str, want: str) -> None:
    result, out = _convert(body)
    assert want in out, out
    assert _data_notes(result) == []  # its loop is fed per process now
    assert list(result.batch_sizes) == ["4"]


def test_a_stream_rebound_from_its_raw_tokens_is_sharded() -> None:
    """The PyTorch transformer tutorial: ``train_data = batchify(train_data, batch_size)``,
    trained on by ``train(model)`` through the global, evaluated through a parameter."""
    result, out = _convert("""
        train_data, val_data = tokens[:800], tokens[800:]
        train_data = batchify(train_data, 4)
        val_data = batchify(val_data, 2)


        def get_batch(source, i):
            seq_len = min(8, len(source) - 1 - i)
            return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


        def train(model):
            for batch, i in enumerate(range(0, train_data.size(0) - 1, 8)):
                data, targets = get_batch(train_data, i)
                loss = model(data.float().t()).sum()
                loss.backward()
                optimizer.step()


        def evaluate(model, eval_data):
            with torch.no_grad():
                return sum(model(get_batch(eval_data, i)[0].float().t()).sum().item()
                           for i in range(0, eval_data.size(0) - 1, 8))


        for epoch in range(2):
            train(model)
            print(evaluate(model, val_data))
        """)
    assert "train_data = batchify(distify.shard_stream(train_data, 4), 4)\n" in out
    assert "val_data = batchify(val_data, 2)\n" in out
    assert _data_notes(result) == []
    [change] = [c.message for c in result.changes if c.kind == "shard-stream"]
    assert "`val_data` is not trained on and stays whole on every process: its evaluation" \
        in change


def test_a_method_named_batchify_is_not_followed() -> None:
    header = _BATCHIFY.split("def batchify")[0] + textwrap.dedent("""\
        class Corpus:
            def batchify(self, data, bsz):
                return data.view(bsz, -1).t()


        batchify = Corpus().batchify
        """)
    result, out = _convert("train_data = batchify(tokens, 4)\n" + _TRAIN_LOOP, header)
    assert "shard_stream" not in out
    assert len(_data_notes(result)) == 1


def test_another_batchify_shape_is_found() -> None:
    header = _BATCHIFY.replace("""\
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()""", """\
    trimmed = data[:data.size(0) // bsz * bsz]
    return trimmed.reshape((-1, bsz))""")
    _, out = _convert("train_data = batchify(tokens, 4)\n" + _TRAIN_LOOP, header)
    assert "train_data = batchify(distify.shard_stream(tokens, 4), 4)\n" in out


def test_a_batch_size_read_by_a_call_is_not_read_twice() -> None:
    result, out = _convert("train_data = batchify(tokens, sizes.pop())\n" + _TRAIN_LOOP,
                           _BATCHIFY + "sizes = [4]\n")
    assert "train_data = batchify(distify.shard_stream(tokens), sizes.pop())\n" in out
    assert list(result.batch_sizes) == ["sizes.pop()"]


def test_a_long_line_hangs_its_arguments() -> None:
    body = ("train_data_for_the_language_model = batchify(corpus_of_tokens_read_from_disk, "
            "batch_size)\n" + _TRAIN_LOOP.replace("train_data", "train_data_for_the_language_"
                                                  "model"))
    _, out = _convert(body, _BATCHIFY + "corpus_of_tokens_read_from_disk = tokens\n"
                      "batch_size = 4\n")
    assert ("train_data_for_the_language_model = batchify(\n"
            "    distify.shard_stream(corpus_of_tokens_read_from_disk, batch_size), batch_size)\n"
            ) in out


# ------------------------------------------------------------------ no-ops and reports


def test_a_reshape_helper_in_a_loader_loop_is_no_stream() -> None:
    header = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(dataset, batch_size=32, shuffle=True)
model = torch.nn.Linear(64, 10)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def flatten(x, bsz):
    return x.view(bsz, -1)


"""
    result, out = _convert("""
        for images, labels in loader:
            flat = flatten(images, 32)
            loss = model(flat).sum()
            loss.backward()
            optimizer.step()
        """, header)
    assert "shard_stream" not in out and "flat = flatten(images, 32)\n" in out
    assert _data_notes(result) == []


def test_a_stream_only_evaluated_stays_whole() -> None:
    result, out = _convert("""
        val_data = batchify(tokens, 4)


        def evaluate(source):
            total = 0.
            with torch.no_grad():
                for i in range(0, source.size(0) - 1, 8):
                    total += model(source[i:i + 8].float().t()).sum().item()
            return total / (len(source) - 1)


        batches = [torch.ones(4, 8) * k for k in range(10)]
        for x in batches:
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
        print(evaluate(val_data))
        """)
    assert "val_data = batchify(tokens, 4)\n" in out and "shard_stream" not in out
    assert len(_data_notes(result)) == 1  # the list-fed training loop still is not split


def test_a_stream_also_used_otherwise_is_reported_not_sharded() -> None:
    result, out = _convert("""
        train_data = batchify(tokens, 4)
        for epoch in range(2):
            for i in range(0, train_data.size(0) - 1, 8):
                loss = model(train_data[i:i + 8].float().t()).sum()
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                print(model(train_data.float().t()).sum())
        """)
    assert "shard_stream" not in out
    notes = _data_notes(result)
    assert len(notes) == 2, notes
    assert "`train_data` feeds a training loop but is also used otherwise " \
        "(`print(model(train_data.float().t()).sum())`)" in notes[0]
    assert "not fed by a DataLoader" in notes[1]


def test_a_stream_read_in_a_lambda_is_used_otherwise() -> None:
    result, out = _convert("train_data = batchify(tokens, 4)\nfirst = lambda: train_data[:1]\n"
                           + _TRAIN_LOOP)
    assert "shard_stream" not in out
    assert "also used otherwise (`lambda: train_data[:1]`)" in _data_notes(result)[0]


def test_a_batchify_from_another_module_is_not_followed() -> None:
    result, out = _convert("from data import batchify\n\ntrain_data = batchify(tokens, 4)\n"
                           + _TRAIN_LOOP, "import torch\n\nmodel = torch.nn.Linear(8, 8)\n"
                           "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n")
    assert "shard_stream" not in out
    assert len(_data_notes(result)) == 1


def test_a_sharded_call_is_recognised() -> None:
    import libcst as cst

    from distify.analysis.bptt_flow import find_streams

    source = (_BATCHIFY + "train_data = batchify(distify.shard_stream(tokens, 4), 4)\n"
              + _TRAIN_LOOP)
    flow = find_streams(cst.parse_module(source))
    assert not flow.shard and list(flow.sharded.values()) == ["4"]
    assert len(flow.fed_backwards) == 1


def test_the_report_names_the_share_the_whole_streams_and_the_batch() -> None:
    result = _convert_fixture()
    assert not result.notes, [n.message for n in result.notes]
    [change] = [c for c in result.changes if c.kind == "shard-stream"]
    assert change.line == 66
    assert "each process trains on its own contiguous 1/N of the stream" in change.message
    assert "`val_data`, `test_data` are not trained on and stay whole" in change.message
    assert list(result.batch_sizes) == ["args.batch_size"]


# ------------------------------------------------------------------ golden file


def _convert_fixture():
    source = HERE / "word_lm.in.py"
    return convert_source(source.read_bytes(), str(source))


def test_golden_output_and_idempotence() -> None:
    output = _convert_fixture().output
    if UPDATE:
        (HERE / "word_lm.out.py").write_bytes(output)
    assert output.decode() == (HERE / "word_lm.out.py").read_text()
    assert convert_source(output).output == output


# ------------------------------------------------------------------ the runtime


def _as_rank(monkeypatch, rank: int, world_size: int):
    from distify.runtime import _split

    monkeypatch.setattr(_split._state, "world_size", lambda: world_size)
    monkeypatch.setattr(_split._state, "rank", lambda: rank)
    return _split.shard_stream


def test_one_process_gets_the_stream_itself() -> None:
    torch = pytest.importorskip("torch")
    import distify.runtime as distify

    stream = torch.arange(11)
    assert distify.shard_stream(stream) is stream


def test_each_rank_gets_its_contiguous_share_and_batchify_cuts_the_global_columns(
        monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    stream = torch.arange(103)

    def batchify(data, bsz):
        return data.narrow(0, 0, data.size(0) // bsz * bsz).view(bsz, -1).t()

    shares = []
    for rank in range(3):
        shard_stream = _as_rank(monkeypatch, rank, 3)
        share = shard_stream(stream, 4)  # 103 // 12 = 8 rows of 4: 32 items each
        assert share.data_ptr() == stream[rank * 32:].data_ptr()  # a view, no copy
        shares.append(share)
        assert shard_stream(list(range(103)), 4) == list(range(rank * 32, rank * 32 + 32))
        assert shard_stream(np.arange(103), np.int64(4)).tolist() == share.tolist()
        assert len(shard_stream(stream)) == 34  # no batch size: all but 103 % 3
    assert torch.equal(torch.cat(shares), stream[:96])  # what one process trims at 12
    # rank r's 4 columns are columns 4r to 4r + 3 of the 12 one process cuts
    columns = torch.cat([batchify(share, 4) for share in shares], dim=1)
    assert torch.equal(columns, batchify(stream, 12))


def test_a_stream_too_short_or_without_length_is_an_error(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from distify.runtime import DistifyError

    shard_stream = _as_rank(monkeypatch, 1, 4)
    with pytest.raises(DistifyError, match=r"a stream of 31 item\(s\) gives each of 4 processes "
                                           r"1 time step\(s\) of 4 column\(s\)"):
        shard_stream(torch.arange(31), 4)
    assert len(shard_stream(torch.arange(32), 4)) == 8
    with pytest.raises(DistifyError, match="without a first dimension"):
        shard_stream(torch.tensor(5))
    with pytest.raises(DistifyError, match="a positive int, not 2.5"):
        shard_stream(torch.arange(100), 2.5)


# ------------------------------------------------------------------ running it


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Every run once: the original and the conversion on one process, the conversion on 2
    processes, and the references the 2-process run is compared with."""
    torch = pytest.importorskip("torch")
    del torch
    root = tmp_path_factory.mktemp("bptt")
    folders = {}
    for variant, suffix in (("original", "in"), ("converted", "out"), ("wide", "in"),
                            ("two", "out")):
        folder = folders[variant] = root / variant
        folder.mkdir()
        (folder / "train.py").write_bytes((HERE / f"word_lm.{suffix}.py").read_bytes())
    env = _env(SHOW_DRAWS="1")
    folders["runs"] = {
        "original": run_python(folders["original"] / "train.py", cwd=folders["original"],
                               env=env),
        "converted": run_python(folders["converted"] / "train.py", cwd=folders["converted"],
                                env=env),
        # one process at the global batch of two, without dropout (drawn per batch shape)
        "wide": run_python(folders["wide"] / "train.py", "--batch_size", "16", "--dropout", "0",
                           cwd=folders["wide"], env=env),
        "two": run_torchrun(folders["two"] / "train.py", "--dropout", "0", nproc=2,
                            cwd=folders["two"], env=env, replicas=True, distinct_data=True,
                            timeout=240),
    }
    # one process evaluating the weights the 2-process job saved (no epoch: load, test)
    folder = folders["reevaluated"] = root / "reevaluated"
    folder.mkdir()
    shutil.copy(folders["two"] / "train.py", folder / "train.py")
    shutil.copy(folders["two"] / "model.pt", folder / "model.pt")
    folders["runs"]["reevaluated"] = run_python(folder / "train.py", "--epochs", "0",
                                                "--dropout", "0", cwd=folder, env=env)
    return folders


def _env(**extra: str) -> dict:
    return clean_env(PYTHONPATH=str(REPO), **extra)


def _lines(stderr: str, tag: str) -> dict[str, list[str]]:
    """``{pid: [what followed the tag, ...]}`` for the ``tag`` lines of ``stderr``."""
    found: dict[str, list[str]] = {}
    for line in stderr.splitlines():
        match = re.match(rf"{tag} (\d+) (.*)", line)
        if match:
            found.setdefault(match[1], []).append(match[2])
    return found


def test_one_process_is_bit_identical_to_the_original(runs) -> None:
    want, got = runs["runs"]["original"], runs["runs"]["converted"]
    assert got.stdout == want.stdout
    assert list(_lines(got.stderr, "DRAW").values()) == list(_lines(want.stderr,
                                                                    "DRAW").values())
    # the whole model pickled (its class lives in the script's __main__): the same records,
    # byte for byte, under the archive folder torch names after the file written
    assert _records(runs["converted"] / "model.pt") == _records(runs["original"] / "model.pt")


def _records(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name.split("/", 1)[1]: archive.read(name) for name in archive.namelist()}


def test_two_processes_train_on_their_own_columns_of_the_global_batch(runs) -> None:
    two, wide = runs["runs"]["two"], runs["runs"]["wide"]
    draws = _lines(two.stderr, "DRAW")
    assert len(draws) == 2, two.stderr[-3000:]
    first, second = draws.values()
    [whole] = _lines(wide.stderr, "DRAW").values()
    assert len(first) == len(second) == len(whole)  # the same steps: nobody waits
    # every window's first time step: rank 0's 8 columns then rank 1's are the 16 of one
    # process at batch 16 (which pid is rank 0 is not known here: try both orders)
    joined = [json.loads(a) + json.loads(b) for a, b in zip(first, second)]
    swapped = [json.loads(b) + json.loads(a) for a, b in zip(first, second)]
    assert [json.loads(w) for w in whole] in (joined, swapped)
    assert all(a != b for a, b in zip(first, second))  # the ranks' windows differ


def test_two_processes_train_as_well_as_one_and_evaluate_exactly(runs) -> None:
    two = runs["runs"]["two"]
    result = result_line(two.stdout)
    evaluations = list(_lines(two.stderr, "EVAL").values())
    assert len(evaluations) == 2 and evaluations[0] == evaluations[1]  # both ranks agree
    history, test_loss = json.loads(evaluations[0][0])
    assert result == {"history": history, "test_loss": test_loss}
    # the same training as one process at the global batch, up to float rounding
    wide = result_line(runs["runs"]["wide"].stdout)
    assert [lr for _, lr, _ in history] == [lr for _, lr, _ in wide["history"]]
    assert [loss for *_, loss in history] == pytest.approx(
        [loss for *_, loss in wide["history"]], rel=1e-4)
    assert history[-1][2] < history[0][2] < 3.0  # it learned (ln 40 ≈ 3.7 at the start)
    # the evaluation is exact: one process evaluating the saved weights gets the same value
    again = result_line(runs["runs"]["reevaluated"].stdout)
    assert again == {"history": [], "test_loss": test_loss}
