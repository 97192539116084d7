"""The notes of the walks after the rewrite (``convert/devices.py``: factories in ``forward``,
fresh models) read only where they can find something; these are the places a shortcut could
miss: model classes defined inside a function or an ``if``, a class inside ``forward``, and
no model made at all."""

from __future__ import annotations

from pathlib import Path

import distify
from distify.convert.engine import convert_source

_NESTED = """\
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


def main():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            h = torch.zeros(x.size(0), 2)
            return self.fc(x) + h

    if True:
        class Head(nn.Module):
            def forward(self, x):
                class Inner(nn.Module):
                    def forward(self, y):
                        return torch.ones(2) + y
                return torch.eye(2).to(x.device) + torch.rand(2) + Inner()(x)

    model = Net().cuda()
    head = Head().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(data):
        opt.zero_grad()
        head(model(x.cuda())).sum().backward()
        opt.step()


main()
"""


def test_forward_of_model_classes_defined_in_a_function_and_an_if_is_read() -> None:
    result = convert_source(_NESTED.encode(), "train.py")
    notes = [(n.line, n.message.split(" in ")[0], n.message.split(" in ")[1].split(".")[0])
             for n in result.notes if "forward has no device=" in n.message]
    # output lines (the import is line 1); torch.eye(...).to(x.device) is moved where it is
    # made: no note
    assert notes == [(14, "`torch.zeros(...)`", "Net"), (22, "`torch.ones(...)`", "Inner"),
                     (23, "`torch.rand(...)`", "Head")], result.notes


def test_no_model_made_means_no_fresh_model_note() -> None:
    """Only a prepared model from a function: nothing is made by ``net = Net()``."""
    source = _NESTED.replace("model = Net().cuda()", "model = build().cuda()")
    result = convert_source(source.encode(), "train.py")
    assert not [n for n in result.notes if "is a fresh" in n.message]


def test_no_rewrite_writes_load_state_dict() -> None:
    """``fresh_models`` skips its walk when the script's own text never says
    ``load_state_dict``: sound only while no rewrite (code or bundled rule pack) makes a node
    with that name."""
    root = Path(distify.__file__).parent
    writers = [path for folder in ("convert", "bundled_rules")
               for path in sorted((root / folder).rglob("*"))
               if path.suffix in (".py", ".yaml", ".yml", ".toml", ".json")
               and "load_state_dict" in path.read_text(encoding="utf-8")]
    assert writers == [root / "convert" / "devices.py"]  # where it is only read


def test_a_fresh_model_is_still_found_when_its_load_is_the_only_mention() -> None:
    source = _NESTED.replace("    model = Net().cuda()\n", "    model = Net().cuda()\n"
                             "    net = Net()\n    net.load_state_dict(torch.load('m.pt'))\n")
    source = source.replace("        opt.step()\n", "        opt.step()\n        net(x)\n")
    result = convert_source(source.encode(), "train.py")
    assert [n.line for n in result.notes if "is a fresh Net" in n.message] == [26], \
        result.notes
    assert result.output.decode().splitlines()[25] == "    net = Net()"
