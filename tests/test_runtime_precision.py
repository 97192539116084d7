"""Mixed precision: bf16 autocast on CPU in one process; fp16 with the GradScaler on 2 processes
(an overflow skips the step everywhere and holds the scheduler; a plain backward is caught)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import REPO, clean_env, run_python, run_torchrun

pytestmark = pytest.mark.pool

SCRIPT = REPO / "tests" / "runtime_scripts" / "precision_checks.py"


def _results(out, ranks):
    results: dict[str, list[dict]] = {}
    for rank in ranks:
        for line in (out / f"results-rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            results.setdefault(record["check"], []).append(record)
    return results


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16")
    run_python(SCRIPT, str(out), cwd=out, env=clean_env(DISTIFY_MIXED_PRECISION="bf16"))
    return _results(out, [0])


@pytest.fixture(scope="module")
def fp16(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp16")
    # Accelerate's launcher variable works too (DISTIFY_MIXED_PRECISION would take precedence).
    run_torchrun(SCRIPT, str(out), nproc=2, cwd=out,
                 env=clean_env(ACCELERATE_MIXED_PRECISION="fp16"), replicas=True)
    return _results(out, [0, 1])


def test_bf16_runs_the_forward_in_bf16_and_returns_float32(bf16):
    [step] = bf16["normal_step"]
    assert step["precision"] == "bf16"
    assert step["inner_dtype"] == "torch.bfloat16"
    assert step["out_dtype"] == "torch.float32"
    assert step["changed"] and not step["skipped"] and step["loss_finite"]
    [plain] = bf16["plain_backward"]
    assert plain["error"] is None  # no scaler under bf16: a plain backward is fine
    assert plain["autocast_dtype"] == "torch.bfloat16"


def test_bf16_never_reports_skipped_steps(bf16):
    # Even with an infinite loss: bf16 has no GradScaler, so the step (and scheduler) go on.
    [overflow] = bf16["overflow_step"]
    assert overflow["skipped"] is False and overflow["last_epoch"] == 2


def test_fp16_normal_step_unscales_before_clipping(fp16):
    for step in fp16["normal_step"]:
        assert step["precision"] == "fp16" and step["inner_dtype"] == "torch.float16"
        assert step["out_dtype"] == "torch.float32"
        assert not step["skipped"] and step["changed"] and step["last_epoch"] == 1
        assert 0 < step["norm"] < 10  # the true norm, not the norm of loss * 65536


def test_fp16_overflow_skips_the_step_and_holds_the_scheduler(fp16):
    for step in fp16["overflow_step"]:  # inf on rank 0 only; both ranks skip
        assert step["skipped"] is True
        assert step["changed"] is False
        assert step["last_epoch"] == 1 and step["lr"] == 0.05
    for step in fp16["after_overflow"]:
        assert step["skipped"] is False and step["changed"]
        assert step["last_epoch"] == 2 and step["lr"] == 0.025


def test_fp16_plain_backward_is_caught(fp16):
    for record in fp16["plain_backward"]:
        assert record["error"].startswith("DistifyError: ")
        assert "distify.backward(loss)" in record["error"]
        assert "\n" not in record["error"]
