"""The servers a benchmark measures: a running one, or a plan's, started and stopped through
`moetune launch`'s Python API (RPC workers first, servers when healthy; on leaving, the servers
are stopped before their workers, Ctrl-C included). This module gathers what the history records
about a launched server; which server of a plan is measured is :mod:`moetune.bench.target`'s rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from moetune.bench.target import CTX, PARALLEL, Target, flag_value, match_slots
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.store.record import NO_RPC, LaunchRef

Status = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Launched:
    url: str
    server: ProcessSpec
    launch_run: str  # the launcher's run id (its directory holds the logs)
    logs: dict[str, Path]
    engine_build: str
    model_path: str | None
    facts: LaunchRef = field(default_factory=LaunchRef)  # the transport asked and confirmed, the load time


def model_arg(argv: tuple[str, ...] | list[str]) -> str | None:
    for i, a in enumerate(argv[:-1]):
        if a in ("-m", "--model"):
            return argv[i + 1]
    return None


def launch_facts(
    server: ProcessSpec,
    transport: str,
    workers: dict[str, str | None],
    *,
    started_at: float | None,
    ready_at: float | None,
) -> LaunchRef:
    """What a run records of the launch behind its server: the transport asked (``none`` when the
    server uses no RPC worker), what the logs of the workers it uses showed (``workers``: every
    RPC worker of the launch), and its load time (process start to healthy)."""
    from moetune.run.prepare import rpc_endpoints

    own = {w: workers.get(w) for w in server.after if w in workers}
    uses_rpc = bool(own) or bool(rpc_endpoints(server.argv))
    load_s = ready_at - started_at if started_at is not None and ready_at is not None else None
    return LaunchRef(transport if uses_rpc else NO_RPC, own, load_s)


def check_transport(target: Target) -> None:
    """Refuse the target's transport before anything starts when its builds cannot give it (RDMA)."""
    if target.spec is not None:
        from moetune.run.launch import check_transport as check

        check(target.spec, target.transport, target.rdma_dev)


def new_launch_id() -> str:
    """A launch's id chosen before it starts, so that its processes can be watched from their start."""
    import secrets
    import time

    from moetune.run.record import new_run_id

    return new_run_id(time.time(), secrets.token_hex(2))


@contextmanager
def launched(
    target: Target,
    *,
    spec: LaunchSpec | None = None,
    timeout_s: float = 600.0,
    status: Status | None = None,
    launch_id: str | None = None,
) -> Iterator[Launched]:
    """Start the target's plan (or ``spec``, a rewritten launch of it), yield its chosen server,
    stop everything on leaving. ``launch_id`` names its run directory (a new one by default)."""
    assert target.server is not None
    with launched_servers(
        target, (target.server,), spec=spec, timeout_s=timeout_s, status=status, launch_id=launch_id
    ) as servers:
        yield servers[target.server]


@contextmanager
def launched_servers(
    target: Target,
    names: tuple[str, ...],
    *,
    spec: LaunchSpec | None = None,
    timeout_s: float = 600.0,
    status: Status | None = None,
    launch_id: str | None = None,
) -> Iterator[dict[str, Launched]]:
    """Start the target's whole plan (a layout: every server and RPC worker), yield the servers
    ``names`` by name, stop everything on leaving."""
    from moetune.engine import registry
    from moetune.run.launch import Event
    from moetune.run.launch import launched as run_launched

    assert target.spec is not None and target.doc is not None
    from moetune.run.prepare import check_fits

    check_fits(target.doc, Path(target.name), force=False)  # a plan that says it does not fit is not started
    spec = spec or target.spec
    chosen = [next(s for s in spec.servers() if s.name == n) for n in names]

    def on_event(e: Event) -> None:
        if status and e.kind in ("start", "ready", "exited"):
            status(
                f"{e.process}: {'starting' if e.kind == 'start' else e.kind} "
                f"{e.detail if e.kind != 'start' else ''}".rstrip()
            )

    with run_launched(
        spec,
        target.doc,
        plan_file=target.name,
        timeout_s=timeout_s,
        on_event=on_event,
        run_id=launch_id,
        transport=target.transport,
        rdma_dev=target.rdma_dev,
    ) as ln:
        out: dict[str, Launched] = {}
        logs = {p.name: ln.log(p.name) for p in spec.processes}
        for c in chosen:
            rec = ln.run.proc(c.name)
            facts = launch_facts(c, target.transport, ln.transports, started_at=rec.started_at, ready_at=rec.ready_at)
            if status:
                status(
                    f"{c.name}: "
                    + (
                        f"transport {facts.describe()}"
                        if facts.transport != NO_RPC
                        else f"loaded in {facts.load_s or 0:.1f} s"
                    )
                )
            out[c.name] = Launched(
                url=ln.urls[c.name],
                server=c,
                launch_run=ln.run.run_id,
                logs=logs,
                engine_build=registry.get(c.engine).version(),
                model_path=model_arg(c.argv),
                facts=facts,
            )
        yield out
    if status:
        status(f"stopped {', '.join(p.name for p in [*spec.servers(), *spec.workers()])}")


