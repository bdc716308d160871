"""`moetune compare`: runs against a baseline, metric by metric (the one policy,
:func:`moetune.report.compare.compare_runs`), round by round (paired runs, an interleaved sweep), or
serve-bench runs ranked by goodput."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.bench.analysis.stats import DEFAULT_CONF, DEFAULT_MIN_CHANGE

if TYPE_CHECKING:
    from moetune.bench.analysis.warnings import Warning
    from moetune.report.compare import Comparison
    from moetune.report.goodput import GoodputRanking
    from moetune.report.paired import PairedComparison
    from moetune.store.db import ResultsDB, Run

Notice = Callable[[str], None]  # told a line as soon as it is known (a run still running, ...)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareRequest:
    """What `moetune compare` was asked: the runs (ids, labels, `latest`) and/or a sweep's."""

    refs: tuple[str, ...] = ()
    baseline: str | None = None  # the run the others are compared with (default: the first)
    sweep: str | None = None
    plot: Path | None = None  # also draw the comparison to this PNG
    min_change: float = DEFAULT_MIN_CHANGE  # a fraction: changes below it are "same"
    conf: float = DEFAULT_CONF
    seed: int = 0
    slo: str | None = None  # goodput's latency targets (KEY=MS,...; None: the runs' own)
    db_path: Path | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Compared:
    """The comparison, each run's noise warnings, and what a plan predicted for its bench runs."""

    comparison: Comparison
    runs: list[Run]
    noise: dict[int, list[Warning]]
    predictions: dict[int, dict[str, Any]] = field(default_factory=dict)  # run -> predicted.report
    plot: Path | None = None

    def to_json(self) -> dict[str, object]:
        return {
            **self.comparison.to_json(),
            "plot": str(self.plot) if self.plot else None,
            "run_warnings": {str(k): [w.to_json() for w in v] for k, v in self.noise.items() if v},
            "prediction_error": {str(k): v["prediction_error"] for k, v in self.predictions.items()},
        }


def interleaved(sweep_id: str, db_path: Path | None = None) -> bool:
    """Whether the sweep ran in interleaved rounds (it is then always compared round by round)."""
    from moetune.store.db import ResultsDB

    with ResultsDB.open(db_path) as db:
        return bool((db.sweep(sweep_id) or {}).get("interleave"))


def _not_done(runs: list[Run], notice: Notice | None, what: str) -> None:
    from moetune.kinds import RunStatus

    for r in runs:
        if r.status != RunStatus.DONE and notice is not None:
            notice(f"run {r.id} ({r.label}) is {r.status}: {what} the samples it has")


def compare(req: CompareRequest, *, notice: Notice | None = None) -> Compared:
    """The runs against the baseline, metric by metric; an input error when no row compares."""
    from moetune.report.compare import compare_runs, require_rows, runs_to_compare
    from moetune.report.plot import plot_runs
    from moetune.store.db import ResultsDB

    with ResultsDB.open(req.db_path) as db:
        runs = runs_to_compare(db, list(req.refs), baseline=req.baseline, sweep_id=req.sweep)
        _not_done(runs, notice, "comparing")
        compared = compare_runs(db, runs, conf=req.conf, min_change=req.min_change, seed=req.seed)
        preds = _predictions(db, runs)
    comp = compared.comparison
    require_rows(comp)
    if req.plot:
        plot_runs([comp.baseline, *comp.others], req.plot, conf=req.conf, seed=req.seed)
    return Compared(comparison=comp, runs=runs, noise=compared.noise, predictions=preds, plot=req.plot)


def _predictions(db: ResultsDB, runs: list[Run]) -> dict[int, dict[str, Any]]:
    """What the plan predicted beside what its bench runs measured, for the runs of a plan."""
    from moetune.bench.analysis.predicted import report
    from moetune.bench.analysis.summary import bench_summary
    from moetune.kinds import RunKind

    return {
        r.id: rep
        for r in runs
        if r.kind == RunKind.BENCH
        and r.meta.details.get("predicted")
        and (rep := report(bench_summary(db.samples(r.id)), dict(r.meta.details)))
    }


def compare_paired(req: CompareRequest) -> PairedComparison:
    """Runs made in alternation (or an interleaved sweep's rounds), judged round by round."""
    from moetune.report.paired import load_refs, load_sweep
    from moetune.report.plot import plot_runs
    from moetune.store.db import ResultsDB

    with ResultsDB.open(req.db_path) as db:
        if req.sweep is not None:
            comp = load_sweep(
                db, req.sweep, baseline=req.baseline, conf=req.conf, min_change=req.min_change, seed=req.seed
            )
        else:
            comp = load_refs(
                db, list(req.refs), baseline=req.baseline, conf=req.conf, min_change=req.min_change, seed=req.seed
            )
    if req.plot:
        plot_runs([comp.baseline, *comp.others], req.plot, conf=req.conf, seed=req.seed)
    return comp


def compare_goodput(req: CompareRequest, *, notice: Notice | None = None) -> GoodputRanking:
    """serve-bench runs ranked by the rate of requests that met the latency targets."""
    from moetune.bench.analysis.slo import parse_slo
    from moetune.errors import InputError
    from moetune.report.compare import runs_to_compare
    from moetune.report.goodput import rank_goodput
    from moetune.store.db import ResultsDB

    slo = None if req.slo is None else parse_slo(req.slo)
    if req.plot is not None:
        raise InputError(
            "--plot draws the per-metric comparison; --metric goodput prints a ranking only",
            hint="drop --plot, or compare without --metric goodput to plot",
        )
    with ResultsDB.open(req.db_path) as db:
        runs = runs_to_compare(db, list(req.refs), baseline=req.baseline, sweep_id=req.sweep)
        _not_done(runs, notice, "judging")
        return rank_goodput(db, runs, slo)
