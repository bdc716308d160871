"""`moetune link-test`."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from moetune.cli.common import db_option, err, json_option, out, print_json
from moetune.cluster.linktest import DEFAULT_PORT, TOOLS, link_test, record, samples, summary
from moetune.hardware import inventory
from moetune.monitor.sampler import RunMonitor
from moetune.store.db import ResultsDB


def _gbit(bits_per_s: float | None) -> str:
    return "-" if bits_per_s is None else f"{bits_per_s / 1e9:.2f} Gbit/s"


def _us(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e6:.0f} µs"


@click.command("link-test")
@click.argument("node_a")
@click.argument("node_b")
@click.option("--hw", "hw_path", required=True, help="Hardware YAML naming both nodes (ssh targets, link addresses).")
@click.option(
    "--streams",
    type=click.IntRange(2, 128),
    default=8,
    show_default=True,
    help="Streams of the parallel test (the single-stream test always runs).",
)
@click.option(
    "--duration",
    "duration_s",
    type=click.FloatRange(0.2, 600),
    default=3.0,
    show_default=True,
    help="Seconds per bandwidth test.",
)
@click.option(
    "--pings",
    type=click.IntRange(1, 100000),
    default=200,
    show_default=True,
    help="Round trips of a 1-byte message for the latency.",
)
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port the receiving end listens on, on NODE_B's link address.",
)
@click.option(
    "--tool",
    type=click.Choice(TOOLS),
    default="auto",
    show_default=True,
    help="Bandwidth by iperf3 (auto: where both ends have it) or the built-in TCP test.",
)
@db_option
@click.option("--label", help="Label of the stored run (default: NODE_A->NODE_B).")
@json_option
def link_test_cmd(
    node_a: str,
    node_b: str,
    hw_path: str,
    streams: int,
    duration_s: float,
    pings: int,
    port: int,
    tool: str,
    db_path: Path | None,
    label: str | None,
    as_json: bool,
) -> None:
    """Bandwidth (one stream, then several) and latency from NODE_A to NODE_B's link address.

    A node with an `ssh` target in the hardware file runs its end over ssh, any other runs it
    here. One llama.cpp RPC connection is one TCP stream: the single-stream figure is what a
    worker gets, the parallel one what the link can carry. Stored in the results database.
    """
    hw = inventory.load(hw_path)
    if not as_json:
        err.print(f"link-test {node_a} -> {node_b}: {duration_s:g} s per bandwidth test, {pings} round trips")
    with RunMonitor(list, phase="link-test") as monitor:  # this host, while the link is measured
        r = link_test(hw, node_a, node_b, streams=streams, duration_s=duration_s, pings=pings, port=port, tool=tool)
    with ResultsDB.open(db_path) as db:
        run = db.run(record(db, r, hardware_file=hw.name or hw.source, label=label))
        monitor.attach(db, run.id)
        path = db.path
    s = summary(r)
    if as_json:
        print_json({"run": {**run.header(), "db": str(path)}, **s, "samples": samples(r)})
        return
    t = Table(title=f"{r.src} -> {r.dst} ({r.addr}:{r.port})")
    t.add_column("test")
    t.add_column("result", justify="right")
    t.add_column("how")
    t.add_row("bandwidth, 1 stream", _gbit(s["single_bits_per_s"]), r.tool)
    t.add_row(f"bandwidth, {s['parallel_streams']} streams", _gbit(s["parallel_bits_per_s"]), r.tool)
    t.add_row(
        "latency (round trip)",
        f"median {_us(s['rtt_median_s'])}",
        f"p99 {_us(s['rtt_p99_s'])}, min {_us(s['rtt_min_s'])}, {s['round_trips']} x {r.msg_bytes} B",
    )
    out.print(t)
    out.print(f"stored as run {run.id} in {path}")


def register(cli: click.Group) -> None:
    cli.add_command(link_test_cmd)
