"""Ordered stop: servers first, each waited on until its pid (and process group) is gone, not until
its port closes; then the RPC workers. A worker stopped while a client still frees its remote
buffers can crash that client (the RDMA transport does, reference report 004), so the order holds
even when a server must be killed after its grace period. A worker on another node is signalled
by its pid there, over ssh (``remote.RemoteProcess``). A process in a container is its `podman run`
client, which passes the signal on; once the client is gone the container is removed by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import moetune.run.container as container
from moetune.errors import RuntimeFailure
from moetune.kinds import LaunchState, ProcessRole
from moetune.run.process import KILL, RUN_ENV, TERM, LocalProcess, Process, group_members, with_env
from moetune.run.record import ProcRecord, RunDir
from moetune.run.status import runs

Notify = Callable[[str, str], None]  # (process name, what happened)
KILL_WAIT_S = 10.0  # after SIGKILL, how long a process may take to disappear before we give up
POLL_S = 0.02


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """A second Ctrl-C must not abandon a stop half-way (and leave workers without servers' order)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def stop_run(
    rd: RunDir, *, grace_s: float = 30.0, final_state: LaunchState = LaunchState.STOPPED, notify: Notify | None = None
) -> list[ProcRecord]:
    """Stop every process of a run in order and record when each went; returns the records."""
    say = notify or (lambda name, what: None)
    with _no_interrupts():
        rd.update(state=LaunchState.STOPPING)
        recs = rd.procs()
        servers = [r for r in reversed(recs) if r.role == ProcessRole.SERVER]
        workers = [r for r in reversed(recs) if r.role == ProcessRole.RPC]
        for group in (servers, workers):
            _stop_group(rd, group, grace_s, say)
        _stop_strays(rd, grace_s, say)
        rd.update(state=final_state)
        return rd.procs()


@dataclass(frozen=True, slots=True)
class Stopped:
    run_id: str
    records: list[ProcRecord]  # as the stop left them: when each was signalled and went

    def to_json(self) -> dict[str, object]:
        return {
            "run": self.run_id,
            "processes": [
                {
                    "name": r.name,
                    "role": r.role,
                    "node": r.node,
                    "pid": r.remote_pid if r.remote else r.pid,
                    "stop_sent_at": r.stop_sent_at,
                    "kill_sent_at": r.kill_sent_at,
                    "exited_at": r.exited_at,
                    "container": r.container,
                }
                for r in self.records
            ],
        }


def stop_runs(run_ids: Sequence[str], *, grace_s: float = 30.0, notify: Notify | None = None) -> Iterator[Stopped]:
    """Stop the runs named, or, given none, every live launch; one after the other, each told as it
    is done. Every run named is looked up before any is stopped."""
    dirs = [RunDir.open(r) for r in run_ids] if run_ids else [RunDir(Path(s.dir)) for s in runs()]
    for rd in dirs:
        yield Stopped(rd.run_id, stop_run(rd, grace_s=grace_s, notify=notify))


def _stop_group(rd: RunDir, recs: list[ProcRecord], grace_s: float, say: Notify) -> None:
    procs: dict[str, Process] = {}
    for r in recs:
        p = r.process(rd.path)
        if p is None:
            continue
        if not p.group_alive():
            if r.exited_at is None:
                rd.update_proc(r.name, exited_at=time.time(), exit_code=p.returncode)
            continue
        procs[r.name] = p
        rd.update_proc(r.name, stop_sent_at=time.time())
        p.signal(TERM)
        if r.container is not None and r.runtime is not None:
            main = (
                (r.container_pid, r.container_start_ticks)
                if r.container_pid is not None
                # up, or still loading
                else container.main_pid(r.runtime, r.container) or (None, None)
            )
            if container.end_if_deaf(*main):
                rd.update_proc(r.name, kill_sent_at=time.time())
        say(r.name, "stopping")
    try:
        _wait_gone(rd, procs, grace_s, say)
    finally:
        _remove_containers(recs)


def _remove_containers(recs: list[ProcRecord]) -> None:
    """The group's containers removed (killed first if a client's end left one running), before the
    next group stops: nothing of a server outlives its stop, nor a container its run."""
    for r in recs:
        if r.container is None or r.runtime is None:
            continue
        if not container.remove(r.runtime, r.container):
            raise RuntimeFailure(
                f"could not remove container {r.container} of {r.name}",
                hint=f"remove it by hand: {r.runtime} rm -f {r.container}",
            )


def _wait_gone(rd: RunDir, procs: dict[str, Process], grace_s: float, say: Notify) -> None:
    """Until each is gone, SIGKILL after the grace period. A process whose node cannot be reached
    is left (not recorded as gone: `moetune ps` shows it, `moetune stop RUN` ends it once the node
    answers), said at once rather than waited on."""
    deadline = time.monotonic() + grace_s
    killed = False
    pending = dict(procs)
    while pending:
        for name, p in list(pending.items()):
            if not p.group_alive():
                rd.update_proc(name, exited_at=time.time(), exit_code=p.returncode)
                del pending[name]
                say(name, "stopped")
            elif (why := getattr(p, "unreachable", None)) is not None:
                del pending[name]
                say(
                    name,
                    f"left running: its node cannot be reached ({why}); `moetune stop {rd.run_id}` again once it can",
                )
        if not pending:
            return
        now = time.monotonic()
        if not killed and now > deadline:
            for name, p in pending.items():
                rd.update_proc(name, kill_sent_at=time.time())
                p.signal(KILL)
                say(name, f"killed after {grace_s:.0f} s")
            killed = True
        elif killed and now > deadline + KILL_WAIT_S:
            left = ", ".join(f"{n} ({_where(p)})" for n, p in pending.items())
            raise RuntimeFailure(f"could not stop {left}", hint="check the processes with `ps` and stop them by hand")
        time.sleep(POLL_S)


def _where(p: Process) -> str:
    describe = getattr(p, "describe", None)  # a process on another node says where
    return str(describe()) if callable(describe) else f"pid {p.pid}"


def _stop_strays(rd: RunDir, grace_s: float, say: Notify) -> None:
    """Processes that carry the run's id but no record (started as Ctrl-C arrived, or children)."""
    known = {pid for r in rd.procs() for pid in (r.pid, r.container_pid)}
    strays = {
        f"pid {pid}": LocalProcess.attach(f"pid {pid}", pid, pid, None)
        for pid in with_env(RUN_ENV, rd.run_id)
        if pid not in known
    }
    if not strays:
        return
    for p in strays.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, TERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.alive() for p in strays.values()):
        time.sleep(POLL_S)
    for name, p in strays.items():
        if p.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, KILL)
        say(name, "stopped (stray)")


def survivors(rd: RunDir) -> list[int]:
    """Pids of anything of this run still alive: recorded processes, their groups, and strays."""
    out = set(with_env(RUN_ENV, rd.run_id))
    for r in rd.procs():
        if r.alive() and r.pid is not None:
            out.add(r.pid)
        if r.pgid is not None:
            out.update(group_members(r.pgid))
    return sorted(out)
