"""Faults, hangs and stale reads found by probing (issue 26), in real 2-process runs (torchrun,
Gloo on CPU) unless a single process shows it.

- a rank that skips a collective: the timeout's error names where each rank was (item 1), and
  the watchdog says so while the job keeps waiting (item 4);
- a load waits for the save of the same file however its path is spelled, through an open
  file object too (item 5), and after a save made on the main process only (item 7);
- ``save_state`` cleans what crashed saves left, and ``load_state`` takes the newest complete
  state (item 8);
- debug mode compares the replicas once more at exit (item 14).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.pool

torch = pytest.importorskip("torch")

from tests.helpers import REPO, clean_env, run_python, run_torchrun  # noqa: E402

SCRIPTS = REPO / "tests" / "runtime_scripts"
SKIP = SCRIPTS / "faults_skip.py"
FILES = SCRIPTS / "faults_files.py"
#: short, so that a hang shows as a failure within the test, not after 30 minutes; 10 s, not
#: less: it also bounds starting the group on a loaded machine (as in test_runtime_ddp)
TIMEOUT_S = 10


def _two(script, *args: str, cwd, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``script`` on 2 processes; also the seconds from the first "STARTED" to the end."""
    env.setdefault("DISTIFY_TIMEOUT", str(TIMEOUT_S))
    proc = run_torchrun(script, *args, nproc=2, cwd=cwd,
                        env=clean_env(PYTHONPATH=str(REPO), **env), timeout=240, check=False,
                        replicas=False)
    ended = time.time()
    starts = [float(t) for t in re.findall(r"STARTED (\d+\.\d{3})", proc.stdout)]
    return proc, ended - min(starts) if starts else 0.0


