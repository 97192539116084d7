"""Cost of the write check (issue 20 item 4): the converted runtime workload on 2 processes with
the check on (the default: an audit hook on rank 1), against the same run with it off
(``DISTIFY_WRITE_CHECK=0``), paired round by round; then ``runtime/micro_audit.py`` prices the
hook per audit event and counts the events a training step raises, in one process.

Prints a markdown summary; nothing is written (the numbers go into the hand-written section of
benchmarks/results/runtime.md).

    python benchmarks/runtime_audit.py              # 5 rounds, ~2-5 min on 2 shared cores
    python benchmarks/runtime_audit.py --rounds 1   # smoke run
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import bench_lines, machine, median
from runtime_overhead import CONVERTED, SCRIPTS, convert

VARIANTS = {"off": {"DISTIFY_WRITE_CHECK": "0"}, "on": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--run-timeout", type=float, default=600)
    args = parser.parse_args()
    convert()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", str(CONVERTED)]
    names = list(VARIANTS)
    runs: dict[str, dict[int, dict]] = {name: {} for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            result = bench_lines(torchrun, VARIANTS[name], args.run_timeout)[0]
            runs[name][round_] = result
            print(f"round {round_ + 1}/{args.rounds} {name:4s} "
                  f"{result['step_ms_mean']:.3f} ms/step", file=sys.stderr)
    micro = bench_lines([sys.executable, str(SCRIPTS / "micro_audit.py")], {}, args.run_timeout)[0]
    print(f"machine: {machine()}\n")
    print("| variant | step ms, median | paired ÷ off | CPU ms/step, median | paired ÷ off |")
    print("|---|---|---|---|---|")
    for name in names:
        row = [name]
        for metric in ("step_ms_mean", "cpu_ms_per_step"):
            ratios = [runs[name][r][metric] / runs["off"][r][metric] for r in runs[name]]
            row += [f"{median([run[metric] for run in runs[name].values()]):.3f}",
                    f"{median(ratios):.4f}× ({min(ratios):.3f}–{max(ratios):.3f})"]
        print("| " + " | ".join(row) + " |")
    added = micro["added_us_per_event"]
    print(f"\nhook: +{added['other']:.3f} µs per audit event, +{added['open_read']:.3f} µs per "
          "open for reading (in-process, medians)\n")
    print("| model | audit events per step | hook µs per step | step µs | hook share |")
    print("|---|---|---|---|---|")
    for s in micro["steps"]:
        print(f"| {s['model']} | {s['events_per_step']:g} ({', '.join(s['by_kind'])}) | "
              f"{s['hook_us_per_step']} | {s['step_us']} | {s['hook_share_of_step']:.4%} |")


if __name__ == "__main__":
    main()
