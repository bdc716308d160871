"""The results history: every run moetune measured, with its context and every raw sample.

One SQLite file (``moetune.paths.default_db()`` unless a path is given), migrated on open.
Samples are committed one by one as they arrive, so an interrupted run keeps every sample it
completed. Samples hold raw values only (timestamps, counters, the server's ``timings``);
figures such as tokens/s are derived when read (:mod:`moetune.bench.analysis.single`).

Each run keeps its kind and status as columns (:class:`~moetune.kinds.RunKind`,
:class:`~moetune.kinds.RunStatus`) and its context as one typed record
(:class:`~moetune.store.record.RunMeta`), the same for every kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from moetune.contention import Contention, RunFlags, run_flags
from moetune.errors import InputError, RuntimeFailure
from moetune.kinds import RunKind, RunStatus
from moetune.paths import default_db
from moetune.procfs import own_start_ticks, read_proc_stat
from moetune.store.migrations import migrate, now_iso
from moetune.store.record import RunMeta, ServiceRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class Writer:
    """The process that writes a run (the ``writer`` column): a run left ``running`` by one that is
    gone was abandoned."""

    pid: int
    start_ticks: int | None
    host: str

    @classmethod
    def own(cls) -> Writer:
        return cls(pid=os.getpid(), start_ticks=own_start_ticks(), host=socket.gethostname())

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Writer:
        pid, ticks = d.get("pid"), d.get("start_ticks")
        return cls(
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else 0,
            start_ticks=ticks if isinstance(ticks, int) and not isinstance(ticks, bool) else None,
            host=str(d.get("host") or ""),
        )

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "host": self.host}


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    id: int
    kind: RunKind
    label: str
    target: str
    meta: RunMeta
    status: RunStatus
    created_at: str
    finished_at: str | None
    summary: dict[str, Any] | None  # as the run kind's writer stored it (bench: BenchSummary.to_json())
    sweep_id: str | None
    writer: Writer | None = None  # the process writing it
    contention: Contention | None = None  # where the CPU went while it measured (None: not counted)

    def flags(self) -> RunFlags:
        """Contended (stored) and noisy (from the summary it stored)."""
        return run_flags(self.contention, self.summary if self.kind == RunKind.BENCH else None)

    @property
    def abandoned(self) -> bool:
        """Left ``running`` by a moetune process that is gone (killed): it will never finish. Its
        samples are kept; a sweep or tune measures it again."""
        w = self.writer
        if self.status != RunStatus.RUNNING or w is None or w.host != socket.gethostname() or not w.pid:
            return False
        st = read_proc_stat(w.pid)
        return st is None or st.state in ("Z", "X") or st.start_ticks != w.start_ticks

    def header(self) -> dict[str, object]:
        """The run as every command's ``--json`` names it (``"run": {...}``)."""
        return {
            "id": self.id,
            "kind": str(self.kind),
            "label": self.label,
            "target": self.target,
            "status": str(self.status),
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "sweep_id": self.sweep_id,
            "abandoned": self.abandoned,
            **self._flag_fields(),
            **({"launch": self.meta.launch.to_json()} if self.meta.launch is not None else {}),
        }

    def _flag_fields(self) -> dict[str, object]:
        f = self.flags()
        return {"contended": f.contended, "noisy": bool(f.noisy)}

    def to_json(self) -> dict[str, object]:
        return {**self.header(), "meta": self.meta.to_json(), "summary": self.summary, "flags": self.flags().to_json()}


@dataclass(frozen=True, slots=True, kw_only=True)
class SampleRow:
    id: int
    run_id: int
    phase: str
    seq: int
    created_at: str
    data: dict[str, object]


def _dumps(doc: Any) -> str:
    return json.dumps(doc, allow_nan=False, separators=(",", ":"), default=str)


