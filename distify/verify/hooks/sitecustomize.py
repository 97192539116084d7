"""Start-up hook of ``distify verify``'s runs: records what each process did (``_distify_verify``).

``distify verify`` puts this folder first on ``PYTHONPATH`` of the runs it starts, so Python
imports this module at start-up in every process. Without ``DISTIFY_VERIFY_DIR`` it does nothing;
nor in the launcher of a run on N processes (``DISTIFY_VERIFY_LAUNCHED`` set, no ``RANK``).
A ``sitecustomize`` that this one hides (later on ``sys.path``) still runs.
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


# In a run on N processes, the launcher itself (torchrun: no RANK) records nothing
if os.environ.get("DISTIFY_VERIFY_DIR") and (
        "RANK" in os.environ or not os.environ.get("DISTIFY_VERIFY_LAUNCHED")):
    import _distify_verify

    _distify_verify.start()

_run_the_hidden_sitecustomize()
