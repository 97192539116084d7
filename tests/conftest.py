"""Suite-wide fixtures.

The hang guard: a test that hangs fails on its own, with the place it hung, instead of
holding the whole suite until CI's wall-clock limit kills it with no name attached.
The limit is generous (tests that launch jobs bound their own children far below it); set
``DISTIFY_TEST_TIMEOUT`` (seconds, 0 turns the guard off) to change it.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tests import _pool

LIMIT_S = int(os.environ.get("DISTIFY_TEST_TIMEOUT", "600"))


class TestHung(BaseException):
    """Raised in the test's own frame when it runs past the limit; a BaseException, so that
    the code under test (a CLI that turns errors into exit codes) cannot swallow it."""

    __test__ = False  # not a test class, whatever its name


@pytest.fixture(autouse=True)
def _hang_guard(request: pytest.FixtureRequest):
    usable = (LIMIT_S > 0 and hasattr(signal, "SIGALRM")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def expire(signum, frame):
        raise TestHung(f"{request.node.nodeid} ran past {LIMIT_S} s (DISTIFY_TEST_TIMEOUT)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test module marked ``pytest.mark.pool`` runs its ``run_python``/``run_torchrun`` jobs
    in the warm worker pool (``tests/_pool.py``), unless ``DISTIFY_TEST_POOL=0``. Set before
    any of the test's fixtures, so a module-scoped fixture that runs the jobs gets it too."""
    _pool.ALLOWED = item.get_closest_marker("pool") is not None


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, a worker hands its pool counts to the controller, which prints them."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["distify_pool"] = dict(_pool.STATS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    for key, count in getattr(node, "workeroutput", {}).get("distify_pool", {}).items():
        _pool.STATS[key] += count


def pytest_terminal_summary(terminalreporter) -> None:
    if any(_pool.STATS.values()):
        terminalreporter.write_line(
            f"worker pool (DISTIFY_TEST_POOL={os.environ.get('DISTIFY_TEST_POOL', '1')}): "
            f"{_pool.STATS['pooled']} jobs forked from it, {_pool.STATS['old way']} run the old "
            "way")
