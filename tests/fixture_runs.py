"""Run fixture scripts and their conversions as real processes, side by side.

For each fixture ``NAME.in.py`` (with its golden conversion ``NAME.out.py``), three runs, each in
a folder of its own (``<root>/NAME-<variant>/train.py``), all of them at once (a thread each,
torchrun's first since they take longest):

- ``original``: the script with plain ``python``;
- ``one``: the conversion with plain ``python`` (world size 1, no process group);
- ``two``: the conversion under torchrun on 2 processes (Gloo, CPU), with the replicas check
  (``run_torchrun(replicas=True)``: the ranks' trained parameters end bit-identical).

Every run gets ``SHOW_DRAWS=1``: the fixtures then write what each process drew, tagged with its
pid, to stderr.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO, clean_env, run_python, run_torchrun

VARIANTS = ("two", "original", "one")


@dataclass(frozen=True)
class Plan:
    """How to run one fixture."""

    #: arguments of every run
    args: tuple[str, ...] = ()
    #: arguments added to the 2-process run (``--batch-size 8``: the same global batch)
    two_args: tuple[str, ...] = ()
    #: the ranks' first training batches must differ (the data is sharded)
    distinct_data: bool = True


def run_side_by_side(root: Path, fixtures: Path, plans: dict[str, Plan],
                     also: Callable[[], subprocess.CompletedProcess] | None = None,
                     ) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Run every fixture of ``plans`` (found in ``fixtures``) in its three variants under
    ``root``; the finished processes by ``(name, variant)``, and ``also``'s (another job run
    alongside) as ``("also", "")``. A failed run fails the test."""
    jobs = []
    for variant in VARIANTS:
        for name, plan in plans.items():
            folder = root / f"{name}-{variant}"
            folder.mkdir()
            suffix = "in" if variant == "original" else "out"
            (folder / "train.py").write_bytes((fixtures / f"{name}.{suffix}.py").read_bytes())
            jobs.append((name, variant, folder, plan))
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {(name, variant): pool.submit(_run, variant, folder, plan)
                   for name, variant, folder, plan in jobs}
        if also is not None:
            futures["also", ""] = pool.submit(also)
    return {key: future.result() for key, future in futures.items()}


def _run(variant: str, folder: Path, plan: Plan) -> subprocess.CompletedProcess:
    env = clean_env(PYTHONPATH=str(REPO), SHOW_DRAWS="1")
    script = folder / "train.py"
    if variant == "two":
        return run_torchrun(script, *plan.args, *plan.two_args, nproc=2, cwd=folder, env=env,
                            replicas=True, distinct_data=plan.distinct_data, timeout=300)
    return run_python(script, *plan.args, cwd=folder, env=env)


def tagged(stderr: str, tag: str) -> dict[str, list[str]]:
    """The ``TAG <pid> <rest>`` lines a run wrote to stderr: ``{pid: [rest, ...]}``, in order."""
    found: dict[str, list[str]] = {}
    for line in stderr.splitlines():
        match = re.match(rf"{tag} (\d+) (.*)", line)
        if match:
            found.setdefault(match[1], []).append(match[2])
    return found


# ---------------------------------------------------------------- golden conversions


def fixture_name(path: Path) -> str:
    """``NAME`` of ``NAME.in.py`` (test ids)."""
    return path.name.split(".")[0]


def check_golden(source: Path, *, again: str | None = "already-distributed") -> None:
    """``NAME.in.py`` converts to ``NAME.out.py`` exactly (``DISTIFY_UPDATE_GOLDEN=1`` rewrites
    the golden file: review its diff), and converting the output again changes nothing (its
    status ``again``, unless None)."""
    from distify.convert.engine import convert_source

    expected = source.with_name(source.name.replace(".in.py", ".out.py"))
    result = convert_source(source.read_bytes(), str(source))
    if os.environ.get("DISTIFY_UPDATE_GOLDEN"):
        expected.write_bytes(result.output)
    assert result.status == "converted"
    assert result.output.decode() == expected.read_text()
    second = convert_source(result.output, "converted.py")
    assert second.output == result.output
    if again is not None:
        assert second.status == again
