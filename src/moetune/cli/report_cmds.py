"""`moetune report`: one self-contained HTML page of a plan, its runs and their comparison."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from moetune.cli.common import db_option, out


@click.command("report")
@click.argument("refs", metavar="RUN|PLAN.json...", nargs=-1)
@click.option("-o", "--output", required=True, metavar="FILE.html", help="Write the page to FILE.html (- for stdout).")
@click.option(
    "--sweep",
    "sweep_id",
    metavar="SID",
    help="The runs of this sweep (an interleaved one: every round, compared round by round).",
)
@click.option(
    "--paired",
    is_flag=True,
    help="The runs named were made in alternation: compare them round by round "
    "(the k-th run of each label is round k), as `compare --paired`.",
)
@db_option
def report_cmd(refs: tuple[str, ...], output: str, sweep_id: str | None, paired: bool, db_path: Path | None) -> None:
    """One self-contained HTML page of a plan, its runs and their comparison.

    RUN is an id, a label (its newest run) or `latest`; PLAN.json a plan file (`moetune plan -o`),
    alone or beside runs (an argument that names a file, or ends in .json, is a plan). Exits 2 for
    an unknown run or an unreadable plan. The page shows the plan (memory per device, layer map, predicted speed,
    command), each run's figures with their confidence intervals and the prediction beside them,
    the machine's metrics during each run with its phases, serve-bench latency and throughput per
    load level, and with two or more runs the comparison against the first; runs made in
    alternation (--paired, or the --sweep of `sweep --interleave`) are judged round by round, with
    the unpaired verdict beside. It loads nothing from the network: styles and SVG charts are inline."""
    from moetune.app.report import ReportRequest, report, write

    rep = report(ReportRequest(refs=refs, sweep=sweep_id, paired=paired, db_path=db_path))
    if output == "-":
        sys.stdout.write(rep.page)
        return
    path = write(rep, Path(output))
    out.print(f"report: {path} ({rep.size_kib:,.0f} KiB)", markup=False, highlight=False)


def register(cli: click.Group) -> None:
    cli.add_command(report_cmd)
