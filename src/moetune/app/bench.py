"""`moetune bench TARGET`: single-stream PP/TG of a running server or a plan (launched, measured,
stopped), or a plan measured by llama-sweep-bench; every sample stored as it arrives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.app.progress import Callbacks

if TYPE_CHECKING:
    from moetune.bench.analysis.bench_summary import BenchSummary
    from moetune.bench.single.runner import BenchOptions
    from moetune.bench.single.sweep_bench import SweepOptions
    from moetune.bench.single.workloads import Workload
    from moetune.store.db import ResultsDB, Run


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRequest:
    """What `moetune bench` was asked. With ``sweep`` the plan is measured by llama-sweep-bench
    (``workloads`` and ``options`` unused), else by requests to its server."""

    target: str  # a server's URL or a plan file
    workloads: list[Workload]
    options: BenchOptions
    server: str | None = None  # a plan with several servers: the one to bench
    label: str | None = None  # the run's name in the history (default: the plan's or the server's)
    launch_timeout_s: float = 600.0
    transport: str | None = None  # a plan's RPC transport (None: as the plan says)
    rdma_dev: str | None = None
    db_path: Path | None = None
    sweep: SweepOptions | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchResult:
    """The stored run, its summary and, for a plan's run, what the plan predicted beside it."""

    run: Run
    summary: BenchSummary
    prediction: dict[str, Any] | None  # bench.analysis.predicted.report
    db_path: Path

    def to_json(self) -> dict[str, object]:
        return {
            "run": {**self.run.header(), "db": str(self.db_path)},
            **self.summary.to_json(),
            **(self.prediction or {}),
            "flags": self.run.flags().to_json(),
        }

    def warnings(self) -> list[tuple[str, str]]:
        """(message, remedy): the samples' warnings, grouped, and the run's flags'."""
        from moetune.bench.analysis.warnings import grouped

        return grouped(list(self.summary.warnings)) + self.run.flags().warnings()


def bench(
    req: BenchRequest, cb: Callbacks | None = None, *, interrupted: Callable[[str], None] | None = None
) -> BenchResult:
    """Measure the target and store the run; ``interrupted`` is told what was kept when Ctrl-C stops
    a run that had started (the KeyboardInterrupt goes on)."""
    from moetune.bench.target import resolve, with_transport
    from moetune.store.db import ResultsDB

    cb = cb or Callbacks()
    if req.sweep is not None:
        return _sweep_bench(req, cb)
    from moetune.bench.single.runner import bench_target

    t = with_transport(resolve(req.target, req.server), req.transport, req.rdma_dev)
    with ResultsDB.open(req.db_path) as db:
        started: list[int] = []
        try:
            run_id = bench_target(
                db,
                t,
                req.workloads,
                req.options,
                label=req.label,
                launch_timeout_s=req.launch_timeout_s,
                status=cb.status,
                progress_for=cb.progress_for,
                on_start=started.append,
                on_snapshot=cb.on_snapshot,
            )
        except KeyboardInterrupt:
            if started and interrupted is not None:
                n = db.sample_counts(started[0]).get("measure", 0)
                interrupted(f"run {started[0]} interrupted: {n} measured samples kept in {db.path}")
            raise
        return stored_run(db, run_id)


def _sweep_bench(req: BenchRequest, cb: Callbacks) -> BenchResult:
    from moetune.bench.single.sweep_bench import bench_sweep
    from moetune.bench.target import resolve
    from moetune.errors import InputError
    from moetune.store.db import ResultsDB

    assert req.sweep is not None
    if req.transport is not None or req.rdma_dev is not None:
        raise InputError(
            "--transport with --sweep: llama-sweep-bench runs outside the launcher, whose transport it does not take",
            hint="drop --transport (the workers use tcp), or bench the plan through its server (without --sweep)",
        )
    t = resolve(req.target, req.server)
    progress = cb.progress_for(req.label or str(t.label)) if cb.progress_for else None
    with ResultsDB.open(req.db_path) as db:
        run_id = bench_sweep(
            db,
            t,
            req.sweep,
            label=req.label,
            launch_timeout_s=req.launch_timeout_s,
            status=cb.status,
            progress=progress,
        )
    with ResultsDB.open(req.db_path) as db:
        return stored_run(db, run_id)


def stored_run(db: ResultsDB, run_id: int) -> BenchResult:
    """A bench run as the history holds it, summarised."""
    from moetune.bench.analysis.predicted import report
    from moetune.bench.analysis.summary import bench_summary

    r = db.run(run_id)
    summary = bench_summary(db.samples(run_id))
    return BenchResult(run=r, summary=summary, prediction=report(summary, dict(r.meta.details)), db_path=db.path)
