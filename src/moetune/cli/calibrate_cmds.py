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
    """Fit the decode speed constants to measured runs (default: every benchmark of a plan).

    Each measured TG of a benchmarked plan, at its context depth, is one equation of the speed
    model; the fit (least squares on relative error, pulled toward the current constants) is kept
    per hardware and engine kind, and `moetune plan` uses it for that hardware from then on
    (`--speed` still overrides). The error printed is leave-one-run-out, on the runs it was fitted on.
    """
    from moetune.bench.analysis.summary import run_summary
    from moetune.kinds import RunKind
    from moetune.plan.calibrate import Observation, calibrate
    from moetune.store import calibrations
    from moetune.store.db import ResultsDB

    groups: dict[tuple[str | None, str], list[Observation]] = {}
    with ResultsDB.open(db_path) as db:
        runs = [db.resolve(r) for r in run_refs] if run_refs else db.runs(RunKind.BENCH)
        for r in runs:
            expect = r.meta.details.get("predicted")
            plan = r.meta.plan
            if not expect or not plan:
                continue
            services = plan.get("services") or [{}]
            engine = str((services[0].get("settings") or {}).get("engine", "llama.cpp"))
            summary = run_summary(db.samples(r.id))
            for name, w in summary.get("workloads", {}).items():
                tg = (w.get("tg") or {}).get("median")
                if tg and name in expect:
                    groups.setdefault((plan.get("hardware"), engine), []).append(Observation(r.id, tg, expect[name]))
    if not groups:
        raise InputError("no benchmark of a plan to calibrate on" + (" among those runs" if run_refs else ""),
                         hint="benchmark a plan first (`moetune bench plan.json`): runs of a bare URL carry no "
                              "prediction to compare with")
    results = []
    for (hardware, engine), obs in groups.items():
        cal = calibrate(obs)
        entry = calibrations.save(hardware, engine, cal.to_json())
        results.append(entry)
        if not as_json:
            err = cal.loo_tg_median_abs_pct
            out.print(f"{hardware} / {engine}: {len(cal.runs)} runs, {cal.observations} TG measurements; "
                      f"median TG error {cal.before_tg_median_abs_pct}% before"
                      + (f", {err}% leave-one-run-out after" if err is not None else " (one run: no held-out error)"),
                      markup=False, highlight=False)
            k = cal.constants
            out.print(f"  cpu_bw_eff={k.cpu_bw_eff:.3f} gpu_bw_eff={k.gpu_bw_eff:.3f} token_overhead_us="
                      f"{k.token_overhead_us:.1f} split_us={k.split_us:.1f} rpc_hop_us={k.rpc_hop_us:.1f} "
                      f"cpu_ctx_gflops_per_core={k.cpu_ctx_gflops_per_core:.2f} gpu_ctx_tflops={k.gpu_ctx_tflops:.1f}",
                      markup=False, highlight=False)
    if as_json:
        print_json(results[0] if len(results) == 1 else results)
    else:
        out.print("`moetune plan` uses these for that hardware from now on (`--speed NAME=VALUE` overrides)")


def register(cli: click.Group) -> None:
    cli.add_command(calibrate_cmd)
