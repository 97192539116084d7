"""The warm worker pool (``tests/_pool.py``): a job forked from it sees what a job started the
old way sees (real torchrun, real python), and ends the way it would.

These tests call the pool directly, so they test it whatever ``DISTIFY_TEST_POOL`` says."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests import _pool
from tests.helpers import REPO, clean_env, run_torchrun

pytest.importorskip("torch")

PROBE = '''\
import atexit, json, os, sys
before = "distify" in sys.modules or "tests" in sys.modules
if sys.argv[1:] == ["fail"]:  # rank 1 fails at once, rank 0 would sleep for two minutes
    if os.environ["RANK"] == "1":
        raise ValueError("boom")
    import time
    time.sleep(120)
import torch
import torch.distributed as dist

# every line in one write: torchrun's workers write unbuffered into one pipe, and a print's
# pieces (its words, its newline) from two ranks can interleave
atexit.register(lambda: os.write(1, f"ATEXIT {os.environ.get('RANK')}\\n".encode()))
os.write(1, b"C-LEVEL\\n")
os.write(2, b"ERR-LINE\\n")
total = None
if os.environ.get("WORLD_SIZE"):
    dist.init_process_group("gloo")
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    total = t.item()
    dist.destroy_process_group()
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS", "EXTRA"]
os.write(1, ("INFO " + json.dumps({
    "env": {k: os.environ.get(k) for k in keys}, "argv": sys.argv, "path0": sys.path[0],
    "extra_path": os.environ["EXTRA"] in sys.path, "cwd": os.getcwd(), "before": before,
    "name": __name__, "file": __file__, "total": total,
    "threads": torch.get_num_threads()}) + "\\n").encode())
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "raise" and os.environ.get("RANK", "1") == "1":
    raise ValueError("boom")
if mode == "exit3":
    sys.exit(3)
if mode == "sleep":
    import time
    time.sleep(120)
'''


def _info(stdout: str) -> list[dict]:
    return [json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("INFO ")]


@pytest.fixture
def probe(tmp_path) -> Path:
    (tmp_path / "extra").mkdir()
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    return script


def _env(tmp_path: Path) -> dict:
    extra = str(tmp_path / "extra")
    return clean_env(PYTHONPATH=f"{extra}:{REPO}", EXTRA=extra)


def test_a_pooled_rank_sees_what_a_torchrun_worker_sees(probe, tmp_path) -> None:
    env = _env(tmp_path)
    real = run_torchrun(probe, "x", cwd=tmp_path, env=env, replicas=False, pool=False)
    pooled = _pool.run(str(probe), ["x"], cwd=str(tmp_path), env=env, nproc=2, torchrun=True,
                       timeout=120, command=["probe"])
    assert pooled.returncode == real.returncode == 0
    assert sorted(_info(pooled.stdout), key=str) == sorted(_info(real.stdout), key=str)
    infos = _info(pooled.stdout)
    assert {i["env"]["RANK"] for i in infos} == {"0", "1"} and infos[0]["total"] == 3.0
    assert not infos[0]["before"] and infos[0]["extra_path"] and infos[0]["threads"] == 1
    for proc in (real, pooled):  # C-level writes and the script's atexit handlers, every rank
        assert proc.stdout.count("C-LEVEL\n") == 2, proc.stdout
        assert sorted(line for line in proc.stdout.splitlines() if "ATEXIT" in line) == \
            ["ATEXIT 0", "ATEXIT 1"]
        assert proc.stderr.count("ERR-LINE\n") == 2


@pytest.mark.parametrize(("mode", "code"), [("", 0), ("exit3", 3), ("raise", 1)])
def test_a_pooled_python_run_ends_like_the_interpreter(probe, tmp_path, mode, code) -> None:
    env = clean_env(PYTHONPATH=str(REPO), EXTRA="-")
    pooled = _pool.run("probe.py", [mode], cwd=str(tmp_path), env=env, nproc=1,
                       torchrun=False, timeout=120, command=["probe"])
    assert pooled.returncode == code, pooled.stderr
    [info] = _info(pooled.stdout)
    assert info["argv"] == ["probe.py", mode] and info["file"] == str(probe)
    assert info["name"] == "__main__" and info["env"]["RANK"] is None
    assert "ATEXIT None" in pooled.stdout  # atexit handlers run after an exit or an exception
    if mode == "raise":  # the script's own traceback, none of the pool's frames
        assert pooled.stderr.endswith("raise ValueError(\"boom\")\nValueError: boom\n")
        assert "Traceback (most recent call last):\n  File \"" + str(probe) in pooled.stderr


def test_a_failed_rank_ends_the_job_with_every_ranks_output(probe, tmp_path) -> None:
    started = time.monotonic()
    pooled = _pool.run(str(probe), ["fail"], cwd=str(tmp_path), env=_env(tmp_path), nproc=2,
                       torchrun=True, timeout=200, command=["probe"])
    assert time.monotonic() - started < 60  # rank 0 killed: not its 120 s sleep, nor the timeout
    assert pooled.returncode == 1
    assert "ValueError: boom" in pooled.stderr
    assert "rank 1 exited with code 1" in pooled.stderr


def test_a_job_past_its_timeout_is_killed_and_raises(probe, tmp_path) -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        _pool.run(str(probe), ["sleep"], cwd=str(tmp_path), env=_env(tmp_path), nproc=2,
                  torchrun=True, timeout=5, command=["probe"])
    assert time.monotonic() - started < 60
    assert "C-LEVEL" in caught.value.output  # what the ranks wrote before, still returned


def test_start_up_variables_other_than_the_servers_run_the_old_way() -> None:
    _pool.ALLOWED = True
    try:
        assert _pool.pooled(clean_env(), None) is _pool.enabled()
        assert not _pool.pooled(clean_env(PYTHONWARNINGS="default"), None)
        assert not _pool.pooled(clean_env(OMP_NUM_THREADS="2"), None)
        assert not _pool.pooled(clean_env(), False)
    finally:
        _pool.ALLOWED = False


DRAWS = '''\
import json, os, random
import numpy
import torch
os.write(1, ("DRAW " + json.dumps([torch.randn(2).tolist(), numpy.random.rand(),
                                   random.random()]) + "\\n").encode())
'''


def test_ranks_of_a_script_that_seeds_nothing_draw_as_fresh_processes_draw(tmp_path) -> None:
    # this torch seeds its default generator from the OS in every fresh process: forked ranks
    # must not share the server's seed (nor numpy's, nor random's)
    script = tmp_path / "draws.py"
    script.write_text(DRAWS)
    env = clean_env(PYTHONPATH=str(REPO))
    real = run_torchrun(script, cwd=tmp_path, env=env, replicas=False, pool=False)
    pooled = [_pool.run(str(script), [], cwd=str(tmp_path), env=env, nproc=2, torchrun=True,
                        timeout=120, command=["draws"]) for _ in range(2)]

    def draws(proc) -> list[list]:
        return [json.loads(line[5:]) for line in proc.stdout.splitlines()
                if line.startswith("DRAW ")]

    fresh = draws(real)
    assert len(fresh) == 2
    for proc in pooled:
        forked = draws(proc)
        assert len(forked) == 2
        for source in range(3):  # torch, numpy, random: alike across ranks only if fresh are
            assert (forked[0][source] == forked[1][source]) == \
                (fresh[0][source] == fresh[1][source]), (source, forked, fresh)
    assert draws(pooled[0]) != draws(pooled[1])  # and a job does not repeat the last one's
