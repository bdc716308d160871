"""`moetune doctor`: findings in server logs, worker logs, captured responses or a run."""

from __future__ import annotations

from pathlib import Path

import click

from moetune.cli.common import db_option, json_option, out, print_json


@click.command()
@click.argument("inputs", nargs=-1, required=True, metavar="LOG|RESPONSES.json|RUN...")
@click.option(
    "--ram-gib",
    type=click.FloatRange(min=1),
    help="RAM of the machine the logs come from (default: what the log or the run record says).",
)
@db_option
@json_option
def doctor(inputs: tuple[str, ...], ram_gib: float | None, db_path: Path | None, as_json: bool) -> None:
    """List what went wrong or wastes time in llama.cpp / ik_llama.cpp logs, each with its evidence.

    RUN is a launch's run id, `latest` (the newest launch), or a benchmark run's id or label (as
    `compare` and `results` take them): the launch that benchmark measured.

    Looks for prefix-cache misses (and a <think> block as their cause), -sm graph falling back to
    layer, requests queued behind too few --parallel slots, context checkpoint restores (hybrid and
    sliding-window models) and the re-processing they avoided, RDMA negotiated without being asked,
    thinking tokens dominating the output (in captured responses), pinned host memory close to
    the RAM, and failed loads (a crash at load with repacked CPU weights is named: plan with
    --repack off). Exit 0 whether or not it finds anything.
    """
    from rich.text import Text

    from moetune.run.sources import examine_inputs

    findings = examine_inputs(inputs, ram_mib=ram_gib * 1024 if ram_gib else None, db_path=db_path)
    if as_json:
        print_json([f.to_json() for f in findings])
        return
    if not findings:
        out.print("no findings")
        return
    for f in findings:
        out.print(Text.assemble((f"{f.code}", "bold yellow"), f"  {f.source}"))
        out.print(Text(f"  {f.title}"))
        out.print(Text(f"  → {f.remedy}", style="cyan"))
        for e in f.evidence:
            out.print(Text(f"  {e.line:>6} | {e.text[:160]}", style="dim"))
        out.print()


def register(cli: click.Group) -> None:
    cli.add_command(doctor)
