"""`moetune calibrate`: fit the speed model's constants to the benchmarks of plans in the history."""

from __future__ import annotations

from pathlib import Path

import click

from moetune.cli.common import db_option, json_option, out, print_json
from moetune.errors import InputError


@click.command("calibrate")
@click.argument("run_refs", nargs=-1)
@db_option
@json_option
def calibrate_cmd(run_refs: tuple[str, ...], db_path: Path | None, as_json: bool) -> None:
    """Fit the speed model's constants to measured runs (default: every benchmark of a plan).

    Each measured TG (at its context depth) and PP (over the prompt it processed) of a benchmarked
    plan is one equation of the speed model; the fit (least squares on log ratios, pulled toward the
    current constants: doubling one costs what a 3% miss does) is kept per hardware and engine kind, and `moetune plan` uses it
    for that hardware from then on (`--speed` still overrides). The error printed is
    leave-one-run-out, on the runs it was fitted on; the stated uncertainty is the band a
    measurement is checked against (`bench` flags a run outside it).
    """
    from moetune.plan.calibrate import FITTED
    from moetune.store.db import ResultsDB
    from moetune.tune.history import calibrate_and_save, gather

    with ResultsDB.open(db_path) as db:
        groups = gather(db, [db.resolve(r) for r in run_refs] if run_refs else None)
    if not groups:
        raise InputError("no benchmark of a plan to calibrate on" + (" among those runs" if run_refs else ""),
                         hint="benchmark a plan first (`moetune bench plan.json`): runs of a bare URL carry no "
                              "prediction to compare with")
    results = []
    for (hardware, engine), obs in groups.items():
        cal, entry = calibrate_and_save((hardware, engine), obs)
        results.append(entry)
        if not as_json:
            out.print(f"{hardware} / {engine}: {len(cal.runs)} runs, {cal.observations} measured workloads",
                      markup=False, highlight=False)
            for fam, before, after, band in (
                    ("TG", cal.before_tg_median_abs_pct, cal.loo_tg_median_abs_pct, cal.uncertainty_tg_pct),
                    ("PP", cal.before_pp_median_abs_pct, cal.loo_pp_median_abs_pct, cal.uncertainty_pp_pct)):
                if before is None:
                    continue
                out.print(f"  {fam}: median error {before}% with the constants before; "
                          + (f"{after}% leave-one-run-out after (stated uncertainty +/-{band}%)" if after is not None
                             else "one run: no held-out error"), markup=False, highlight=False)
            out.print("  " + " ".join(f"{n}={getattr(cal.constants, n):.4g}" for n in FITTED),
                      markup=False, highlight=False)
    if as_json:
        print_json(results[0] if len(results) == 1 else results)
    else:
        out.print("`moetune plan` uses these for that hardware from now on (`--speed NAME=VALUE` overrides)")


def register(cli: click.Group) -> None:
    cli.add_command(calibrate_cmd)
