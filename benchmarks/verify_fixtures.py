"""`distify verify` over the committed fixtures: pass/fail per fixture and check.

Every fixture pair ``tests/fixtures/<group>/NAME.in.py`` / ``NAME.out.py`` (the golden
conversion) is verified with ``distify verify NAME.in.py NAME.out.py --cpu --steps 2`` (5 runs,
two of them on 2 processes; 3 when the original runs no evaluation loop), one fixture at a
time, and the result of each check is written to ``benchmarks/results/verify_fixtures.md``.
A failed check is a finding: either verify is wrong or the conversion is; the results file
says which, where it was looked into (``FINDINGS`` below).

Usage::

    python benchmarks/verify_fixtures.py                 # every fixture pair (long: minutes each)
    python benchmarks/verify_fixtures.py long_tail/gan_n_critic metrics  # some, by group or name
    python benchmarks/verify_fixtures.py --no-record ...  # print only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, ROOT, bench_env, machine, table, today, write_results

FIXTURES = ROOT / "tests" / "fixtures"
#: fixtures verify cannot run as they are, and why
SKIPPED = {
    "side_effects_tail/download_unit": "needs a URL argument (its test serves a file locally)",
    "long_tail/hf_config_model": "imports transformers, which is not installed here",
    "side_effects_tail/trackers": "imports wandb, which is not installed here (its test checks "
                                  "the conversion's text only)",
}
#: the script arguments a fixture needs (its own test passes them too)
ARGS = {
    "devices/cpu_flag": ["--cpu"],  # without it the script asks for CUDA (tests/test_devices.py)
}
#: what was found about a fixture while verify was made to pass it (written beside its row)
FINDINGS: dict[str, str] = {
    "bptt/word_lm": "verify was wrong, fixed: check 1 compared a pickled whole model "
                    "(`torch.save(model, f)`) byte for byte; now its tensors",
    "full_batch/gcn": "verify was wrong, fixed: check 3 failed full-batch training (the same "
                      "graph on every rank, by design); now it passes when the original fed "
                      "every training forward the same inputs too",
    "metrics/vae_style": "verify was wrong, fixed: with --steps K the frozen pair read K batches "
                         "on 1 process and K per rank on 2, so the reduced training loss printed "
                         "after evaluation differed; now N x ceil(K/N) and ceil(K/N)",
}


def pairs(selected: list[str]) -> list[str]:
    """``group/NAME`` of every fixture pair, or of those ``selected`` names (group or pair)."""
    found = sorted(f"{path.parent.name}/{path.name[:-len('.in.py')]}"
                   for path in FIXTURES.glob("*/*.in.py")
                   if path.with_name(path.name.replace(".in.py", ".out.py")).is_file())
    if not selected:
        return found
    return [name for wanted in selected for name in found  # in the order asked
            if name == wanted or name.split("/")[0] == wanted]


def verify(name: str, steps: int, timeout: float) -> dict:
    """One fixture's verify: its checks (number -> ok, evidence), its runs and wall time."""
    source = FIXTURES / f"{name}.in.py"
    converted = source.with_name(source.name.replace(".in.py", ".out.py"))
    cmd = [sys.executable, "-m", "distify", "verify", str(source), str(converted), "--cpu",
           "--steps", str(steps), "--timeout", str(timeout), "--json", "--",
           *ARGS.get(name, [])]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=bench_env({}), capture_output=True, text=True,
                          timeout=10 * timeout)
    seconds = time.perf_counter() - started
    try:
        output = json.loads(proc.stdout)
    except ValueError:
        return {"name": name, "ok": False, "seconds": seconds, "checks": {},
                "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    error = None
    if output["original_failed"]:
        error = "the original failed on its own: " + \
            (output["original_stderr"].strip().splitlines() or ["?"])[-1]
    return {"name": name, "ok": output["ok"], "seconds": seconds, "error": error,
            "checks": {c["number"]: (c["ok"], c["evidence"]) for c in output["checks"]},
            "runs": len(output["runs"])}


def report(results: list[dict], steps: int) -> str:
    rows = []
    for result in results:
        checks = result["checks"]
        marks = " ".join(f"{n}{'✓' if checks[n][0] else '✗'}" for n in sorted(checks)) or "-"
        failed = [f"check {n}: {checks[n][1]}" for n in sorted(checks) if not checks[n][0]]
        why = "; ".join(filter(None, [result.get("error"), *failed, FINDINGS.get(result["name"])]))
        verdict = "pass" if result["ok"] else "**FAIL**"
        if (result.get("error") or "").startswith("the original failed on its own"):
            verdict = "not verified"  # the script cannot run here: nothing to verify
        rows.append([result["name"], verdict, marks,
                     f"{result['seconds']:.0f} s", why.replace("|", "\\|")])
    passed = sum(result["ok"] for result in results)
    verified = sum(bool(result["checks"]) for result in results)
    skipped = "\n".join(f"- `{name}`: skipped, {why}" for name, why in SKIPPED.items())
    return (f"# `distify verify` over the fixtures\n\nRecorded {today()} on {machine()}.\n"
            f"Command per fixture: `distify verify NAME.in.py NAME.out.py --cpu --steps {steps} "
            "--json` (`python benchmarks/verify_fixtures.py`). "
            f"**{passed} of {verified} fixtures verified pass** ({len(results)} run). Wall "
            "times are of a shared, loaded "
            "2-core machine.\n\n"
            + table(["fixture", "verify", "checks", "wall", "failed checks and findings"], rows)
            + f"\n\n{skipped}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="groups (long_tail) or pairs (long_tail/x)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--results", default="verify_fixtures.md",
                        help="file name under benchmarks/results (a second sweep alongside)")
    args = parser.parse_args()
    results = []
    for name in pairs(args.names):
        if name in SKIPPED:
            continue
        result = verify(name, args.steps, args.timeout)
        results.append(result)
        failed = [n for n, (ok, _) in sorted(result["checks"].items()) if not ok]
        print(f"{name}: {'pass' if result['ok'] else 'FAIL'} {failed or ''} "
              f"{result.get('error') or ''} ({result['seconds']:.0f} s)", flush=True)
        if not args.no_record:  # after each fixture: a long sweep stopped early keeps its rows
            write_results(RESULTS / args.results, report(results, args.steps))
    if args.no_record:
        print(report(results, args.steps))


if __name__ == "__main__":
    main()
