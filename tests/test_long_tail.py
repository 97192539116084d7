"""Pattern classes of real scripts (issue 21), each converted right or reported."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from distify.lint import lint_text
from tests.fixture_runs import Plan, check_golden, fixture_name, run_side_by_side
from tests.helpers import FIXTURES

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

UNUSED_IMPORT = FIXTURES / "convert" / "unused_dist_import.in.py"


def test_an_unused_torch_distributed_import_is_not_already_distributed() -> None:
    source = UNUSED_IMPORT.read_bytes()
    result = convert_source(source, "train.py")
    assert result.status == "converted"
    assert b"distify.prepare(model, optimizer)" in result.output
    # `check` still lints it as distributed code: a file importing torch.distributed is meant
    # to run on several processes, and its unguarded save is the classic pitfall.
    assert [f.code for f in lint_text(source.decode(), "train.py")] == ["DST101"]


def test_a_used_import_still_marks_the_file_distributed() -> None:
    seed = "    torch.manual_seed(1)\n"
    source = UNUSED_IMPORT.read_text().replace(seed, "    dist.init_process_group('gloo')\n" + seed)
    result = convert_source(source.encode(), "train.py")
    assert result.status == "already-distributed"
    assert "uses torch.distributed.init_process_group" in result.reason


# ---------------------------------------------------------------- models and optimizers
# Fixtures in tests/fixtures/long_tail/: NAME.in.py converts to NAME.out.py exactly (update with
# DISTIFY_UPDATE_GOLDEN=1 and review the diff), NAME.noop.py comes out byte-identical.
LONG_TAIL = FIXTURES / "long_tail"
GOLDEN = sorted(LONG_TAIL.glob("*.in.py"))


@pytest.mark.parametrize("source", GOLDEN, ids=fixture_name)
def test_golden_output_and_converting_twice_changes_nothing(source: Path) -> None:
    check_golden(source)


def _prepares(result) -> list[str]:
    return [line.strip() for line in result.output.decode().splitlines()
            if "distify.prepare(" in line and "DataLoader" not in line
            and "loader" not in line.split("=")[0]]


def test_an_optimizer_chosen_by_flag_prepares_the_model_on_every_path() -> None:
    result = convert_source((LONG_TAIL / "optimizer_by_flag.in.py").read_bytes(), "t.py")
    # one prepare per branch that builds an optimizer, none for the branch that raises
    assert _prepares(result) == ["model, optimizer = distify.prepare(model, optimizer)"] * 3
    assert not [n for n in result.notes if "prepare" in n.message]


def test_an_optimizer_behind_a_flag_beside_manual_sgd_prepares_the_model_on_both_paths() -> None:
    result = convert_source((LONG_TAIL / "manual_sgd_or_optimizer.in.py").read_bytes(), "t.py")
    assert _prepares(result) == ["model, optimizer = distify.prepare(model, optimizer)",
                                 "model = distify.prepare(model)"]
    said = [c.message for c in result.changes if c.kind == "prepare-model"]
    assert any("on every path" in message for message in said), said
    # the path without an optimizer prepares it in an `else:`: no path prepares it twice
    assert "\nelse:\n    model = distify.prepare(model)\n" in result.output.decode()


def test_a_model_built_only_on_some_paths_is_reported_not_prepared_blindly() -> None:
    source = textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(list(range(8)), batch_size=2)
        if torch.cuda.is_available():
            model = torch.nn.Linear(2, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            optimizer.zero_grad()
            model(x.float().view(-1, 1).repeat(1, 2)).sum().backward()
            optimizer.step()
        """)
    result = convert_source(source.encode(), "t.py")
    assert "model = distify.prepare(model)" not in result.output.decode()
    notes = [n.message for n in result.notes]
    assert any("prepared on some paths of this `if` only" in n for n in notes), notes


def test_a_helper_returning_several_objects_prepares_each_module_once() -> None:
    result = convert_source((LONG_TAIL / "helper_returns_several.in.py").read_bytes(), "t.py")
    out = result.output.decode()
    assert "distify.prepare(set_model(" not in out  # never a tuple handed to prepare
    assert _prepares(result) == ["model = distify.prepare(model)",
                                 "classifier, optimizer = distify.prepare(classifier, optimizer)"]


