"""The report's edge: read the plan files and the runs a page is made of (the results history, each
run's samples and machine snapshots), derive their figures with the analysis every other
command uses, and hand :mod:`.page` one :class:`~.data.ReportData`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from moetune.errors import InputError
from moetune.kinds import RunKind
from moetune.monitor.snapshot import Snapshot
from moetune.report.compare import Comparison, runs_to_compare
from moetune.report.html.data import PlanSource, ReportData, RunReport, phases
from moetune.report.paired import PairedComparison, load_refs, load_sweep
from moetune.store.db import ResultsDB, Run

PLAN_KEYS = ("services", "devices", "launch")
PLAN_HINT = (
    "write one with `moetune plan MODEL --hw HW -o plan.json`; runs are named by id, label or `latest` "
    "(see `moetune results list`)"
)


def is_plan_arg(arg: str) -> bool:
    """An argument that names a file, or ends in .json, is a plan; anything else names a run."""
    if arg == "latest" or arg.isdigit():
        return False
    return arg.endswith(".json") or Path(arg).is_file()


def read_plan(path: Path) -> PlanSource:
    """A plan document as `moetune plan -o` writes it; an input error that names what is wrong."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"plan file {path}: no such file", hint=PLAN_HINT) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"plan file {path}: cannot read it ({e})", hint=PLAN_HINT) from None
    except json.JSONDecodeError as e:
        raise InputError(f"plan file {path}: not JSON ({e.msg} at line {e.lineno})", hint=PLAN_HINT) from None
    if not isinstance(doc, dict) or not any(isinstance(doc.get(k), dict | list) for k in PLAN_KEYS):
        raise InputError(f"plan file {path}: not a plan (it has none of {', '.join(PLAN_KEYS)})", hint=PLAN_HINT)
    return PlanSource(path.name, doc)


def read_snapshots(rows: Sequence[Mapping[str, Any]]) -> tuple[Snapshot, ...]:
    """The run's snapshots; a row this moetune cannot read is left out (a newer sampler's, or torn)."""
    out = []
    for d in rows:
        try:
            out.append(Snapshot.from_json(d))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(sorted(out, key=lambda s: s.t))


def run_report(db: ResultsDB, run: Run) -> RunReport:
    """One run's part of the page, its samples streamed from the history (a long serve-bench run
    is read a batch at a time, never held whole)."""
    from moetune.bench.analysis.predicted import report
    from moetune.report.results_view import derived

    counts = db.sample_counts(run.id)
    serve = None
    if run.kind == RunKind.SERVE_BENCH and counts.get("measure"):
        from moetune.bench.analysis.objective import WorkloadRunSeries
        from moetune.bench.serve.layout_run import is_layout_run, stored_layout_report
        from moetune.bench.serve.run import stored_report
        from moetune.report.results_view import metric_figures

        if is_layout_run(run):  # its services alone and under the shared load
            serve = stored_layout_report(db, run)
            figures = derived(run, db.iter_samples(run.id))
        else:
            series = WorkloadRunSeries()  # the run's figures taken in the same pass as its levels'
            serve = stored_report(db, run, tap=series.add)
            figures = metric_figures(series.metrics())
    else:
        figures = derived(run, db.iter_samples(run.id))
    prediction = report(figures, dict(run.meta.details)) if run.kind == RunKind.BENCH else None
    snaps = read_snapshots(db.metrics(run.id))
    return RunReport(
        run=run,
        counts=counts,
        derived=figures,
        prediction=prediction,
        snapshots=snaps,
        phases=phases(snaps, db.iter_sample_rows(run.id)),
        serve=serve,
    )


def comparison(db: ResultsDB, runs: list[Run]) -> tuple[Comparison | None, list[str]]:
    """`moetune compare`'s comparison of the runs (:func:`~moetune.report.compare.compare_runs`,
    its rule for runs without samples included), and what to tell beside it (runs left out and
    why, noise warnings); where compare would refuse, no comparison and its reason as a note."""
    from moetune.bench.analysis.warnings import grouped
    from moetune.report.compare import compare_runs, require_rows

    try:
        compared = compare_runs(db, runs)
    except InputError as e:
        return None, [str(e)]
    c = compared.comparison
    try:
        require_rows(c)
    except InputError as e:
        return None, [*c.notes, str(e)]
    notes = list(c.notes)
    for r in runs:
        for message, _remedy in grouped(compared.noise[r.id]):
            notes.append(f"run {r.id}: {message}")
    return c, notes


def _plans(files: Sequence[PlanSource], runs: Sequence[Run]) -> tuple[PlanSource, ...]:
    """The plan files, then the plans the runs recorded; one entry per distinct document."""
    titles: dict[str, list[str]] = {}
    docs: dict[str, Mapping[str, Any]] = {}
    sources = [
        *((p.title, p.doc) for p in files),
        *((f"plan of run {r.id} ({r.label})", r.meta.plan) for r in runs if r.meta.plan),
    ]
    for title, doc in sources:
        key = json.dumps(doc, sort_keys=True, default=str)
        docs.setdefault(key, doc)
        titles.setdefault(key, []).append(title)
    return tuple(PlanSource(", ".join(titles[k]), docs[k]) for k in docs)


def _runs(
    db: ResultsDB, refs: Sequence[str], sweep: str | None, paired: bool
) -> tuple[list[Run], PairedComparison | None]:
    """The runs to show, and their paired comparison where they were made in alternation: an
    interleaved sweep (every run of its complete rounds), or runs named with ``paired``."""
    if sweep is not None:
        if refs:
            raise InputError("--sweep reports the sweep's runs; name no runs with it (plan files are fine)")
        spec = db.sweep(sweep)
        if spec is None:
            raise InputError(f"no sweep {sweep!r}", hint="see `moetune results list` for sweep ids")
        if not spec.get("interleave"):
            return runs_to_compare(db, [], sweep_id=sweep), None
        comp = load_sweep(db, sweep)
    elif paired:
        comp = load_refs(db, list(refs))
    else:
        return list({r.id: r for r in (db.resolve(ref) for ref in refs)}.values()), None
    ids = [run for rnd in comp.rounds.values() for run in rnd.values()]
    return [db.resolve(str(i)) for i in ids], comp


def gather(
    args: Sequence[str],
    db_path: Path | None,
    *,
    generated_at: str,
    version: str = "",
    sweep: str | None = None,
    paired: bool = False,
) -> ReportData:
    """Everything the page shows: the plans given, the runs named (by id, label or `latest`) or a
    sweep's; runs made in alternation (``paired``, an interleaved sweep) compared round by round."""
    if not args and sweep is None:
        raise InputError("name runs (id, label or `latest`), a --sweep or a plan file to report on", hint=PLAN_HINT)
    files = [read_plan(Path(a)) for a in args if is_plan_arg(a)]
    refs = [a for a in args if not is_plan_arg(a)]
    if not refs and sweep is None:
        return ReportData(plans=_plans(files, []), generated_at=generated_at, version=version)
    with ResultsDB.open(db_path) as db:
        runs, pair = _runs(db, refs, sweep, paired)
        reports = tuple(run_report(db, r) for r in runs)
        comp, notes = comparison(db, runs) if len(runs) > 1 and pair is None else (None, [])
        path = str(db.path)
    return ReportData(
        plans=_plans(files, runs),
        runs=reports,
        comparison=comp,
        paired=pair,
        compare_notes=tuple(notes),
        generated_at=generated_at,
        version=version,
        db_path=path,
    )
