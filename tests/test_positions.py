"""``analysis.positions.lines_of``: the line of every node is where LibCST's public
``WhitespaceInclusivePositionProvider`` starts it, and the code is ``Module.code``."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, WhitespaceInclusivePositionProvider

from distify.analysis.positions import lines_of
from distify.analysis.walk import PUNCTUATION
from distify.convert.engine import convert_source

_LEAVES = (*PUNCTUATION, cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.Ellipsis,
           cst.SimpleString, cst.FormattedStringText)
_FIXTURES = sorted((Path(__file__).parent / "fixtures").rglob("*.py"))
_AWKWARD = '''\
"""A docstring
over lines."""
import os  # comment


@decorator(
    arg,  # why
)
def f(a,
      b=\\
      2):
    x = """one
two""" + f"""{a}
{b!r:>{a}}"""

    # a comment line

    if a: pass
    while b:
        pass
    class C: pass
    y = [a,
         b] + (
        c
    ) + g(x=\\
          1, *(
              d))[
        0]
    z = (
        "s"
    ) if a not in (b,
                   c) else ...
    return (
        a  # c
        + b
    )
'''


def _every_node(module: cst.Module) -> list[cst.CSTNode]:
    found = []

    def add(node: cst.CSTNode) -> None:
        found.append(node)
        for child in node.children:
            add(child)

    add(module)
    return found


def _check(module: cst.Module, leaves: bool = True) -> None:
    """Every node's line (or, without ``leaves``, every node but whitespace, punctuation, names,
    numbers and strings: the nodes a rewrite anchors report lines to, which a quicker walk
    finds) is the provider's."""
    nodes = _every_node(module)
    if not leaves:
        nodes = [node for node in nodes if not isinstance(node, _LEAVES)]
    code, lines = lines_of(module, nodes)
    assert code == module.code
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(
        WhitespaceInclusivePositionProvider)
    assert {id(n): lines[id(n)] for n in nodes} == \
        {id(n): positions[n].start.line for n in nodes}


@pytest.mark.parametrize("leaves", [True, False])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_every_node_of_awkward_code_is_on_the_providers_line(newline: str, leaves: bool) -> None:
    _check(cst.parse_module(_AWKWARD.replace("\n", newline)), leaves)


def test_an_empty_block_written_with_pass_counts_its_line() -> None:
    module = cst.parse_module("if a:\n    x = 1\ny = 2\n")
    tree = module.with_changes(body=[module.body[0].with_changes(
        body=cst.IndentedBlock(body=[])), module.body[1]])
    assert tree.code == "if a:\n    pass\ny = 2\n"
    _check(tree)
    _check(tree, leaves=False)
    assert lines_of(tree, [tree.body[1]])[1] == {id(tree.body[1]): 3}


@pytest.mark.parametrize("leaves", [True, False])
@pytest.mark.parametrize("path", _FIXTURES[::7], ids=lambda p: p.name)
def test_every_node_of_a_converted_fixture_is_on_the_providers_line(path: Path,
                                                                    leaves: bool) -> None:
    output = convert_source(path.read_bytes(), str(path)).output
    try:
        module = cst.parse_module(output)
    except cst.ParserSyntaxError:
        pytest.skip("LibCST cannot parse it")
    _check(module, leaves)


def test_a_parenthesized_string_over_lines_counts_its_parentheses() -> None:
    module = cst.parse_module('x = (\n    "abc"\n)\ny = 1\nz = (\n    """a\nb"""  # c\n)\nw = 2\n')
    _check(module)
    _check(module, leaves=False)
    code, lines = lines_of(module, module.body)
    assert [lines[id(s)] for s in module.body] == [1, 4, 5, 9]
