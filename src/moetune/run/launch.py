"""Start every process of a plan in order and wait until each is up; watch them afterwards.

RPC workers start first, each waited on until it accepts connections; then the servers, each
waited on until ``/health`` answers 200, with the load phase read from its log as it grows.
Whatever goes wrong (a process exits, the health wait times out, Ctrl-C), everything started so
far is stopped in order (``stop.stop_run``) and the run directory records why.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.engine.logs import LEGACY, parse_log, parse_worker_log
from moetune.engine.logs.types import READY
from moetune.engine.logs.types import STARTING as STARTING_PHASE
from moetune.hardware.fingerprint import fingerprint, machine_facts
from moetune.model.quants import IK
from moetune.plan.launchspec import RPC, LaunchSpec
from moetune.run import diagnose
from moetune.run.diagnose import Diagnosis, LayerExperts
from moetune.run.health import LogFollower, health, port_open
from moetune.run.prepare import LaunchFailed, Prepared, model_paths, prepare, ubatch
from moetune.run.process import NAME_ENV, RUN_ENV, Process, start_process
from moetune.run.record import (
    FAILED,
    HEALTHY,
    STARTING,
    STOPPED,
    ProcRecord,
    RunDir,
    RunInfo,
    new_run_id,
    recorded_env,
)
from moetune.run.stop import stop_run

WORKER_TIMEOUT_S = 60.0
POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class Event:
    process: str
    kind: str  # start | phase | tick | ready | stopping | stopped | exited
    elapsed_s: float  # since this process started
    detail: str = ""


Observer = Callable[[Event], None]


@dataclass(frozen=True, slots=True)
class Launched:
    run: RunDir
    urls: dict[str, str]  # server name -> URL
    pids: dict[str, int]

    @property
    def url(self) -> str:
        """The first server's URL."""
        return next(iter(self.urls.values()))

    def log(self, name: str) -> Path:
        return self.run.log_path(name)

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run.run_id, "url": self.url, "urls": self.urls, "pids": self.pids, "dir": str(self.run.path)}


def launch(spec: LaunchSpec, plan_doc: dict[str, Any], *, plan_file: str | None = None, detached: bool = False,
           timeout_s: float = 1800.0, run_id: str | None = None, on_event: Observer | None = None) -> Launched:
    """Start the plan's processes and return once every server is healthy.

    Raises LaunchFailed (with the diagnosis) after stopping whatever had started.
    """
    emit = on_event or (lambda e: None)
    prepared = prepare(spec)
    engines = {_engine_key(p): p.engine for p in prepared}
    versions = {k: e.version() for k, e in engines.items()}
    now = time.time()
    info = RunInfo(run=run_id or new_run_id(now, secrets.token_hex(2)), created_at=now, state=STARTING,
                   launch=spec.to_json(), engines=versions, fingerprint=fingerprint(), machine=machine_facts(),
                   launcher_pid=os.getpid(), detached=detached, plan_file=plan_file)
    rd = RunDir.create(info, plan_doc)
    procs: dict[str, Process] = {}

    def notify(name: str, what: str) -> None:
        emit(Event(name, what, 0.0))

    try:
        for p in prepared:
            procs[p.name] = _start(rd, p)
            emit(Event(p.name, "start", 0.0, " ".join(p.argv)))
            if p.spec.role == RPC:
                _wait_worker(rd, p, procs[p.name], emit)
            else:
                _wait_server(rd, p, procs, timeout_s, plan_doc, emit)
    except LaunchFailed as e:
        stop_run(rd, final_state=FAILED, notify=notify)
        rd.update(diagnosis=e.diagnosis.to_json())
        e.run_id = rd.run_id
        raise
    except BaseException:  # Ctrl-C while loading, or a bug: leave nothing behind
        stop_run(rd, final_state=STOPPED, notify=notify)
        raise
    rd.update(state=HEALTHY)
    recs = {r.name: r for r in rd.procs()}
    return Launched(rd, {p.name: p.spec.url for p in prepared if p.spec.role != RPC},
                    {n: r.pid for n, r in recs.items() if r.pid is not None})


def _engine_key(p: Prepared) -> str:
    return p.engine.name if not p.spec.bin_dir else f"{p.engine.name} ({p.spec.bin_dir})"


@contextmanager
def launched(spec: LaunchSpec, plan_doc: dict[str, Any], *, plan_file: str | None = None, timeout_s: float = 1800.0,
             on_event: Observer | None = None) -> Iterator[Launched]:
    """``with launched(spec, doc) as ln:`` serve on ``ln.url``; on leaving (an exception or Ctrl-C
    included) everything stops in order."""
    ln = launch(spec, plan_doc, plan_file=plan_file, timeout_s=timeout_s, on_event=on_event)
    try:
        yield ln
    finally:
        stop_run(ln.run)


def _start(rd: RunDir, p: Prepared) -> Process:
    env = {**p.spec.env, RUN_ENV: rd.run_id, NAME_ENV: p.name}
    full_env = {**os.environ, **env}
    rec = ProcRecord(p.name, p.spec.role, p.spec.node, p.spec.host, p.spec.port, list(p.argv), env,
                     recorded_env({k: v for k, v in os.environ.items() if k not in env}), rd.log_path(p.name).name,
                     os.getcwd())
    rd.add_proc(rec)
    proc = start_process(p.name, p.spec.ssh, p.argv, full_env, rd.log_path(p.name))
    pgid = getattr(proc, "pgid", proc.pid)
    rd.update_proc(p.name, pid=proc.pid, pgid=pgid, start_ticks=getattr(proc, "start_ticks", None),
                   started_at=time.time())
    return proc


