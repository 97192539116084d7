"""`distify verify` as the project's oracle: committed fixtures and their golden conversions pass.

A lean, representative set, verified two at a time (each verify makes 3 to 5 runs, one or two of
them on 2 processes): a training loop without a DataLoader (``while``/``range`` with random
batches: ``--steps`` stops it after K optimizer steps), an evaluation loop with metrics and result
files (check 5 compares lines, check 1 files), and two optimizers on one loader. The sweep over
every fixture is ``benchmarks/verify_fixtures.py`` (results in
``benchmarks/results/verify_fixtures.md``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from tests.helpers import FIXTURES, REPO, clean_env

STEPS = 2
CHOSEN = ["random_batches/char_gpt", "metrics/vae_style", "long_tail/gan_n_critic"]


def _verify(name: str) -> dict:
    source = FIXTURES / f"{name}.in.py"
    proc = subprocess.run(
        [sys.executable, "-m", "distify", "verify", str(source),
         str(source.with_name(source.name.replace(".in.py", ".out.py"))), "--cpu", "--steps",
         str(STEPS), "--timeout", "240", "--json"],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=1200)
    assert proc.stdout, f"{name}: no output, exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return {"code": proc.returncode, "stderr": proc.stderr, **json.loads(proc.stdout)}


def test_fixtures_pass_verify():
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = dict(zip(CHOSEN, pool.map(_verify, CHOSEN)))
    for name, outcome in outcomes.items():
        failed = [check for check in outcome["checks"] if not check["ok"]]
        assert outcome["code"] == 0 and outcome["ok"] and not failed, (name, failed or outcome)
        assert [check["number"] for check in outcome["checks"]] == [1, 2, 3, 4, 5, 6, 7]
    checks = {name: {check["number"]: check["evidence"] for check in outcome["checks"]}
              for name, outcome in outcomes.items()}
    # no DataLoader: every run stopped after STEPS optimizer steps, and said so; no evaluation
    # loop, so no frozen-weights pair
    runs = outcomes["random_batches/char_gpt"]["runs"]
    assert [run["capped_steps"] for run in runs] == [STEPS] * 3, runs
    assert "ranks at the end (no training DataLoader loop ended)" in \
        checks["random_batches/char_gpt"][2]
    # an evaluation loop: the frozen pair ran and its printed metrics were compared; the
    # result files were compared at world size 1; replicas at every epoch end
    vae = checks["metrics/vae_style"]
    assert len(outcomes["metrics/vae_style"]["runs"]) == 5
    assert not vae[5].startswith("nothing to compare"), vae[5]
    assert "file(s) written: " in vae[1] and "0 file(s)" not in vae[1], vae[1]
    assert "training epoch end(s) and at the end" in vae[2], vae[2]
    assert "training epoch end(s) and at the end" in checks["long_tail/gan_n_critic"][2]
