"""`moetune launch PLAN`: start a plan's RPC workers, then its servers, wait until every server is
healthy (the machine sampled meanwhile), and, in the foreground, watch them until Ctrl-C or a
crash. The plan's verdict is checked first: a plan that does not fit is refused unless forced."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.errors import RuntimeFailure

if TYPE_CHECKING:
    from moetune.engine.launchspec import LaunchSpec
    from moetune.run.launch import Event, Launched
    from moetune.run.verify import Verification

Notify = Callable[[str, str], None]  # (process, what happened to it)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchRequest:
    plan: Path
    detach: bool = False  # return once every server is healthy
    timeout_s: float = 1800.0  # for each server's /health
    transport: str | None = None  # the RPC workers' (None: tcp)
    rdma_dev: str | None = None
    force: bool = False  # launch a plan whose verdict is that it does not fit
    verify: bool = False  # the engine's dry run of each server once the workers listen
    metrics_port: int | None = None  # serve the launch's metrics on 127.0.0.1:PORT while it lives


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """The plan read and checked: its launch spec, its document, and (message, remedy) to say before
    launching (the shortfalls of a forced plan, the workers that listen on the network)."""

    spec: LaunchSpec
    doc: dict[str, Any]
    warnings: list[tuple[str, str]]


def prepare(req: LaunchRequest) -> Prepared:
    """Read the plan and check it (its verdict, the metrics port free) before anything starts."""
    from moetune.run.prepare import check_fits, public_bind_warnings, read_plan

    spec, doc = read_plan(req.plan)
    if req.metrics_port is not None:
        from moetune.monitor.serve import bind

        bind("127.0.0.1", req.metrics_port, list).server_close()  # a port in use is said now, before loading
    warnings = [
        (
            f"launching a plan that does not fit (--force): {shortfall}",
            "expect the server to fail while loading; `moetune doctor RUN` reads why",
        )
        for shortfall in check_fits(doc, req.plan, req.force)
    ]
    return Prepared(spec=spec, doc=doc, warnings=warnings + public_bind_warnings(spec))


def verify(prepared: Prepared) -> list[Verification]:
    """The engine's own dry run of each server's exact command (the RPC workers must listen)."""
    from moetune.run.verify import doc_subjects, verify_subjects

    return verify_subjects(doc_subjects(prepared.doc))


def disagreements(verified: list[Verification]) -> list[tuple[str, str]]:
    """(message, remedy) for each service whose dry run disagrees with the plan."""
    return [
        (
            f"{v.service}: the engine's dry run disagrees with the plan: {'; '.join(v.disagreements)}",
            "the engine's figures are the truth: re-plan with more margin (or --force past a shortfall)",
        )
        for v in verified
        if v.disagreements
    ]


def start(
    req: LaunchRequest,
    prepared: Prepared,
    *,
    on_event: Callable[[Event], None],
    preflight: Callable[[], None] | None = None,
    on_launched: Callable[[Launched], None] | None = None,
) -> Launched:
    """Launch, the machine sampled into the run directory (one line a second) while the model
    loads; ``preflight`` (with ``req.verify``) runs once the workers listen. ``on_launched`` hears
    of the launch as soon as it serves, before the sampler's last sample (up to a second): a
    Ctrl-C meanwhile finds the launch there to stop."""
    from moetune.bench.servers import new_launch_id
    from moetune.kinds import Transport
    from moetune.monitor.sampler import LaunchSink, Sampler, interval_from_env, watches_of_launch
    from moetune.run.launch import launch

    run_id = new_launch_id()
    sampler = Sampler(LaunchSink(run_id), watches=lambda: watches_of_launch(run_id), interval_s=interval_from_env())

    def observe(e: Event) -> None:
        if e.kind == "phase":
            sampler.phase = e.detail
        on_event(e)

    sampler.start()
    try:
        launched = launch(
            prepared.spec,
            prepared.doc,
            plan_file=str(req.plan.resolve()),
            detached=req.detach,
            timeout_s=req.timeout_s,
            on_event=observe,
            transport=req.transport or Transport.TCP,
            rdma_dev=req.rdma_dev,
            preflight=preflight if req.verify else None,
            run_id=run_id,
        )
        if on_launched is not None:
            on_launched(launched)
        return launched
    finally:
        sampler.stop()


def launched_json(launched: Launched, verified: list[Verification]) -> dict[str, object]:
    doc = launched.to_json()
    if verified:
        from moetune.run.verify import verify_json

        doc["verify"] = verify_json(verified)
    return doc


def serve_metrics(launched: Launched, port: int) -> Path | None:
    """`moetune metrics serve --launch RUN` in the background, on its own: it ends with the launch.
    None once it listens; else its log, where it says why not."""
    import subprocess
    import sys

    from moetune.monitor.serve import wait_listening

    log = launched.run.path / "metrics-serve.log"
    with open(log, "ab") as f:
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "moetune",
                "metrics",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--launch",
                launched.run.run_id,
            ],
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=f,
            start_new_session=True,
        )
    return None if wait_listening("127.0.0.1", port, timeout_s=10.0) else log


def watch(
    launched: Launched,
    *,
    on_event: Callable[[Event], None],
    notify: Notify,
    on_interrupt: Callable[[], None],
) -> None:
    """Watch the servers until Ctrl-C stops them (then the workers); RuntimeFailure when one dies."""
    from moetune.run.launch import watch as watch_run

    why = watch_run(launched.run, on_event=on_event, notify=notify, on_interrupt=on_interrupt)
    if why is not None:
        raise RuntimeFailure(why.message, hint=why.hint)


def stop_unwatched(launched: Launched | None, notify: Notify) -> None:
    """After a Ctrl-C between the launch and the watch: stop a launch that is still healthy."""
    from moetune.kinds import LaunchState

    if launched is not None and launched.run.info().state == LaunchState.HEALTHY:
        from moetune.run.stop import stop_run

        stop_run(launched.run, notify=notify)
