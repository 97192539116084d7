"""convert/starts: a statement line's first line as written, read from the ``ast`` tree, is the
first line of its LibCST code (what the line-length checks measured by generating it)."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst as cst
import pytest

from distify.convert.starts import StatementStarts

FIXTURES = Path(__file__).parent / "fixtures"


def _lines(module: cst.Module) -> list[cst.SimpleStatementLine]:
    found: list[cst.SimpleStatementLine] = []

    class _Lines(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
            found.append(node)

    module.visit(_Lines())
    return found


def _statements(source: bytes) -> list[ast.AST]:
    from distify.analysis.filemodel import FileModel
    from distify.rules import default_rules

    return FileModel(ast.parse(source), source, default_rules()).statements.all


def _generated(line: cst.SimpleStatementLine) -> int:
    code = cst.Module([]).code_for_node(line.with_changes(leading_lines=()))
    return len(code.split("\n", 1)[0])


def _written_on_one_line(line: cst.SimpleStatementLine) -> bool:
    """No line break from the line's first token to its last (its code without the leading
    lines, and without the comment and the line end after it)."""
    code = cst.Module([]).code_for_node(line.with_changes(
        leading_lines=(), trailing_whitespace=cst.TrailingWhitespace()))
    code = code.rstrip("\r\n")
    return "\n" not in code and "\r" not in code


def _check(source: bytes) -> int:
    module = cst.parse_module(source)
    starts = StatementStarts(_statements(source), source, module)
    lines = _lines(module)
    for line in lines:
        code = cst.Module([]).code_for_node(line)
        assert starts.first_line(line) == _generated(line), code
        assert starts.one_line(line) is _written_on_one_line(line), code
    return len(lines)


def _over_the_fixtures(check) -> int:
    """``check(source)`` summed over every fixture both parsers read."""
    total = 0
    for path in sorted(FIXTURES.rglob("*.py")):
        try:
            total += check(path.read_bytes())
        except (SyntaxError, cst.ParserSyntaxError):
            continue
    return total


def test_every_statement_line_of_the_fixtures() -> None:
    assert _over_the_fixtures(_check) > 3_000


@pytest.mark.parametrize("source", [
    "x = 1; y = 2  # two\nif x: a = 1; b = 2\nelif y:\n    pass\nelse:\n    c = 3\n",
    "try:\n    a()\nexcept E:\n    b()\nelse:\n    c()\nfinally:\n    d()\n",
    "for i in r:\n    x = i\nelse:\n    y = 0\nwhile z:\n    break\n",
    "@dec\ndef f(a):\n    '''doc'''\n    return (a +\n            1)\n",
    "class C:\n    x: int = 1\n    def g(self): return self.x\n",
    "with open(p) as f, open(q) as g:\n    data = f.read()  # é\n",
    "match v:\n    case 1:\n        r = 'one'\n    case _:\n        r = 'ñ' * 3\n",
    "async def h():\n    async with a:\n        await b\n    async for c in d:\n        pass\n",
    "# a comment\n\n\nx = {\n    'k': 1,\n}\ny = 'a' \\\n    'b'\n",
    "\ufeffx = 1\r\ny = 2\r\n",
    "x = (1,\r\n     2)\r\ny = 3\nz = 4\r\n",  # mostly CRLF, one LF
    "x = 1\ny = (2,\r\n     3)\nz = 4\n",  # mostly LF, one CRLF
    # a line break only in the first statement of a line, only between two statements of a
    # line (a backslash), only in a string
    "a = f(\n); b = 1\nc = 1; \\\n  d = 2\ne = 1; g = \"\"\"x\ny\"\"\"\nprint(1, 2)  # done\n",
])
def test_shapes(source: str) -> None:
    assert _check(source.encode("utf-8")) >= 1


def test_no_answer_where_lines_end_with_a_lone_carriage_return() -> None:
    source = b"x = 1\ry = 2\n"
    module = cst.parse_module(source)
    starts = StatementStarts(_statements(source), source, module)
    assert all(starts.first_line(line) is None for line in _lines(module))
    assert all(starts.one_line(line) is None for line in _lines(module))
    assert starts.first_line(cst.SimpleStatementLine([cst.Pass()])) is None
    assert starts.one_line(cst.SimpleStatementLine([cst.Pass()])) is None


def test_a_conversion_measures_its_lines_from_the_source(monkeypatch) -> None:
    from distify.convert.engine import convert_source

    asked: list[int | None] = []
    first_line = StatementStarts.first_line

    def counted(self, statement):
        asked.append(first_line(self, statement))
        return asked[-1]

    monkeypatch.setattr(StatementStarts, "first_line", counted)
    source = (b"import torch\nmodel = torch.nn.Linear(2, 2)\n"
              b"opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              b"for x in range(3):\n    loss = model(torch.ones(2)).sum()\n"
              b"    loss.backward()\n    print('loss', loss.item())\n")
    assert convert_source(source).status == "converted"
    assert asked and all(length is not None for length in asked)


def test_a_renamed_call_on_a_one_line_statement_is_not_walked_for_a_line_break(
        monkeypatch) -> None:
    """``_holds_line_break`` answers from the source for an unchanged call on a line written
    on one line, and its answer is always the walk's (every conversion of the fixtures)."""
    from distify.convert.base import TransformerBase
    from distify.convert.engine import convert_source
    from distify.convert.syntax import _spans_lines
    from distify.errors import UserError

    answers: list[tuple[bool, bool]] = []
    holds = TransformerBase._holds_line_break

    def checked(self, node, original):
        fast = node is original and self.ctx.statements \
            and bool(self.starts.one_line(self.ctx.statements[-1]))
        answer = holds(self, node, original)
        assert answer is _spans_lines(node), cst.Module([]).code_for_node(node)
        answers.append((fast, answer))
        return answer

    monkeypatch.setattr(TransformerBase, "_holds_line_break", checked)
    for path in sorted(FIXTURES.rglob("*.py")):
        try:
            convert_source(path.read_bytes(), str(path))
        except UserError:
            continue
    assert sum(fast for fast, _ in answers) > 100  # answered from the source
    assert any(answer for _, answer in answers)  # and some calls do span lines


