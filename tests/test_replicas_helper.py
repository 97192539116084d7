"""The replica check every 2-process test uses: ``run_torchrun(..., replicas=...)``.

Each rank records a sha256 of every parameter it trained (``tests/replicas``); the check fails,
naming the tensors and the ranks, when the ranks end with different parameters.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import (
    REPLICAS,
    REPLICAS_ENV,
    REPO,
    check_replicas,
    clean_env,
    run_torchrun,
)

pytestmark = pytest.mark.pool

torch = pytest.importorskip("torch")

SCRIPT = '''\
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import distify.runtime as distify


def main(mode):
    if mode == "collectives":
        print(distify.reduce(distify.rank() + 1))
        return
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = distify.prepare(DataLoader(data, batch_size=8, shuffle=True))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    manual = mode.startswith("manual")
    if manual:  # no optimizer: SGD by hand on p.data
        model = distify.prepare(model)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = distify.prepare(model, optimizer)
    for _ in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            if manual:
                model.zero_grad()
                distify.backward(loss)
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.1)
            else:
                optimizer.zero_grad()
                distify.backward(loss)
                optimizer.step()
    if mode.endswith("perturb") and distify.rank() == 1:
        with torch.no_grad():
            model[2].weight[0, 3] += 1e-6  # one replica drifts
    distify.print("trained")


if __name__ == "__main__":
    main(sys.argv[1])  # the model is local to main(): gone before the process exits
'''


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def _env():
    return clean_env(PYTHONPATH=str(REPO))


def test_identical_replicas_pass_and_the_records_say_what_trained(script, tmp_path):
    proc = run_torchrun(script, "ddp", cwd=tmp_path, env=_env(), replicas=True,
                        distinct_data=True)
    assert proc.stdout.count("trained") == 1
    replicas = proc.replicas
    names = [t["name"] for t in replicas.trained(0)]
    assert names == ["Sequential.0.weight", "Sequential.0.bias", "Sequential.2.weight",
                     "Sequential.2.bias"]
    assert replicas.trained(0) == replicas.trained(1)
    for rank in (0, 1):
        record = replicas.records[rank]
        assert record["source"] == "optimizers"
        assert record["optimizers"] == [{"type": "SGD", "steps": 8}]  # 2 epochs of 4 batches
        assert record["training_forwards"] == 8 and record["modules"] == ["Sequential"]
        # model(x) on batches of 8 (each rank has 32 of the 64 samples): the first 3 recorded
        assert [i["shapes"] for i in replicas.inputs(rank)] == [[[8, 4]]] * 3
    # each rank trained on its own shard
    assert replicas.inputs(0)[0]["sha256"] != replicas.inputs(1)[0]["sha256"]


def test_a_replica_that_drifts_fails_the_check_naming_the_tensor_and_rank(script, tmp_path):
    with pytest.raises(AssertionError) as caught:
        run_torchrun(script, "perturb", cwd=tmp_path, env=_env(), replicas=True)
    message = str(caught.value)
    assert "not bit-identical" in message
    assert "rank 1 differs from rank 0 in 1 of 4 trained tensors: Sequential.2.weight [1, 8]" \
        in message


def test_without_an_optimizer_the_root_modules_that_trained_are_compared(script, tmp_path):
    with pytest.raises(AssertionError) as caught:
        run_torchrun(script, "manual_perturb", cwd=tmp_path, env=_env(), replicas=True)
    assert "rank 1 differs from rank 0 in 1 of 4 trained tensors: Sequential.2.weight" \
        in str(caught.value)
    proc = run_torchrun(script, "manual", cwd=tmp_path, env=_env(), replicas=True,
                        distinct_data=True)
    assert proc.replicas.records[1]["source"] == "modules"
    assert len(proc.replicas.trained(1)) == 4


def test_a_job_that_trains_nothing_passes_unless_training_is_required(script, tmp_path):
    proc = run_torchrun(script, "collectives", cwd=tmp_path, env=_env())  # replicas=None
    assert proc.replicas.trained(0) == proc.replicas.trained(1) == []
    assert proc.replicas.records[0]["source"] == "none"
    with pytest.raises(AssertionError, match="rank 0 trained nothing"):
        check_replicas(_copy_records(proc.replicas.records, tmp_path / "copy"), 2)


def _copy_records(records, folder):
    folder.mkdir()
    for rank, record in records.items():
        (folder / f"rank{rank}.json").write_text(json.dumps(record))
    return folder


def _record(rank, trained, inputs=()):
    return {"rank": rank, "errors": [], "failed": False, "source": "optimizers",
            "trained": trained, "inputs": list(inputs)}


def _tensor(name, sha):
    return {"name": name, "shape": [2], "dtype": "float32", "sha256": sha}


def test_check_messages(tmp_path):
    folder = _copy_records({0: _record(0, [_tensor("w", "a")], [{"sha256": "x"}])},
                           tmp_path / "one")
    with pytest.raises(AssertionError, match=r"rank\(s\) \[1\] of 2 wrote no replica record"):
        check_replicas(folder, 2)
    same = {r: _record(r, [_tensor("w", "a"), _tensor("b", "c")], [{"sha256": "x"}])
            for r in (0, 1)}
    folder = _copy_records(same, tmp_path / "same")
    check_replicas(folder, 2)
    with pytest.raises(AssertionError, match=r"ranks \[\(0, 1\)\] consumed the same first"):
        check_replicas(folder, 2, distinct_data=True)
    other = {0: _record(0, [_tensor("w", "a")]), 1: _record(1, [_tensor("v", "a")])}
    with pytest.raises(AssertionError, match="rank 1 trained other tensors than rank 0"):
        check_replicas(_copy_records(other, tmp_path / "other"), 2)


def test_hashes_cover_every_dtype_and_layout():
    sys.path.insert(0, str(REPLICAS))
    try:
        import _distify_replicas as recorder
    finally:
        sys.path.remove(str(REPLICAS))
    recorder._torch = torch
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64):
        t = base.to(dtype)
        assert recorder._tensor_bytes(t) == t.contiguous().view(torch.uint8).numpy().tobytes()
        # a transposed view hashes its values, as its contiguous copy does
        assert recorder._sha256(t.t()) == recorder._sha256(t.t().contiguous())
    one_ulp = torch.tensor([1.0], dtype=torch.bfloat16).view(torch.int16) + 1
    assert recorder._sha256(torch.tensor([1.0], dtype=torch.bfloat16)) != \
        recorder._sha256(one_ulp.view(torch.bfloat16))
    assert recorder._sha256(torch.tensor(3.0)) == recorder._sha256(torch.tensor([3.0]))


def test_the_start_up_hook_does_nothing_without_its_variable():
    code = ("import sys; print(sys.modules['sitecustomize'].__file__); "
            "print(sorted(m for m in ('_distify_replicas', 'torch', 'numpy', 'json') "
            "if m in sys.modules))")
    env = clean_env(PYTHONPATH=str(REPLICAS))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out == [str(REPLICAS / "sitecustomize.py"), "[]"]
    env[REPLICAS_ENV] = "/nonexistent"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[1] == "['_distify_replicas', 'json']"  # torch is hooked when the script imports it
