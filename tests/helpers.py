"""Shared test helpers: run scripts as real processes (plain python or torchrun on CPU/Gloo), and
check that the ranks of a job end with bit-identical trained parameters (``check_replicas``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests import _pool

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
# tests/replicas/sitecustomize.py records, in each rank, what it trained (see check_replicas)
REPLICAS = REPO / "tests" / "replicas"
REPLICAS_ENV = "DISTIFY_TEST_REPLICAS"


def simulated_rank(rank: int, world_size: int = 2):
    """A runtime state (``distify.runtime._state.Runtime``) for this process as ``rank`` of a
    ``world_size`` job on the CPU, with no process group: for tests of what a rank computes on
    its own (patch it in as ``_state._RUNTIME``; nothing may communicate)."""
    import torch

    from distify.runtime import _state

    return _state.Runtime(_state.Settings(rank, rank, world_size, world_size,
                                          torch.device("cpu"), "no", False))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without any launcher variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"}
           and not k.startswith(("DISTIFY_", "ACCELERATE_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": ""})
    env.update(extra)
    return env


def run_python(script: Path | str, *args: str, cwd: Path | str, env: dict | None = None,
               timeout: float = 300, pool: bool | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python script args`` (no launcher); fail the test with its output on error
    (``check=False``: return whatever exit code it had).

    ``pool``: run it as a child forked from the warm worker pool (``tests/_pool.py``) instead of
    a new interpreter; None: when the test's module is marked ``pytest.mark.pool``. Either way
    ``DISTIFY_TEST_POOL=0`` runs a real ``python``."""
    env = env or clean_env()
    cmd = [sys.executable, str(script), *args]
    if _pool.pooled(env, pool):
        proc = _pool.run(str(script), list(args), cwd=str(cwd), env=env, nproc=1,
                         torchrun=False, timeout=timeout, command=cmd)
    else:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    if check:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_torchrun(script: Path | str, *args: str, nproc: int = 2, cwd: Path | str,
                 env: dict | None = None, timeout: float = 300, check: bool = True,
                 replicas: bool | None = None, distinct_data: bool = False,
                 pool: bool | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` on ``nproc`` local processes with torchrun (Gloo on CPU).

    Every rank records what it trained (``tests/replicas``), and after a successful run the
    ranks' trained parameters must be bit-identical (see :func:`check_replicas`):
    ``replicas=True`` also requires that something trained, ``None`` checks only if something
    did, ``False`` records nothing (scripts that crash or end abnormally). ``distinct_data``:
    the ranks' first training batches must differ too (a sharded DataLoader). The records are
    in ``proc.replicas`` (a :class:`Replicas`, or None when nothing was checked).

    ``pool``: run the ranks as children forked from the warm worker pool (``tests/_pool.py``),
    with torchrun's worker environment but without its launcher; None: when the test's module
    is marked ``pytest.mark.pool``. ``DISTIFY_TEST_POOL=0`` runs real torchrun either way. The
    ranks' outputs come one after the other, in rank order.
    """
    if distinct_data and replicas is False:
        raise ValueError("distinct_data needs the replicas' records: replicas=True or None")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(script), *args]
    env = env or clean_env()
    with tempfile.TemporaryDirectory(prefix="distify-replicas-") as directory:
        if replicas is not False:
            env = replicas_env(env, directory)
        if _pool.pooled(env, pool):
            proc = _pool.run(str(script), list(args), cwd=str(cwd), env=env, nproc=nproc,
                             torchrun=True, timeout=timeout, command=cmd)
        else:
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        if check:
            assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        proc.replicas = None  # type: ignore[attr-defined]
        if replicas is not False and proc.returncode == 0:
            proc.replicas = check_replicas(  # type: ignore[attr-defined]
                directory, nproc, required=replicas, distinct_data=distinct_data,
                output=proc.stderr)
    return proc


# ------------------------------------------------------------ replicas: bit-identical ranks


def replicas_env(env: dict | None, directory: Path | str) -> dict:
    """``env`` (default :func:`clean_env`) with the replica recorder on, writing to
    ``directory``: for jobs started some other way than :func:`run_torchrun` (``distify
    launch``), checked afterwards with :func:`check_replicas`."""
    env = dict(env if env is not None else clean_env())
    env[REPLICAS_ENV] = str(directory)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPLICAS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


@dataclass
class Replicas:
    """What each rank recorded (``tests/replicas/_distify_replicas.py``), by rank."""

    records: dict[int, dict]

    def trained(self, rank: int = 0) -> list[dict]:
        """The rank's trained tensors: ``{"name", "shape", "dtype", "sha256"}`` each."""
        return self.records[rank]["trained"]

    def inputs(self, rank: int = 0) -> list[dict]:
        """The rank's first root training forwards' inputs: ``{"module", "sha256", "shapes"}``."""
        return self.records[rank]["inputs"]


def check_replicas(directory: Path | str, nproc: int, *, required: bool | None = True,
                   distinct_data: bool = False, output: str = "") -> Replicas:
    """Assert that every rank wrote its record to ``directory`` and that all ranks' trained
    parameters are bit-identical (``required``: something must have trained; ``None``: nothing
    trained is fine too). With ``distinct_data`` the ranks' first training batches must all
    differ. ``output`` (the job's stderr) is added to the failure messages about the records."""
    directory = Path(directory)
    records, missing = {}, []
    for rank in range(nproc):
        path = directory / f"rank{rank}.json"
        if path.is_file():
            records[rank] = json.loads(path.read_text())
        else:
            missing.append(rank)
    tail = f"\n{output[-3000:]}" if output else ""
    assert not missing, (
        f"rank(s) {missing} of {nproc} wrote no replica record in {directory} (a rank ended "
        f"by os._exit or a signal writes none: pass replicas=False for such a script){tail}")
    for rank, record in records.items():
        assert not record["errors"], f"rank {rank}: the replica recorder failed: " \
            f"{record['errors']}{tail}"
        assert not record["failed"], f"rank {rank} ended with an uncaught exception{tail}"
    result = Replicas(records)
    if required is None and not any(record["trained"] for record in records.values()):
        return result
    for rank, record in records.items():
        assert record["trained"], (
            f"rank {rank} trained nothing: no optimizer stepped and no module ran a training "
            f"forward (train mode, gradients on){tail}")
    _assert_identical(records)
    if distinct_data:
        _assert_distinct_data(records)
    return result


def _assert_identical(records: dict[int, dict]) -> None:
    want = records[0]["trained"]
    layout = [(t["name"], t["shape"], t["dtype"]) for t in want]
    problems = []
    for rank, record in sorted(records.items())[1:]:
        got = record["trained"]
        if [(t["name"], t["shape"], t["dtype"]) for t in got] != layout:
            problems.append(
                f"rank {rank} trained other tensors than rank 0: "
                f"{[(t['name'], t['shape']) for t in got]} vs {[(n, s) for n, s, _ in layout]}")
            continue
        differ = [f"{t['name']} {t['shape']}" for t, w in zip(got, want)
                  if t["sha256"] != w["sha256"]]
        if differ:
            problems.append(f"rank {rank} differs from rank 0 in {len(differ)} of {len(want)} "
                            f"trained tensors: {', '.join(differ)}")
    assert not problems, "the ranks' trained parameters are not bit-identical: " + \
        "; ".join(problems)


def _assert_distinct_data(records: dict[int, dict]) -> None:
    firsts = {}
    for rank, record in sorted(records.items()):
        assert record["inputs"], f"rank {rank} recorded no training forward's inputs"
        firsts[rank] = record["inputs"][0]["sha256"]
    same = [(a, b) for a in firsts for b in firsts if a < b and firsts[a] == firsts[b]]
    assert not same, f"ranks {same} consumed the same first training batch (the data is not " \
        "sharded over the ranks)"


def result_line(stdout: str, required: bool = True) -> dict | None:
    """The JSON of the last ``RESULT {...}`` line a fixture script printed (None if it printed
    none and ``required`` is false)."""
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines or not required, stdout
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


def flatten(obj, prefix: str = "") -> dict:
    """A nested checkpoint (dicts, lists, tuples) as ``{"a.0.b": leaf}``, to compare key by key."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {prefix.rstrip("."): obj}
    out: dict = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}{key}."))
    return out


# ------------------------------------------------------------------ conversions and checkpoints


def convert_project(source: Path, out: Path) -> None:
    """``distify convert source -o out --no-config``, through the command line's code."""
    from click.testing import CliRunner

    from distify.cli import main

    outcome = CliRunner().invoke(main, ["convert", str(source), "-o", str(out), "--no-config"])
    assert outcome.exit_code == 0, outcome.output


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (caches left out), relative path → bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def compare_state(got: dict, want: dict, *, exact: bool, rtol: float = 1e-3,
                  atol: float = 1e-4, skip: tuple[str, ...] = ()) -> None:
    """Two flattened checkpoints (:func:`flatten`): the same keys (no ``module.`` prefix gained
    or lost), and the same values, bit for bit when ``exact``, else floats within tolerance.
    ``skip``: keys whose values differ by design (say why where it is passed)."""
    import pytest
    import torch

    assert got.keys() == want.keys()
    for key, value in want.items():
        if key in skip:
            continue
        if isinstance(value, torch.Tensor):
            if exact or not value.is_floating_point():
                assert torch.equal(got[key], value), key
            else:
                torch.testing.assert_close(got[key], value, rtol=rtol, atol=atol, msg=key)
        elif isinstance(value, float) and not exact:
            assert got[key] == pytest.approx(value, rel=rtol, abs=1e-6), key
        else:
            assert got[key] == value, key
