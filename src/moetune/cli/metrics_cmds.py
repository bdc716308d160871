"""`moetune metrics serve|dashboard`: the machine while moetune measures, for Prometheus and Grafana."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from moetune.cli.common import db_option, print_text, warn


@click.group()
def metrics() -> None:
    """Export the machine's figures to Prometheus; a Grafana dashboard for them."""


@metrics.command("serve")
@click.option(
    "--listen",
    default="127.0.0.1:9101",
    show_default=True,
    metavar="HOST:PORT",
    help="Address to serve /metrics on (port 0: any free port). It has no authentication: "
    "keep it on loopback or a trusted network.",
)
@click.option(
    "--launch",
    "launch_id",
    metavar="RUN",
    help="Export this launch alone (its processes, the host, the GPUs) and stop when its processes "
    "are gone (what `launch --metrics-port` starts).",
)
@db_option
def serve_cmd(listen: str, launch_id: str | None, db_path: Path | None) -> None:
    """Serve GET /metrics (Prometheus text format) until Ctrl-C or SIGTERM.

    It exports the host and its GPUs, every live launch's processes and servers (sampled at each
    scrape, labelled with the launch's id), and the newest snapshot of every run being measured
    (status running) in the results database, labelled with the run's id, kind and label; metric
    names are listed in `moetune.monitor.exposition` and the README."""
    import threading

    from moetune.monitor.serve import (
        DbSource,
        LaunchSource,
        bind,
        combine,
        is_loopback,
        parse_listen,
        serve_until_stopped,
    )
    from moetune.run.record import RunDir

    host, port = parse_listen(listen)
    if not is_loopback(host):
        warn(
            f"--listen {listen}: /metrics has no authentication, and this address is not loopback",
            "bind 127.0.0.1 and let Prometheus scrape on this machine, or firewall the port",
        )
    if launch_id is not None:
        RunDir.open(launch_id)  # an unknown launch is an input error, said now
    launches = LaunchSource(only=launch_id)
    db = DbSource(db_path)
    stop = threading.Event()
    try:
        server = bind(host, port, combine(launches, db))
        what = f"launch {launch_id}" if launch_id else f"live launches, running runs in {db.db.path}"
        sys.stderr.write(f"serving {server.url}/metrics ({what}); Ctrl-C to stop\n")
        sys.stderr.flush()
        if launch_id is not None:  # ends with its launch

            def watch() -> None:
                while not stop.wait(2.0):
                    if not launches.live():
                        stop.set()

            threading.Thread(target=watch, daemon=True, name="moetune-metrics-launch").start()
        serve_until_stopped(server, stop)
        sys.stderr.write("stopped\n")
    finally:
        stop.set()
        launches.close()
        db.close()


@metrics.command("dashboard")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the dashboard to this file (default: stdout).",
)
def dashboard_cmd(output: Path | None) -> None:
    """The Grafana dashboard (JSON) for `moetune metrics serve`: import it in Grafana
    (Dashboards → New → Import) and choose the Prometheus data source."""
    from importlib.resources import files

    text = (files("moetune.monitor") / "grafana" / "moetune.json").read_text()
    if output is None:
        print_text(text)
        return
    try:
        output.write_text(text)
    except OSError as e:
        from moetune.errors import InputError

        raise InputError(f"cannot write {output}: {e.strerror or e}", hint="choose a writable path with -o") from None
    sys.stderr.write(f"wrote {output}\n")


def register(cli: click.Group) -> None:
    cli.add_command(metrics)
