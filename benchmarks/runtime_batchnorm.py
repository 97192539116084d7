"""Cost of syncing BatchNorm buffers after each training forward (``distify/runtime/_buffers.py``).

A small CNN with 9 BatchNorm layers trains on 2 processes under torchrun (Gloo on the CPU,
``OMP_NUM_THREADS=1``), prepared by distify three ways in the same job, each its own copy:

- ``after forward``: the runtime as it is: rank 0's buffers broadcast right after each
  training forward (one packed broadcast), every rank evaluating with them;
- ``none``: that broadcast turned off (the runtime's private flag): no buffer collective at
  all, the ranks' statistics drift apart; the floor;
- ``before forward``: DDP's own sync instead (``broadcast_buffers`` on: rank 0's buffers at the
  start of each training forward), which the runtime did before.

Each round times every variant's steps (forward, backward with the gradient all-reduce,
optimizer step), the order rotated round by round; the ratios are paired per round. A second
workload accumulates gradients over 4 micro-steps (``sync_gradients(False)`` on the first 3):
there the runtime broadcasts after each of the 4 forwards, DDP only before the first.

    python benchmarks/runtime_batchnorm.py                 # 7 rounds, ~2 min on 2 cores
    python benchmarks/runtime_batchnorm.py --rounds 2 --no-record
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, ROOT, machine, table, today, versions, write_results

VARIANTS = ("after forward", "none", "before forward")
WORKLOADS = {"plain": 1, "accumulate 4": 4}  # name → micro-steps per optimizer step


# --------------------------------------------------------------------------- in each rank
def _model():
    from torch import nn

    def block(channels_in, channels_out):
        return [nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
                nn.BatchNorm2d(channels_out), nn.ReLU()]

    layers = block(3, 32)
    for _ in range(7):
        layers += block(32, 32)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 64),
                         nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 10))


def _prepare(variant: str):
    import torch

    import distify.runtime as distify
    from distify.runtime._subclass import private_state

    torch.manual_seed(0)
    model = _model()
    model, optimizer = distify.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    runtime = private_state(model)
    if variant != "after forward":
        runtime.buffers = None
    if variant == "before forward":
        runtime.ddp.broadcast_buffers = True
    return model, optimizer


def _steps(model, optimizer, batch, micro_steps: int, count: int) -> float:
    """Seconds per optimizer step over ``count`` steps."""
    import torch
    from torch import nn

    import distify.runtime as distify

    images, labels = batch
    start = time.perf_counter()
    for _ in range(count):
        for micro in range(micro_steps):
            distify.sync_gradients(micro == micro_steps - 1)
            loss = nn.functional.cross_entropy(model(images), labels)
            distify.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.distributed.barrier()
    return (time.perf_counter() - start) / count


def _sync_alone(model, count: int) -> float:
    """Seconds per call of a prepared model's buffer sync by itself: distify's broadcast
    after the forward when it has one, else DDP's own (what it runs before a forward)."""
    from distify.runtime._subclass import private_state

    runtime = private_state(model)
    sync = runtime.buffers.broadcast_from_main if runtime.buffers else runtime.ddp._sync_buffers
    start = time.perf_counter()
    for _ in range(count):
        sync()
    return (time.perf_counter() - start) / count


def worker(rounds: int, steps: int) -> None:
    import torch

    import distify.runtime as distify

    generator = torch.Generator().manual_seed(distify.rank())
    batch = (torch.randn(32, 3, 16, 16, generator=generator),
             torch.randint(0, 10, (32,), generator=generator))
    prepared = {variant: _prepare(variant) for variant in VARIANTS}
    times: dict[str, dict[str, list[float]]] = {w: {v: [] for v in VARIANTS} for w in WORKLOADS}
    for workload, micro_steps in WORKLOADS.items():
        for model, optimizer in prepared.values():  # warm-up
            _steps(model, optimizer, batch, micro_steps, 3)
        for round_ in range(rounds):
            order = VARIANTS[round_ % len(VARIANTS):] + VARIANTS[:round_ % len(VARIANTS)]
            for variant in order:
                model, optimizer = prepared[variant]
                times[workload][variant].append(
                    _steps(model, optimizer, batch, micro_steps, steps))
    alone = {variant: _sync_alone(prepared[variant][0], 300)
             for variant in ("after forward", "before forward")}
    buffers = list(prepared["after forward"][0].buffers())
    if distify.is_main_process():
        print("RESULT " + json.dumps({
            "times": times, "broadcast_alone_s": alone, "buffers": len(buffers),
            "buffer_bytes": sum(b.numel() * b.element_size() for b in buffers)}), flush=True)


# --------------------------------------------------------------------------- the launcher
def _paired(times: dict[str, list[float]], variant: str, base: str) -> float:
    return statistics.median(a / b for a, b in zip(times[variant], times[base]))


def report(result: dict, rounds: int, steps: int, command: str) -> str:
    lines = [
        "# BatchNorm buffer sync: cost per training step",
        "",
        f"- date: {today()}",
        f"- machine: {machine()}; devices: CPU, Gloo",
        f"- versions: {versions('torch')}",
        f"- command: `{command}`",
        f"- launch: 2 processes, `python -m torch.distributed.run --standalone`, "
        f"`OMP_NUM_THREADS=1`; {rounds} rounds × {steps} optimizer steps per variant, order "
        "rotated every round",
        "- workload: 8 conv+BatchNorm2d blocks (32 channels, 16×16 images, batch 32 per "
        f"process) + a BatchNorm1d head: 9 BatchNorm layers, {result['buffers']} buffers, "
        f"{result['buffer_bytes']:,} bytes; SGD",
        "",
        "Step time: wall time per optimizer step in rank 0 (median over rounds); **paired**: "
        "the median over rounds of (variant ÷ `none` in the same round), and of "
        "(`after forward` ÷ `before forward`).",
        "",
    ]
    for workload, times in result["times"].items():
        rows = [[variant, f"{statistics.median(times[variant]) * 1e3:.2f}",
                 f"{_paired(times, variant, 'none'):.3f}×",
                 f"{_paired(times, 'after forward', variant):.3f}×"]
                for variant in VARIANTS]
        lines += [f"## {workload}", "",
                  table(["buffer sync", "step ms", "paired ÷ none",
                         "after forward ÷ this"], rows), ""]
    alone = result["broadcast_alone_s"]
    lines += ["The buffer sync alone, per call, in rank 0: distify's (packing, one Gloo "
              f"broadcast, unpacking on rank 1) {alone['after forward'] * 1e6:.0f} µs; DDP's "
              f"own (`_sync_buffers`) {alone['before forward'] * 1e6:.0f} µs.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.steps)
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTIFY_")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         __file__, "--worker", "--rounds", str(args.rounds), "--steps", str(args.steps)],
        env=env, capture_output=True, text=True, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"benchmark failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    command = "python benchmarks/runtime_batchnorm.py" + "".join(
        f" {arg}" for arg in sys.argv[1:])
    text = report(json.loads(lines[-1][len("RESULT "):]), args.rounds, args.steps, command)
    print(text)
    if not args.no_record:
        write_results(RESULTS / "runtime_batchnorm.md", text)


if __name__ == "__main__":
    main()
