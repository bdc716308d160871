"""Start every process of a plan in order and wait until each is up; watch them afterwards.

RPC workers start first (here, or on their node over ssh), each waited on until it accepts
connections from here; then the servers, each waited on until ``/health`` answers 200, with the
load phase read from its log as it grows. Once a server is up, the transport each of its workers
uses is read from the worker's log, recorded, and checked against the one asked for.
Whatever goes wrong (a process exits, the health wait times out, Ctrl-C), everything started so
far is stopped in order (``stop.stop_run``) and the run directory records why.
"""

from __future__ import annotations

import os
import secrets
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import moetune.run.diagnose as diagnose
from moetune.engine import auth
from moetune.engine.launchspec import LaunchSpec
from moetune.engine.logs import parse_log, parse_worker_log
from moetune.errors import InputError
from moetune.hardware.fingerprint import fingerprint, machine_facts
from moetune.kinds import EngineKind, LaunchState, LogEra, LogPhase, ProcessRole, Transport
from moetune.procfs import own_start_ticks
from moetune.run.container import container_name
from moetune.run.container import main_pid as container_main_pid
from moetune.run.diagnose import Diagnosis, LayerExperts
from moetune.run.health import LogFollower, health, port_open
from moetune.run.prepare import (
    LaunchFailed,
    Prepared,
    api_key_files,
    model_paths,
    prepare,
    rpc_endpoints,
    split_workers,
    ubatch,
)
from moetune.run.process import NAME_ENV, RUN_ENV, LocalProcess, Process
from moetune.run.record import (
    ProcRecord,
    RunDir,
    RunInfo,
    new_run_id,
    recorded_env,
)
from moetune.run.remote import RemoteProcess, ssh_base, ssh_said
from moetune.run.stop import Notify, stop_run
from moetune.run.transport import env_for, mismatch, observed

WORKER_TIMEOUT_S = 60.0
TRANSPORT_WAIT_S = 5.0  # after a server is up, for its workers' logs to show the connection
POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class Event:
    process: str
    kind: str  # start | phase | tick | ready | transport | stopping | stopped | exited
    elapsed_s: float  # since this process started
    detail: str = ""


