"""Side effects of real scripts (issue 21 items 17-20): console writes outside print, trackers
distify did not know, hand-written downloads as one unit, and helpers without torch."""

from __future__ import annotations

import functools
import http.server
import io
import os
import tarfile
import textwrap
import threading
from pathlib import Path

import pytest

from distify.convert.engine import convert_source
from distify.convert.project import launch_entry, plan_project, write_planned
from distify.rules import default_rules
from tests.fixture_runs import Plan, check_golden, fixture_name, run_side_by_side
from tests.helpers import FIXTURES, REPO, clean_env, run_python, run_torchrun

# the script runs fork from the warm worker pool (tests/_pool.py; DISTIFY_TEST_POOL=0: real ones)
pytestmark = pytest.mark.pool

TAIL = FIXTURES / "side_effects_tail"
GOLDEN = sorted(TAIL.glob("*.in.py"))
UPDATE = bool(os.environ.get("DISTIFY_UPDATE_GOLDEN"))


@pytest.mark.parametrize("source", GOLDEN, ids=fixture_name)
def test_golden_output_and_converting_twice_changes_nothing(source: Path) -> None:
    check_golden(source)


def _out(name: str) -> str:
    return (TAIL / f"{name}.out.py").read_text()


def test_console_writes_are_guarded_and_errors_stay_on_every_process() -> None:
    out = _out("console_writes")
    assert "    sys.stderr.write(\"usage: train.py [epochs]\\n\")" in out  # outside a loop
    assert "        sys.stderr.write(\"cannot save: %s\\n\" % err)" in out  # in an except
    assert "    if distify.is_main_process():\n        sys.stdout.write(\"\\nEpoch" in out
    assert "            sys.stderr.write(\"batch %d\\r\" % batch_idx)" in out  # a progress line
    assert "            progress_bar(batch_idx" in out


def test_every_wandb_call_follows_wandb_init_and_trackers_are_built_once() -> None:
    out = _out("trackers")
    assert "if distify.is_main_process():\n    wandb.init(project=\"tail\")\n" \
        "    wandb.config.update(args)\n    wandb.run.name = " in out
    for line in ("distify.on_main_process(Logger)(", "distify.on_main_process(LossWriter)(",
                 "distify.on_main_process(TFLogger)(", "        wandb.log(",
                 "    wandb.watch(model)", "    wandb.finish()"):
        assert line in out, line
    assert "\n        logger.log_value(" in out  # the ignoring stand-in takes the calls


def test_an_unknown_logger_is_reported() -> None:
    source = textwrap.dedent("""\
        import torch
        from mylogs import RunLogger
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        log = RunLogger("runs")
        """)
    result = convert_source(source.encode(), "t.py")
    notes = [n.message for n in result.notes if n.kind == "tracker"]
    assert len(notes) == 1 and "`mylogs.RunLogger(...)` is built on every process" in notes[0]
    assert "distify.on_main_process(RunLogger)(...)" in notes[0]


def test_a_download_whose_names_are_read_later_is_reported_not_split() -> None:
    source = textwrap.dedent("""\
        import requests
        import torch
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        r = requests.get("https://example.com/w.pt")
        open("w.pt", "wb").write(r.content)
        size = len(r.content)
        """)
    result = convert_source(source.encode(), "t.py")
    out = result.output.decode()
    assert "main_process_first" not in out
    # output line (a CPU-only script: distify.init(cpu=True) follows the runtime import)
    assert [n.line for n in result.notes if n.kind == "download"] == [8]
    assert "later code reads what it binds (`r`)" in result.notes[0].message


def test_a_data_set_that_downloads_itself_is_fetched_by_the_main_process_first() -> None:
    source = textwrap.dedent("""\
        import torch
        from torch_geometric.datasets import Planetoid
        dataset = Planetoid("data", "Cora")
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        """)
    out = convert_source(source.encode(), "t.py").output.decode()
    assert "with distify.main_process_first():\n    dataset = Planetoid(" in out


def test_a_project_converts_its_helper_without_torch_and_launches_the_script(tmp_path) -> None:
    planned = plan_project(TAIL / "project", tmp_path / "out", default_rules(),
                           "distify.runtime")
    by_name = {p.source.name: p.result for p in planned}
    helper = by_name["utils.py"]
    assert (helper.status, helper.helper) == ("converted", True)
    out = helper.output.decode()
    assert "with distify.open(path, \"w\") as f:" in out
    assert "distify.print(\"class indices written to\", path)" in out
    assert "    if distify.is_main_process():\n        sys.stdout.write(\"\\r\" if" in out
    assert "\n        sys.stdout.flush()\n" in out
    entry = launch_entry([p for p in planned if p.result.status == "converted"])
    assert entry is not None and entry.source.name == "train.py"
    # a file without torch that no converted script imports stays as it is
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "notes.py").write_text("print('hello')\n")
    alone = plan_project(tmp_path / "p", None, default_rules(), "distify.runtime")
    assert alone[0].result.status == "no-torch"


