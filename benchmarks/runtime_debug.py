"""Debug mode's cost per training step: DISTIFY_DEBUG=1 vs the runtime without it.

One small training loop (an MLP on a fixed synthetic batch, prepared with ``distify.prepare``,
``distify.backward``, an SGD step and a ``distify.reduce`` of the loss every ``--reduce-every``
steps) runs under ``python -m torch.distributed.run --standalone --nproc-per-node N`` (Gloo on
the CPU, ``OMP_NUM_THREADS=1``) in three variants, alternated round by round:

- ``off``: no debug mode (the baseline);
- ``debug``: ``DISTIFY_DEBUG=1``, weights compared every 10 backward calls (the default);
- ``debug_every_1``: ``DISTIFY_DEBUG=1 DISTIFY_DEBUG_EVERY=1``, weights compared every step.

Debug mode adds one ``all_gather_object`` before every collective the runtime makes (here the
backward and the reduce), plus a checksum of every trainable parameter when weights are
compared. Each job times its own steady-state steps (warm-up excluded) and prints one JSON line
from rank 0; ratios are against ``off`` in the same round.

    python benchmarks/runtime_debug.py                  # 5 rounds x 3 variants, ~3 min on 2 cores
    python benchmarks/runtime_debug.py --rounds 1 --no-record   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, ROOT, machine, median, table, today, versions, write_results

VARIANTS = {
    "off": {},
    "debug": {"DISTIFY_DEBUG": "1"},
    "debug_every_1": {"DISTIFY_DEBUG": "1", "DISTIFY_DEBUG_EVERY": "1"},
}


# --------------------------------------------------------------------------- the job itself
def worker(args) -> None:
    """The timed loop, run by every rank under torchrun (``--worker``)."""
    import torch
    from torch import nn

    import distify.runtime as distify

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = distify.prepare(model, optimizer)
    x = torch.randn(args.batch_size, args.features, device=distify.device())
    y = torch.randint(0, 10, (args.batch_size,), device=distify.device())
    times, loss = [], None
    start = cpu = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            distify.wait_for_everyone()
            start, cpu = time.perf_counter(), time.process_time()
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        distify.backward(loss)
        optimizer.step()
        if (step + 1) % args.reduce_every == 0:
            distify.reduce(loss.detach(), "mean")
        if step >= args.warmup:
            times.append(time.perf_counter() - began)
    elapsed, cpu_used = time.perf_counter() - start, time.process_time() - cpu
    params = sum(p.numel() for p in model.parameters())
    distify.print(json.dumps({
        "bench": "runtime_debug", "steps": args.steps, "params": params,
        "step_ms_mean": 1e3 * elapsed / args.steps,
        "step_ms_median": 1e3 * sorted(times)[len(times) // 2],
        "cpu_ms_per_step": 1e3 * cpu_used / args.steps,
        "steps_per_s": args.steps / elapsed, "final_loss": loss.item()}))


# --------------------------------------------------------------------------- the runs
def run_variant(variant: str, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTIFY_")}
    env.update(VARIANTS[variant], OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1",
               DISTIFY_USE_CPU="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(args.nproc), __file__, "--worker", *worker_args(args)]
    began = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=args.run_timeout)
    wall = time.perf_counter() - began
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"bench"')]
    if proc.returncode != 0 or len(lines) != 1:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
        return {"ok": False, "wall_s": wall, "error": f"exit {proc.returncode}:\n{tail}"}
    return {**json.loads(lines[0]), "ok": True, "wall_s": wall}


def worker_args(args) -> list[str]:
    return [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in
            ("features", "hidden", "batch_size", "steps", "warmup", "reduce_every")]


def bench(args) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = defaultdict(list)
    names = list(VARIANTS)
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for variant in order:
            result = run_variant(variant, args)
            result["round"] = round_
            runs[variant].append(result)
            status = (f"{result['step_ms_mean']:.3f} ms/step" if result["ok"]
                      else "FAILED: " + result["error"].splitlines()[0])
            print(f"round {round_ + 1}/{args.rounds} {variant:14s} {status} "
                  f"({result['wall_s']:.1f} s)", file=sys.stderr)
    return runs


# --------------------------------------------------------------------------- the report
def render(args, runs: dict[str, list[dict]], wall: float) -> str:
    ok = {v: [r for r in runs[v] if r["ok"]] for v in VARIANTS}
    base = {r["round"]: r for r in ok["off"]}

    def paired(variant: str, metric: str) -> float | None:
        ratios = [r[metric] / base[r["round"]][metric] for r in ok[variant]
                  if r["round"] in base]
        return median(ratios) if ratios else None

    def added_us(variant: str) -> float | None:
        deltas = [1e3 * (r["step_ms_mean"] - base[r["round"]]["step_ms_mean"])
                  for r in ok[variant] if r["round"] in base]
        return median(deltas) if deltas else None

    rows = []
    for variant in VARIANTS:
        if not ok[variant]:
            rows.append([f"`{variant}`"] + ["—"] * 6 + [f"**all {len(runs[variant])} runs failed**"])
            continue
        step = paired(variant, "step_ms_mean")
        cpu = paired(variant, "cpu_ms_per_step")
        added = added_us(variant)
        rows.append([
            f"`{variant}`", " ".join(f"{k}={v}" for k, v in VARIANTS[variant].items()) or "—",
            f"{median([r['steps_per_s'] for r in ok[variant]]):.0f}",
            f"{median([r['step_ms_mean'] for r in ok[variant]]):.3f}",
            f"{median([r['step_ms_median'] for r in ok[variant]]):.3f}",
            f"{step:.2f}×" if step else "—", f"{cpu:.2f}×" if cpu else "—",
            f"{added:+.0f}" if added is not None else "—"])
    params = ok["off"][0]["params"] if ok["off"] else "?"
    out = ["# Debug mode's cost per training step\n",
           f"- date: {today()}",
           f"- machine: {machine()}; devices: CPU, Gloo",
           f"- versions: {versions('torch')}",
           f"- command: `python benchmarks/runtime_debug.py"
           f"{'' if args.rounds == 5 else f' --rounds {args.rounds}'}`",
           f"- launch: `python -m torch.distributed.run --standalone --nproc-per-node "
           f"{args.nproc}`, `OMP_NUM_THREADS={args.threads}`; {args.rounds} rounds, variant "
           "order rotated every round",
           f"- workload: MLP {args.features}→{args.hidden}→{args.hidden}→10 ({params} "
           f"parameters), batch {args.batch_size} per process, SGD; a step = forward, "
           f"`distify.backward` (DDP all-reduce), optimizer step, and a `distify.reduce` of the "
           f"loss every {args.reduce_every} step(s); {args.steps} timed steps after "
           f"{args.warmup} warm-up steps, measured in rank 0",
           f"- benchmark wall time: {wall:.0f} s", "",
           "## Results\n",
           "**paired ÷ off**: the median over rounds of (variant ÷ `off` in the same round), "
           "which cancels the machine's load drifting between rounds; **added µs/step**: the "
           "median over rounds of (variant − `off`) mean step time.\n",
           table(["variant", "environment", "steps/s", "step ms, mean", "step ms, median",
                  "paired ÷ off (wall)", "paired ÷ off (CPU)", "added µs/step"], rows),
           ""]
    failures = [(v, r) for v in VARIANTS for r in runs[v] if not r["ok"]]
    if failures:
        out += ["## Failed runs\n"]
        for v, r in failures:
            out += [f"- {v}, round {r['round'] + 1}:", "```", r["error"], "```"]
        out += [""]
    out += ["## Every run\n",
            table(["round", "variant", "step ms (mean)", "median step ms", "CPU ms/step",
                   "steps/s", "final loss", "wall s"],
                  [[str(r["round"] + 1), v, f"{r['step_ms_mean']:.3f}",
                    f"{r['step_ms_median']:.3f}", f"{r['cpu_ms_per_step']:.3f}",
                    f"{r['steps_per_s']:.0f}", f"{r['final_loss']:.4f}", f"{r['wall_s']:.1f}"]
                   for round_ in range(args.rounds) for v in VARIANTS for r in runs[v]
                   if r["round"] == round_ and r["ok"]]), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per process")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=400, help="timed steps per job")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--reduce-every", type=int, default=1,
                        help="reduce the loss every N steps (a logged metric)")
    parser.add_argument("--run-timeout", type=float, default=300)
    parser.add_argument("--results", type=Path, default=RESULTS / "runtime_debug.md")
    parser.add_argument("--no-record", action="store_true", help="print, do not write results")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    began = time.perf_counter()
    runs = bench(args)
    text = render(args, runs, time.perf_counter() - began)
    if args.no_record:
        print(text)
    else:
        write_results(args.results, text)
    return 0 if all(r["ok"] for v in VARIANTS for r in runs[v]) else 1


if __name__ == "__main__":
    sys.exit(main())
