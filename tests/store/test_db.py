"""The results store: runs, samples committed one by one, reading back, references."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from moetune.errors import InputError
from moetune.kinds import RunKind
from moetune.paths import default_db
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta, ServerInfo


def test_default_location_is_the_data_directory(moetune_home: Path) -> None:
    with ResultsDB.open() as db:
        assert db.path == default_db() == moetune_home / "results.sqlite"
    assert (moetune_home / "results.sqlite").exists()


def test_creates_missing_directories(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "a" / "b" / "r.sqlite") as db:
        assert db.runs() == []


def test_run_life_cycle(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        meta = RunMeta(
            kind=RunKind.BENCH,
            argv=("moetune", "bench"),
            server=ServerInfo(url="http://x:1", slots=2),
            details={"workloads": []},
        )
        rid = db.create_run(meta, label="cpu-moe", target="http://x:1")
        assert db.run(rid).status == "running"
        assert [db.add_sample(rid, {"i": i}) for i in range(3)]
        db.add_sample(rid, {"w": 1}, phase="warmup")
        db.finish_run(rid, summary={"tg": {"median": 1.0}})
        r = db.run(rid)
        assert (r.kind, r.label, r.target, r.status) == ("bench", "cpu-moe", "http://x:1", "done")
        assert r.meta == meta  # the typed record read back as written
        assert r.summary == {"tg": {"median": 1.0}}
        assert r.finished_at is not None
        assert db.samples(rid) == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert db.samples(rid, "warmup") == [{"w": 1}]
        assert len(db.samples(rid, None)) == 4
        assert [(s.phase, s.seq) for s in db.sample_rows(rid)] == [
            ("measure", 0),
            ("measure", 1),
            ("measure", 2),
            ("warmup", 0),
        ]
        assert db.sample_counts(rid) == {"measure": 3, "warmup": 1}


def test_samples_are_committed_as_they_arrive(tmp_path: Path) -> None:
    """Another connection sees each sample at once: a killed writer loses nothing it added."""
    path = tmp_path / "r.sqlite"
    db = ResultsDB.open(path)
    rid = db.create_run(RunMeta(kind=RunKind("bench")), label="x", target="u")
    db.add_sample(rid, {"n": 1})
    reader = sqlite3.connect(path)
    assert reader.execute("SELECT COUNT(*) FROM samples WHERE run_id = ?", (rid,)).fetchone()[0] == 1
    db.add_sample(rid, {"n": 2})
    assert reader.execute("SELECT COUNT(*) FROM samples WHERE run_id = ?", (rid,)).fetchone()[0] == 2
    reader.close()
    # the writer goes away without finishing: the run stays "running", its samples stay
    del db
    with ResultsDB.open(path) as again:
        assert again.run(rid).status == "running"
        assert again.samples(rid) == [{"n": 1}, {"n": 2}]


def test_runs_newest_first_filtered_and_limited(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        a = db.create_run(RunMeta(kind=RunKind("bench")), label="a", target="t")
        b = db.create_run(RunMeta(kind=RunKind("serve-bench")), label="b", target="t")
        db.create_sweep("sw-1", {"plans": []})
        c = db.create_run(RunMeta(kind=RunKind("bench")), label="c", target="t", sweep_id="sw-1")
        assert [r.id for r in db.runs()] == [c, b, a]
        assert [r.id for r in db.runs(kind="bench")] == [c, a]
        assert [r.id for r in db.runs(limit=1)] == [c]
        assert [r.id for r in db.runs(sweep_id="sw-1")] == [c]
        assert db.sweep("sw-1") == {"plans": []}
        assert db.create_sweep("sw-1", {"plans": ["x"]}) is False  # resumed sweep keeps its record


@pytest.mark.parametrize(("ref", "label"), [("1", "a"), ("latest", "b2"), ("a", "a"), ("b", "b")])
def test_resolve_by_id_label_or_latest(tmp_path: Path, ref: str, label: str) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        for lab in ("a", "b", "b2"):
            db.create_run(RunMeta(kind=RunKind("bench")), label=lab, target="t")
        assert db.resolve(ref).label == label


def test_unknown_references_are_input_errors(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        with pytest.raises(InputError, match="no runs"):
            db.resolve("latest")
        with pytest.raises(InputError, match="no run 7"):
            db.run(7)
        with pytest.raises(InputError, match="nope"):
            db.resolve("nope")


def test_bad_kind_status_and_values_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nonsense"):
        RunKind("nonsense")
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        rid = db.create_run(RunMeta(kind=RunKind("link-test")), label="x", target="t")
        with pytest.raises(ValueError, match="great"):
            db.finish_run(rid, "great")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            db.add_sample(rid, {"x": float("nan")})  # raw samples stay valid JSON
        assert db.samples(rid) == []


def test_samples_stream_a_batch_at_a_time_as_they_were_stored(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "h.sqlite") as db:
        rid = db.create_run(RunMeta(kind=RunKind.SERVE_BENCH), label="x", target="t")
        other = db.create_run(RunMeta(kind=RunKind.SERVE_BENCH), label="y", target="t")
        for i in range(7):
            db.add_sample(rid, {"i": i}, phase="warmup" if i == 2 else "measure")
            db.add_sample(other, {"i": -i})
        whole = db.sample_rows(rid)
        assert [r.data["i"] for r in whole] == list(range(7))
        for batch in (1, 2, 3, 7, 100):
            assert list(db.iter_sample_rows(rid, batch=batch)) == whole
            assert [r.data["i"] for r in db.iter_sample_rows(rid, "measure", batch=batch)] == [0, 1, 3, 4, 5, 6]
            assert [s["i"] for s in db.iter_samples(rid, batch=batch)] == [0, 1, 3, 4, 5, 6]
        assert db.sample_rows(rid, "warmup")[0].data == {"i": 2}
