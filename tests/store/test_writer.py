"""The ``writer`` column of a run: the process that writes it, stored as {pid, start_ticks, host}
and read back as a typed :class:`Writer`; a run left running by a process that is gone is abandoned."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from moetune.kinds import RunKind, RunStatus
from moetune.procfs import own_start_ticks
from moetune.store.db import ResultsDB, Writer
from moetune.store.record import RunMeta


def test_the_writer_column_keeps_its_shape_and_reads_back_typed(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        rid = db.create_run(RunMeta(kind=RunKind.BENCH), label="a", target="t")
        (stored,) = db._conn.execute("SELECT writer FROM runs WHERE id = ?", (rid,)).fetchone()
        assert json.loads(stored) == {
            "pid": os.getpid(),
            "start_ticks": own_start_ticks(),
            "host": socket.gethostname(),
        }
        run = db.run(rid)
        assert run.writer == Writer(pid=os.getpid(), start_ticks=own_start_ticks(), host=socket.gethostname())
        assert not run.abandoned  # this process writes it, and lives


def test_a_run_left_running_by_a_gone_process_is_abandoned(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        rid = db.create_run(RunMeta(kind=RunKind.BENCH), label="a", target="t")
        gone = Writer(pid=os.getpid(), start_ticks=(own_start_ticks() or 0) + 1, host=socket.gethostname())
        db._conn.execute("UPDATE runs SET writer = ? WHERE id = ?", (json.dumps(gone.to_json()), rid))
        assert db.run(rid).abandoned
        db.finish_run(rid, RunStatus.DONE)
        assert not db.run(rid).abandoned  # finished: not abandoned, whoever wrote it


def test_a_hand_edited_writer_reads_as_empty_values() -> None:
    assert Writer.from_json({"pid": "12", "host": 3}) == Writer(pid=0, start_ticks=None, host="3")
