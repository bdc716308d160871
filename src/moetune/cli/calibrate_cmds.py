"""`moetune calibrate`: fit the speed model's constants to the benchmarks of plans in the history."""

from __future__ import annotations

from pathlib import Path

import click

from moetune.cli.common import db_option, json_option, out, print_json, warn


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
    from moetune.app.calibrate import CalibrateRequest, calibrate
    from moetune.plan.calibrate import FITTED

    done = calibrate(
        CalibrateRequest(refs=run_refs, include_contended=include_contended, force=force, db_path=db_path), warn=warn
    )
    if as_json:
        print_json(done.to_json())
        return
    left = done.left_out
    for f in done.fits:
        cal = f.calibration
        out.print(
            f"{f.hardware} / {f.engine}: {len(cal.runs)} runs over {f.placements} placements, "
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
            "  " + " ".join(f"{n}={getattr(cal.constants, n):.4g}" for n in FITTED if n not in cal.held),
            markup=False,
            highlight=False,
        )
        if cal.held:
            out.print(
                f"  held at the hardware file's measured values (`moetune hw attention`): {', '.join(cal.held)}",
                markup=False,
                highlight=False,
            )
        if not f.entry["applied"]:
            warn(
                f"{f.hardware} / {f.engine}: not stored: {f.entry['not_applied']}; `moetune plan` keeps the "
                "constants it had",
                "benchmark more placements on a quiet machine, or give --force",
            )
    if done.applied:
        out.print("`moetune plan` uses these for that hardware from now on (`--speed NAME=VALUE` overrides)")


def register(cli: click.Group) -> None:
    cli.add_command(calibrate_cmd)
