"""The results database's schema, as an append-only list of migrations.

Rules (as simonw/llm and sqlite-utils keep them): a released migration is never edited or
reordered; a change to the schema is a new function appended to ``MIGRATIONS``. Each migration
runs in one transaction together with the row that records it, so a crash leaves the database at
the previous version, never half-way. ``tests/store/test_migrate.py`` upgrades a checked-in
database written by the first release (``tests/fixtures/db/``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

Migration = Callable[[sqlite3.Connection], None]


def m001_runs_and_samples(db: sqlite3.Connection) -> None:
    db.execute("""
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            kind TEXT NOT NULL,            -- bench | serve-bench | link-test
            label TEXT NOT NULL,
            target TEXT NOT NULL,          -- URL or plan file
            meta TEXT NOT NULL,            -- JSON: plan, argv, engine build, fingerprints, workload
            status TEXT NOT NULL,          -- running | done | interrupted | failed
            created_at TEXT NOT NULL,      -- ISO 8601, UTC
            finished_at TEXT,
            summary TEXT                   -- JSON, written by finish_run; figures are derived on read
        )""")
    db.execute("""
        CREATE TABLE samples (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            phase TEXT NOT NULL,           -- warmup | measure | fill | ...
            seq INTEGER NOT NULL,          -- order within (run, phase), from 0
            created_at TEXT NOT NULL,
            data TEXT NOT NULL             -- JSON of raw values: timestamps, counters, server timings
        )""")
    db.execute("CREATE INDEX samples_by_run ON samples(run_id, phase, seq)")
    db.execute("CREATE INDEX runs_by_kind ON runs(kind, id)")


def m002_sweeps(db: sqlite3.Connection) -> None:
    db.execute("""
        CREATE TABLE sweeps (
            id TEXT PRIMARY KEY,           -- derived from the sweep's plans and options: same command, same id
            created_at TEXT NOT NULL,
            spec TEXT NOT NULL             -- JSON: labels, plan files, bench options
        )""")
    db.execute("ALTER TABLE runs ADD COLUMN sweep_id TEXT REFERENCES sweeps(id)")
    db.execute("CREATE INDEX runs_by_sweep ON runs(sweep_id, label)")


def _v1_to_v2(kind: str, d: dict[str, Any]) -> dict[str, Any]:
    """One run's metadata in the record every kind writes from schema 2 on (``store/record.py``).
    Frozen with this migration: the shapes the first release wrote, one per kind."""

    def obj(x: Any) -> dict[str, Any]:
        return x if isinstance(x, dict) else {}

    srv = obj(d.get("server"))
    known = (
        "schema_version",
        "moetune_version",
        "argv",
        "plan",
        "server",
        "engine_build",
        "model",
        "model_fingerprint",
        "hardware",
        "hardware_fingerprint",
        "launch_run",
        "started_unix",
        "target",
    )
    out: dict[str, Any] = {
        "schema_version": 2,
        "kind": kind,
        "moetune_version": d.get("moetune_version") or "",
        "argv": d.get("argv") or [],
        "started_unix": d.get("started_unix"),
        "server": None,
        "model": {"path": None, "fingerprint": None, "name": None, "note": None},
        "host": {"fingerprint": None, "facts": {}, "hardware_file": None},
        "engine_build": d.get("engine_build"),
        "plan": d.get("plan"),
        "launch_run": d.get("launch_run"),
        "details": {k: v for k, v in d.items() if k not in known},
    }
    if kind == "bench":
        if srv:
            out["server"] = {
                "url": srv.get("url") or "",
                "dialect": "llama.cpp" if srv.get("props") else "openai",
                "build": srv.get("build_info"),
                "model_path": srv.get("model_path"),
                "model_alias": srv.get("model_alias"),
                "slots": srv.get("total_slots"),
                "n_ctx_slot": srv.get("n_ctx"),
                "busy_slots": None,
                "props": obj(srv.get("props")),
            }
        m = obj(d.get("model"))
        out["model"].update(path=m.get("path"), fingerprint=m.get("fingerprint"), note=m.get("note"))
        out["host"].update(fingerprint=d.get("hardware_fingerprint"), facts=obj(d.get("hardware")))
    elif kind == "serve-bench":
        if srv:
            out["server"] = {
                "url": d.get("target") or "",
                "props": {},
                **{
                    k: srv.get(k)
                    for k in ("dialect", "build", "model_path", "model_alias", "slots", "n_ctx_slot", "busy_slots")
                },
            }
        out["model"].update(
            path=srv.get("model_path"),
            fingerprint=d.get("model_fingerprint"),
            name=d.get("model") if isinstance(d.get("model"), str) else None,
        )
        out["host"]["fingerprint"] = d.get("hardware") if isinstance(d.get("hardware"), str) else None
    elif kind == "link-test":
        out["host"]["hardware_file"] = d.get("hardware") if isinstance(d.get("hardware"), str) else None
    return out


def m003_one_run_record(db: sqlite3.Connection) -> None:
    """Every kind of run stored its metadata in its own shape; rewrite them all as schema 2."""
    rows = db.execute("SELECT id, kind, meta FROM runs").fetchall()
    for run_id, kind, meta in rows:
        try:
            d = json.loads(meta)
        except ValueError:
            d = {}
        if not isinstance(d, dict) or d.get("schema_version") == 2:
            continue
        db.execute(
            "UPDATE runs SET meta = ? WHERE id = ?",
            (json.dumps(_v1_to_v2(kind, d), separators=(",", ":"), default=str), run_id),
        )


def m004_metrics(db: sqlite3.Connection) -> None:
    """What the machine did during each run, about once a second (``moetune.monitor``)."""
    db.execute("""
        CREATE TABLE metrics (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            t REAL NOT NULL,               -- wall clock, seconds since the epoch
            data TEXT NOT NULL             -- JSON: moetune.monitor.snapshot.Snapshot
        )""")
    db.execute("CREATE INDEX metrics_by_run ON metrics(run_id, t)")


def m005_run_writer(db: sqlite3.Connection) -> None:
    """Which process writes each run (pid, start ticks, host): a run left ``running`` by a writer
    that is gone (killed) reads as abandoned."""
    db.execute("ALTER TABLE runs ADD COLUMN writer TEXT")


def m006_run_contention(db: sqlite3.Connection) -> None:
    """Where the machine's CPU went while each run measured (``moetune.contention.Contention``):
    the engine's, moetune's, and the foreign load that flags a run contended."""
    db.execute("ALTER TABLE runs ADD COLUMN contention TEXT")


def m007_kld_bases(db: sqlite3.Connection) -> None:
    """The reference logits `moetune quality` saved (``llama-perplexity --kl-divergence-base``):
    one file per reference plan, evaluation text and chunking, reused by every candidate."""
    db.execute("""
        CREATE TABLE kld_bases (
            key TEXT PRIMARY KEY,          -- hash of the reference's perplexity argv, model file, text, engine
            path TEXT NOT NULL,            -- the logits file
            size_bytes INTEGER NOT NULL,
            run_id INTEGER REFERENCES runs(id),  -- the reference's quality run that wrote it
            created_at TEXT NOT NULL
        )""")


def m008_run_services(db: sqlite3.Connection) -> None:
    """The services of a layout run (`serve-bench LAYOUT_PLAN --load SERVICE=SPEC`): one row per
    service it drove, with what that service is (its server's answers, model, launch) and its
    workload; the run's samples name their service (``data.service``)."""
    db.execute("""
        CREATE TABLE run_services (
            run_id INTEGER NOT NULL REFERENCES runs(id),
            name TEXT NOT NULL,            -- the plan's server name
            position INTEGER NOT NULL,     -- in the order the --load options gave them
            meta TEXT NOT NULL,            -- JSON: moetune.store.record.ServiceRecord
            PRIMARY KEY (run_id, name)
        )""")


MIGRATIONS: list[Migration] = [
    m001_runs_and_samples,
    m002_sweeps,
    m003_one_run_record,
    m004_metrics,
    m005_run_writer,
    m006_run_contention,
    m007_kld_bases,
    m008_run_services,
]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def applied(db: sqlite3.Connection) -> list[str]:
    db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    return [r[0] for r in db.execute("SELECT name FROM _migrations ORDER BY rowid")]


def migrate(db: sqlite3.Connection) -> list[str]:
    """Apply every migration not yet recorded; return the names applied now.

    The connection must be in autocommit mode (``isolation_level=None``): each migration is run
    inside its own explicit ``BEGIN IMMEDIATE`` … ``COMMIT``.
    """
    done = set(applied(db))
    known = [m.__name__ for m in MIGRATIONS]
    unknown = done - set(known)
    if unknown:
        raise sqlite3.DatabaseError(f"database has migrations this moetune does not know: {sorted(unknown)}")
    now: list[str] = []
    for m in MIGRATIONS:
        if m.__name__ in done:
            continue
        db.execute("BEGIN IMMEDIATE")
        try:
            # another process may have migrated between our read and the lock
            if db.execute("SELECT 1 FROM _migrations WHERE name = ?", (m.__name__,)).fetchone():
                db.execute("COMMIT")
                continue
            m(db)
            db.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (m.__name__, now_iso()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        now.append(m.__name__)
    return now
