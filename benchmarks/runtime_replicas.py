"""Cost of the always-on replica check (issue 20 item 1): the converted runtime workload with the
check on, against the same run with it off (``DISTIFY_REPLICA_CHECK=0``), paired round by round.

Three variants of ``benchmarks/runtime/train_single.py`` converted by ``distify convert`` (the
runtime benchmark's workload: 4 epochs of 100 steps per rank, so the default check runs at each
epoch end):

- ``off``: ``DISTIFY_REPLICA_CHECK=0``;
- ``on``: the default (each epoch end, and every ``DEFAULT_EVERY`` training forwards);
- ``every20``: ``DISTIFY_REPLICA_CHECK_EVERY=20``, ten times the default's rate, so that the
  periodic check's cost shows above the noise.

Then ``runtime/micro_replicas.py`` measures one check against one step inside one job (how
``DEFAULT_EVERY`` was chosen). Prints a markdown summary; nothing is written (the numbers go into
the hand-written section of benchmarks/results/runtime.md).

    python benchmarks/runtime_replicas.py              # 5 rounds, ~3-6 min on 2 shared cores
    python benchmarks/runtime_replicas.py --rounds 1   # smoke run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import bench_lines, machine, median
from runtime_overhead import CONVERTED, SCRIPTS, convert

VARIANTS = {"off": {"DISTIFY_REPLICA_CHECK": "0"}, "on": {},
            "every20": {"DISTIFY_REPLICA_CHECK_EVERY": "20"}}


def _torchrun(script: Path, extra: dict[str, str], timeout: float) -> list[dict]:
    return bench_lines([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", str(script)], extra, timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--run-timeout", type=float, default=600)
    args = parser.parse_args()
    convert()
    names = list(VARIANTS)
    runs: dict[str, dict[int, dict]] = {name: {} for name in names}
    for round_ in range(args.rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            result = _torchrun(CONVERTED, VARIANTS[name], args.run_timeout)[0]
            runs[name][round_] = result
            print(f"round {round_ + 1}/{args.rounds} {name:8s} "
                  f"{result['step_ms_mean']:.3f} ms/step, {result['cpu_ms_per_step']:.3f} "
                  "CPU ms/step", file=sys.stderr)
    print(f"machine: {machine()}\n")
    print("| variant | step ms, median | paired ÷ off | CPU ms/step, median | paired ÷ off |")
    print("|---|---|---|---|---|")
    for name in names:
        row = [name]
        for metric in ("step_ms_mean", "cpu_ms_per_step"):
            ratios = [runs[name][r][metric] / runs["off"][r][metric] for r in runs[name]]
            row += [f"{median([run[metric] for run in runs[name].values()]):.3f}",
                    f"{median(ratios):.4f}× ({min(ratios):.3f}–{max(ratios):.3f})"]
        print("| " + " | ".join(row) + " |", flush=True)
    micro = _torchrun(SCRIPTS / "micro_replicas.py", {}, args.run_timeout)
    print("\n| model | parameters | tensors | step µs | check µs | step CPU µs | check CPU µs "
          "| K for 0.5% (wall, CPU) |")
    print("|---|---|---|---|---|---|---|---|")
    for m in micro:
        print(f"| {m['model']} | {m['parameters']} | {m['tensors_compared']} | {m['step_us']} | "
              f"{m['check_us']} | {m['step_cpu_us']} | {m['check_cpu_us']} | "
              f"{m['k_for_half_percent']}, {m['k_for_half_percent_cpu']} |")


if __name__ == "__main__":
    main()
