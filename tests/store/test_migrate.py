"""Migrations: a blank database gets them all; a database from the first release is upgraded in
place with its data kept; a failing migration leaves the database at its previous version."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from moetune.errors import RuntimeFailure
from moetune.store import migrations
from moetune.store.db import ResultsDB
from moetune.store.migrations import MIGRATIONS, migrate

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "db" / "results-v1.sqlite"
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
        assert r.meta["engine_build"] == "b11434-d1e7395"
        samples = db.samples(1)
        assert [s["timings"]["predicted_n"] for s in samples] == [61, 61, 61]
        rid = db.create_run(kind="bench", label="new", target="t", meta={}, sweep_id=None)
        assert rid == 2


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
