"""Cost of `distify verify`'s instrumentation (issue 22: at most 5% per run).

1. Paired runs: the runtime benchmark's workload (``runtime/train_single.py``, converted by the
   CLI in this run) on 2 processes under torchrun, Gloo on the CPU, with verify's hooks
   (``distify/verify/hooks`` first on ``PYTHONPATH``, as verify's runs have them: audit hook,
   module forward hooks, optimizer step hook, DataLoader wrapper, parameter digests at each
   epoch end, the record at exit) and without, alternated round by round; the step time the
   script measures itself (steady state, its first steps excluded) and the process CPU time per
   step, paired per round.
2. In process, a bound: the hooks a training step of that model calls (counted), each timed in a
   tight loop, against the step's own time; and one epoch end's parameter digests.

    python benchmarks/verify_overhead.py               # 5 rounds, writes results/verify.md
    python benchmarks/verify_overhead.py --rounds 1 --no-record   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    RESULTS,
    ROOT,
    WORK,
    bench_env,
    bench_lines,
    machine,
    median,
    today,
    write_results,
)
from runtime_overhead import SINGLE, convert

HOOKS = ROOT / "distify" / "verify" / "hooks"
CONVERTED = WORK / "verify" / "train_distify.py"
ARGS = ["--epochs", "2"]


def hooked_env(records: str) -> dict[str, str]:
    """What verify's runs on N processes add to the environment (``runs._env``)."""
    return {"PYTHONPATH": str(HOOKS), "DISTIFY_VERIFY_DIR": records,
            "DISTIFY_VERIFY_SCRIPT": str(CONVERTED), "DISTIFY_VERIFY_LAUNCHED": "1"}


def paired(rounds: int, timeout: float) -> dict[str, list[dict]]:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", str(CONVERTED), *ARGS]
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for round_ in range(rounds):
        for name in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
            with tempfile.TemporaryDirectory(prefix="distify-verify-bench-") as records:
                extra = hooked_env(records) if name == "on" else {}
                result = bench_lines(torchrun, extra, timeout)[0]
                if name == "on":  # the hooks really ran: each rank wrote its record
                    found = sorted(p.name for p in Path(records).glob("rank*.json"))
                    if found != ["rank0.json", "rank1.json"]:
                        raise SystemExit(f"the hooked run left records {found}")
                    result["epochs"] = len(json.loads(
                        (Path(records) / "rank0.json").read_text())["epochs"])
            runs[name].append(result)
            print(f"round {round_ + 1}/{rounds} {name:3s} {result['step_ms_mean']:.3f} ms/step",
                  file=sys.stderr)
    return runs


MICRO = r"""
import json, os, sys, time, timeit
import torch
import _distify_verify as hooks
sys.path.insert(0, os.environ["BENCH_RUNTIME"])
from train_single import MLP
import torch.nn.functional as F

torch.manual_seed(0)
model = MLP(128, 256, 10)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))

def step():
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()

for _ in range(30):
    step()
step_s = min(timeit.repeat(step, number=50, repeat=5)) / 50
hooks._install()  # now every forward and step calls the hooks, as in a verify run
for _ in range(30):
    step()
hooked_s = min(timeit.repeat(step, number=50, repeat=5)) / 50
modules = sum(1 for _ in model.modules())  # each forward calls both module hooks once each
out = model(x)
leaf = model.head
def forward_hooks():
    hooks._before_forward(leaf, (x,))
    hooks._after_forward(leaf, (x,), {}, out)
def root_hooks():
    hooks._before_forward(model, (x,))
    hooks._after_forward(model, (x,), {}, out)
hooks._local.depth = 1  # as if inside the root's call: a leaf module's cost
leaf_s = min(timeit.repeat(forward_hooks, number=2000, repeat=5)) / 2000
hooks._local.depth = 0
root_s = min(timeit.repeat(root_hooks, number=2000, repeat=5)) / 2000
step_hook_s = min(timeit.repeat(lambda: hooks._after_step(opt, (), {}), number=2000,
                                repeat=5)) / 2000
epoch_s = min(timeit.repeat(lambda: hooks._trained(), number=5, repeat=3)) / 5
print(json.dumps({"bench": "verify_micro", "step_us": step_s * 1e6, "modules": modules,
                  "hooked_step_us": hooked_s * 1e6,
                  "leaf_hooks_us": leaf_s * 1e6, "root_hooks_us": root_s * 1e6,
                  "step_hook_us": step_hook_s * 1e6, "epoch_digest_ms": epoch_s * 1e3,
                  "parameters": sum(p.numel() for p in model.parameters())}))
"""


