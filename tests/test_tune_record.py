"""A tune's sweep record as stored (``sweeps.spec``): its shape, key by key, and its one reader."""

from __future__ import annotations

from pathlib import Path

from moetune.store.db import ResultsDB
from moetune.tune.record import TuneRecord

GOLDEN = {
    "kind": "tune",
    "objective": "goodput",
    "hw": "hw.yaml",
    "model": "m.gguf",
    "workload": {"name": "short", "depth": 0},
    "candidates": ["auto t4", "cpu-moe t4"],
    "failed": {"cpu-moe t4": "out of memory"},
    "serve": {"concurrency": 4, "requests": 16},
    "work": None,
    "weighted": None,
}


def _record() -> TuneRecord:
    return TuneRecord(
        objective="goodput",
        hw="hw.yaml",
        model="m.gguf",
        workload={"name": "short", "depth": 0},
        candidates=("auto t4", "cpu-moe t4"),
        failed={"cpu-moe t4": "out of memory"},
        serve={"concurrency": 4, "requests": 16},
    )


def test_the_stored_shape() -> None:
    doc = _record().to_json()
    assert doc == GOLDEN and list(doc) == list(GOLDEN)


def test_stored_and_read_back_through_the_history(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        assert db.create_sweep("tu-1", _record().to_json())
        assert not db.create_sweep("tu-1", _record().to_json())  # a resumed search finds it
        stored = db.sweep("tu-1")
        assert stored is not None and TuneRecord.from_json(stored) == _record()


def test_a_damaged_record_reads_as_empty_parts() -> None:
    r = TuneRecord.from_json({"objective": "tg", "failed": ["x"], "candidates": "abc", "serve": 3})
    assert (r.objective, r.failed, r.candidates, r.serve, r.workload) == ("tg", {}, (), None, {})
