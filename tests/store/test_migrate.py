"""Migrations: a blank database gets them all; a database from the first release is upgraded in
place with its data kept; a failing migration leaves the database at its previous version."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from moetune.errors import RuntimeFailure
from moetune.kinds import RunKind
from moetune.store import migrations
from moetune.store.db import ResultsDB
from moetune.store.migrations import MIGRATIONS, migrate
from moetune.store.record import RunMeta

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "db" / "results-v1.sqlite"
FIXTURE_V2 = FIXTURE.with_name("results-v2.sqlite")
ALL = [m.__name__ for m in MIGRATIONS]


def _columns(path: Path, table: str) -> list[str]:
    c = sqlite3.connect(path)
    try:
        return [r[1] for r in c.execute(f"PRAGMA table_info({table})")]
    finally:
        c.close()


def test_blank_database_gets_every_migration(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        assert db.schema_versions() == ALL
    assert "sweep_id" in _columns(tmp_path / "r.sqlite", "runs")
    with ResultsDB.open(tmp_path / "r.sqlite") as db:  # opening again applies nothing
        assert db.schema_versions() == ALL


def test_upgrades_the_first_releases_database(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    shutil.copy(FIXTURE, path)
    assert "sweep_id" not in _columns(path, "runs")
    with ResultsDB.open(path) as db:
        assert db.schema_versions() == ALL
        r = db.run(1)
        assert (r.label, r.status, r.sweep_id) == ("cpu-moe", "done", None)
        assert r.meta.engine_build == "b11434-d1e7395"
        assert (r.meta.model.path, r.meta.model.fingerprint) == ("/models/m.gguf", "0123456789abcdef")
        assert r.meta.host.fingerprint == "fedcba9876543210"
        assert r.meta.details["workloads"] == [{"name": "short-json", "kind": "chat"}]
        samples = db.samples(1)
        assert [s["timings"]["predicted_n"] for s in samples] == [61, 61, 61]
        rid = db.create_run(RunMeta(kind=RunKind("bench")), label="new", target="t", sweep_id=None)
        assert rid == 2


def test_every_kinds_metadata_becomes_the_one_record(tmp_path: Path) -> None:
    """The second release wrote each kind's metadata in its own shape (hardware a dict for bench, a
    fingerprint string for serve-bench, a file name for link-test); after m003 all read as RunMeta."""
    path = tmp_path / "v2.sqlite"
    shutil.copy(FIXTURE_V2, path)
    with ResultsDB.open(path) as db:
        bench, serve, link = db.run(1), db.run(2), db.run(3)
    assert bench.meta.server is not None and serve.meta.server is not None
    assert (bench.meta.server.build, bench.meta.server.slots, bench.meta.server.n_ctx_slot) == (
        "b11434-d1e7395",
        1,
        4096,
    )
    assert bench.meta.host.facts["cpu"] == "Xeon" and bench.meta.launch_run == "20261120-100000-abcd"
    assert (serve.meta.server.slots, serve.meta.server.n_ctx_slot, serve.meta.server.url) == (
        2,
        2048,
        "http://127.0.0.1:8080",
    )
    assert (serve.meta.model.name, serve.meta.model.fingerprint) == ("m", "0123456789abcdef")
    assert serve.meta.host.fingerprint == "fedcba9876543210"
    assert serve.meta.details["workload"]["input_len"] == 64 and serve.meta.details["run_tag"] == "ab12"
    assert link.meta.host.hardware_file == "two-hosts" and link.meta.server is None
    assert link.meta.details["addr"] == "10.9.0.2"
    for r in (bench, serve, link):
        assert r.meta.kind == r.kind
        assert RunMeta.from_json(r.meta.to_json(), r.kind) == r.meta  # written and read the same way


def test_the_fixture_itself_is_untouched_by_the_suite() -> None:
    assert _columns(FIXTURE, "runs")[-1] == "summary"


def test_a_failing_migration_rolls_back_with_its_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "old.sqlite"
    shutil.copy(FIXTURE, path)

    def m003_broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half_done (x)")
        raise sqlite3.OperationalError("disk on fire")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*MIGRATIONS, m003_broken])
    with pytest.raises(RuntimeFailure, match="disk on fire"):
        ResultsDB.open(path)
    c = sqlite3.connect(path, isolation_level=None)
    names = [r[0] for r in c.execute("SELECT name FROM _migrations ORDER BY rowid")]
    tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    c.close()
    assert names == ALL  # m002 committed before, m003 not at all
    assert "half_done" not in tables


def test_a_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    ResultsDB.open(path).close()
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("INSERT INTO _migrations VALUES ('m999_future', 'x')")
    c.close()
    with pytest.raises(RuntimeFailure, match="m999_future"):
        ResultsDB.open(path)


def test_migrate_is_idempotent_on_a_raw_connection(tmp_path: Path) -> None:
    c = sqlite3.connect(tmp_path / "r.sqlite", isolation_level=None)
    assert migrate(c) == ALL
    assert migrate(c) == []
    c.close()
