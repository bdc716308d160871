"""Compare runs against a baseline, metric by metric, with a verdict that statistics back.

Runs of any kind can be compared: :data:`METRIC_EXTRACTORS` maps a run's kind to a function that
turns its raw samples into named :class:`MetricSamples` (per-sample values, and whether higher is
better). Add a kind by adding an entry::

    from moetune.report.compare import METRIC_EXTRACTORS
    METRIC_EXTRACTORS["serve-bench"] = serve_metrics   # list[dict] -> dict[str, MetricSamples]

Beside what the samples give, a run that moetune launched has its launch's ``load_s`` (seconds from
the server's start to healthy; lower is better: one value per launch, so two single runs are never
told apart by it, while an interleaved sweep's rounds pair it) and the RPC transport its workers'
logs confirmed, shown per run.

The verdict rule is :func:`moetune.bench.analysis.stats.difference`'s (bootstrap CI of the ratio of
medians; "same" when it includes 1 or the change is under the practical threshold).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass, field, replace

from moetune.bench.analysis.link import link_metric_samples
from moetune.bench.analysis.objective import serve_bench_metrics
from moetune.bench.analysis.single import bench_metrics
from moetune.bench.analysis.stats import (
    DEFAULT_CONF,
    DEFAULT_MIN_CHANGE,
    SAME,
    MetricSamples,
    Summary,
    difference,
    summarize,
)
from moetune.bench.analysis.warnings import NOISE, Warning, bench_warnings
from moetune.errors import InputError
from moetune.kinds import RunKind, RunStatus
from moetune.quality.metrics import qa_metrics, quality_metrics
from moetune.report.quality_beside import QualityBeside, quality_of
from moetune.store.db import ResultsDB, Run
from moetune.store.record import LaunchRef

MetricExtractor = Callable[[Iterable[dict[str, object]]], dict[str, MetricSamples]]  # reads the samples once
METRIC_EXTRACTORS: dict[str, MetricExtractor] = {
    RunKind.BENCH: bench_metrics,
    RunKind.SERVE_BENCH: serve_bench_metrics,
    RunKind.LINK_TEST: link_metric_samples,
    RunKind.QUALITY: quality_metrics,
    RunKind.QA: qa_metrics,
}
COMPARE_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMetrics:
    run: int
    label: str
    kind: str
    status: str
    metrics: dict[str, MetricSamples]
    _: KW_ONLY
    transport: str | None = None  # the RPC transport confirmed at launch (none without RPC); None: not launched
    flags: tuple[str, ...] = ()  # contended, noisy (moetune.contention.RunFlags)
    flag_notes: tuple[str, ...] = ()  # what they say
    quality: QualityBeside | None = None  # `moetune quality`'s newest run of the same plan
    launch_run: str | None = None  # the launch its server came from (`moetune launch`'s run id); None: not launched

    @property
    def marked(self) -> str:
        """The label with its flags: ``auto t2 [contended]``."""
        return self.label + (f" [{', '.join(self.flags)}]" if self.flags else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareRow:
    run: int
    label: str
    metric: str
    unit: str
    higher_is_better: bool
    n: int
    median: float
    ci_low: float
    ci_high: float
    baseline_median: float
    change_pct: float
    change_ci_low_pct: float
    change_ci_high_pct: float
    verdict: str  # faster | slower | same (better and worse in the metric's direction, whatever it measures)
    noisy: bool = False  # "same" only because the interval is wide: the medians differ by more than the threshold
    family: str = ""  # the metric's family (tg, pp, quality…): the views word a verdict by it

    def to_json(self) -> dict[str, object]:
        return {
            "run": self.run,
            "label": self.label,
            "metric": self.metric,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "n": self.n,
            "median": self.median,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "baseline_median": self.baseline_median,
            "change_pct": self.change_pct,
            "change_ci_low_pct": self.change_ci_low_pct,
            "change_ci_high_pct": self.change_ci_high_pct,
            "verdict": self.verdict,
            "noisy": self.noisy,
            "family": self.family,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    baseline: RunMetrics
    baseline_stats: dict[str, Summary]
    others: list[RunMetrics]
    rows: list[CompareRow]
    conf: float
    min_change: float
    notes: list[str] = field(default_factory=list)
    not_compared: list[RunMetrics] = field(default_factory=list)  # runs that share no metric with the baseline

    def metric_names(self) -> list[str]:
        """Metrics the baseline shares with at least one compared run, in the baseline's order
        (a run that lacks one shows a dash there)."""
        return [n for n in self.baseline.metrics if any(n in o.metrics for o in self.others)]

    def to_json(self) -> dict[str, object]:
        return {
            "schema_version": COMPARE_SCHEMA_VERSION,
            "rule": {
                "confidence": self.conf,
                "min_change_pct": self.min_change * 100,
                "statistic": "bootstrap CI of the ratio of medians",
            },
            "baseline": {
                "run": self.baseline.run,
                "label": self.baseline.label,
                "metrics": {
                    k: {**s.to_json(), "unit": self.baseline.metrics[k].unit} for k, s in self.baseline_stats.items()
                },
            },
            "rows": [r.to_json() for r in self.rows],
            "transports": {str(r.run): r.transport for r in [self.baseline, *self.others]},
            "not_compared": [{"run": o.run, "label": o.label, "kind": o.kind} for o in self.not_compared],
            "run_flags": {str(o.run): list(o.flags) for o in [self.baseline, *self.others] if o.flags},
            "quality": {str(o.run): o.quality.to_json() for o in [self.baseline, *self.others] if o.quality},
            "notes": self.notes,
        }


LOAD_METRIC = "load_s"


def load_metric(launch: LaunchRef | None) -> dict[str, MetricSamples]:
    """``load_s`` of a launched run: the server's start to healthy, in seconds (lower is better)."""
    if launch is None or launch.load_s is None:
        return {}
    return {LOAD_METRIC: MetricSamples(values=(launch.load_s,), higher_is_better=False, unit="s", family="load")}