class ResultsDB:
    """A connection to the results database. Use :meth:`open`; close it (or use ``with``)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.path = path

    @classmethod
    def open(cls, path: Path | None = None) -> ResultsDB:
        p = Path(path) if path is not None else default_db()
        conn: sqlite3.Connection | None = None
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(p, isolation_level=None, check_same_thread=False, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            migrate(conn)
        except sqlite3.DatabaseError as e:
            if conn is not None:
                conn.close()
            raise RuntimeFailure(
                f"results database {p}: {e}", hint="choose another file with --db, or move this one aside"
            ) from None
        except OSError as e:
            raise InputError(f"results database {p}: {e}", hint="choose a writable location with --db") from None
        return cls(conn, p)

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write the disk or another writer refuses becomes one clear error; SQLite rolls the
        statement back, so what was stored before stays as it was."""
        try:
            yield
        except sqlite3.OperationalError as e:
            msg = str(e)
            if "full" in msg:
                hint = "free space on that disk (what was stored before is intact), or use another file with --db"
            elif "locked" in msg or "busy" in msg:
                hint = (
                    "another process held the database for more than 30 s: wait for it (`moetune ps`, "
                    "`lsof FILE`), or use another file with --db"
                )
            else:
                hint = "choose another file with --db, or move this one aside"
            raise RuntimeFailure(f"results database {self.path}: {msg}", hint=hint) from None

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------

    def create_run(self, meta: RunMeta, *, label: str, target: str, sweep_id: str | None = None) -> int:
        with self._lock, self._writing():
            writer = Writer.own().to_json()
            cur = self._conn.execute(
                "INSERT INTO runs (kind, label, target, meta, status, created_at, sweep_id, writer) "
                "VALUES (?, ?, ?, ?, 'running', ?, ?, ?)",
                (str(meta.kind), label, target, _dumps(meta.to_json()), now_iso(), sweep_id, _dumps(writer)),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def add_sample(self, run_id: int, data: Mapping[str, object], *, phase: str = "measure") -> int:
        """Store one raw sample; committed before this returns."""
        with self._lock, self._writing():
            cur = self._conn.execute(
                "INSERT INTO samples (run_id, phase, seq, created_at, data) "
                "SELECT ?, ?, COALESCE(MAX(seq) + 1, 0), ?, ? FROM samples WHERE run_id = ? AND phase = ?",
                (run_id, phase, now_iso(), _dumps(data), run_id, phase),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def add_service(self, run_id: int, rec: ServiceRecord) -> None:
        """Record one service of a layout run (``run_services``)."""
        with self._lock, self._writing():
            self._conn.execute(
                "INSERT INTO run_services (run_id, name, position, meta) VALUES (?, ?, ?, ?)",
                (run_id, rec.name, rec.position, _dumps(rec.to_json())),
            )

    def set_contention(self, run_id: int, c: Contention | None) -> None:
        """Store where the CPU went while the run measured (``moetune.contention``)."""
        with self._lock, self._writing():
            self._conn.execute(
                "UPDATE runs SET contention = ? WHERE id = ?", (None if c is None else _dumps(c.to_json()), run_id)
            )

    def finish_run(
        self, run_id: int, status: RunStatus = RunStatus.DONE, summary: Mapping[str, object] | None = None
    ) -> None:
        status = RunStatus(status)
        with self._lock, self._writing():
            self._conn.execute(
                "UPDATE runs SET status = ?, finished_at = ?, summary = ? WHERE id = ?",
                (str(status), now_iso(), None if summary is None else _dumps(summary), run_id),
            )

    def add_metrics(self, run_id: int, t: float, data: Mapping[str, object]) -> None:
        """Store one snapshot of the machine (``moetune.monitor.snapshot.Snapshot.to_json()``)."""
        with self._lock, self._writing():
            self._conn.execute("INSERT INTO metrics (run_id, t, data) VALUES (?, ?, ?)", (run_id, t, _dumps(data)))

    def create_sweep(self, sweep_id: str, spec: Mapping[str, object]) -> bool:
        """Record a sweep; False when it exists already (a resumed sweep)."""
        with self._lock, self._writing():
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO sweeps (id, created_at, spec) VALUES (?, ?, ?)",
                (sweep_id, now_iso(), _dumps(spec)),
            )
            return cur.rowcount == 1

    def update_sweep(self, sweep_id: str, spec: Mapping[str, object]) -> None:
        """Rewrite a sweep's record (a tune's state: the candidates that failed, and why)."""
        with self._lock, self._writing():
            self._conn.execute("UPDATE sweeps SET spec = ? WHERE id = ?", (_dumps(spec), sweep_id))

    def put_kld_base(self, key: str, path: Path, size_bytes: int, run_id: int) -> None:
        """Record the reference logits a quality run saved (replacing an older record of the key)."""
        with self._lock, self._writing():
            self._conn.execute(
                "INSERT OR REPLACE INTO kld_bases (key, path, size_bytes, run_id, created_at) VALUES (?, ?, ?, ?, ?)",
                (key, str(path), size_bytes, run_id, now_iso()),
            )

    # -- reading ---------------------------------------------------------------------------

    def kld_base(self, key: str) -> tuple[Path, int, int | None] | None:
        """(file, size in bytes, the reference's run) of saved reference logits, if recorded."""
        row = self._conn.execute("SELECT path, size_bytes, run_id FROM kld_bases WHERE key = ?", (key,)).fetchone()
        return None if row is None else (Path(row[0]), int(row[1]), None if row[2] is None else int(row[2]))

    _RUN_COLS = "id, kind, label, target, meta, status, created_at, finished_at, summary, sweep_id, writer, contention"

    @staticmethod
    def _run(row: tuple[Any, ...]) -> Run:
        kind = RunKind(row[1])
        return Run(
            id=int(row[0]),
            kind=kind,
            label=row[2],
            target=row[3],
            meta=RunMeta.from_json(json.loads(row[4]), kind),
            status=RunStatus(row[5]),
            created_at=row[6],
            finished_at=row[7],
            summary=None if row[8] is None else json.loads(row[8]),
            sweep_id=row[9],
            writer=None if row[10] is None else Writer.from_json(json.loads(row[10])),
            contention=None if row[11] is None else Contention.from_json(json.loads(row[11])),
        )

    def run(self, run_id: int) -> Run:
        row = self._conn.execute(f"SELECT {self._RUN_COLS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise InputError(f"no run {run_id} in {self.path}", hint="see `moetune results list`")
        return self._run(row)

    def runs(
        self,
        kind: RunKind | None = None,
        limit: int | None = None,
        *,
        sweep_id: str | None = None,
        status: RunStatus | None = None,
    ) -> list[Run]:
        """Runs, newest first."""
        q = f"SELECT {self._RUN_COLS} FROM runs"
        where, args = [], []
        if kind is not None:
            where.append("kind = ?")
            args.append(str(kind))
        if sweep_id is not None:
            where.append("sweep_id = ?")
            args.append(sweep_id)
        if status is not None:
            where.append("status = ?")
            args.append(str(status))
        if where:
            q += " WHERE " + " AND ".join(where)
        q += " ORDER BY id DESC"
        if limit is not None:
            q += f" LIMIT {int(limit)}"
        return [self._run(r) for r in self._conn.execute(q, args)]

    def resolve(self, ref: str) -> Run:
        """A run by id, ``latest``, or label (the newest run with that label)."""
        if ref.isdigit():
            return self.run(int(ref))
        if ref == "latest":
            rows = self.runs(limit=1)
            if not rows:
                raise InputError(f"no runs in {self.path} yet", hint="run `moetune bench URL` first")
            return rows[0]
        row = self._conn.execute(
            f"SELECT {self._RUN_COLS} FROM runs WHERE label = ? ORDER BY id DESC LIMIT 1", (ref,)
        ).fetchone()
        if row is None:
            raise InputError(f"no run with id or label {ref!r} in {self.path}", hint="see `moetune results list`")
        return self._run(row)

    def samples(self, run_id: int, phase: str | None = "measure") -> list[dict[str, object]]:
        """Raw sample data of a run in the order recorded; ``phase=None`` for every phase."""
        return [r.data for r in self.sample_rows(run_id, phase)]

    def iter_samples(
        self, run_id: int, phase: str = "measure", *, from_seq: int = 0, batch: int = 256
    ) -> Iterator[dict[str, object]]:
        """Raw sample data of one phase of a run, from its ``from_seq``-th sample on, read a batch at a
        time: a long run's samples, streamed without holding them all (or the connection) at once."""
        seq = from_seq
        while True:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT seq, data FROM samples WHERE run_id = ? AND phase = ? AND seq >= ? ORDER BY seq LIMIT ?",
                    (run_id, phase, seq, batch),
                ).fetchall()
            for _, data in rows:
                yield json.loads(data)
            if len(rows) < batch:
                return
            seq = rows[-1][0] + 1

    def sample_rows(self, run_id: int, phase: str | None = None) -> list[SampleRow]:
        return list(self.iter_sample_rows(run_id, phase, batch=1 << 30))

    def iter_sample_rows(self, run_id: int, phase: str | None = None, *, batch: int = 256) -> Iterator[SampleRow]:
        """A run's samples (of every phase, or of ``phase``) as stored, in the order stored, read a
        batch at a time."""
        after = 0
        where = " AND phase = ?" if phase is not None else ""
        while True:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT id, run_id, phase, seq, created_at, data FROM samples WHERE run_id = ? AND id > ?"
                    f"{where} ORDER BY id LIMIT ?",
                    (run_id, after, *((phase,) if phase is not None else ()), batch),
                ).fetchall()
            for r in rows:
                yield SampleRow(id=r[0], run_id=r[1], phase=r[2], seq=r[3], created_at=r[4], data=json.loads(r[5]))
            if len(rows) < batch:
                return
            after = rows[-1][0]

    def services(self, run_id: int) -> list[ServiceRecord]:
        """The services of a layout run in their order; none for a run of one server."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT meta FROM run_services WHERE run_id = ? ORDER BY position, name", (run_id,)
            ).fetchall()
        return [ServiceRecord.from_json(json.loads(r[0])) for r in rows]

    def sample_counts(self, run_id: int) -> dict[str, int]:
        return {
            r[0]: r[1]
            for r in self._conn.execute(
                "SELECT phase, COUNT(*) FROM samples WHERE run_id = ? GROUP BY phase", (run_id,)
            )
        }

    def metrics(self, run_id: int) -> list[dict[str, object]]:
        """A run's snapshots of the machine, oldest first (JSON as stored; read them with
        ``Snapshot.from_json``)."""
        return [
            json.loads(r[0])
            for r in self._conn.execute("SELECT data FROM metrics WHERE run_id = ? ORDER BY t, id", (run_id,))
        ]

    def latest_metrics(self, run_id: int) -> dict[str, object] | None:
        row = self._conn.execute(
            "SELECT data FROM metrics WHERE run_id = ? ORDER BY t DESC, id DESC LIMIT 1", (run_id,)
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def sweep(self, sweep_id: str) -> dict[str, Any] | None:
        row = self._conn.execute("SELECT spec FROM sweeps WHERE id = ?", (sweep_id,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def schema_versions(self) -> list[str]:
        return [r[0] for r in self._conn.execute("SELECT name FROM _migrations ORDER BY rowid")]
