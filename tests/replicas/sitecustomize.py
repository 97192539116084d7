"""Test-only start-up hook: record what each process of a job trained (see ``_distify_replicas``).

The test helpers (``tests/helpers.py``: ``run_torchrun(..., replicas=...)``, ``replicas_env``)
put this folder first on ``PYTHONPATH``, so Python imports this module at start-up in every
process of the job. Without ``DISTIFY_TEST_REPLICAS`` it does nothing and imports nothing; with
it, the recorder starts (it waits for the script to import torch). Either way, a
``sitecustomize`` that this one hides (later on ``sys.path``) still runs.
"""

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


if os.environ.get("DISTIFY_TEST_REPLICAS"):
    import _distify_replicas

    _distify_replicas.start()

_run_the_hidden_sitecustomize()
