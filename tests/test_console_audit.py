"""Only the main process is heard on the console, and files written on other processes are
reported (issue 20 items 3 and 4): real 2-process `distify launch` jobs on CPU with Gloo.

One job with the default console and one with --all-ranks and a failure on rank 1; the script
(tests/runtime_scripts/audit_train.py) prints and writes the way real scripts do.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distify.launch.torchrun import Console, _prefixed, _StdoutCopy, console_for
from tests.helpers import REPO, clean_env, run_python

pytest.importorskip("torch", reason="real launches need torch")

pytestmark = pytest.mark.pool

SCRIPTS = REPO / "tests" / "runtime_scripts"
TIMEOUT = 240
HAS_NUMPY = importlib.util.find_spec("numpy") is not None


def _line_of(marker: str) -> int:
    lines = (SCRIPTS / "audit_train.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith(f"# {marker}"))


def _folder(tmp_path: Path) -> tuple[Path, dict]:
    """A job folder outside the temporary folder (which the write check lets through), and its
    environment: TMPDIR and HF_HOME elsewhere."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("audit_train.py", "audit_helper.py"):
        shutil.copy(SCRIPTS / name, work / name)
    (tmp_path / "tmp").mkdir()
    env = clean_env(TMPDIR=str(tmp_path / "tmp"), HF_HOME=str(tmp_path / "hf"))
    return work, env


def _launch(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "distify", "launch", "--cpu",
                           "--num_processes", "2", *args], cwd=cwd, env=env,
                          capture_output=True, timeout=TIMEOUT)
    # decoded by hand: text=True would turn the progress lines' \r into \n
    proc.stdout, proc.stderr = proc.stdout.decode(), proc.stderr.decode()
    return proc


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "outside distify.open/distify.save" in line]