def _line(script, mark: str) -> str:
    """``path:N`` of the line marked ``# MARK: mark`` in ``script``, as the runtime names it
    (the scripts run from a temporary folder: their full path)."""
    for number, text in enumerate(script.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# MARK: {mark}"):
            return f"{script}:{number}"
    raise AssertionError(f"no line marked {mark} in {script}")


# ------------------------------------------------------------------ item 1: name the mismatch


def test_a_skipped_backward_times_out_naming_where_each_rank_was(tmp_path) -> None:
    proc, seconds = _two(SKIP, "skip", cwd=tmp_path)
    assert proc.returncode != 0
    backward = _line(SKIP, "backward")
    assert (f"DistifyError: distify: rank 0 gave up after {TIMEOUT_S} s in the gradient "
            f"all-reduce of backward #6 at {backward} (DISTIFY_TIMEOUT={TIMEOUT_S}; ") \
        in proc.stderr, proc.stderr[-3000:]
    assert (f": rank 1 had left the script, after the gradient all-reduce of backward #5 at "
            f"{backward}: every rank must reach the same distify calls in the same order") \
        in proc.stderr
    assert "Timed out" in proc.stderr  # Gloo's own error stays, as the cause
    assert "finished" not in proc.stdout
    assert seconds < 2 * TIMEOUT_S  # ends at the timeout, not later


# ------------------------------------------------------------------ item 4: the watchdog


def test_the_watchdog_says_where_each_rank_is_while_the_job_keeps_waiting(tmp_path) -> None:
    proc, _ = _two(SKIP, "slow", cwd=tmp_path, DISTIFY_WATCHDOG="2", DISTIFY_TIMEOUT="60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "finished" in proc.stdout
    backward = _line(SKIP, "backward")
    said = [line for line in proc.stderr.splitlines() if "distify: rank 0 has waited" in line]
    assert len(said) == 1, proc.stderr[-3000:]  # once per wait
    assert re.search(
        rf"distify: rank 0 has waited \d+ s in the gradient all-reduce of backward #4 at "
        rf"{re.escape(backward)}; rank 1 was last in the gradient all-reduce of backward #3 at "
        rf"{re.escape(backward)} \(\d+ s ago\) \(the job keeps waiting, up to DISTIFY_TIMEOUT\)",
        said[0]), said[0]
    assert "rank 1 has waited" not in proc.stderr  # rank 1 never waited that long


def test_the_watchdog_can_be_turned_off_and_rejects_nonsense(tmp_path) -> None:
    # rank 0 waits 2 s for rank 1: a watchdog that took 0 for "at once" would have spoken
    proc, _ = _two(SKIP, "slow", "6", "2", cwd=tmp_path, DISTIFY_WATCHDOG="0",
                   DISTIFY_TIMEOUT="60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "has waited" not in proc.stderr
    bad = subprocess.run([sys.executable, "-c", "import distify.runtime as d; d.init()"],
                         env=clean_env(DISTIFY_WATCHDOG="soon"), capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1
    assert "DISTIFY_WATCHDOG='soon' must be a number of seconds" in bad.stderr


# ------------------------------------------------------------ items 5 and 7: fresh reads


@pytest.mark.parametrize("mode", ["abspath", "symlink", "fileobj", "main_only",
                                  "main_only_open", "dataset"])
def test_every_load_reads_the_file_the_main_process_just_saved(tmp_path, mode) -> None:
    proc, _ = _two(FILES, mode, cwd=tmp_path, DISTIFY_TIMEOUT="60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in results) == [0, 1]
    for result in results:
        assert result["stale"] == 0 and result["missing"] == 0, result
    assert "finished" in proc.stdout


# ------------------------------------------------------------------ item 8: state debris


def _env() -> dict:
    return clean_env(PYTHONPATH=str(REPO))


def _run(tmp_path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "s.py"
    script.write_text("import json, os, torch\nimport distify.runtime as distify\n"
                      "from distify.runtime import _checkpoint\n"
                      "model = distify.prepare(torch.nn.Linear(2, 1))\n" + body)
    return run_python(script, cwd=tmp_path, env=_env(), timeout=120, check=False)


def _debris(tmp_path) -> list[str]:
    return sorted(p for p in os.listdir(tmp_path) if ".tmp-" in p or ".old-" in p)


def test_a_crash_in_save_state_leaves_debris_that_the_next_save_removes(tmp_path) -> None:
    assert _run(tmp_path, "distify.save_state('st', step=1)\n").returncode == 0
    crash = ("def crash(*args):\n    os._exit(3)\n"
             "_checkpoint._publish = crash\n"  # dies once every part is written
             "distify.save_state('st', step=2)\n")
    assert _run(tmp_path, crash).returncode == 3
    assert _run(tmp_path, crash).returncode == 3
    assert len(_debris(tmp_path)) == 2  # two full scratch folders, nothing removes them
    out = _run(tmp_path, "print(json.dumps(distify.load_state('st')))\n"
                         "distify.save_state('st', step=7)\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '{"step": 1}'
    assert _debris(tmp_path) == []
    assert sorted(os.listdir(tmp_path / "st")) == ["distify_state.pt", "model_0.pt",
                                                   "random_0.pt"]


def test_load_state_prefers_the_higher_generation_then_the_later_write(tmp_path) -> None:
    out = _run(tmp_path, "distify.save_state('st', step=3)\n")
    assert out.returncode == 0, out.stderr
    state_file = tmp_path / "st" / "distify_state.pt"
    saved = torch.load(state_file, weights_only=False)
    for name, generation, step, stamp in (("st.old-a", 5, 50, 100), ("st.old-b", 2, 20, 300),
                                          ("st.old-c", None, 99, 200)):
        folder = tmp_path / name
        folder.mkdir()
        for part in ("model_0.pt", "random_0.pt"):
            (folder / part).write_bytes((tmp_path / "st" / part).read_bytes())
        record = dict(saved, values={"step": step})
        if generation is None:
            record.pop("generation")
        else:
            record["generation"] = generation
        torch.save(record, folder / "distify_state.pt")
        os.utime(folder / "distify_state.pt", (stamp, stamp))
    os.rename(tmp_path / "st", tmp_path / "st.tmp-cut")  # a scratch folder is never resumed
    out = _run(tmp_path, "print(json.dumps(distify.load_state('st')))\n")
    assert out.stdout.strip() == '{"step": 50}', out.stderr  # generation 5, not the name
    (tmp_path / "st.old-a" / "distify_state.pt").unlink()  # no longer complete
    out = _run(tmp_path, "print(json.dumps(distify.load_state('st')))\n")
    assert out.stdout.strip() == '{"step": 20}', out.stderr  # generation 2 beats none
    (tmp_path / "st.old-b" / "distify_state.pt").unlink()
    out = _run(tmp_path, "print(json.dumps(distify.load_state('st')))\n"
                         "distify.save_state('st', step=100)\n")
    assert out.stdout.strip() == '{"step": 99}', out.stderr
    assert _debris(tmp_path) == []


def test_a_resumed_run_counts_generations_on_and_keeps_one_folder(tmp_path) -> None:
    for step in (1, 2, 3):
        out = _run(tmp_path, f"distify.load_state('st')\ndistify.save_state('st', step={step})\n")
        assert out.returncode == 0, out.stderr
    saved = torch.load(tmp_path / "st" / "distify_state.pt", weights_only=False)
    assert saved["generation"] == 3 and saved["values"] == {"step": 3}
    assert _debris(tmp_path) == []


# ------------------------------------------------------------------ item 14: debug at exit


def test_debug_mode_compares_the_replicas_once_more_at_exit(tmp_path) -> None:
    script = SCRIPTS / "faults_diverge_end.py"
    proc, _ = _two(script, cwd=tmp_path, DISTIFY_DEBUG="1")
    assert "trained" in proc.stdout  # the loop itself passed every check
    assert proc.returncode != 0
    assert ("DistifyError: distify debug: replicas diverged: Net.head.weight differs from rank "
            "0's on rank 1 (equal at backward call 1, compared at the end of the script, after "
            "5 backward calls)") in proc.stderr, proc.stderr[-3000:]
    # a message, not a crash in the exit handler: no traceback through the runtime (pooled
    # ranks' output has no "[rank0]: " prefix, the launcher's own traceback has no such frame)
    assert "[rank0]: Traceback" not in proc.stderr
    assert f'File "{REPO / "distify" / "runtime"}' not in proc.stderr, proc.stderr[-3000:]


def test_debug_mode_at_exit_passes_replicas_that_stayed_equal(tmp_path) -> None:
    # rank 1 is 1 s late at step 3; the ranks meet again at the next backward, and at exit
    proc, _ = _two(SKIP, "slow", "4", "1", cwd=tmp_path, DISTIFY_DEBUG="1",
                   DISTIFY_TIMEOUT="60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DistifyError" not in proc.stderr
