"""`moetune results list|show|export` and `moetune compare RUN...`: the history of measurements."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console, RenderableType

from moetune.bench.stats import DEFAULT_MIN_CHANGE
from moetune.bench.warn import Code, bench_warnings, grouped
from moetune.cli.common import json_option, out, print_json, warn
from moetune.errors import InputError
from moetune.report.compare import Comparison, compare, load
from moetune.report.compare_view import comparison_csv, comparison_markdown, comparison_table
from moetune.report.plot import plot_runs
from moetune.report.results_view import (
    FORMATS,
    derived,
    export_csv,
    export_json,
    export_md,
    runs_json,
    runs_table,
    show,
)
from moetune.store.db import KINDS, ResultsDB, Run

F = TypeVar("F", bound=Callable[..., Any])
WIDE = 200  # columns for tables written to files and pipes


def db_option(f: F) -> F:
    return click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path),
                        help="Results database (default: results.sqlite in moetune's data directory).")(f)


def open_db(path: Path | None) -> ResultsDB:
    return ResultsDB.open(path)


@click.group()
def results() -> None:
    """The history of benchmark runs: list, show, export."""


@results.command("list")
@click.option("--kind", type=click.Choice(KINDS), help="Only runs of this kind.")
@click.option("--sweep", "sweep_id", help="Only the runs of this sweep.")
@click.option("-n", "--limit", type=click.IntRange(1), default=50, show_default=True)
@db_option
@json_option
def list_cmd(kind: str | None, sweep_id: str | None, limit: int, db_path: Path | None, as_json: bool) -> None:
    """Runs, newest first."""
    with open_db(db_path) as db:
        runs = db.runs(kind, limit, sweep_id=sweep_id)
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
    with open_db(db_path) as db:
        r = db.resolve(run_ref)
        d = derived(r, db.samples(r.id))
        if as_json:
            print_json({**r.to_json(), "derived": d, "samples": db.sample_counts(r.id)})
            return
        print_wide(show(r, d, db.sample_counts(r.id)))
        for message, remedy in grouped(d.get("warnings", [])):
            warn(message, remedy)


@results.command("export")
@click.argument("run_refs", metavar="[RUN]...", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True)
@click.option("--all", "all_runs", is_flag=True, help="Every run in the database.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE, not stdout.")
@db_option
def export_cmd(run_refs: tuple[str, ...], fmt: str, all_runs: bool, output: Path | None, db_path: Path | None) -> None:
    """Runs with every raw sample: md (summary tables), csv (one row per sample, SI units), json (as stored)."""
    import json

    with open_db(db_path) as db:
        runs = _runs(db, run_refs, all_runs)
        if fmt == "json":
            text = json.dumps(export_json(db, runs), indent=2, default=str) + "\n"
        elif fmt == "csv":
            text = export_csv(db, runs)
        else:
            text = export_md(db, runs)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    else:
        sys.stdout.write(text)


def _runs(db: ResultsDB, refs: tuple[str, ...], all_runs: bool) -> list[Run]:
    if all_runs:
        return list(reversed(db.runs()))
    if not refs:
        raise InputError("name the runs to export (ids, labels or `latest`), or give --all")
    return [db.resolve(r) for r in refs]


def run_noise(run: Run, samples: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The warnings that make a run's verdicts less trustworthy (noise, cache state)."""
    if run.kind != "bench":
        return []
    keep = {Code.NOISY, Code.OUTLIERS, Code.FIRST_RUN_SLOWER, Code.CACHE_HIT, Code.CACHE_MISS, Code.FEW_SAMPLES}
    return [w.to_json() for w in bench_warnings(samples) if w.code in keep]


def comparison_output(c: Comparison, fmt: str) -> None:
    if fmt == "md":
        sys.stdout.write(comparison_markdown(c))
    elif fmt == "csv":
        sys.stdout.write(comparison_csv(c))
    else:
        print_wide(comparison_table(c))
    for n in c.notes:
        warn(n)


@click.command("compare")
@click.argument("run_refs", metavar="RUN...", nargs=-1)
@click.option("--baseline", "baseline_ref", metavar="RUN", help="The run the others are compared with "
                                                                 "(default: the first RUN).")
@click.option("--sweep", "sweep_id", help="Compare the completed runs of a sweep (baseline: the sweep's).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Draw bars with their intervals (and TG/PP against depth for depth runs) to FILE.png.")
@click.option("--min-change", type=click.FloatRange(0, 100), default=DEFAULT_MIN_CHANGE * 100, show_default=True,
              help="Changes below this many percent are called 'same' (no significant difference).")
@click.option("--confidence", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["table", "md", "csv"]), default="table", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@db_option
@json_option
def compare_cmd(run_refs: tuple[str, ...], baseline_ref: str | None, sweep_id: str | None, plot_path: Path | None,
                min_change: float, confidence: float, fmt: str, seed: int, db_path: Path | None,
                as_json: bool) -> None:
    """Compare runs with a baseline: median and confidence interval per metric, change in %, and a
    verdict per row: faster, slower, or no significant difference (same).

    The rule: the bootstrap confidence interval of the ratio of medians; "same" when it contains 1
    or the change is below --min-change."""
    with open_db(db_path) as db:
        runs = [db.resolve(r) for r in run_refs]
        if sweep_id:
            spec = db.sweep(sweep_id)
            if spec is None:
                raise InputError(f"no sweep {sweep_id!r}", hint="see `moetune results list` for sweep ids")
            done = {r.label: r for r in reversed(db.runs(sweep_id=sweep_id)) if r.status == "done"}
            order = [p["label"] for p in spec.get("plans", [])]
            if spec.get("baseline") in done and baseline_ref is None:
                baseline_ref = str(done[spec["baseline"]].id)
            runs += [done[lab] for lab in order if lab in done]
        if baseline_ref is not None:
            base = db.resolve(baseline_ref)
            runs = [base, *[r for r in runs if r.id != base.id]]
        if len(runs) < 2:
            raise InputError("compare needs at least two runs (RUN_A RUN_B, or RUN --baseline RUN)",
                             hint="see `moetune results list` for run ids")
        for r in runs:
            if r.status != "done":
                warn(f"run {r.id} ({r.label}) is {r.status}: comparing the samples it has")
        data = load(db, runs)
        noise = {r.id: run_noise(r, db.samples(r.id)) for r in runs}
    comp = compare(data[0], data[1:], conf=confidence, min_change=min_change / 100, seed=seed)
    if not comp.rows:
        raise InputError(f"runs {', '.join(str(r.id) for r in runs)} share no metric with the baseline",
                         hint="compare runs of the same workloads (see `moetune results show RUN`)")
    if plot_path:
        plot_runs(data, plot_path, conf=confidence, seed=seed)
    if as_json:
        print_json({**comp.to_json(), "plot": str(plot_path) if plot_path else None,
                    "run_warnings": {str(k): v for k, v in noise.items() if v}})
        return
    comparison_output(comp, fmt)
    for rid, ws in noise.items():
        for message, remedy in grouped(ws):
            warn(f"run {rid}: {message}", remedy)
    if plot_path:
        out.print(f"plot: {plot_path}")


def register(cli: click.Group) -> None:
    cli.add_command(results)
    cli.add_command(compare_cmd)


def print_wide(r: RenderableType) -> None:
    """Tables at their natural width when stdout is a file or pipe (rich would fold them to 80 columns)."""
    if out.is_terminal:
        out.print(r)
    else:
        Console(width=WIDE, highlight=False, soft_wrap=True).print(r)