def extract(run: Run, samples: Iterable[dict[str, object]]) -> RunMetrics:
    fn = METRIC_EXTRACTORS.get(run.kind)
    if fn is None:
        raise InputError(
            f"run {run.id} is a {run.kind!r} run, which compare does not know how to read",
            hint=f"compare runs of kinds: {', '.join(sorted(METRIC_EXTRACTORS))}",
        )
    metrics = fn(samples)
    launch = run.meta.launch
    if metrics:  # a run without measured samples stays empty: nothing to compare it by
        metrics.update(load_metric(launch))
    f = run.flags()
    return RunMetrics(
        run=run.id,
        label=run.label,
        kind=run.kind,
        status=run.status,
        metrics=metrics,
        transport=launch.confirmed if launch is not None else None,
        flags=f.markers,
        flag_notes=tuple(f"run {run.id} ({run.label}): {m}" for m, _ in f.warnings()),
        launch_run=run.meta.launch_run,
    )


def load(db: ResultsDB, runs: list[Run]) -> list[RunMetrics]:
    """The runs' metrics, each with the quality measured of its plan, where there is one. A run
    without measured samples (interrupted before its first, say) is an input error that names it:
    there is nothing to compare it by (:func:`compare_runs`' rule)."""
    out = []
    quality = quality_of(db, runs)
    for r in runs:
        rm = replace(extract(r, db.iter_samples(r.id)), quality=quality.get(r.id))
        if not rm.metrics:
            raise InputError(
                f"run {r.id} ({r.label}) has no measured samples to compare",
                hint="it may have been interrupted before its first sample; run it again",
            )
        out.append(rm)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsCompared:
    """What :func:`compare_runs` gives: the comparison, every run's metrics (the baseline first, in
    the runs' order, those not compared included), and each run's noise warnings (:func:`run_noise`)."""

    comparison: Comparison
    metrics: tuple[RunMetrics, ...]
    noise: dict[int, list[Warning]]


