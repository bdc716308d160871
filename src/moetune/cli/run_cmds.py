"""`moetune launch`, `moetune ps`, `moetune stop`."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from moetune.cli.common import err, json_option, out, print_json, transport_options, warn

if TYPE_CHECKING:
    from rich.status import Status

    from moetune.run.launch import Event, Launched
    from moetune.run.prepare import LaunchFailed
    from moetune.run.verify import Verification


class Display:
    """Progress on stderr: a line per phase change, a spinner with the elapsed time on a terminal."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.status: Status | None = None

    def __call__(self, e: Event) -> None:
        from rich.text import Text

        if self.quiet:
            return
        if e.kind == "tick":
            if err.is_terminal:
                text = Text(f"{e.process}: {e.detail}  {e.elapsed_s:5.1f} s")
                if self.status is None:
                    self.status = err.status(text)
                    self.status.start()
                else:
                    self.status.update(text)
            return
        self.close()
        if e.kind == "start":
            err.print(Text.assemble((f"{e.process}: ", "bold"), ("start ", ""), (e.detail[:200], "dim")))
        elif e.kind in ("phase", "ready"):
            err.print(
                Text(f"  {e.elapsed_s:6.1f} s  {e.process}: {e.detail if e.kind == 'phase' else 'ready ' + e.detail}")
            )
        elif e.kind == "transport":
            err.print(Text(f"  {e.process}: transport {e.detail}, from its log"))
        else:
            err.print(Text(f"  {e.process}: {e.kind}"))

    def notify(self, name: str, what: str) -> None:
        from moetune.run.launch import Event

        self(Event(name, what, 0.0))

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP stop a foreground launch the way Ctrl-C does (servers first)."""

    def raise_interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _show_failure(e: LaunchFailed, as_json: bool) -> None:
    """The diagnosis goes out as the error (cause, hint, evidence); add the JSON and where the logs are."""
    from moetune.run.record import RunDir

    if as_json:
        print_json({"run": e.run_id, "error": e.diagnosis.to_json()})
    if e.run_id:
        e.details = (*e.details, f"logs: {RunDir.open(e.run_id).path}")


@click.command("launch")
@click.argument("plan", metavar="PLAN.json", type=click.Path(path_type=Path))
@click.option("--detach", is_flag=True, help="Return once every server is healthy (stop it with `moetune stop RUN`).")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(1),
    default=1800.0,
    show_default=True,
    help="Seconds to wait for each server's /health.",
)
@transport_options()
@click.option("--force", is_flag=True, help="Launch a plan whose verdict is that it does not fit (refused otherwise).")
@click.option(
    "--verify",
    is_flag=True,
    help="Preflight: once the RPC workers listen, run the engine's own dry run "
    "of each server's exact command (llama-fit-params; ik_llama.cpp's --dry-run) and say where it "
    "disagrees with the plan, before loading anything.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve this launch's metrics for Prometheus on 127.0.0.1:PORT/metrics while it lives "
    "(`moetune metrics serve --launch RUN`, started once the servers are healthy).",
)
@json_option
def launch_cmd(
    plan: Path,
    detach: bool,
    timeout_s: float,
    transport: str | None,
    rdma_dev: str | None,
    force: bool,
    verify: bool,
    metrics_port: int | None,
    as_json: bool,
) -> None:
    """Start a plan's RPC workers (over ssh on other nodes), then its servers; wait until every
    server is healthy. A plan whose verdict is that it does not fit is refused (exit 2) unless --force.

    Without --detach it stays in the foreground: Ctrl-C stops the servers, waits until their
    processes are gone, then stops the workers. Logs, exact commands and times are kept in the
    run directory (`moetune ps` shows it).
    """
    from moetune.app import launch as app
    from moetune.run.prepare import LaunchFailed

    req = app.LaunchRequest(
        plan=plan,
        detach=detach,
        timeout_s=timeout_s,
        transport=transport,
        rdma_dev=rdma_dev,
        force=force,
        verify=verify,
        metrics_port=metrics_port,
    )
    prepared = app.prepare(req)
    for message, remedy in prepared.warnings:
        warn(message, remedy)
    display = Display(quiet=as_json)
    verified: list[Verification] = []

    def preflight() -> None:
        from moetune.report.plan_view import print_verify

        display.close()
        with err.status("the engine's dry run", spinner="dots"):
            verified.extend(app.verify(prepared))
        if not as_json:
            print_verify(verified, err)
        for message, remedy in app.disagreements(verified):
            warn(message, remedy)

    with _signals_interrupt():
        launched: Launched | None = None

        def serving(la: Launched) -> None:
            nonlocal launched
            launched = la  # before the sampler's last sample: a Ctrl-C then stops it below

        try:
            launched = app.start(req, prepared, on_event=display, preflight=preflight, on_launched=serving)
            display.close()
            if metrics_port is not None:
                log = app.serve_metrics(launched, metrics_port)
                if log is not None:
                    warn(f"the metrics endpoint on 127.0.0.1:{metrics_port} did not come up", f"see {log}")
                elif not as_json:
                    err.print(f"metrics: http://127.0.0.1:{metrics_port}/metrics (ends with the launch)")
            _print_launched(launched, as_json, verified)
            if not detach:
                _foreground(launched, display)
        except LaunchFailed as e:
            display.close()
            _show_failure(e, as_json)
            raise
        except KeyboardInterrupt:
            app.stop_unwatched(launched, display.notify)  # not yet watched
            raise
        finally:
            display.close()


def _print_launched(launched: Launched, as_json: bool, verified: list[Verification]) -> None:
    if as_json:
        from moetune.app.launch import launched_json

        print_json(launched_json(launched, verified))
        return
    for name, url in launched.urls.items():
        out.print(f"{name}: {url}")
    pids = ", ".join(
        f"{n} {launched.nodes[n] + ':' if launched.nodes.get(n, 'local') != 'local' else ''}{p}"
        for n, p in launched.pids.items()
    )
    out.print(f"run {launched.run.run_id}  (pids {pids})")
    for name, t in launched.transports.items():
        out.print(f"{name} transport: {t or 'unknown'}")


def _foreground(launched: Launched, display: Display) -> None:
    from rich.text import Text

    from moetune.app.launch import watch

    err.print(Text("serving; Ctrl-C stops the servers, then the workers", style="dim"))
    watch(
        launched,
        on_event=display,
        notify=display.notify,
        on_interrupt=lambda: err.print(f"stopping run {launched.run.run_id}"),
    )
    err.print(f"run {launched.run.run_id} was stopped")


@click.command("ps")
@click.option("--all", "show_all", is_flag=True, help="Also list runs whose processes are gone.")
@json_option
def ps_cmd(show_all: bool, as_json: bool) -> None:
    """Launches with live processes (their pids checked now)."""
    from moetune.run.status import runs

    rows = [r.to_json() for r in runs(show_all)]
    if as_json:
        print_json(rows)
        return
    from rich.table import Table

    if not rows:
        out.print("no live launches" + ("" if show_all else " (--all lists stopped ones)"))
        return
    t = Table()
    boxed = any(r["containers"] for r in rows)
    for c in ("run", "state", "age", "servers", "processes", *(["containers"] if boxed else [])):
        t.add_column(c, no_wrap=c == "run", overflow="fold")
    now = time.time()
    for r in rows:
        procs = " ".join(
            f"{n}{'' if r['nodes'][n] == 'local' else '@' + r['nodes'][n]}:{p}" + ("" if r["alive"][n] else "(gone)")
            for n, p in r["pids"].items()
        )
        age = now - r["created_at"]
        t.add_row(
            r["run"],
            f"{r['state']}, orphaned" if r["orphaned"] else r["state"],
            f"{age / 60:.0f} min" if age >= 60 else f"{age:.0f} s",
            " ".join(r["urls"].values()),
            procs,
            *([" ".join(r["containers"].values())] if boxed else []),
        )
    out.print(t)
    for r in rows:
        if r["orphaned"]:
            warn(
                f"run {r['run']} is orphaned: the moetune process that launched it is gone, and nobody will stop "
                "its servers",
                f"moetune stop {r['run']}",
            )


@click.command("stop")
@click.argument("runs", nargs=-1, metavar="RUN...")
@click.option("--all", "stop_all", is_flag=True, help="Stop every live launch.")
@click.option(
    "--grace",
    "grace_s",
    type=click.FloatRange(0),
    default=30.0,
    show_default=True,
    help="Seconds a process gets after SIGTERM before SIGKILL.",
)
@json_option
def stop_cmd(runs: tuple[str, ...], stop_all: bool, grace_s: float, as_json: bool) -> None:
    """Stop launches in order: servers first (waiting until their pids are gone), then RPC workers."""
    if not runs and not stop_all:
        raise click.UsageError("give a RUN (see `moetune ps`) or --all")
    from moetune.run.stop import stop_runs

    docs = []
    for st in stop_runs(runs, grace_s=grace_s, notify=None if as_json else Display(False).notify):
        docs.append(st.to_json())
        if as_json:
            continue
        out.print(f"run {st.run_id} stopped")
        for r in sorted(st.records, key=lambda r: r.exited_at or 0):
            took = (
                f"gone {r.exited_at - r.stop_sent_at:.2f} s after SIGTERM"
                if r.exited_at and r.stop_sent_at
                else "already gone"
            )
            pid = (
                f"pid {r.remote_pid} on {r.node}"
                if r.remote
                else f"pid {r.pid}, container {r.container} removed"
                if r.container
                else f"pid {r.pid}"
            )
            out.print(f"  {r.name} ({r.role}, {pid}): {took}" + (" (killed)" if r.kill_sent_at else ""))
    if as_json:
        print_json(docs)


def register(cli: click.Group) -> None:
    cli.add_command(launch_cmd)
    cli.add_command(ps_cmd)
    cli.add_command(stop_cmd)
