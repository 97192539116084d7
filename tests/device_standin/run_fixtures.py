"""Run converted scripts one after another in this process, under the device stand-in.

``python run_fixtures.py RESULTS.json FOLDER...``: each FOLDER holds a ``train.py``; it runs
as ``__main__`` with FOLDER as its working directory and the arguments in FOLDER/args.txt, if
any (split on white space), at world size 1 with a
fresh distify runtime, under :mod:`_distify_standin`. RESULTS.json gets, per folder, ``ok``,
the last lines of the error when it failed, and the devices of the models it prepared. A
script gets ``DISTIFY_STANDIN_SECONDS`` (60) before it is stopped. One interpreter for all of
them: torch is imported once, which makes the whole run several times faster than a process
per script.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import signal
import sys
import traceback

import _distify_standin


class _TooLong(Exception):
    pass


def _stop(signum, frame):
    raise _TooLong(f"still running after {os.environ.get('DISTIFY_STANDIN_SECONDS', '60')} s")


#: the device types of the models prepared by the script running now
_MODEL_DEVICES: set[str] = set()


def _record_models() -> None:
    """Note the devices of every model the scripts prepare (they are gone when a script ends)."""
    from distify.runtime import _prepare

    add = _prepare.Prepared.add

    def recording_add(self, kind, obj):
        if kind == "models":
            _MODEL_DEVICES.update(p.device.type for p in obj.parameters())
        return add(self, kind, obj)

    _prepare.Prepared.add = recording_add


def run_one(folder: str) -> dict:
    from distify.runtime import _state

    _state.reset()
    script = os.path.join(folder, "train.py")
    before, argv = os.getcwd(), sys.argv
    os.chdir(folder)
    arguments = os.path.join(folder, "args.txt")
    sys.argv = [script]
    if os.path.exists(arguments):
        with open(arguments, encoding="utf-8") as handle:
            sys.argv += handle.read().split()
    out = io.StringIO()
    result: dict = {"ok": True, "error": "", "models": []}
    signal.alarm(int(os.environ.get("DISTIFY_STANDIN_SECONDS", "60")))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            result.update(ok=False, error=f"exit {stop.code}")
    except BaseException as error:  # every failure is a result
        frames = traceback.format_tb(error.__traceback__)[-3:]
        result.update(ok=False, error="".join(frames) + f"{type(error).__name__}: {error}"[:600])
    finally:
        signal.alarm(0)
        os.chdir(before)
        sys.argv = argv
    result["models"] = sorted(_MODEL_DEVICES)
    _MODEL_DEVICES.clear()
    result["output"] = out.getvalue()[-2000:]
    return result


def main() -> None:
    _distify_standin.install()
    _record_models()
    signal.signal(signal.SIGALRM, _stop)
    results = {folder: run_one(folder) for folder in sys.argv[2:]}
    with open(sys.argv[1], "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
