"""Test-only start-up hook: with ``DISTIFY_TEST_STANDIN=1``, this process gets the stand-in
accelerator of ``_distify_standin`` (put this folder first on ``PYTHONPATH``). Without it, it
does nothing and imports nothing. A ``sitecustomize`` that this one hides still runs."""

import os


def _run_the_hidden_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("DISTIFY_TEST_STANDIN") == "1":
    import _distify_standin

    _distify_standin.install()

_run_the_hidden_sitecustomize()