Observer = Callable[[Event], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Launched:
    run: RunDir
    urls: dict[str, str]  # server name -> URL
    pids: dict[str, int]  # each process's pid on its node
    nodes: dict[str, str] = field(default_factory=dict)  # process name -> node (hardware file)
    transports: dict[str, str | None] = field(default_factory=dict)  # RPC worker -> TCP | RDMA, from its log

    @property
    def url(self) -> str:
        """The first server's URL."""
        return next(iter(self.urls.values()))

    def log(self, name: str) -> Path:
        return self.run.log_path(name)

    def to_json(self) -> dict[str, object]:
        return {
            "run": self.run.run_id,
            "url": self.url,
            "urls": self.urls,
            "pids": self.pids,
            "nodes": self.nodes,
            "transports": self.transports,
            "dir": str(self.run.path),
        }


def launch(
    spec: LaunchSpec,
    plan_doc: Mapping[str, object],
    *,
    plan_file: str | None = None,
    detached: bool = False,
    timeout_s: float = 1800.0,
    run_id: str | None = None,
    on_event: Observer | None = None,
    transport: str = Transport.TCP,
    rdma_dev: str | None = None,
    preflight: Callable[[], None] | None = None,
) -> Launched:
    """Start the plan's processes and return once every server is healthy.

    ``preflight`` runs once the RPC workers listen, before the first server starts (`launch
    --verify`: the engine's dry run of each server needs its workers).

    ``transport`` (tcp, rdma, auto) is set on the RPC workers and the servers that use them, and
    confirmed from each worker's log (``transport.py``). Raises InputError for a transport the
    builds cannot give, LaunchFailed (with the diagnosis) after stopping whatever had started.
    """
    emit = on_event or (lambda e: None)
    prepared = prepare(spec)
    for p in prepared:  # a server that requires a key: this process's clients send it
        for f in api_key_files(p.argv):
            auth.use_key(p.spec.url, auth.read_key_file(f))
    envs = transport_envs(prepared, transport, rdma_dev)
    engines = {_engine_key(p): p for p in prepared}
    versions = {k: _version(p) for k, p in engines.items()}
    now = time.time()
    info = RunInfo(
        run=run_id or new_run_id(now, secrets.token_hex(2)),
        created_at=now,
        state=LaunchState.STARTING,
        launch=spec.to_json(),
        engines=versions,
        fingerprint=fingerprint(),
        machine=machine_facts(),
        launcher_pid=os.getpid(),
        detached=detached,
        plan_file=plan_file,
        transport=transport,
        launcher_start_ticks=own_start_ticks(),
    )
    rd = RunDir.create(info, plan_doc)
    procs: dict[str, Process] = {}

    def notify(name: str, what: str) -> None:
        emit(Event(name, what, 0.0))

    try:
        for p in prepared:
            if preflight is not None and p.spec.role != ProcessRole.RPC:
                preflight()
                preflight = None
            procs[p.name] = _start(rd, p, envs.get(p.name, {}))
            started = shlex.join(rd.proc(p.name).argv)
            emit(Event(p.name, "start", 0.0, (f"on {p.spec.node} over ssh: " if p.remote else "") + started))
            if p.spec.role == ProcessRole.RPC:
                _wait_worker(rd, p, procs[p.name], emit)
            else:
                _wait_server(rd, p, procs, timeout_s, plan_doc=plan_doc, emit=emit)
                _confirm_transport(rd, p, prepared, transport, emit=emit)
        rd.update(state=LaunchState.HEALTHY)  # inside: a Ctrl-C as it returns stops the run too
        recs = {r.name: r for r in rd.procs()}
        return Launched(
            run=rd,
            urls={p.name: p.spec.url for p in prepared if p.spec.role != ProcessRole.RPC},
            pids={n: pid for n, r in recs.items() if (pid := r.remote_pid if r.remote else r.pid) is not None},
            nodes={p.name: p.spec.node for p in prepared},
            transports={n: r.transport for n, r in recs.items() if r.role == ProcessRole.RPC},
        )
    except LaunchFailed as e:
        stop_run(rd, final_state=LaunchState.FAILED, notify=notify)
        rd.update(diagnosis=e.diagnosis.to_json())
        e.run_id = rd.run_id
        raise
    except BaseException:  # Ctrl-C while loading, or a bug: leave nothing behind
        stop_run(rd, final_state=LaunchState.STOPPED, notify=notify)
        raise


def _engine_key(p: Prepared) -> str:
    if p.node is not None:
        return f"{p.engine.name} (node {p.spec.node}: {p.node.bin_dir})"
    return p.engine.name if not p.spec.bin_dir else f"{p.engine.name} ({p.spec.bin_dir})"


def _version(p: Prepared) -> str:
    if p.node is not None:  # no version flag on the RPC server: name what ran where
        return f"{p.argv[0]} on {p.node.hostname}" + (" (RDMA build)" if p.rdma else "")
    return p.engine.version()


def _uses_rpc(p: Prepared, workers: set[str]) -> bool:
    return p.spec.role == ProcessRole.RPC or bool(workers & set(p.spec.after)) or bool(rpc_endpoints(p.argv))


def check_transport(spec: LaunchSpec, transport: str, rdma_dev: str | None = None) -> None:
    """Refuse a transport the plan's builds cannot give, before anything starts (what
    :func:`launch` does first; a sweep or a tune asks it of every plan before the first launch)."""
    if transport not in tuple(Transport):
        raise InputError(f"--transport {transport!r}: choose {', '.join(Transport)}")
    if transport == Transport.RDMA:  # the builds are read (over ssh for another node's) only for RDMA
        transport_envs(prepare(spec), transport, rdma_dev)


def transport_envs(prepared: list[Prepared], transport: str, rdma_dev: str | None) -> dict[str, dict[str, str]]:
    """The transport's variables for each process that speaks RPC; refuses RDMA where a build lacks it."""
    if transport not in tuple(Transport):
        raise InputError(f"--transport {transport!r}: choose {', '.join(Transport)}")
    workers = {p.name for p in prepared if p.spec.role == ProcessRole.RPC}
    users = [p for p in prepared if _uses_rpc(p, workers)]
    if transport == Transport.RDMA:
        if not users:
            raise InputError("--transport rdma: the plan uses no RPC worker", hint="drop --transport")
        lacking = [p for p in users if not p.rdma]
        if lacking:
            where = ", ".join(f"{p.name} ({p.argv[0]} on node {p.spec.node})" for p in lacking)
            raise InputError(
                f"--transport rdma: no RDMA transport in the engine build of {where} (a worker of "
                "such a build says `transport : TCP`, not `TCP (RDMA auto-negotiate enabled)`)",
                hint="build llama.cpp with -DGGML_RPC=ON -DGGML_RPC_RDMA=ON where libibverbs is "
                "installed, on both nodes; or launch with --transport tcp",
            )
    return {p.name: env_for(transport, p.rdma, rdma_dev) for p in users}


@contextmanager
def launched(
    spec: LaunchSpec,
    plan_doc: Mapping[str, object],
    *,
    plan_file: str | None = None,
    timeout_s: float = 1800.0,
    on_event: Observer | None = None,
    run_id: str | None = None,
    transport: str = Transport.TCP,
    rdma_dev: str | None = None,
) -> Iterator[Launched]:
    """``with launched(spec, doc) as ln:`` serve on ``ln.url``; on leaving (an exception or Ctrl-C
    included) everything stops in order."""
    ln = launch(
        spec,
        plan_doc,
        plan_file=plan_file,
        timeout_s=timeout_s,
        on_event=on_event,
        run_id=run_id,
        transport=transport,
        rdma_dev=rdma_dev,
    )
    try:
        yield ln
    finally:
        stop_run(ln.run)


def _start(rd: RunDir, p: Prepared, extra_env: dict[str, str]) -> Process:
    env = {**p.spec.env, **extra_env, RUN_ENV: rd.run_id, NAME_ENV: p.name}
    if p.spec.ssh:  # the node's own environment, plus these
        rec = ProcRecord(
            name=p.name,
            role=p.spec.role,
            node=p.spec.node,
            host=p.spec.host,
            port=p.spec.port,
            argv=list(p.argv),
            env=env,
            env_inherited={},
            log=rd.log_path(p.name).name,
            cwd="~",
            ssh_target=p.spec.ssh,
            ssh=ssh_base(),
        )
        rd.add_proc(rec)

        def spawned(proc: RemoteProcess) -> None:  # recorded before the wait: a Ctrl-C now still stops it
            rd.update_proc(p.name, pid=proc.pid, pgid=proc.pgid, start_ticks=proc.start_ticks, started_at=time.time())

        remote = RemoteProcess.start(
            p.name, p.spec.ssh, p.argv, env, log=rd.log_path(p.name), ssh=rec.ssh, on_spawn=spawned
        )
        rd.update_proc(p.name, remote_pid=remote.remote_pid, remote_start_ticks=remote.remote_start_ticks)
        return remote
    full_env = {**{k: v for k, v in os.environ.items() if k != auth.KEY_ENV}, **env}  # the key: moetune's alone
    argv = run_argv(rd, p, env)
    rec = ProcRecord(
        name=p.name,
        role=p.spec.role,
        node=p.spec.node,
        host=p.spec.host,
        port=p.spec.port,
        argv=list(argv),
        env=env,
        env_inherited=recorded_env({k: v for k, v in os.environ.items() if k not in env}),
        log=rd.log_path(p.name).name,
        cwd=os.getcwd(),
        container=container_name(rd.run_id, p.name) if p.container else None,
        runtime=p.container.runtime if p.container else None,
    )
    rd.add_proc(rec)
    proc = LocalProcess.start(p.name, argv, full_env, rd.log_path(p.name))
    pgid = getattr(proc, "pgid", proc.pid)
    rd.update_proc(
        p.name, pid=proc.pid, pgid=pgid, start_ticks=getattr(proc, "start_ticks", None), started_at=time.time()
    )
    return proc


def run_argv(rd: RunDir, p: Prepared, env: dict[str, str]) -> tuple[str, ...]:
    """What starts: the prepared argv, or for an image engine the container's command (named after
    the run and the process; the environment passed in)."""
    if p.container is None:
        return p.argv
    return p.container.argv(p.argv, p.spec.port, container_name(rd.run_id, p.name), env)


def _record_container(rd: RunDir, p: Prepared) -> None:
    """Once it is up, the container's main process: what the sampler reads."""
    if p.container is None:
        return
    found = container_main_pid(p.container.runtime, container_name(rd.run_id, p.name))
    if found is not None:
        rd.update_proc(p.name, container_pid=found[0], container_start_ticks=found[1])


def _wait_worker(rd: RunDir, p: Prepared, proc: Process, emit: Observer) -> None:
    t0 = time.monotonic()
    where = f" on {p.spec.node}" if p.remote else ""
    while True:
        elapsed = time.monotonic() - t0
        if not proc.alive():
            rd.update_proc(p.name, exited_at=time.time(), exit_code=proc.returncode)
            text = _read(rd.log_path(p.name))
            wlog = parse_worker_log(text)
            if isinstance(proc, RemoteProcess) and not proc.started:
                raise LaunchFailed(
                    diagnose.ssh_failed(
                        p.name, p.spec.node, proc.target, _last_line(text) or f"ssh exit {proc.returncode}"
                    )
                )
            raise LaunchFailed(diagnose.worker_exit(p.name, wlog, proc.returncode, p.endpoint + where))
        if port_open(p.spec.host, p.spec.port, timeout_s=0.5):
            rd.update_proc(p.name, ready_at=time.time())
            _record_container(rd, p)
            pid = f", pid {proc.remote_pid}" if isinstance(proc, RemoteProcess) else ""
            emit(Event(p.name, "ready", elapsed, f"listening on {p.endpoint}{where}{pid}"))
            return
        if elapsed > WORKER_TIMEOUT_S:
            raise LaunchFailed(
                Diagnosis(
                    cause=diagnose.NOT_HEALTHY,
                    process=p.name,
                    message=f"{p.name}: RPC worker not listening on {p.endpoint} after {elapsed:.0f} s",
                    hint="run the worker's command by hand to see why",
                )
            )
        time.sleep(POLL_S / 2)


def _wait_server(
    rd: RunDir,
    p: Prepared,
    procs: dict[str, Process],
    timeout_s: float,
    *,
    plan_doc: Mapping[str, object],
    emit: Observer,
) -> None:
    proc = procs[p.name]
    follower = LogFollower(rd.log_path(p.name), era=LogEra.LEGACY if p.engine.kind == EngineKind.IK else None)
    t0 = time.monotonic()
    phase = LogPhase.STARTING

    def read_phases(elapsed: float) -> LogPhase:
        nonlocal phase
        for now_phase in follower.poll():
            if now_phase != phase and now_phase != LogPhase.READY:  # "ready" is told once /health says so
                emit(Event(p.name, "phase", elapsed, now_phase))
            phase = now_phase
        return phase

    while True:
        elapsed = time.monotonic() - t0
        emit(Event(p.name, "tick", elapsed, read_phases(elapsed)))
        if not proc.alive():
            rd.update_proc(p.name, exited_at=time.time(), exit_code=proc.returncode)
            log = parse_log(_read(rd.log_path(p.name)), LogEra.LEGACY if p.engine.kind == EngineKind.IK else None)
            layers, uniform = _expert_sizes(plan_doc, p) if log.alloc_failures else ([], None)
            mine, outside = split_workers(p.argv, rd.workers())
            workers = {ep: parse_worker_log(_read(rd.log_path(name))) for ep, name in mine.items()}
            raise LaunchFailed(
                diagnose.server_exit(
                    p.name,
                    log,
                    proc.returncode,
                    loading=True,
                    layers=layers,
                    uniform=uniform,
                    n_ubatch=ubatch(p.argv),
                    rpc_outside=outside,
                    workers=workers,
                )
            )
        for name, other in procs.items():
            if name != p.name and not other.alive():
                rec = rd.proc(name)
                rd.update_proc(name, exited_at=time.time(), exit_code=other.returncode)
                wlog = parse_worker_log(_read(rd.log_path(name)))
                d = diagnose.worker_exit(name, wlog, other.returncode, f"{rec.host}:{rec.port}", listening=True)
                raise LaunchFailed(
                    Diagnosis(
                        cause=d.cause,
                        process=name,
                        message=f"{d.message} while {p.name} was loading",
                        hint=d.hint,
                        evidence=d.evidence,
                    )
                )
        if health(p.spec.url, timeout_s=2.0) == 200:
            read_phases(elapsed)  # the phases the log gained since the last look
            rd.update_proc(p.name, ready_at=time.time())
            _record_container(rd, p)
            emit(Event(p.name, "ready", elapsed, p.spec.url))
            return
        if elapsed > timeout_s:
            log = parse_log(_read(rd.log_path(p.name)))
            raise LaunchFailed(diagnose.not_healthy(p.name, p.spec.url, elapsed, log))
        time.sleep(POLL_S)


def _confirm_transport(
    rd: RunDir, server: Prepared, prepared: list[Prepared], transport: str, *, emit: Observer
) -> None:
    """Read the transport from the logs of the workers this server uses; record it; fail on a
    contradiction with what was asked (the stop that follows keeps the order)."""
    workers = [p for p in prepared if p.spec.role == ProcessRole.RPC and p.name in server.spec.after]
    for w in workers:
        deadline = time.monotonic() + TRANSPORT_WAIT_S
        while True:
            wlog = parse_worker_log(_read(rd.log_path(w.name)))
            settled = wlog.rdma_activated if transport == Transport.RDMA else wlog.connections
            if settled or time.monotonic() > deadline:
                break
            time.sleep(POLL_S / 2)
        seen = observed(wlog)
        rd.update_proc(w.name, transport=seen)
        emit(Event(w.name, "transport", 0.0, f"{seen or 'unknown (no connection in its log)'} (asked: {transport})"))
        d = mismatch(w.name, transport, seen, wlog)
        if d is not None:
            raise LaunchFailed(d)


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else ""


def _expert_sizes(plan_doc: Mapping[str, object], p: Prepared) -> tuple[list[LayerExperts], tuple[float, int] | None]:
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


def watch(
    rd: RunDir,
    *,
    on_event: Observer | None = None,
    notify: Notify | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> Diagnosis | None:
    """Stay with a healthy run in the foreground. When a process exits, stop the rest in order,
    record the diagnosis on the run and return it; when the run is stopped from elsewhere, return
    None. Ctrl-C (KeyboardInterrupt) stops the run in order (``on_interrupt`` first) and re-raises."""
    try:
        why = supervise(rd, on_event=on_event)
    except KeyboardInterrupt:
        if on_interrupt is not None:
            on_interrupt()
        stop_run(rd, notify=notify)
        raise
    if why is not None:
        stop_run(rd, final_state=LaunchState.FAILED, notify=notify)
        rd.update(diagnosis=why.to_json())
    return why


def supervise(rd: RunDir, *, poll_s: float = 0.5, on_event: Observer | None = None) -> Diagnosis | None:
    """Watch a healthy run until a process exits (returns why) or the run is stopped from elsewhere
    (returns None). Ctrl-C raises KeyboardInterrupt: the caller stops the run."""
    emit = on_event or (lambda e: None)
    recs = rd.procs()
    procs = {r.name: (r, r.process(rd.path)) for r in recs}
    while True:
        time.sleep(poll_s)
        for name, (rec, proc) in procs.items():
            if proc is None or proc.alive():
                continue
            if rd.info().state != LaunchState.HEALTHY:  # someone ran `moetune stop`
                return None
            rd.update_proc(name, exited_at=time.time(), exit_code=proc.returncode)
            emit(Event(name, "exited", 0.0, ""))
            if isinstance(proc, RemoteProcess) and proc.session_lost():
                return diagnose.ssh_session_lost(
                    name,
                    rec.node,
                    f"{rec.host}:{rec.port}",
                    proc.local.returncode if proc.local else None,
                    last=ssh_said(_read(rd.log_path(name))),
                )
            if rec.role == ProcessRole.RPC:
                wlog = parse_worker_log(_read(rd.log_path(name)))
                where = f" on {rec.node}" if rec.remote else ""
                return diagnose.worker_exit(
                    name, wlog, proc.returncode, f"{rec.host}:{rec.port}{where}", listening=True
                )
            log = parse_log(_read(rd.log_path(name)))
            return diagnose.server_exit(name, log, proc.returncode, loading=False)