def test_a_config_or_tokenizer_is_never_prepared() -> None:
    result = convert_source((LONG_TAIL / "hf_config_model.in.py").read_bytes(), "t.py")
    assert _prepares(result) == ["model, optimizer = distify.prepare(model, optimizer)"]


def test_an_optimizer_that_is_none_first_is_prepared_where_it_is_built() -> None:
    result = convert_source((LONG_TAIL / "optimizer_none_on_a_path.in.py").read_bytes(), "t.py")
    out = result.output.decode()
    assert "optimizer = None\n" in out
    assert out.index("optimizer = None") < out.index("model, optimizer = distify.prepare(")


def test_a_backward_with_no_model_leaves_the_script_alone() -> None:
    source = (LONG_TAIL / "autograd_demo.noop.py").read_bytes()
    result = convert_source(source, "t.py")
    assert (result.status, result.output) == ("unchanged", source)
    assert "plain tensors" in result.reason and "line 8" in result.reason
    # a tensor regression trained by an optimizer is training: it is converted as before
    trained = source.decode() + "opt = torch.optim.SGD([x], lr=0.1)\nopt.step()\n"
    assert convert_source(trained.encode(), "t.py").status != "unchanged"


def test_an_autograd_example_beside_a_model_keeps_its_plain_backward() -> None:
    """yunjey's pytorch_basics: `y = w * x + b; y.backward()` on plain tensors, then a
    `nn.Linear` trained further down. Only the model's backward goes through the runtime (the
    plain one, rewritten, raised at 2 processes: no prepared model made that loss)."""
    source = textwrap.dedent("""\
        import torch
        import torch.nn as nn

        x = torch.tensor(1., requires_grad=True)
        w = torch.tensor(2., requires_grad=True)
        b = torch.tensor(3., requires_grad=True)
        y = w * x + b
        y.backward()
        print(x.grad)

        linear = nn.Linear(3, 2)
        optimizer = torch.optim.SGD(linear.parameters(), lr=0.01)
        pred = linear(torch.randn(10, 3))
        loss = nn.MSELoss()(pred, torch.randn(10, 2))
        loss.backward()
        optimizer.step()
        """)
    result = convert_source(source.encode(), "basics.py")
    out = result.output.decode()
    assert "\ny.backward()\n" in out and "distify.backward(loss)" in out
    assert [c.line for c in result.changes if "plain tensors" in c.message] == \
        [out.splitlines().index("y.backward()") + 1]