def why_gone(ln: Launched) -> str | None:
    """Why a server moetune launched stopped answering, when its process is gone: the last error
    its log shows, or that it was killed from outside; None while it still runs."""
    from moetune.engine.logs import parse_log
    from moetune.run.record import RunDir

    try:
        rec = next((r for r in RunDir.open(ln.launch_run).procs() if r.name == ln.server.name), None)
    except Exception:  # the run directory went away: nothing to say
        return None
    if rec is None or rec.alive():
        return None
    log_path = ln.logs.get(ln.server.name)
    try:
        errors = parse_log(log_path.read_text(errors="replace")).errors if log_path else []
    except OSError:
        errors = []
    return (
        f"{ln.server.name} is gone; its log ends with: {errors[-1].text}"
        if errors
        else f"{ln.server.name} is gone and its log shows no error: it was killed or stopped from outside"
    )


class ServerSource(Protocol):
    target: str

    def url_for(self, concurrency: int) -> tuple[str, bool]:
        """The URL for a level, and whether the server behind it is new (just launched)."""
        ...

    def level_info(self, concurrency: int) -> dict[str, object]:
        """What the level ran on beyond the server's own answers (the launched argv)."""
        ...

    @property
    def current(self) -> Launched | None:
        """The server moetune launched, if it did."""
        ...

    def close(self) -> None: ...


class RunningServer:
    current = None

    def __init__(self, url: str) -> None:
        self.target = url

    def url_for(self, concurrency: int) -> tuple[str, bool]:
        return self.target, False

    def level_info(self, concurrency: int) -> dict[str, object]:
        return {}

    def close(self) -> None:
        pass


class PlanServers:
    """Launches a plan's server once, or once per level with ``--match-slots``; stops it in order."""

    def __init__(
        self, target: Target, *, match: bool, need_per_slot: int, status: Status, timeout_s: float = 600.0
    ) -> None:
        self.plan = target
        self.target = target.name
        self.match = match
        self.need = need_per_slot
        self.status = status
        self.timeout_s = timeout_s
        self.current: Launched | None = None
        self._stack: ExitStack | None = None
        self.argv: dict[int, list[str]] = {}
        self.facts: dict[int, LaunchRef] = {}  # each launch's, by the level it was made for
        self.launch_id: str | None = None  # the launch being started or served (its processes are sampled)

    def url_for(self, concurrency: int) -> tuple[str, bool]:
        if self.current is not None and not self.match:
            return self.current.url, False
        self.close()
        assert self.plan.spec is not None and self.plan.plan_path is not None
        spec = (
            match_slots(self.plan.spec, concurrency, need_per_slot=self.need, server=self.plan.server)
            if self.match
            else self.plan.spec
        )
        argv = next(s.argv for s in spec.servers() if s.name == self.plan.server)
        what = f" with --parallel {flag_value(argv, PARALLEL)} -c {flag_value(argv, CTX)}" if self.match else ""
        self.status(f"launching {self.plan.plan_path.name}{what}")
        self._stack = ExitStack()
        self.launch_id = new_launch_id()
        try:
            self.current = self._stack.enter_context(
                launched(self.plan, spec=spec, timeout_s=self.timeout_s, status=self.status, launch_id=self.launch_id)
            )
        except BaseException:
            self._stack = None
            raise
        self.argv[concurrency] = list(argv)
        self.facts[concurrency] = self.current.facts
        return self.current.url, True

    def level_info(self, concurrency: int) -> dict[str, object]:
        if concurrency not in self.argv:
            return {}
        return {"argv": self.argv[concurrency], "launch": self.facts[concurrency].to_json()}

    def close(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()
