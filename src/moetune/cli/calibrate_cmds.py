"""`moetune calibrate`: fit the speed model's constants to the benchmarks of plans in the history."""

from __future__ import annotations

from pathlib import Path

import click

from moetune.cli.common import db_option, json_option, out, print_json, warn
from moetune.errors import InputError


@click.command("calibrate")
@click.argument("run_refs", nargs=-1)
@click.option(
    "--include-contended",
    is_flag=True,
    help="Fit contended runs too (another program took more CPU than MOETUNE_MAX_FOREIGN_CORES while "
    "they measured); they are left out by default.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Store the calibration even when its stated uncertainty is worse than the built-in constants'.",
)
@db_option
@json_option
def calibrate_cmd(
    run_refs: tuple[str, ...], include_contended: bool, force: bool, db_path: Path | None, as_json: bool
) -> None:
    """Fit the speed model's constants to measured runs (default: every benchmark of a plan).

    Each measured TG (at its context depth) and PP (over the prompt it processed) of a benchmarked
    plan is one equation of the speed model; the fit (least squares on log ratios, pulled toward the
    current constants: doubling one costs what a 3% miss does) is kept per hardware and engine kind, and `moetune plan` uses it
    for that hardware from then on (`--speed` still overrides). The error printed is
    leave-one-run-out, on the runs it was fitted on; the stated uncertainty is the band a
    measurement is checked against (`bench` flags a run outside it). Contended runs are left out
    (--include-contended keeps them), and a calibration whose stated uncertainty is worse than the
    built-in constants' is not stored (--force stores it).
    """
    from moetune.plan.calibrate import FITTED
    from moetune.store.db import ResultsDB, Run
    from moetune.tune.history import calibrate_and_save, gather, placements, plan_prior

    left: list[Run] = []
    with ResultsDB.open(db_path) as db:
        groups = gather(
            db,
            [db.resolve(r) for r in run_refs] if run_refs else None,
            include_contended=include_contended,
            left_out=left,
        )
        if left:
            warn(
                f"left out {len(left)} contended run{'s' if len(left) > 1 else ''}: "
                + "; ".join(
                    f"run {r.id} ({r.label}): " + (r.contention.message() if r.contention else "") for r in left[:3]
                )
                + ("; ..." if len(left) > 3 else ""),
                "benchmark them again on a quiet machine, or give --include-contended",
            )
        if not groups:
            raise InputError(
                "no benchmark of a plan to calibrate on"
                + (" among those runs" if run_refs else "")
                + (f" ({len(left)} contended left out)" if left else ""),
                hint="benchmark a plan first (`moetune bench plan.json`): runs of a bare URL carry no "
                "prediction to compare with" + ("; --include-contended fits contended runs" if left else ""),
            )
        places = {k: placements(db, tuple(sorted({o.run for o in obs}))) for k, obs in groups.items()}
        priors = {k: plan_prior(db, obs) for k, obs in groups.items()}
    results = []
    for (hardware, engine), obs in groups.items():
        cal, entry = calibrate_and_save(
            (hardware, engine),
            obs,
            priors[(hardware, engine)],
            placements=places[(hardware, engine)],
            left_out=len(left),
            force=force,
        )
        results.append({**entry, "left_out_runs": [r.id for r in left]})
        if not as_json:
            out.print(
                f"{hardware} / {engine}: {len(cal.runs)} runs over {places[(hardware, engine)]} placements, "
                f"{cal.observations} measured workloads" + (f" ({len(left)} contended runs left out)" if left else ""),
                markup=False,
                highlight=False,
            )
            for fam, before, after, band in (
                ("TG", cal.before_tg_median_abs_pct, cal.loo_tg_median_abs_pct, cal.uncertainty_tg_pct),
                ("PP", cal.before_pp_median_abs_pct, cal.loo_pp_median_abs_pct, cal.uncertainty_pp_pct),
            ):
                if before is None:
                    continue
                out.print(
                    f"  {fam}: median error {before}% with the constants before; "
                    + (
                        f"{after}% leave-one-run-out after (stated uncertainty +/-{band}%)"
                        if after is not None
                        else "one run: no held-out error"
                    ),
                    markup=False,
                    highlight=False,
                )
            out.print(
                "  " + " ".join(f"{n}={getattr(cal.constants, n):.4g}" for n in FITTED), markup=False, highlight=False
            )
            if not entry["applied"]:
                warn(
                    f"{hardware} / {engine}: not stored: {entry['not_applied']}; `moetune plan` keeps the "
                    "constants it had",
                    "benchmark more placements on a quiet machine, or give --force",
                )
    if as_json:
        print_json(results[0] if len(results) == 1 else results)
    elif any(e["applied"] for e in results):
        out.print("`moetune plan` uses these for that hardware from now on (`--speed NAME=VALUE` overrides)")


def register(cli: click.Group) -> None:
    cli.add_command(calibrate_cmd)
