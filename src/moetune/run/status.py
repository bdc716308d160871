"""What `moetune ps` shows: every launch's state as its record says, corrected by its pids checked
now (a run recorded as starting or healthy whose processes are all gone has exited)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moetune.kinds import LaunchState, ProcessRole
from moetune.run.process import pid_alive
from moetune.run.record import RunDir


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchStatus:
    run: str
    state: LaunchState
    created_at: float
    detached: bool
    urls: dict[str, str]  # server name -> URL
    pids: dict[str, int | None]  # process name -> pid (on its node)
    alive: dict[str, bool]
    nodes: dict[str, str]
    transport: str | None  # asked for
    transports: dict[str, str | None]  # worker -> seen in its log
    dir: str
    diagnosis: str | None
    orphaned: bool = False  # a foreground launch whose launcher is gone (killed): nobody will stop it
    containers: dict[str, str] = field(default_factory=dict)  # process name -> its container's name

    @property
    def live(self) -> bool:
        return any(self.alive.values())

    def to_json(self) -> dict[str, Any]:  # read by key in cli/run_cmds.py (ps)
        return {
            "run": self.run,
            "state": self.state,
            "created_at": self.created_at,
            "detached": self.detached,
            "urls": self.urls,
            "pids": self.pids,
            "alive": self.alive,
            "nodes": self.nodes,
            "transport": self.transport,
            "transports": self.transports,
            "dir": self.dir,
            "diagnosis": self.diagnosis,
            "orphaned": self.orphaned,
            "containers": self.containers,
        }


def run_status(rd: RunDir) -> LaunchStatus:
    info = rd.info()
    procs = rd.procs()
    alive = {r.name: r.alive() for r in procs}
    state = info.state
    if state in (LaunchState.STARTING, LaunchState.HEALTHY) and not any(alive.values()):
        state = LaunchState.EXITED
    message = (info.diagnosis or {}).get("message")
    return LaunchStatus(
        run=info.run,
        state=state,
        created_at=info.created_at,
        detached=info.detached,
        urls={r.name: r.url for r in procs if r.role == ProcessRole.SERVER},
        pids={r.name: r.remote_pid if r.remote else r.pid for r in procs},
        alive=alive,
        nodes={r.name: r.node for r in procs},
        transport=info.transport,
        transports={r.name: r.transport for r in procs if r.role == ProcessRole.RPC},
        dir=str(rd.path),
        diagnosis=None if message is None else str(message),
        orphaned=not info.detached
        and any(alive.values())
        and not pid_alive(info.launcher_pid, info.launcher_start_ticks),
        containers={r.name: r.container for r in procs if r.container},
    )


def runs(show_all: bool = False) -> list[LaunchStatus]:
    """Launches with a live process (every one recorded, with ``show_all``), oldest first."""
    out = [run_status(rd) for rd in RunDir.all()]
    return out if show_all else [s for s in out if s.live]