def micro(timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="distify-verify-bench-") as records:
        # the hooks importable, not started (no DISTIFY_VERIFY_DIR): installed mid-run
        extra = {"PYTHONPATH": str(HOOKS), "BENCH_RUNTIME": str(ROOT / "benchmarks" / "runtime"),
                 "DISTIFY_VERIFY_SCRIPT": records + "/none.py"}
        proc = subprocess.run([sys.executable, "-c", MICRO], cwd=ROOT, env=bench_env(extra),
                              capture_output=True, text=True, timeout=timeout)
    lines = [json.loads(line) for line in proc.stdout.splitlines()
             if line.startswith('{"bench"')]
    if not lines:
        raise SystemExit(f"the in-process measurement failed:\n{proc.stderr[-3000:]}")
    return lines[0]


def report(runs: dict[str, list[dict]], found: dict, load: str) -> str:
    rows = []
    for metric, label in (("step_ms_mean", "step time, ms"), ("cpu_ms_per_step", "CPU ms/step")):
        ratios = [on[metric] / off[metric] for on, off in zip(runs["on"], runs["off"])]
        rows.append(f"| {label} | {median([r[metric] for r in runs['off']]):.3f} | "
                    f"{median([r[metric] for r in runs['on']]):.3f} | {median(ratios):.4f}× | "
                    f"{min(ratios):.3f}–{max(ratios):.3f} |")
    per_step = (found["modules"] - 1) * found["leaf_hooks_us"] + found["root_hooks_us"] + \
        found["step_hook_us"]
    return f"""# `distify verify`: the instrumentation's cost

Recorded {today()} on {machine()}; {load}.
`python benchmarks/verify_overhead.py --rounds {len(runs['on'])}`. Target (issue 22): at most
5% per run.

## Paired runs: the converted workload on 2 processes, with and without verify's hooks

`benchmarks/runtime/train_single.py` converted by the CLI in this run, `{' '.join(ARGS)}`
(2 × 200 steps of a 3-layer MLP, batch 64 per rank), under torchrun on 2 processes, Gloo,
CPU, one thread per process; "on" puts `distify/verify/hooks` first on `PYTHONPATH` with a
record folder, as verify's runs do (every rank wrote its record; {runs['on'][0].get('epochs')}
epoch ends digested per rank). {len(runs['on'])} alternated rounds; the step time is measured by the script itself
(steady state), paired per round (on ÷ off of the same round).

| measure | off, median | on, median | on ÷ off, median of pairs | spread of pairs |
|---|---|---|---|---|
{chr(10).join(rows)}

## In process: what the hooks cost per training step (a bound)

One process, the same model and batch: a training step takes {found['step_us']:.0f} µs without
the hooks and {found['hooked_step_us']:.0f} µs with them (best of 5 × 50 steps each, measured
one after the other in one process: {found['hooked_step_us'] / found['step_us']:.3f}×). Each
forward calls the two module hooks once per module ({found['modules']} modules): a leaf module's
pair {found['leaf_hooks_us']:.2f} µs, the root's (which records the first inputs and the model)
{found['root_hooks_us']:.2f} µs; the optimizer's step hook {found['step_hook_us']:.2f} µs. Per
step: {per_step:.1f} µs, **{per_step / found['step_us']:.2%} of the step**. At each training
epoch end the digests of the {found['parameters']:,} trained parameters take
{found['epoch_digest_ms']:.2f} ms (once per epoch; about {found['epoch_digest_ms'] * 1e3 /
found['step_us']:.1f} steps' time). Not counted here: the audit hook (one call per audit
event; a training step raises none, see `runtime/micro_audit.py`) and the DataLoader wrapper
(one `next` per batch).
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--run-timeout", type=float, default=600)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    load = f"load average {os.getloadavg()[0]:.1f} at start"
    convert(SINGLE, CONVERTED)
    runs = paired(args.rounds, args.run_timeout)
    found = micro(args.run_timeout)
    load += f", {os.getloadavg()[0]:.1f} at the end"
    text = report(runs, found, load)
    if args.no_record:
        print(text)
    else:
        write_results(RESULTS / "verify.md", text)


if __name__ == "__main__":
    main()
