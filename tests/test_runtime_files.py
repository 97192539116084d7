"""``distify.open`` and ``distify.reduce_meters`` in one process, with the main process's and the
other processes' side simulated (their 2-process behaviour: tests/test_metrics_e2e.py)."""

from __future__ import annotations

import json
import pickle

import pytest

import distify.runtime as distify
from distify.runtime import _io, _state
from tests import test_runtime_unit
from tests.helpers import simulated_rank

fresh = test_runtime_unit.fresh  # a runtime not initialised yet, no launcher in the environment
pytestmark = pytest.mark.usefixtures("fresh")


def _as_rank(monkeypatch, rank: int) -> None:
    """This process as ``rank`` of 2 (no process group: nothing here may communicate)."""
    monkeypatch.setattr(_state, "_RUNTIME", simulated_rank(rank))
    monkeypatch.setattr(_state, "shared_store", lambda: None)


def test_a_write_is_atomic_and_leaves_nothing_behind(tmp_path) -> None:
    target = tmp_path / "history.json"
    target.write_text("previous")
    with distify.open(target, "w") as f:
        json.dump({"epoch": 1}, f)
        assert f.name == str(target)
        assert target.read_text() == "previous"  # not replaced before the file is complete
    assert json.loads(target.read_text()) == {"epoch": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.json"]


def test_an_error_inside_the_with_keeps_the_previous_file(tmp_path) -> None:
    target = tmp_path / "model.pkl"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="boom"), distify.open(target, "wb") as f:
        f.write(b"half")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pkl"]


def test_a_dropped_file_object_is_finished(tmp_path) -> None:
    target = tmp_path / "model.pkl"
    pickle.dump({"w": 1}, distify.open(target, "wb"))  # closed when dropped, as open() is
    assert pickle.loads(target.read_bytes()) == {"w": 1}


def test_exclusive_mode_and_appends_behave_as_the_builtin(tmp_path) -> None:
    target = tmp_path / "log.txt"
    with distify.open(target, "x") as f:
        f.write("a\n")
    with pytest.raises(FileExistsError):
        distify.open(target, "x")
    with distify.open(target, "a") as f:
        f.write("b\n")
    with distify.open(target) as f:
        assert f.read() == "a\nb\n"


def test_other_processes_write_into_nothing(tmp_path, monkeypatch) -> None:
    _as_rank(monkeypatch, 1)
    target = tmp_path / "results.json"
    target.write_text("the main process's")
    with distify.open(target, "w") as f:
        json.dump({"rank": 1}, f)
        assert f.name == str(target)
    with distify.open(target, "a") as f:
        f.write("more")
    with distify.open(target, "wb") as f:
        pickle.dump([1, 2], f)
        assert f.tell() > 0
    assert target.read_text() == "the main process's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_a_read_of_a_written_path_waits_for_the_main_process(tmp_path, monkeypatch) -> None:
    _as_rank(monkeypatch, 1)
    met = []
    monkeypatch.setattr(_io._collectives, "wait_for_everyone", lambda: met.append(True))
    target = tmp_path / "h.json"
    target.write_text("{}")
    with distify.open(target) as f:  # never written in this run: no wait
        f.read()
    assert met == []
    with distify.open(target, "w") as f:
        f.write("{}")
    with distify.open(target) as f:  # written: meets the main process first (no store here)
        f.read()
    assert met == [True]


class AverageMeter:
    def __init__(self):
        self.sum, self.count, self.avg = 0.0, 0, 0.0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def test_reduce_meters_leaves_a_single_process_alone() -> None:
    meter = AverageMeter()
    meter.update(0.5, 4)
    distify.reduce_meters(meter)
    assert (meter.sum, meter.count, meter.avg) == (2.0, 4, 0.5)


def test_reduce_meters_names_a_meter_without_totals() -> None:
    class Averager:
        def __init__(self):
            self.total = 0.0

    with pytest.raises(distify.DistifyTypeError, match=r"Averager has no numeric `\.sum`"):
        distify.reduce_meters(AverageMeter(), Averager())


def test_gather_for_metrics_takes_numpy_arrays() -> None:
    np = pytest.importorskip("numpy")
    values = np.arange(4)
    assert distify.gather_for_metrics(values) is values  # one process: the value itself
