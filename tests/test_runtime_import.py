"""Where the runtime's import goes: after a module docstring and ``__future__`` imports, and under
a name the script does not already use (an existing alias ``distify`` keeps its meaning).

LibCST's ``AddImportsVisitor`` was measured as the alternative (benchmarks/results/convert.md):
it would change 45 of the 66 golden outputs that hold the import (a blank line added after it)
and costs 3.8x the LibCST floor on the 5,000-line benchmark script, so the engine keeps its own.
"""

from __future__ import annotations

import pytest

from distify.convert.engine import convert_source


@pytest.mark.parametrize("before, after", [
    pytest.param('"""Doc."""\nimport torch\nprint(1)\n',
                 '"""Doc."""\nimport torch\nimport distify.runtime as distify\n'
                 "distify.print(1)\n", id="after-the-docstring"),
    pytest.param("from __future__ import annotations; import torch; print(1)\n",
                 "from __future__ import annotations; import distify.runtime as distify; "
                 "import torch; distify.print(1)\n", id="future-import-sharing-its-line"),
    pytest.param('"""Doc."""\nfrom __future__ import annotations\nimport torch\n'
                 "import numpy as distify\nprint(distify.ones(1))\n",
                 '"""Doc."""\nfrom __future__ import annotations\nimport torch\n'
                 "import numpy as distify\nimport distify.runtime as distify_rt\n"
                 "distify_rt.print(distify.ones(1))\n", id="existing-alias-keeps-its-name"),
])
def test_runtime_import_placement(before: str, after: str) -> None:
    assert convert_source(before.encode()).output.decode() == after