# ---------------------------------------------------------------- real runs
def _archive(folder: Path) -> Path:
    """points.tar.gz holding points.csv (x1,x2,x3,y per row), served by the test."""
    rows = "".join(f"{i % 5 / 5:.1f},{i % 3 / 3:.2f},{i % 7 / 7:.2f},{i % 4 / 4:.2f}\n"
                   for i in range(40)).encode()
    path = folder / "points.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("points.csv")
        info.size = len(rows)
        tar.addfile(info, io.BytesIO(rows))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("torch")
    served = tmp_path_factory.mktemp("served")
    _archive(served)
    handler = functools.partial(_QuietHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/points.tar.gz"
    root = tmp_path_factory.mktemp("tail")
    plans = {"console_writes": Plan(), "download_unit": Plan(args=(url,))}
    project = root / "project_two"
    planned = plan_project(TAIL / "project", project, default_rules(), "distify.runtime")
    write_planned(planned, make_dirs=True)
    env = clean_env(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    try:
        done = run_side_by_side(root, TAIL, plans, also=lambda: run_torchrun(
            project / "train.py", cwd=project, env=env, replicas=True, distinct_data=True,
            timeout=300))
        done["project", "original"] = run_python(TAIL / "project" / "train.py", cwd=root,
                                                 env=env)
    finally:
        server.shutdown()
    done["project", "two"] = done.pop(("also", ""))
    done["project", "folder"] = project
    done["project", "original-folder"] = root
    return done


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def test_console_output_comes_from_the_main_process_only(runs) -> None:
    original, one, two = (runs["console_writes", v] for v in ("original", "one", "two"))
    assert one.stdout == original.stdout
    # half the batches per process, one progress line each (text mode reads "\r" as a line
    # end); the epoch lines come once
    assert two.stdout.count("Epoch:") == original.stdout.count("Epoch:") == 2
    assert two.stdout.count(" 3/4 \n") == 2 and original.stdout.count(" 7/8 \n") == 2
    assert two.stdout.count("Loss:") == 8 and original.stdout.count("Loss:") == 16
    assert two.stderr.count("batch 3\n") == 2 and "batch 4" not in two.stderr


def test_the_download_runs_once_and_every_process_reads_it(runs) -> None:
    original, one, two = (runs["download_unit", v] for v in ("original", "one", "two"))
    assert one.stdout == original.stdout == f"Downloading {_url(original)}\nrows 40\n"
    assert two.stdout == original.stdout  # downloaded and printed once; both read 40 rows


def _url(proc) -> str:
    return proc.args[2]


def test_a_project_helper_writes_and_prints_once(runs) -> None:
    two, original = runs["project", "two"], runs["project", "original"]
    assert two.stdout.count("class indices written to") == 1
    assert original.stdout.count("class indices written to") == 1
    assert two.stdout.count(" 3/3") == 2 and original.stdout.count(" 6/6") == 2
    written = (runs["project", "folder"] / "classes.json").read_text()
    assert written == (runs["project", "original-folder"] / "classes.json").read_text()


_DOWNLOAD_IN_MAIN = '''\
import tarfile

import requests
import torch

if __name__ == "__main__":
    torch.manual_seed(0)
    print("Downloading dataset...")
    with requests.get("https://example.com/cora.tgz", stream=True) as tgz_file:
        with tarfile.open(fileobj=tgz_file.raw, mode="r:gz") as tgz_object:
            tgz_object.extractall()
    features = torch.load("cora.pt")
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(3):
        loss = model(features).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def test_a_download_inside_the_main_block_is_a_unit_of_its_own() -> None:
    """pytorch/examples' gcn: the fetch sits in `if __name__ == "__main__":` with the training.
    The unit is the fetch and its extraction, never the whole block (which ran the training on
    the main process alone while the others waited at the barrier: a hang)."""
    output = convert_source(_DOWNLOAD_IN_MAIN.encode(), "gcn.py").output.decode()
    assert ("    with distify.main_process_first():\n"
            "        if distify.is_main_process():\n"
            "            with requests.get(") in output
    assert "\n    model, optimizer = distify.prepare(model, optimizer)\n" in output
    assert "\n        distify.backward(loss)\n" in output  # in the epoch loop, on every process
    assert output.count("main_process_first") == 1
