"""`moetune ps` reads run records and checks pids now: a run recorded as starting or healthy whose
processes are gone has exited; stopped and failed runs keep their recorded state."""

from __future__ import annotations

import json
import os

import pytest

from moetune.kinds import LaunchState, ProcessRole
from moetune.run.record import ProcRecord, RunDir, RunInfo
from moetune.run.status import runs
from tests.helpers import run_cli


def _run(run_id: str, state: LaunchState, pid: int | None) -> RunDir:
    info = RunInfo(
        run=run_id,
        created_at=1.0,
        state=state,
        launch={},
        engines={},
        fingerprint="f",
        machine={},
        launcher_pid=1,
        detached=True,
    )
    rd = RunDir.create(info, {})
    rec = ProcRecord(
        name="main",
        role=ProcessRole.SERVER,
        node="local",
        host="127.0.0.1",
        port=8080,
        argv=["llama-server"],
        env={},
        env_inherited={},
        log="main.log",
        pid=pid,
        start_ticks=None,
    )
    rd.add_proc(rec)
    return rd


@pytest.mark.parametrize(
    ("recorded", "shown"),
    [
        (LaunchState.HEALTHY, LaunchState.EXITED),
        (LaunchState.STARTING, LaunchState.EXITED),
        (LaunchState.STOPPED, LaunchState.STOPPED),
        (LaunchState.FAILED, LaunchState.FAILED),
    ],
)
def test_state_of_a_run_whose_processes_are_gone(recorded: LaunchState, shown: LaunchState) -> None:
    _run("20260101-000000-0001", recorded, pid=None)
    assert runs() == []  # nothing live
    (st,) = runs(show_all=True)
    assert st.state == shown and not st.live
    assert st.urls == {"main": "http://127.0.0.1:8080"} and st.pids == {"main": None}


def test_a_live_process_keeps_the_recorded_state() -> None:
    _run("20260101-000000-0002", LaunchState.HEALTHY, pid=os.getpid())  # this process: alive
    (st,) = runs()
    assert st.state == LaunchState.HEALTHY and st.live
    (row,) = json.loads(run_cli("ps", "--json").stdout)
    assert row == {**st.to_json(), "state": "healthy"}