def _wait_worker(rd: RunDir, p: Prepared, proc: Process, emit: Observer) -> None:
    t0 = time.monotonic()
    while True:
        elapsed = time.monotonic() - t0
        if not proc.alive():
            rd.update_proc(p.name, exited_at=time.time(), exit_code=proc.returncode)
            wlog = parse_worker_log(_read(rd.log_path(p.name)))
            raise LaunchFailed(diagnose.worker_exit(p.name, wlog, proc.returncode, p.endpoint))
        if port_open(p.spec.host, p.spec.port, timeout_s=0.5):
            rd.update_proc(p.name, ready_at=time.time())
            emit(Event(p.name, "ready", elapsed, f"listening on {p.endpoint}"))
            return
        if elapsed > WORKER_TIMEOUT_S:
            raise LaunchFailed(Diagnosis(diagnose.NOT_HEALTHY, p.name,
                                         f"{p.name}: RPC worker not listening on {p.endpoint} after {elapsed:.0f} s",
                                         "run the worker's command by hand to see why"))
        time.sleep(POLL_S / 2)


def _wait_server(rd: RunDir, p: Prepared, procs: dict[str, Process], timeout_s: float, plan_doc: dict[str, Any],
                 emit: Observer) -> None:
    proc = procs[p.name]
    follower = LogFollower(rd.log_path(p.name), era=LEGACY if p.engine.kind == IK else None)
    t0 = time.monotonic()
    phase = STARTING_PHASE

    def read_phases(elapsed: float) -> str:
        nonlocal phase
        for now_phase in follower.poll():
            if now_phase != phase and now_phase != READY:  # "ready" is told once /health says so
                emit(Event(p.name, "phase", elapsed, now_phase))
            phase = now_phase
        return phase

    while True:
        elapsed = time.monotonic() - t0
        emit(Event(p.name, "tick", elapsed, read_phases(elapsed)))
        if not proc.alive():
            rd.update_proc(p.name, exited_at=time.time(), exit_code=proc.returncode)
            log = parse_log(_read(rd.log_path(p.name)), LEGACY if p.engine.kind == IK else None)
            layers, uniform = _expert_sizes(plan_doc, p) if log.alloc_failures else ([], None)
            raise LaunchFailed(diagnose.server_exit(p.name, log, proc.returncode, loading=True, layers=layers,
                                                    uniform=uniform, n_ubatch=ubatch(p.argv)))
        for name, other in procs.items():
            if name != p.name and not other.alive():
                rec = rd.proc(name)
                rd.update_proc(name, exited_at=time.time(), exit_code=other.returncode)
                wlog = parse_worker_log(_read(rd.log_path(name)))
                d = diagnose.worker_exit(name, wlog, other.returncode, f"{rec.host}:{rec.port}", listening=True)
                raise LaunchFailed(Diagnosis(d.cause, name, f"{d.message} while {p.name} was loading", d.hint,
                                             d.evidence))
        if health(p.spec.url, timeout_s=2.0) == 200:
            read_phases(elapsed)  # the phases the log gained since the last look
            rd.update_proc(p.name, ready_at=time.time())
            emit(Event(p.name, "ready", elapsed, p.spec.url))
            return
        if elapsed > timeout_s:
            log = parse_log(_read(rd.log_path(p.name)))
            raise LaunchFailed(diagnose.not_healthy(p.name, p.spec.url, elapsed, log))
        time.sleep(POLL_S)


def _expert_sizes(plan_doc: dict[str, Any], p: Prepared) -> tuple[list[LayerExperts], tuple[float, int] | None]:
    """Per-layer expert sizes for the out-of-memory advice: the plan's placement, else the model's
    average MoE layer (read from its headers)."""
    layers = diagnose.layer_experts_from_plan(plan_doc, p.name)
    if layers:
        return layers, None
    from moetune.model.profile import load_profile  # only on this failure path
    for m in model_paths(p.argv)[:1]:
        try:
            moe = [x.expert_bytes for x in load_profile(m).layers if x.kind == "moe"]
        except Exception:  # an unreadable model only costs the advice
            return [], None
        if moe:
            return [], (sum(moe) / len(moe) / 2**20, len(moe))
    return [], None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def supervise(rd: RunDir, *, poll_s: float = 0.5, on_event: Observer | None = None) -> Diagnosis | None:
    """Watch a healthy run until a process exits (returns why) or the run is stopped from elsewhere
    (returns None). Ctrl-C raises KeyboardInterrupt: the caller stops the run."""
    emit = on_event or (lambda e: None)
    recs = rd.procs()
    procs = {r.name: (r, r.process()) for r in recs}
    while True:
        time.sleep(poll_s)
        for name, (rec, proc) in procs.items():
            if proc is None or proc.alive():
                continue
            if rd.info().state != HEALTHY:  # someone ran `moetune stop`
                return None
            rd.update_proc(name, exited_at=time.time(), exit_code=proc.returncode)
            emit(Event(name, "exited", 0.0, ""))
            if rec.role == RPC:
                wlog = parse_worker_log(_read(rd.log_path(name)))
                return diagnose.worker_exit(name, wlog, proc.returncode, f"{rec.host}:{rec.port}", listening=True)
            log = parse_log(_read(rd.log_path(name)))
            return diagnose.server_exit(name, log, proc.returncode, loading=False)