def compare_runs(
    db: ResultsDB,
    runs: list[Run],
    *,
    conf: float = DEFAULT_CONF,
    min_change: float = DEFAULT_MIN_CHANGE,
    seed: int = 0,
) -> RunsCompared:
    """The one comparison policy of `moetune compare`, `moetune sweep` and `moetune report`: the
    first run is the baseline; every run must be of a kind compare reads and have measured samples,
    or the comparison is refused with an input error naming the first that has none (the report
    says it in place of the comparison); each run has the quality of its plan beside it and its
    noise warnings. Whether rows are required is the caller's (:func:`require_rows`): a sweep with
    one plan measured still ends with its table."""
    data = load(db, runs)
    noise = {r.id: run_noise(r, db.iter_samples(r.id)) for r in runs}
    comp = compare(data[0], data[1:], conf=conf, min_change=min_change, seed=seed)
    return RunsCompared(comparison=comp, metrics=tuple(data), noise=noise)


def compare(
    baseline: RunMetrics,
    others: list[RunMetrics],
    *,
    conf: float = DEFAULT_CONF,
    min_change: float = DEFAULT_MIN_CHANGE,
    seed: int = 0,
) -> Comparison:
    """Every metric the baseline and another run share, as one row per (run, metric); a run that
    shares none is left out with a note that says why (another kind of run, or other workloads)."""
    base_stats = {k: summarize(v.values, conf=conf, seed=seed) for k, v in baseline.metrics.items()}
    rows: list[CompareRow] = []
    notes: list[str] = []
    compared: list[RunMetrics] = []
    skipped: list[RunMetrics] = []
    notes += [n for r in [baseline, *others] for n in r.flag_notes]
    for o in others:
        if not any(n in baseline.metrics for n in o.metrics):
            skipped.append(o)
            notes.append(f"{_unlike(baseline, o)}: not compared")
            continue
        compared.append(o)
        extra = [n for n in o.metrics if n not in baseline.metrics]
        missing = [n for n in baseline.metrics if n not in o.metrics]
        if extra:
            notes.append(f"run {o.run} ({o.label}) has metrics the baseline lacks, not compared: {', '.join(extra)}")
        if missing:
            notes.append(f"run {o.run} ({o.label}) lacks the baseline's {', '.join(missing)}")
        for name, ms in o.metrics.items():
            b = baseline.metrics.get(name)
            if b is None:
                continue
            s = summarize(ms.values, conf=conf, seed=seed)
            if base_stats[name].median <= 0 or s.median < 0:  # a count that can be 0 (tokens reused): no ratio
                notes.append(
                    f"{name}: the baseline's median is {base_stats[name].median:g}, so no change in % "
                    f"(run {o.run}: {s.median:g})"
                )
                continue
            d = difference(
                b.values, ms.values, higher_is_better=ms.higher_is_better, conf=conf, min_change=min_change, seed=seed
            )
            lo, hi = d.change_ci_pct
            noisy = d.verdict == SAME and abs(d.ratio - 1.0) >= min_change
            rows.append(
                CompareRow(
                    run=o.run,
                    label=o.label,
                    metric=name,
                    unit=ms.unit,
                    higher_is_better=ms.higher_is_better,
                    n=s.n,
                    median=s.median,
                    ci_low=s.ci_low,
                    ci_high=s.ci_high,
                    baseline_median=base_stats[name].median,
                    change_pct=d.change_pct,
                    change_ci_low_pct=lo,
                    change_ci_high_pct=hi,
                    verdict=d.verdict,
                    noisy=noisy,
                    family=ms.family,
                )
            )
    told = sorted({r.run for r in rows if r.verdict != SAME and r.metric != LOAD_METRIC})
    apart = [o.run for o in compared if o.run in told and o.launch_run not in (None, baseline.launch_run)]
    if baseline.launch_run is not None and apart:
        notes.append(single_launches_note(baseline.run, apart))
    return Comparison(
        baseline=baseline,
        baseline_stats=base_stats,
        others=compared,
        rows=rows,
        conf=conf,
        min_change=min_change,
        notes=notes,
        not_compared=skipped,
    )


