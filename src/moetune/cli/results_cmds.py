"""`moetune results list|show|export` and `moetune compare`: the history, read back."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from moetune.cli.common import comparison_output, db_option, json_option, out, print_json, print_wide, warn
from moetune.kinds import RunKind
from moetune.option_defaults import DEFAULT_MIN_CHANGE, RESULT_FORMATS

if TYPE_CHECKING:
    from moetune.app.compare import Compared
    from moetune.report.paired import PairedComparison


@click.group()
def results() -> None:
    """The history of benchmark runs: list, show, export."""


@results.command("list")
@click.option("--kind", type=click.Choice([str(k) for k in RunKind]), help="Only runs of this kind.")
@click.option("--sweep", "sweep_id", help="Only the runs of this sweep.")
@click.option("-n", "--limit", type=click.IntRange(1), default=50, show_default=True)
@db_option
@json_option
def list_cmd(kind: str | None, sweep_id: str | None, limit: int, db_path: Path | None, as_json: bool) -> None:
    """Runs, newest first."""
    from moetune.report.results_view import runs_json, runs_table
    from moetune.store.db import ResultsDB

    with ResultsDB.open(db_path) as db:
        runs = db.runs(RunKind(kind) if kind else None, limit, sweep_id=sweep_id)
        if as_json:
            print_json(runs_json(db, runs))
        elif not runs:
            out.print(f"no runs in {db.path} yet; `moetune bench URL` makes one")
        else:
            print_wide(runs_table(db, runs))


@results.command("show")
@click.argument("run_ref", metavar="RUN")
@db_option
@json_option
def show_cmd(run_ref: str, db_path: Path | None, as_json: bool) -> None:
    """One run: its context (plan, command, engine, model, hardware), figures and warnings.

    RUN is an id, a label (its newest run) or `latest`."""
    from moetune.app.results import show as shown_run
    from moetune.bench.analysis.warnings import Warning, grouped
    from moetune.report.results_view import show

    shown = shown_run(run_ref, db_path)
    if as_json:
        print_json(shown.to_json())
        return
    r, d = shown.run, shown.derived
    print_wide(show(r, d, shown.samples))
    for message, remedy in grouped([Warning.from_json(w) for w in d.get("warnings", [])]) + r.flags().warnings():
        warn(message, remedy)


@results.command("export")
@click.argument("run_refs", metavar="[RUN]...", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(RESULT_FORMATS), required=True)
@click.option("--all", "all_runs", is_flag=True, help="Every run in the database.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE, not stdout.")
@db_option
def export_cmd(run_refs: tuple[str, ...], fmt: str, all_runs: bool, output: Path | None, db_path: Path | None) -> None:
    """Runs with every raw sample: md (summary tables), csv (one row per sample, SI units), json (as stored)."""
    from moetune.app.results import ExportRequest, export

    export(ExportRequest(refs=run_refs, all_runs=all_runs, fmt=fmt, output=output, db_path=db_path), sys.stdout)


@click.command("compare")
@click.argument("run_refs", metavar="RUN...", nargs=-1)
@click.option(
    "--baseline", "baseline_ref", metavar="RUN", help="The run the others are compared with (default: the first RUN)."
)
@click.option("--sweep", "sweep_id", help="Compare the completed runs of a sweep (baseline: the sweep's).")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Draw bars with their intervals (and TG/PP against depth for depth runs) to FILE.png.",
)
@click.option(
    "--min-change",
    type=click.FloatRange(0, 100),
    default=DEFAULT_MIN_CHANGE * 100,
    show_default=True,
    help="Changes below this many percent are called 'same' (no significant difference).",
)
@click.option("--confidence", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "md", "csv"]), default="table", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option(
    "--metric",
    type=click.Choice(["all", "goodput"]),
    default="all",
    show_default=True,
    help="goodput: rank serve-bench runs by the rate of requests that met latency targets (--slo, "
    "else the targets the runs were measured with).",
)
@click.option(
    "--slo",
    "slo_text",
    metavar="KEY=MS,...",
    help="Latency targets for --metric goodput (implies it): any subset of ttft_ms, itl_ms, tpot_ms, e2e_ms.",
)
@click.option(
    "--paired",
    is_flag=True,
    help="Runs made in alternation, judged round by round: the k-th run of each "
    "configuration (label) forms round k; a label names all its completed runs. An interleaved sweep "
    "(--sweep) is always compared so.",
)
@db_option
@json_option
def compare_cmd(
    run_refs: tuple[str, ...],
    baseline_ref: str | None,
    sweep_id: str | None,
    plot_path: Path | None,
    min_change: float,
    confidence: float,
    fmt: str,
    seed: int,
    metric: str,
    slo_text: str | None,
    paired: bool,
    db_path: Path | None,
    as_json: bool,
) -> None:
    """Compare runs with a baseline: median and confidence interval per metric, change in %, and a
    verdict per row: faster, slower, or no significant difference (same).

    The rule: the bootstrap confidence interval of the ratio of medians; "same" when it contains 1
    or the change is below --min-change.

    --metric goodput (or --slo) ranks serve-bench runs instead: by their best level's rate of
    requests that met every latency target, with each level's share met.

    --paired (and --sweep of a sweep run with --interleave) judges by the differences within rounds:
    per round the ratio of medians, and the t interval of their mean log across rounds."""
    from moetune.app import compare as app

    req = app.CompareRequest(
        refs=run_refs,
        baseline=baseline_ref,
        sweep=sweep_id,
        plot=plot_path,
        min_change=min_change / 100,
        conf=confidence,
        seed=seed,
        slo=slo_text,
        db_path=db_path,
    )
    if paired or (sweep_id is not None and app.interleaved(sweep_id, db_path)):
        if metric == "goodput" or slo_text is not None:
            raise click.UsageError("--metric goodput ranks runs; a paired comparison judges metrics round by round")
        if sweep_id is not None and run_refs:
            raise click.UsageError("--sweep compares the sweep's rounds; give no runs with it")
        _print_paired(app.compare_paired(req), plot_path, fmt, as_json)
    elif metric == "goodput" or slo_text is not None:
        from moetune.report.goodput import ranking_csv, ranking_markdown, ranking_table

        ranking = app.compare_goodput(req, notice=warn)
        if as_json:
            print_json(ranking.to_json())
        else:
            comparison_output(ranking, fmt, (ranking_markdown, ranking_csv, ranking_table))
    else:
        _print_compared(app.compare(req, notice=warn), fmt, as_json)


def _print_compared(compared: Compared, fmt: str, as_json: bool) -> None:
    from moetune.bench.analysis.warnings import grouped
    from moetune.report.results_view import prediction_lines

    if as_json:
        print_json(compared.to_json())
        return
    comparison_output(compared.comparison, fmt)
    for r in compared.runs:
        lines = prediction_lines(compared.predictions.get(r.id))
        if lines and fmt == "table":
            out.print(f"run {r.id} ({r.label}): " + lines[0], markup=False, highlight=False)
            for line in lines[1:]:
                out.print(line, markup=False, highlight=False)
    for rid, ws in compared.noise.items():
        for message, remedy in grouped(ws):
            warn(f"run {rid}: {message}", remedy)
    if compared.plot:
        out.print(f"plot: {compared.plot}")


def _print_paired(comp: PairedComparison, plot_path: Path | None, fmt: str, as_json: bool) -> None:
    from moetune.report.paired_view import VIEWS

    if as_json:
        print_json({**comp.to_json(), "plot": str(plot_path) if plot_path else None})
        return
    comparison_output(comp, fmt, VIEWS)
    if plot_path:
        out.print(f"plot: {plot_path} (every round's samples pooled)")


def register(cli: click.Group) -> None:
    cli.add_command(results)
    cli.add_command(compare_cmd)