def test_two_optimizers_on_different_schedules_are_not_accumulation() -> None:
    out = convert_source((LONG_TAIL / "gan_n_critic.in.py").read_bytes(), "t.py").output.decode()
    assert "sync_gradients" not in out  # the critic steps every batch: average every backward
    # real accumulation (one optimizer, stepped every n-th batch) still synchronises only then
    accumulating = textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
        loader = DataLoader(torch.randn(16, 2), batch_size=4)
        for i, x in enumerate(loader):
            model(x).sum().backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
            scheduler.step()
        """)
    out = convert_source(accumulating.encode(), "t.py").output.decode()
    assert "distify.sync_gradients((i + 1) % 4 == 0)" in out


def test_prepare_passes_none_through() -> None:
    pytest.importorskip("torch")
    import torch

    from distify.runtime import _state
    from distify.runtime._prepare import prepare

    _state.reset()
    try:
        model = torch.nn.Linear(2, 2)
        assert prepare(model, None) == (model, None)
        assert prepare(None) is None
    finally:
        _state.reset()


# Run side by side: the original, the conversion on 1 process (the same output), and on 2
# processes (identical replicas, distinct data per rank, only rank 0 printed).
PLANS = {"optimizer_by_flag": Plan(), "manual_sgd_or_optimizer": Plan(),
         "helper_returns_several": Plan(), "optimizer_none_on_a_path": Plan(),
         "gan_n_critic": Plan(), "loader_views": Plan()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    return run_side_by_side(tmp_path_factory.mktemp("long_tail"), LONG_TAIL, PLANS)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_conversion_runs_as_the_original_on_one_process_and_together_on_two(runs, name) -> None:
    original, one, two = (runs[name, v] for v in ("original", "one", "two"))
    assert one.stdout == original.stdout
    if name == "gan_n_critic":  # it prints a per-process batch count: half as many batches
        assert len(two.stdout.splitlines()) == len(original.stdout.splitlines())
    elif name == "loader_views":  # the same counts; before training, the same accuracy
        def lines(proc):
            return [line for line in proc.stdout.splitlines()
                    if "train samples" in line or "before training" in line]

        assert lines(two) == lines(original)
        assert [line.rsplit(" over ", 1)[1] for line in two.stdout.splitlines()
                if " over " in line] == ["45"] * 4
    else:
        assert two.stdout == original.stdout  # only rank 0 printed, the same lines


def test_launch_warns_about_a_script_that_imports_torch_distributed_unused(tmp_path) -> None:
    import subprocess
    import sys

    from tests.helpers import clean_env

    def dry_run(script: Path) -> str:
        proc = subprocess.run([sys.executable, "-m", "distify", "launch", "--num_processes", "2",
                               "--cpu", "--dry-run", str(script)], cwd=tmp_path, env=clean_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    assert ("does not use torch.distributed, distify or Accelerate (it imports torch.distributed "
            "but never uses it)") in dry_run(UNUSED_IMPORT)
    converted = tmp_path / "train_dist.py"
    converted.write_bytes(convert_source(UNUSED_IMPORT.read_bytes(), "train.py").output)
    assert "warning" not in dry_run(converted)


def test_loops_over_views_of_a_loader_reduce_their_sums_and_say_nothing_false() -> None:
    result = convert_source((LONG_TAIL / "loader_views.in.py").read_bytes(), "t.py")
    out = result.output.decode()
    for name in ("correct", "seen", "samples", "loss_sum", "counted"):
        assert f"{name} = distify.reduce({name})" in out, name
    assert "running_loss = distify.reduce" not in out  # nothing reads it (issue 21 item 25)
    assert not [n for n in result.notes if "not fed by a DataLoader" in n.message]


# ------------------------------------------------- item 26: a GPU index prints as it did
GPU_INDEX = textwrap.dedent("""\
    import torch

    def main(gpu_id):
        model = torch.nn.Linear(2, 1).to(gpu_id)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4):
            opt.zero_grad()
            model(x.to(gpu_id)).sum().backward()
            opt.step()
        print(f"[GPU{gpu_id}] done")

    if __name__ == "__main__":
        device = 0  # shorthand for cuda:0
        main(device)
        main(0 if torch.cuda.is_available() else "cpu")
""")


def test_a_gpu_index_the_script_keeps_prints_as_it_did_and_its_comment_is_updated() -> None:
    out = convert_source(GPU_INDEX.encode(), "train.py").output.decode()
    assert "    device = distify.device_index()  # this process's GPU (was: shorthand for " \
           "cuda:0)\n" in out, out
    assert "    main(distify.device_index())\n" in out, out
    assert "model = torch.nn.Linear(2, 1).to(distify.device())" in out, out
    assert 'print(f"[GPU{gpu_id}] done")' in out  # the text itself is the script's


def test_device_index_is_the_gpus_index_else_the_device() -> None:
    import torch

    import distify.runtime as distify
    from distify.runtime import _state

    _state.reset()
    try:
        expected = distify.device()
        got = distify.device_index()
        if expected.type == "cuda":  # what `device = 0` printed, on each process's own GPU
            assert got == expected.index and isinstance(got, int)
        else:  # what `0 if torch.cuda.is_available() else "cpu"` printed: cpu
            assert got == expected and str(got) == "cpu"
        assert torch.zeros(1).to(got).device == expected
    finally:
        _state.reset()


def test_sums_of_a_batch_drawn_with_next_are_reduced_together() -> None:
    """`x, y = next(batches)` in `for i in range(len(loader))`: `total += y.size(0)` adds what
    the batch gives, as `correct` does; both are summed over the processes (only `correct`
    was, so `correct / total` printed about N times the accuracy)."""
    source = textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(40, 8), torch.randint(0, 3, (40,))),
                            batch_size=4, shuffle=True)
        model = torch.nn.Linear(8, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            correct, total = 0, 0
            batches = iter(loader)
            for i in range(len(loader)):
                x, y = next(batches)
                out = model(x)
                loss = torch.nn.functional.cross_entropy(out, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += y.size(0)
                correct += (out.argmax(1) == y).sum().item()
            print(epoch, correct / total)
        """)
    out = convert_source(source.encode(), "train.py").output.decode()
    assert "\n    total = distify.reduce(total)\n" in out
    assert "\n    correct = distify.reduce(correct)\n" in out
