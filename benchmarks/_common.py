"""Helpers shared by the benchmarks: timing, medians, the machine's description, markdown."""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
WORK = BENCH / ".work"
RESULTS = BENCH / "results"


def venv_bin(name: str) -> str:
    """The console script ``name`` installed beside this interpreter (e.g. ``distify``)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(cmd: list[str], *, env: dict[str, str] | None = None,
              cwd: str | Path | None = None, cpu: bool = False) -> float:
    """Run ``cmd`` to completion (output discarded) and return its wall time in seconds, or
    with ``cpu`` the CPU time (user + system) it used: on a shared machine the CPU time of a
    single-threaded command does not count the time other work held the CPUs."""
    start, start_cpu = time.perf_counter(), children_cpu()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          cwd=cwd)
    elapsed = children_cpu() - start_cpu if cpu else time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stderr.decode(errors='replace')}")
    return elapsed


def error_excerpt(proc: subprocess.CompletedProcess) -> str:
    """The lines of a failed job that say why (torchrun's summary alone does not)."""
    text = (proc.stdout + proc.stderr).strip().splitlines()
    why = [line for line in text if any(word in line for word in (
        "Error", "error", "terminate", "what()", "Traceback", "Exception"))]
    return "\n".join(why[-10:] + ["..."] + text[-8:])


def bench_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a benchmark job: no DISTIFY_* setting of the caller's, one thread,
    unbuffered output, this checkout first on the path; ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTIFY_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def bench_lines(cmd: list[str], extra: dict[str, str], timeout: float) -> list[dict]:
    """Run ``cmd`` under :func:`bench_env` and return the JSON lines it printed that start
    with ``{"bench"``; exit with the job's error when there are none."""
    proc = subprocess.run(cmd, cwd=ROOT, env=bench_env(extra), capture_output=True, text=True,
                          timeout=timeout)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"bench"')]
    if not lines:
        raise SystemExit(f"{Path(cmd[-1]).name} failed (exit {proc.returncode}):\n"
                         f"{error_excerpt(proc)}")
    return lines


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    """min–max of ``values`` in milliseconds, for the tables."""
    return f"{min(values) * 1e3:.0f}–{max(values) * 1e3:.0f}"


def machine() -> str:
    """One line describing where the numbers were taken."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = ", load average at start %.2f" % os.getloadavg()[0]
    return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU(s) ({cpu}){load}; "
            f"Python {platform.python_version()}")


def versions(*modules: str) -> str:
    from importlib import metadata

    found = []
    for name in modules:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def today() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


#: a results file may end with a hand-written analysis from this marker on; re-runs keep it
KEEP_MARKER = "<!-- hand-written analysis: kept when the benchmark rewrites this file -->"


def precompile_distify() -> str:
    """Write the bytecode of the distify being measured, as installing it does, and say so.

    Whole-process runs import every module of distify's convert (or check) path; without
    bytecode (``PYTHONDONTWRITEBYTECODE`` set, as on the shared machine, or a read-only
    checkout) each process compiles them all again, about 0.1 s, while the floor's LibCST,
    installed with its bytecode, never does."""
    import compileall

    import distify

    folder = Path(distify.__file__).parent
    compileall.compile_dir(str(folder), quiet=1)
    return (f"bytecode: distify's compiled first (`compileall`, as an install does; "
            f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r} here)")


def write_results(path: Path, text: str) -> None:
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        old = path.read_text(encoding="utf-8")
        if KEEP_MARKER in old:
            text = text.rstrip("\n") + "\n\n" + old[old.index(KEEP_MARKER):]
    path.write_text(text, encoding="utf-8")
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"recorded {shown}", file=sys.stderr)