def _code_check(source: bytes) -> bool:
    """``StatementStarts.code`` of the parsed module is its own code; True when it was known."""
    module = cst.parse_module(source)
    starts = StatementStarts(_statements(source), source, module)
    code = starts.code(module)
    if code is not None:
        assert code == module.code
    return code is not None


def test_the_source_copy_of_every_fixture_is_its_code() -> None:
    assert _over_the_fixtures(_code_check) > 200


@pytest.mark.parametrize("source", [
    "# a header\n\n\n@dec\n# between decorators\n@dec2(\n    1)\n\ndef f():\n    pass\n"
    "    # indented, after the block\n# at column 0\nx = 1  # trailing\n\n\n# footer\n",
    "\ufeffimport os\r\nx = 1\r\n\r\ndef g():\r\n    return 2\r\n",
    "if a: b = 1; c = 2\nfor i in r: pass\nclass C: x = 1\nwhile 0: pass\nz = 3\n",
    "async def h():\n    async with a:\n        pass\n\x0c\nmatch v:\n    case 1:\n        pass\n"
    "y = '''a\nb'''\nw = (1,\n     2)\nq = 1\n",
    "try:\n    a()\nexcept E:\n    pass\nelse:\n    b()\nfinally:\n    c()\n\n\nlast = 1\n",
])
def test_the_source_copy_of_shapes(source: str) -> None:
    assert _code_check(source.encode("utf-8"))


@pytest.mark.parametrize("source", [b"x = 1\ny = 2", b"x = 1\ry = 2\n", b"", b"# only\n",
                                    b"x = 1\n"])
def test_no_source_copy_where_it_is_not_known(source: bytes) -> None:
    """No final line end (LibCST drops the last one it would write), a lone carriage return,
    no statement, or only the last one (generated, as its end is the file's): the module's
    code is generated."""
    assert not _code_check(source)


def test_a_conversion_copies_its_unchanged_statements_and_checks_the_copy(monkeypatch) -> None:
    """Every fixture's conversion: the copy is the converted module's own code, and is used;
    a copy with a line too many is not (the walk of the module counts its line breaks)."""
    import distify.analysis.positions as positions
    import distify.convert.engine as engine
    from distify.errors import UserError

    used: list[bool] = []
    lines_of = positions.lines_of

    def checked(module, nodes, code=None):
        nodes = list(nodes)
        out, lines = lines_of(module, nodes, code)
        if code is not None:
            assert code == module.code
            used.append(out is code)
            wrong, _ = lines_of(module, nodes, code + "\n")
            assert wrong == module.code and wrong is not code
        return out, lines

    monkeypatch.setattr(engine, "lines_of", checked)
    for path in sorted(FIXTURES.rglob("*.py")):
        try:
            engine.convert_source(path.read_bytes(), str(path))
        except UserError:
            continue
    assert len(used) > 50 and all(used)
