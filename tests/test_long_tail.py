"""Pattern classes of real scripts (issue 21), each converted right or reported."""

from __future__ import annotations

from distify.convert.engine import convert_source
from distify.lint import lint_text
from tests.helpers import FIXTURES

UNUSED_IMPORT = FIXTURES / "convert" / "unused_dist_import.in.py"


def test_an_unused_torch_distributed_import_is_not_already_distributed() -> None:
    source = UNUSED_IMPORT.read_bytes()
    result = convert_source(source, "train.py")
    assert result.status == "converted"
    assert b"distify.prepare(model, optimizer)" in result.output
    # `check` still lints it as distributed code: a file importing torch.distributed is meant
    # to run on several processes, and its unguarded save is the classic pitfall.
    assert [f.code for f in lint_text(source.decode(), "train.py")] == ["DST101"]


def test_a_used_import_still_marks_the_file_distributed() -> None:
    seed = "    torch.manual_seed(1)\n"
    source = UNUSED_IMPORT.read_text().replace(seed, "    dist.init_process_group('gloo')\n" + seed)
    result = convert_source(source.encode(), "train.py")
    assert result.status == "already-distributed"
    assert "uses torch.distributed.init_process_group" in result.reason
