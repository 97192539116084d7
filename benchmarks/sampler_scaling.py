"""Streamed DataLoader sharding (issue 12) against the one-shot sharding it replaced.

Three measurements, in one job of ``--nproc`` processes under ``torch.distributed.run`` (Gloo on
the CPU, ``OMP_NUM_THREADS=1``), timed on rank 0:

- **scaling**: ``distify.prepare`` of a loader over ``RandomSampler(replacement=True,
  num_samples=N)`` (minGPT's trainer), then its first ``--batches`` batches, for N = 1e4 ... 1e10:
  wall time, and peak Python memory (``tracemalloc``, a separate pass so it does not slow the
  timed one). The one-shot path runs only up to ``--oneshot-max`` (it draws the whole epoch).
- **epoch**: one epoch of the sharded batch sampler alone (draw, broadcast, plan: the cost of
  sharding) and of the whole loader (indices to collated batches), shuffled, for datasets of
  60,000 (one chunk: one broadcast, as before) and 1,000,000 samples (16 chunks vs one
  broadcast); the two paths alternate round by round, medians and the paired ratio.
- **iterable**: an epoch over an IterableDataset of 60,000 samples sharded by distify, in TRAIN
  mode (one all-reduce of a flag per batch) and EVAL mode (none), against the same dataset
  splitting itself by rank under ``shard=False`` (what a user had to write before).

The one-shot path is the ``distify/runtime/_data.py`` of the commit before streamed sharding
(the parent of the commit that added ``_stream.py``), read with ``git show`` into
``benchmarks/.work/`` and imported as ``distify.runtime._data_oneshot``.

    python benchmarks/sampler_scaling.py                      # ~2 min on 2 cores
    python benchmarks/sampler_scaling.py --rounds 1 --no-record
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, ROOT, WORK, machine, table, today, versions, write_results

ONESHOT = WORK / "_data_oneshot.py"
SIZES = [10**4, 10**5, 10**6, 10**7, 10**8, 10**9, 10**10]


# --------------------------------------------------------------------------- the one-shot path
def oneshot_source() -> str:
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "distify/runtime/_stream.py"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    if not added:
        raise SystemExit("no commit adds distify/runtime/_stream.py: nothing to compare with")
    return subprocess.run(["git", "show", f"{added[-1]}~1:distify/runtime/_data.py"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout


def load_oneshot():
    spec = importlib.util.spec_from_file_location("distify.runtime._data_oneshot", ONESHOT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the job itself
def worker(args) -> None:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, RandomSampler

    import distify.runtime as distify
    from distify.runtime import _data

    prepares = {"streamed": _data.prepare_loader, "oneshot": load_oneshot().prepare_loader}
    data = list(range(1000))

    def scaling(path: str, size: int, memory: bool) -> float:
        sampler = RandomSampler(data, replacement=True, num_samples=size,
                                generator=torch.Generator().manual_seed(0))
        distify.wait_for_everyone()
        if memory:
            tracemalloc.start()
        began = time.perf_counter()
        loader = prepares[path](DataLoader(data, batch_size=args.batch_size, sampler=sampler))
        for step, _ in enumerate(loader):
            if step + 1 == args.batches:
                break
        elapsed = time.perf_counter() - began
        if memory:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            return peak
        return elapsed

    def epoch(path: str, size: int, whole: bool) -> float:
        loader = prepares[path](DataLoader(range(size), batch_size=args.batch_size,
                                           shuffle=True))
        distify.wait_for_everyone()
        began = time.perf_counter()
        for _ in (loader if whole else loader._loader.batch_sampler):
            pass
        return time.perf_counter() - began

    class Stream(IterableDataset):
        def __init__(self, size: int, own_split: bool) -> None:
            self.size, self.own_split = size, own_split

        def __iter__(self):
            if self.own_split:
                return iter(range(distify.rank(), self.size, distify.world_size()))
            return iter(range(self.size))

    model = distify.prepare(torch.nn.Linear(1, 1))  # training with gradients on: TRAIN mode

    def iterable(variant: str) -> float:
        own = variant == "own split, shard=False"
        loader = distify.prepare(DataLoader(Stream(args.stream, own), batch_size=args.batch_size),
                                 shard=not own)
        model.train(variant != "EVAL")
        distify.wait_for_everyone()
        began = time.perf_counter()
        with torch.set_grad_enabled(variant != "EVAL"):
            for _ in loader:
                pass
        return time.perf_counter() - began

    result: dict = {"bench": "sampler", "scaling": {}, "epoch": {}, "iterable": {}}
    for path in prepares:
        scaling(path, SIZES[0], memory=False)  # warm-up: imports, first collectives
    for size in SIZES:
        for path in prepares:
            if path == "oneshot" and size > args.oneshot_max:
                continue
            times = [scaling(path, size, memory=False) for _ in range(args.rounds)]
            result["scaling"][f"{path} {size}"] = {
                "seconds": statistics.median(times), "peak_bytes": scaling(path, size, True)}
    for size in (60_000, 1_000_000):
        for whole in (False, True):
            runs: dict[str, list[float]] = {path: [] for path in prepares}
            for round_ in range(args.rounds):
                for path in (list(prepares) if round_ % 2 else list(prepares)[::-1]):
                    runs[path].append(epoch(path, size, whole))
            result["epoch"][f"{size} {'loader' if whole else 'sampler'}"] = runs
    variants = ["own split, shard=False", "TRAIN", "EVAL"]
    runs = {variant: [] for variant in variants}
    for round_ in range(args.rounds):
        for variant in variants[round_ % 3:] + variants[:round_ % 3]:
            runs[variant].append(iterable(variant))
    result["iterable"] = runs
    distify.print(json.dumps(result))


# --------------------------------------------------------------------------- the report
def run_job(args) -> dict:
    WORK.mkdir(parents=True, exist_ok=True)
    ONESHOT.write_text(oneshot_source())
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTIFY_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DISTIFY_USE_CPU="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(args.nproc), __file__, "--worker", f"--rounds={args.rounds}",
           f"--batches={args.batches}", f"--batch-size={args.batch_size}",
           f"--oneshot-max={args.oneshot_max}", f"--stream={args.stream}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"bench"')]
    if proc.returncode != 0 or len(lines) != 1:
        raise SystemExit(f"the job failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(lines[0])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def render(args, result: dict, wall: float) -> str:
    scaling = result["scaling"]
    rows = []
    for size in SIZES:
        new, old = scaling[f"streamed {size}"], scaling.get(f"oneshot {size}")
        rows.append([f"{size:.0e}", _ms(new["seconds"]), f"{new['peak_bytes'] / 2**20:.2f}",
                     _ms(old["seconds"]) if old else "not run",
                     f"{old['peak_bytes'] / 2**20:.1f}" if old else "not run",
                     f"{old['seconds'] / new['seconds']:.1f}×" if old else "—"])
    epoch_rows = []
    for key, runs in result["epoch"].items():
        size, what = key.split()
        ratio = statistics.median(n / o for n, o in zip(runs["streamed"], runs["oneshot"]))
        epoch_rows.append([f"{int(size):,}", what, _ms(statistics.median(runs["oneshot"])),
                           _ms(statistics.median(runs["streamed"])), f"{ratio:.2f}×"])
    base = result["iterable"]["own split, shard=False"]
    batches = -(-args.stream // (args.nproc * args.batch_size))
    iterable_rows = [[variant, _ms(statistics.median(runs)),
                      f"{statistics.median(r / b for r, b in zip(runs, base)):.2f}×",
                      f"{statistics.median(1e6 * (r - b) / batches for r, b in zip(runs, base)):+.0f}"]
                     for variant, runs in result["iterable"].items()]
    return "\n".join([
        "# Streamed DataLoader sharding vs the one-shot order\n",
        f"- date: {today()}",
        f"- machine: {machine()}; devices: CPU, Gloo",
        f"- versions: {versions('torch')}",
        f"- command: `python benchmarks/sampler_scaling.py"
        f"{'' if args.rounds == 5 else f' --rounds {args.rounds}'}`",
        f"- launch: `python -m torch.distributed.run --standalone --nproc-per-node "
        f"{args.nproc}`, `OMP_NUM_THREADS=1`; times on rank 0, medians of {args.rounds} rounds",
        f"- benchmark wall time: {wall:.0f} s", "",
        "## Preparing and drawing the first batches of a huge sampler\n",
        f"`RandomSampler(data, replacement=True, num_samples=N)`, batch {args.batch_size} per "
        f"process: `distify.prepare(loader)` and its first {args.batches} batches. Peak memory: "
        "Python allocations (`tracemalloc`) during that, in a separate pass.\n",
        table(["N", "streamed ms", "streamed peak MiB", "one-shot ms", "one-shot peak MiB",
               "one-shot ÷ streamed (time)"], rows), "",
        "## One shuffled epoch\n",
        f"`DataLoader(range(size), batch_size={args.batch_size}, shuffle=True)`: the sharded "
        "batch sampler alone (draw the order, broadcast it, plan this rank's batches) and the "
        "whole loader (indices to collated batches). Paired: median over rounds of streamed ÷ "
        "one-shot in the same round (the order of the two alternates).\n",
        table(["samples", "what", "one-shot ms", "streamed ms", "streamed ÷ one-shot"],
              epoch_rows), "",
        "## An epoch over an IterableDataset\n",
        f"{args.stream:,} integers, batch {args.batch_size}: sharded by distify in TRAIN mode "
        "(one all-reduce of a flag per batch) and EVAL mode (no collective after the first "
        "batch's digest), against the dataset splitting itself by `distify.rank()` under "
        "`shard=False` (the baseline). Every rank reads the whole stream when distify shards "
        "it; here reading is cheap, so this is the sharding's own cost.\n",
        table(["variant", "epoch ms", "÷ own split", f"added µs per batch ({batches} batches)"],
              iterable_rows), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--oneshot-max", type=int, default=10**6,
                        help="largest N the one-shot path draws (10**7 takes ~20 s, 600 MB)")
    parser.add_argument("--stream", type=int, default=60_000)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    began = time.perf_counter()
    result = run_job(args)
    text = render(args, result, time.perf_counter() - began)
    print(text)
    if not args.no_record:
        write_results(RESULTS / "sampler.md", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
