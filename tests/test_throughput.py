"""Throughput counters over per-process batches are reported (issue 21 item 16's last bullet,
found on nanoGPT's `num_tokens` and the LambdaLabs guide's `tok_per_step`)."""

from __future__ import annotations

import textwrap

import pytest

from distify.convert.engine import convert_source
from distify.convert.throughput import COUNTER

_LOADER_LOOP = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=8)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
num_tokens = 0
for images, y in {iterated}:
    images = images * 2
    loss = torch.nn.functional.mse_loss(model(images), y)
    optimizer.zero_grad()
    loss.{backward}()
    optimizer.step()
    num_tokens += images.numel()
    tok_per_step = 8 * 4
    tokens_per_s = tok_per_step / 0.5
print(num_tokens, tokens_per_s)
"""

_DRAWN = """\
import torch

data = torch.arange(1000) % 17
model = torch.nn.Sequential(torch.nn.Embedding(17, 16), torch.nn.Linear(16, 17))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def get_batch():
    ix = torch.randint(len(data) - 8, (4,))
    return torch.stack([data[i:i + 8] for i in ix]), torch.stack([data[i + 1:i + 9] for i in ix])


num_tokens = 0
for it in range(5):
    X, Y = get_batch()
    loss = torch.nn.functional.cross_entropy(model(X).view(-1, 17), Y.view(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    num_tokens += X.numel()
print(num_tokens)
"""


def _noted(source: str) -> dict[str, int]:
    result = convert_source(textwrap.dedent(source).encode(), "train.py")
    lines = result.output.decode().splitlines()
    found = {}
    for change in result.changes:
        if change.kind == "throughput":
            assert "the whole job's is × `distify.world_size()`" in change.message
            found[change.message.split("`")[1]] = change.line
            assert found[change.message.split("`")[1]] and \
                change.message.split("`")[1] in lines[change.line - 1]
    return found


@pytest.mark.parametrize("iterated", ["loader", "enumerate(loader)"])
def test_counters_in_a_training_loop_over_a_prepared_loader_are_reported(iterated) -> None:
    source = _LOADER_LOOP.format(iterated=iterated, backward="backward")
    if iterated != "loader":
        source = source.replace("for images, y in", "for i, (images, y) in")
    # `images` is the batch, not a counter; tokens_per_s is computed from a counter
    assert set(_noted(source)) == {"num_tokens", "tok_per_step"}


def test_counters_over_per_process_draws_are_reported() -> None:
    assert set(_noted(_DRAWN)) == {"num_tokens"}


def test_no_note_where_the_loop_trains_nothing_or_every_process_has_the_same_batches() -> None:
    # an evaluation loop: no backward
    assert _noted(_LOADER_LOOP.format(iterated="loader", backward="detach")) == {}
    # batches from a hand-made list: the same on every process (reported elsewhere as unsharded)
    same = _LOADER_LOOP.format(iterated="batches", backward="backward").replace(
        "num_tokens = 0\n", "num_tokens = 0\nbatches = [(torch.randn(8, 4), torch.randn(8, 1))]\n")
    assert _noted(same) == {}


@pytest.mark.parametrize(("name", "counter"), [
    ("num_tokens", True), ("tok_per_step", True), ("tokens_seen", True),
    ("images_per_sec", True), ("n_samples", True), ("throughput", True),
    ("images", False), ("tokens", False), ("sample", False), ("seq_len", False),
    ("token_embedding", False),
])
def test_what_names_a_counter(name: str, counter: bool) -> None:
    assert bool(COUNTER.match(name)) is counter
