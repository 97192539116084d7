"""The garbage collector off while one file is converted or checked.

Parsing a file allocates an object for most of its nodes (LibCST's and ``ast``'s), and the
collector, triggered every 700 allocations, scans the growing young generation again and again:
about a fifth of a large file's conversion, and a tenth of a check. Neither command leaves a
reference cycle behind (``tests/test_no_cycles.py``): what a file's work drops is freed by
reference counting as it is dropped. So none runs while a file is worked on; the collector is
back, as the caller had it, when the file is done.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def no_collections() -> Iterator[None]:
    """No garbage collection inside; nested in a caller that turned it off, it stays off."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
