"""`moetune sweep PLAN...`: launch, bench and stop each plan in turn (or in interleaved rounds), then
compare them with the baseline, as one result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.app.progress import Callbacks
from moetune.bench.analysis.stats import DEFAULT_MIN_CHANGE
from moetune.errors import RuntimeFailure

if TYPE_CHECKING:
    from moetune.bench.single.interleave import InterleaveResult
    from moetune.bench.single.runner import BenchOptions
    from moetune.bench.single.sweep import Outcome, SweepSpec
    from moetune.bench.single.workloads import Workload
    from moetune.report.compare import Comparison
    from moetune.report.paired import PairedComparison


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRequest:
    """What `moetune sweep` was asked. ``interleave`` (launches | batches): measure the plans in
    alternating ``rounds`` and judge them by the paired differences; None: one plan after another."""

    spec: SweepSpec
    workloads: list[Workload]
    options: BenchOptions
    db_path: Path | None = None
    baseline: str | None = None  # the baseline plan's label (default: the sweep file's, else the first)
    sid: str | None = None  # the sweep's id (default: derived from the plans and options)
    launch_timeout_s: float = 600.0
    plot: Path | None = None  # also draw the comparison to this PNG
    min_change: float = DEFAULT_MIN_CHANGE  # a fraction: changes below it are "no significant difference"
    interleave: str | None = None
    rounds: int = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepResult:
    """A sweep of one plan after another: each plan's outcome, the comparison with the baseline, and
    the measured plans' warnings as (message, remedy), each message naming its plan and run."""

    sweep: str
    outcomes: list[Outcome]
    comparison: Comparison
    warnings: list[tuple[str, str]] = field(default_factory=list)
    plot: Path | None = None

    @property
    def measured(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.run is not None]

    def to_json(self) -> dict[str, object]:
        return {
            "sweep": self.sweep,
            "plans": [{"label": o.label, "run": o.run, "status": o.status, "error": o.error} for o in self.outcomes],
            "plot": str(self.plot) if self.plot else None,
            "comparison": self.comparison.to_json(),
        }

    def failure(self) -> RuntimeFailure | None:
        """The error to exit with once the result is shown: the plans that failed, if any."""
        from moetune.bench.single.sweep import FAILED

        failed = [o for o in self.outcomes if o.status == FAILED]
        if not failed:
            return None
        return RuntimeFailure(
            f"sweep {self.sweep}: {len(failed)} plan(s) failed: "
            + "; ".join(f"{o.label}: {(o.error or '').splitlines()[0]}" for o in failed),
            hint="fix them and run the same command again: completed plans are skipped",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class InterleavedResult:
    """A sweep in rounds: what the rounds did, and the paired comparison of the complete ones (None
    where a failure left none to compare: ``why`` says what the comparison said)."""

    run: InterleaveResult
    comparison: PairedComparison | None
    why: str = ""
    plot: Path | None = None  # asked for (drawn where there is a comparison)

    @property
    def complete(self) -> int:
        return len(self.comparison.rounds) if self.comparison else 0

    def to_json(self) -> dict[str, object]:
        res = self.run
        return {
            "sweep": res.sweep,
            "interleave": {
                "mode": res.mode,
                "rounds": res.rounds,
                "complete": self.complete,
                "launches": res.launches,
                "launch_s": res.launch_s,
                "wall_s": res.wall_s,
            },
            "plans": [o.to_json() for o in res.outcomes],
            "plot": str(self.plot) if self.plot else None,
            "comparison": self.comparison.to_json() if self.comparison else None,
        }

    def failure(self) -> RuntimeFailure | None:
        """The error to exit with once the result is shown: the first round that failed, if any."""
        if not self.run.failed:
            return None
        o = self.run.failed[0]
        return RuntimeFailure(
            f"sweep {self.run.sweep}: {o.label} failed in round {o.round}: "
            f"{(o.error or '').splitlines()[0]}" + ("" if self.comparison else f" ({self.why})"),
            hint="fix it and run the same command again: complete rounds are skipped",
        )


def sweep(req: SweepRequest, cb: Callbacks | None = None) -> SweepResult:
    """Run every plan not yet complete in this sweep (resumable), then compare the measured ones with
    the baseline by the rule of `moetune compare`."""
    from moetune.bench.analysis.warnings import grouped
    from moetune.bench.single.sweep import baseline_of, run_sweep
    from moetune.report.compare import compare_runs
    from moetune.report.plot import plot_runs
    from moetune.store.db import ResultsDB

    cb = cb or Callbacks()
    with ResultsDB.open(req.db_path) as db:
        sid, outcomes = run_sweep(
            db,
            req.spec,
            req.workloads,
            req.options,
            sid=req.sid,
            launch_timeout_s=req.launch_timeout_s,
            status=cb.status,
            progress_for=cb.progress_for,
            on_snapshot=cb.on_snapshot,
        )
        ok = [o for o in outcomes if o.run is not None]
        base = baseline_of(req.spec, outcomes, req.baseline)
        runs = [db.run(o.run) for o in [base, *[o for o in ok if o is not base]] if o.run is not None]
        compared = compare_runs(db, runs, min_change=req.min_change, seed=req.options.seed)
        if req.plot:
            plot_runs(list(compared.metrics), req.plot, seed=req.options.seed, title=f"sweep {sid}")
        warnings = [
            (f"{o.label} (run {o.run}): {message}", remedy)
            for o in ok
            if o.run is not None
            for message, remedy in grouped(compared.noise[o.run]) + db.run(o.run).flags().warnings()
        ]
    return SweepResult(sweep=sid, outcomes=outcomes, comparison=compared.comparison, warnings=warnings, plot=req.plot)


def sweep_interleaved(req: SweepRequest, cb: Callbacks | None = None) -> InterleavedResult:
    """Run every round not yet complete (``req.interleave``: launches | batches), the plans in
    alternating order, then pair the complete rounds' runs."""
    from moetune.bench.analysis.rounds import LAUNCHES
    from moetune.bench.single.interleave import run_interleaved
    from moetune.errors import MoetuneError
    from moetune.report.paired import load_sweep
    from moetune.report.plot import plot_runs
    from moetune.store.db import ResultsDB

    cb = cb or Callbacks()
    with ResultsDB.open(req.db_path) as db:
        res = run_interleaved(
            db,
            req.spec,
            req.workloads,
            req.options,
            mode=req.interleave or LAUNCHES,
            rounds=req.rounds,
            sid=req.sid,
            launch_timeout_s=req.launch_timeout_s,
            status=cb.status,
            progress_for=cb.progress_for,
            on_snapshot=cb.on_snapshot,
        )
        why = ""
        comp: PairedComparison | None
        try:
            comp = load_sweep(db, res.sweep, baseline=req.baseline, min_change=req.min_change, seed=req.options.seed)
        except MoetuneError as e:
            if not res.failed:
                raise
            comp, why = None, str(e)
    if comp is not None and req.plot:
        plot_runs([comp.baseline, *comp.others], req.plot, seed=req.options.seed, title=f"sweep {res.sweep} (pooled)")
    return InterleavedResult(run=res, comparison=comp, why=why, plot=req.plot)
