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
    from datetime import UTC, datetime

    from moetune import __version__
    from moetune.errors import InputError
    from moetune.report.html.gather import gather
    from moetune.report.html.page import render_page

    data = gather(
        refs,
        db_path,
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        version=__version__,
        sweep=sweep_id,
        paired=paired,
    )
    page = render_page(data)
    if output == "-":
        sys.stdout.write(page)
        return
    path = Path(output)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page)
    except OSError as e:
        raise InputError(
            f"cannot write the report to {path}: {e.strerror or e}", hint="choose a writable FILE.html with -o"
        ) from None
    out.print(f"report: {path} ({len(page.encode()) / 1024:,.0f} KiB)", markup=False, highlight=False)


def register(cli: click.Group) -> None:
    cli.add_command(report_cmd)