def test_console_shows_rank_0_and_writes_on_rank_1_are_reported(tmp_path):
    work, env = _folder(tmp_path)
    proc = _launch("audit_train.py", cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr

    # the console: rank 0's progress line and helper print, nothing of rank 1's
    assert "\rstep 3/3 rank 0\n" in proc.stdout and "epoch done on rank 0" in proc.stdout
    assert "rank 1" not in proc.stdout and "audit 1" not in proc.stdout, proc.stdout
    assert "audit 0 False" in proc.stdout  # the main process has no write check
    # the log folder keeps every rank's stdout, and the console says where
    note = [line for line in proc.stderr.splitlines() if line.startswith("distify: not shown")]
    assert len(note) == 1 and "rank 1's stdout" in note[0], proc.stderr
    attempt = Path(note[0].rsplit(" ", 1)[1])
    assert attempt.is_dir() and attempt.is_relative_to(tmp_path / "tmp")
    rank0, rank1 = ((attempt / str(r) / "stdout.log").read_bytes().decode() for r in (0, 1))
    assert "\rstep 3/3 rank 0\n" in rank0 and "epoch done on rank 0" in rank0
    assert "\rstep 3/3 rank 1\n" in rank1 and "epoch done on rank 1" in rank1
    assert "audit 1 True" in rank1  # rank 1 has the write check

    # each path rank 1 wrote is reported once, with the script line that wrote it
    reported = _warnings(proc.stderr)
    expected = {"out/metrics_rank1.txt": f"audit_train.py:{_line_of('per-rank open')}",
                "out/last.pt": f"audit_train.py:{_line_of('torch.save')}",
                "out/summary.txt": f"audit_helper.py:{_helper_line()}"}
    if HAS_NUMPY:
        expected["out/weights.npy"] = f"audit_train.py:{_line_of('np.save')}"
    for path, where in expected.items():
        mine = [line for line in reported if f"writes {path} ({where})" in line]
        assert len(mine) == 1, (path, where, proc.stderr)
        assert "rank 1 writes" in mine[0]
    # the known places, distify.save and distify.open are silent; rank 0 reports nothing
    assert len(reported) == len(expected), proc.stderr
    assert "rank 0 writes" not in proc.stderr


def _helper_line() -> int:
    lines = (SCRIPTS / "audit_helper.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.endswith("# helper write"))


def test_all_ranks_option_and_an_error_on_rank_1(tmp_path):
    work, env = _folder(tmp_path)
    proc = _launch("--all-ranks", "audit_train.py", "--fail", cwd=work, env=env)
    assert proc.returncode == 1, proc.stderr
    assert "[rank0]: epoch done on rank 0\n" in proc.stdout, proc.stdout
    assert "[rank1]: epoch done on rank 1\n" in proc.stdout, proc.stdout
    # rank 1's \r progress line, prefixed (where the \r falls depends on how the output was
    # read in chunks: only the prefixed text is certain)
    assert re.search(r"\[rank1\]: step 3/3 rank 1", proc.stdout), proc.stdout
    # rank 1's error reaches the console, in its summary as before
    summary = [line for line in proc.stderr.splitlines() if line.startswith("distify: ")]
    assert "distify: rank 1 failed first: ValueError: boom on rank 1" in summary, proc.stderr
    assert summary[-1].startswith("distify: the job failed with exit code 1; its full stderr")
    log = Path(summary[-1].rsplit(" ", 1)[1])
    assert log.name == "stderr.log" and "boom on rank 1" in log.read_text()


def test_one_process_installs_no_write_check(tmp_path):
    work, env = _folder(tmp_path)
    proc = run_python(work / "audit_train.py", cwd=work, env=env, timeout=TIMEOUT)
    assert "audit 0 False" in proc.stdout
    assert not _warnings(proc.stderr), proc.stderr


# ---------------------------------------------------------- which workers a console copies


def _attempt(folder: Path, outputs: dict[int, bytes]) -> None:
    """torchrun's layout: <run>/attempt_0/<local rank>/stdout.log."""
    for local, data in outputs.items():
        path = folder / "run_x" / "attempt_0" / str(local) / "stdout.log"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)


class _Out:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def flush(self) -> None:
        pass


def _copied(console: Console) -> bytes:
    out = _Out()
    copy = _StdoutCopy(console, -1, out)
    copy.start()
    copy.finish()
    return out.data


@pytest.mark.parametrize("machine_rank,all_ranks,expected", [
    (0, False, b"a0\rb0\n"),
    (1, False, b""),  # rank 0 runs on machine 0: this machine's console shows none
    (1, True, b"[rank2]: a0\r[rank2]: b0\n[rank3]: a1\n"),
], ids=["main-machine", "other-machine", "other-machine-all-ranks"])
def test_console_of_a_machine_copies_global_rank_0_only(tmp_path, machine_rank, all_ranks,
                                                        expected):
    from distify.launch.config import default_config, with_overrides

    cfg = with_overrides(default_config(), num_processes=4, num_machines=2,
                         machine_rank=machine_rank, main_process_ip="10.0.0.1",
                         main_process_port=29500, use_cpu=True)
    _attempt(tmp_path, {0: b"a0\rb0\n", 1: b"a1\n"})
    assert _copied(console_for(cfg, str(tmp_path), all_ranks=all_ranks)) == expected


def test_prefix_marks_every_line_and_progress_update():
    assert _prefixed(b"a\nb", b"[r]: ", True) == (b"[r]: a\n[r]: b", False)
    assert _prefixed(b"c\n", b"[r]: ", False) == (b"c\n", True)
    assert _prefixed(b"\rx\r", b"[r]: ", True) == (b"[r]: \r[r]: x\r", True)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")
def test_c10d_console_finds_rank_0_among_the_workers(tmp_path):
    """c10d hands ranks out as machines join: the worker whose environment says RANK=0 is shown
    (here a stand-in child of this process plays torchrun's worker with local rank 1)."""
    import os

    env = {**os.environ, "LOCAL_RANK": "1", "RANK": "0"}
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        _attempt(tmp_path, {0: b"from rank 4\n", 1: b"from rank 0\n"})
        out = _Out()
        copy = _StdoutCopy(Console(str(tmp_path), False, None), os.getpid(), out)
        copy.start()
        deadline = time.monotonic() + 20
        while out.data != b"from rank 0\n" and time.monotonic() < deadline:
            time.sleep(0.05)
        copy.finish()
    finally:
        worker.kill()
        worker.wait(timeout=10)
    assert out.data == b"from rank 0\n"


def test_console_follows_an_attempt_folder_made_anew(tmp_path):
    """An agent whose own workers did not fail restarts them under the same attempt number,
    and torchrun deletes and remakes that folder: the new file is copied, not the deleted one."""
    _attempt(tmp_path, {0: b"first run\n"})
    out = _Out()
    copy = _StdoutCopy(Console(str(tmp_path), False, 0), -1, out)
    copy.start()
    deadline = time.monotonic() + 20
    while out.data != b"first run\n" and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(tmp_path / "run_x" / "attempt_0")
    _attempt(tmp_path, {0: b"resumed\n"})
    while out.data != b"first run\nresumed\n" and time.monotonic() < deadline:
        time.sleep(0.05)
    copy.finish()
    assert out.data == b"first run\nresumed\n"
