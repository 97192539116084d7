"""The committed fixtures on a real GPU: each original script against its golden conversion.

For every fixture ``NAME.in.py`` that picks CUDA when it is there (it mentions ``cuda``), with
its golden conversion ``NAME.out.py`` (so no LibCST is needed where this runs):

- ``original``: ``python train.py`` (the single-GPU script as its author runs it);
- ``converted``: ``torchrun --standalone --nproc_per_node N train.py`` (distify's runtime:
  NCCL, the device from ``LOCAL_RANK``, every safety net on).

Each run goes in a folder of its own and gets a start-up probe (a ``sitecustomize`` first on
``PYTHONPATH``) that writes, as the process ends, whether CUDA was initialised and its peak
memory: a run that silently stayed on the CPU shows up as such. The printed numbers of the
two runs are compared in order (at world size 1 the conversion must print what the original
printed; GPU kernels are not bit-reproducible run to run, so "close" allows 1e-3 relative).

``python benchmarks/gpu_fixtures.py [--nproc N] [--jobs J] [--results FILE]``; results as a
Markdown table on stdout and in FILE (and in ``$OUT`` when set). For a session lent a GPU
machine (``benchmarks/gpu_check.sh`` runs it first); on a machine without CUDA it says so and
exits 0 unless ``--allow-cpu`` (a dry run of the plumbing).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"

PROBE = '''\
import atexit, os, sys

def _gpu_probe():
    torch = sys.modules.get("torch")
    used = bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())
    peak = torch.cuda.max_memory_allocated() if used else 0
    rank = os.environ.get("RANK", "-")
    sys.stderr.write(f"GPUPROBE rank={rank} cuda={int(used)} peak={peak}\\n")
    sys.stderr.flush()

atexit.register(_gpu_probe)
'''

NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?|-?\d+e[-+]?\d+", re.IGNORECASE)


def fixtures() -> list[Path]:
    found = []
    for source in sorted(FIXTURES.glob("*/*.in.py")):
        golden = source.with_name(source.name.replace(".in.py", ".out.py"))
        if golden.exists() and "cuda" in source.read_text(encoding="utf-8"):
            found.append(source)
    return found


def run(folder: Path, command: list[str], env: dict[str, str], timeout: float):
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=timeout)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as stopped:
        rc = "timeout"
        out = (stopped.stdout or b"").decode(errors="replace") if isinstance(
            stopped.stdout, bytes) else (stopped.stdout or "")
        err = (stopped.stderr or b"").decode(errors="replace") if isinstance(
            stopped.stderr, bytes) else (stopped.stderr or "")
    return {"rc": rc, "out": out, "err": err, "seconds": time.perf_counter() - start}


def probe(err: str) -> str:
    lines = re.findall(r"GPUPROBE rank=(\S+) cuda=(\d) peak=(\d+)", err)
    if not lines:
        return "no probe line"
    # torchrun's own agent process (no RANK) initialises nothing: only the workers are shown
    workers = [line for line in lines if line[0] != "-"] or lines
    return ", ".join(f"{'' if rank == '-' else f'rank {rank} '}"
                     f"{'cuda' if used == '1' else 'CPU'} {int(peak) / 2**20:.0f} MiB"
                     for rank, used, peak in workers)


#: lines that print a duration or a speed: their numbers are not results
TIMING = re.compile(r"\btime\b|ms/|elapsed|/s\b|\bsec|it/s|s/it", re.IGNORECASE)


def numbers(output: str) -> list[float]:
    """The printed numbers of ``output``, leaving out lines that print timings."""
    return [float(x) for line in output.splitlines() if not TIMING.search(line)
            for x in NUMBER.findall(line)]


def compare(original: str, converted: str) -> str:
    a, b = numbers(original), numbers(converted)
    if not a and not b:
        return "no numbers printed"
    if len(a) != len(b):
        return f"differ: {len(a)} numbers vs {len(b)}"
    worst = max((abs(x - y) / max(abs(x), abs(y), 1e-6) for x, y in zip(a, b)), default=0.0)
    if worst == 0:
        return f"equal ({len(a)} numbers)"
    if worst <= 1e-3:
        return f"close ({len(a)} numbers, max rel diff {worst:.1e})"
    return f"differ (max rel diff {worst:.1e})"


def check(source: Path, root: Path, nproc: int, timeout: float,
          extra_env: dict[str, str]) -> dict:
    name = f"{source.parent.name}/{source.name.split('.')[0]}"
    env = dict(os.environ, PYTHONPATH=f"{root / 'probe'}{os.pathsep}{REPO}",
               PYTHONUNBUFFERED="1")
    rows = {}
    for variant, suffix in (("original", "in"), ("converted", "out")):
        folder = root / f"{name.replace('/', '-')}-{variant}"
        folder.mkdir()
        shutil.copyfile(source.with_name(source.name.replace(".in.py", f".{suffix}.py")),
                        folder / "train.py")
        if variant == "original":
            command = [sys.executable, "train.py"]
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc_per_node={nproc}", "train.py"]
        rows[variant] = run(folder, command,
                            {**env, **extra_env} if variant == "converted" else env, timeout)
    return {"name": name, **rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=0, help="processes (default: GPUs, max 2)")
    parser.add_argument("--jobs", type=int, default=6, help="fixtures run at once")
    parser.add_argument("--timeout", type=float, default=150)
    parser.add_argument("--results", default="benchmarks/results/gpu_fixtures.md")
    parser.add_argument("--allow-cpu", action="store_true")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set for the converted runs (e.g. DISTIFY_MIXED_PRECISION=bf16)")
    parser.add_argument("--only", nargs="*", default=None, help="fixture names (default: all)")
    args = parser.parse_args()

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print("gpu_fixtures: skipped: no CUDA (--allow-cpu runs the plumbing on the CPU)")
        return 0
    nproc = args.nproc or (min(2, torch.cuda.device_count()) if cuda else 1)
    header = (f"torch {torch.__version__}, "
              + (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, "
                 f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}" if cuda else "no CUDA")
              + f"; converted runs on {nproc} process(es)"
              + (f" with {' '.join(args.env)}" if args.env else ""))
    root = Path(tempfile.mkdtemp(prefix="gpu_fixtures."))
    (root / "probe").mkdir()
    (root / "probe" / "sitecustomize.py").write_text(PROBE)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        chosen = [s for s in fixtures()
                  if args.only is None or s.name.split(".")[0] in args.only]
        extra_env = dict(item.split("=", 1) for item in args.env)
        results = list(pool.map(lambda s: check(s, root, nproc, args.timeout, extra_env),
                                chosen))
    lines = [f"# Fixtures on a GPU ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"- {header}", f"- {len(results)} fixtures, {args.jobs} at a time, "
             f"{time.perf_counter() - started:.0f} s in all", "",
             "| fixture | original | converted | devices (original; converted) | printed numbers |",
             "|---|---|---|---|---|"]
    failures = 0
    for r in results:
        o, c = r["original"], r["converted"]
        verdict = compare(o["out"], c["out"]) if o["rc"] == 0 and c["rc"] == 0 else "—"
        if c["rc"] != 0 and o["rc"] == 0:
            failures += 1
        lines.append(f"| {r['name']} | rc {o['rc']}, {o['seconds']:.0f} s | rc {c['rc']}, "
                     f"{c['seconds']:.0f} s | {probe(o['err'])}; {probe(c['err'])} | {verdict} |")
    for r in results:
        for variant in ("original", "converted"):
            run_ = r[variant]
            if run_["rc"] != 0:
                tail = "\n".join((run_["err"] or run_["out"]).strip().splitlines()[-8:])
                lines += ["", f"## {r['name']} ({variant}) failed: rc {run_['rc']}", "",
                          "```", tail, "```"]
    text = "\n".join(lines) + "\n"
    print(text)
    results_path = REPO / args.results
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(text)
    if os.environ.get("OUT"):
        shutil.copyfile(results_path, Path(os.environ["OUT"]) / results_path.name)
    shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