def single_launches_note(baseline: int, others: list[int]) -> str:
    """Why a verdict between runs of separate launches may be a launch's luck: their intervals
    cover the requests within each launch, not what differs from one launch to the next."""
    runs = ", ".join(str(r) for r in others)
    return (
        f"run {baseline} and run{'s' if len(others) > 1 else ''} {runs} were each measured in a launch "
        "of its own: a verdict's interval covers the requests within a launch, not what differs from one "
        "launch to the next (on a shared machine a whole launch runs fast or slow: on this project's "
        "2-core test VM, 12 back-to-back pairs of launches of one server measured TG from -18% to +24% "
        "apart), so a difference under that may be a launch's luck; to judge by "
        "launches, `moetune sweep A.json B.json --interleave launches --rounds 4`"
    )


def _unlike(baseline: RunMetrics, o: RunMetrics) -> str:
    """Why a run shares no metric with the baseline."""
    b = f"the baseline run {baseline.run} ({baseline.label})"
    if o.kind != baseline.kind:
        return f"run {o.run} ({o.label}) is a {o.kind} run and {b} a {baseline.kind} run, which share no metric"
    return (
        f"run {o.run} ({o.label}) shares no metric with {b}: it measured {', '.join(list(o.metrics)[:4])}"
        + (", …" if len(o.metrics) > 4 else "")
        + f"; the baseline {', '.join(list(baseline.metrics)[:4])}"
        + (", …" if len(baseline.metrics) > 4 else "")
    )


def require_rows(c: Comparison) -> None:
    """An input error when nothing could be compared: every other run shares no metric with the baseline."""
    if c.rows:
        return
    kinds = {o.kind for o in c.not_compared} - {c.baseline.kind}
    if len(c.not_compared) == 1:
        why = _unlike(c.baseline, c.not_compared[0])
    else:
        why = (
            f"runs {', '.join(str(o.run) for o in c.not_compared)} share no metric with the baseline run "
            f"{c.baseline.run} ({c.baseline.label})"
        )
    hint = (
        "compare runs of one kind (`moetune results list --kind KIND`)"
        if kinds
        else "compare runs of the same workloads (see `moetune results show RUN`), or choose another --baseline"
    )
    raise InputError(f"nothing to compare: {why}", hint=hint)


def run_noise(run: Run, samples: Iterable[dict[str, object]]) -> list[Warning]:
    """The warnings that make a run's verdicts less trustworthy (noise, cache state): a bench
    run's (the samples of another kind are not read)."""
    if run.kind != RunKind.BENCH:
        return []
    return [w for w in bench_warnings(list(samples)) if w.code in NOISE]


def runs_to_compare(
    db: ResultsDB, refs: list[str], *, baseline: str | None = None, sweep_id: str | None = None
) -> list[Run]:
    """The runs named (ids, labels, `latest`), then a sweep's completed runs in its plans' order;
    the baseline first: ``baseline``, else the sweep's own, else the first named."""
    runs = [db.resolve(r) for r in refs]
    if sweep_id:
        spec = db.sweep(sweep_id)
        if spec is None:
            raise InputError(f"no sweep {sweep_id!r}", hint="see `moetune results list` for sweep ids")
        done = {r.label: r for r in reversed(db.runs(sweep_id=sweep_id)) if r.status == RunStatus.DONE}
        if spec.get("baseline") in done and baseline is None:
            baseline = str(done[spec["baseline"]].id)
        runs += [done[p["label"]] for p in spec.get("plans", []) if p["label"] in done]
    if baseline is not None:
        base = db.resolve(baseline)
        runs = [base, *[r for r in runs if r.id != base.id]]
    if len(runs) < 2:
        raise InputError(
            "compare needs at least two runs (RUN_A RUN_B, or RUN --baseline RUN)",
            hint="see `moetune results list` for run ids",
        )
    return runs
