"""Paired comparison: configurations measured in rounds (an interleaved sweep, or runs a user
alternated by hand), each round's median set against the baseline's median in the same round.

:func:`paired_compare` is pure: rounds of run ids and each run's metrics in, rows out. Each row has
the paired verdict (:func:`moetune.bench.analysis.paired.paired_difference`: the t interval of the
mean log ratio across rounds) and, for contrast, the unpaired one that ``compare`` gives the same
samples pooled (:func:`moetune.bench.analysis.stats.difference`), which reads machine drift
between rounds as noise or, when the plans did not alternate, as a difference.

The loaders read the rounds from the history: a sweep's from the tag each run records
(:mod:`moetune.bench.analysis.rounds`), or runs named on the command line, paired in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from moetune.bench.analysis.paired import PairedDifference, noisy, paired_difference
from moetune.bench.analysis.rounds import complete_rounds, rounds_by_order, tagged_runs
from moetune.bench.analysis.stats import (
    DEFAULT_CONF,
    DEFAULT_MIN_CHANGE,
    Difference,
    Summary,
    difference,
    median,
    summarize,
)
from moetune.errors import InputError
from moetune.kinds import RunStatus
from moetune.report.compare import COMPARE_SCHEMA_VERSION, RunMetrics, extract
from moetune.store.db import ResultsDB, Run

PAIRED_STATISTIC = (
    "paired: per round, the ratio of medians (other over baseline, same round); the t interval "
    "of the mean log ratio across rounds, exponentiated"
)
UNPAIRED_STATISTIC = "bootstrap CI of the ratio of medians, every round's samples pooled"


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundCell:
    round: int
    baseline_run: int
    run: int
    baseline_median: float
    median: float

    @property
    def ratio(self) -> float:
        return self.median / self.baseline_median

    def to_json(self) -> dict[str, object]:
        return {
            "round": self.round,
            "baseline_run": self.baseline_run,
            "run": self.run,
            "baseline_median": self.baseline_median,
            "median": self.median,
            "ratio": self.ratio,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PairedRow:
    label: str
    runs: tuple[int, ...]  # by round
    metric: str
    unit: str
    higher_is_better: bool
    n: int  # samples, every round
    median: float  # every round's samples pooled
    baseline_median: float
    per_round: tuple[RoundCell, ...]
    paired: PairedDifference
    unpaired: Difference
    min_change: float

    @property
    def verdict(self) -> str:
        return self.paired.verdict

    @property
    def noisy(self) -> bool:
        return noisy(self.paired.verdict, self.paired.ratio, self.min_change)

    @property
    def unpaired_noisy(self) -> bool:
        return noisy(self.unpaired.verdict, self.unpaired.ratio, self.min_change)

    def to_json(self) -> dict[str, object]:
        lo, hi = self.paired.change_ci_pct
        ulo, uhi = self.unpaired.change_ci_pct
        return {
            "label": self.label,
            "runs": list(self.runs),
            "metric": self.metric,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "rounds": self.paired.rounds,
            "n": self.n,
            "median": self.median,
            "baseline_median": self.baseline_median,
            "per_round": [c.to_json() for c in self.per_round],
            "ratio": self.paired.ratio,
            "ratio_ci_low": self.paired.ratio_ci_low,
            "ratio_ci_high": self.paired.ratio_ci_high,
            "change_pct": self.paired.change_pct,
            "change_ci_low_pct": lo,
            "change_ci_high_pct": hi,
            "verdict": self.verdict,
            "noisy": self.noisy,
            "unpaired": {
                "change_pct": self.unpaired.change_pct,
                "change_ci_low_pct": ulo,
                "change_ci_high_pct": uhi,
                "verdict": self.unpaired.verdict,
                "noisy": self.unpaired_noisy,
            },
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PairedComparison:
    baseline: RunMetrics  # every round's samples pooled (``run``: its first round's run)
    baseline_stats: dict[str, Summary]
    others: list[RunMetrics]  # pooled likewise
    rounds: dict[int, dict[str, int]]  # round -> label -> run
    rows: list[PairedRow]
    conf: float
    min_change: float
    sweep: str | None = None
    mode: str | None = None  # launches | batches for a sweep; None for runs paired by hand
    notes: list[str] = field(default_factory=list)

    def metric_names(self) -> list[str]:
        return [n for n in self.baseline.metrics if any(r.metric == n for r in self.rows)]

    def to_json(self) -> dict[str, object]:
        base = self.baseline.label
        return {
            "schema_version": COMPARE_SCHEMA_VERSION,
            "paired": True,
            "rule": {
                "confidence": self.conf,
                "min_change_pct": self.min_change * 100,
                "statistic": PAIRED_STATISTIC,
                "unpaired_statistic": UNPAIRED_STATISTIC,
            },
            "sweep": self.sweep,
            "mode": self.mode,
            "baseline": {
                "label": base,
                "runs": [rr[base] for rr in self.rounds.values()],
                "metrics": {
                    k: {**s.to_json(), "unit": self.baseline.metrics[k].unit} for k, s in self.baseline_stats.items()
                },
            },
            "rounds": [{"round": k, "runs": dict(v)} for k, v in self.rounds.items()],
            "rows": [r.to_json() for r in self.rows],
            "transports": {r.label: r.transport for r in [self.baseline, *self.others]},
            "notes": self.notes,
        }


def _pooled(label: str, runs: list[RunMetrics]) -> RunMetrics:
    names = [n for n in runs[0].metrics if all(n in r.metrics for r in runs)]
    metrics = {
        n: replace(runs[0].metrics[n], values=tuple(v for r in runs for v in r.metrics[n].values)) for n in names
    }
    transports = sorted({r.transport for r in runs if r.transport})
    return RunMetrics(
        run=runs[0].run,
        label=label,
        kind=runs[0].kind,
        status=str(RunStatus.DONE),
        metrics=metrics,
        transport="+".join(transports) if transports else None,
    )


def paired_compare(
    rounds: dict[int, dict[str, int]],
    metrics: dict[int, RunMetrics],
    baseline: str,
    *,
    conf: float = DEFAULT_CONF,
    min_change: float = DEFAULT_MIN_CHANGE,
    seed: int = 0,
    sweep: str | None = None,
    mode: str | None = None,
) -> PairedComparison:
    """Every other configuration against ``baseline``, metric by metric, paired by round.
    ``rounds`` maps each round to its runs by label; ``metrics`` holds each run's metrics. A metric
    some round lacks is left out with a note."""
    if not rounds:
        raise InputError("no complete round to compare", hint="run the interleaved sweep (again) to complete one")
    labels = list(next(iter(rounds.values())))
    if baseline not in labels or len(labels) < 2:
        raise InputError(
            f"paired comparison needs the baseline {baseline!r} and another configuration "
            f"in every round (got {', '.join(labels)})"
        )
    order = sorted(rounds)
    by_label = {lab: [metrics[rounds[k][lab]] for k in order] for lab in labels}
    pooled = {lab: _pooled(lab, rms) for lab, rms in by_label.items()}
    base_pool = pooled[baseline]
    base_stats = {k: summarize(v.values, conf=conf, seed=seed) for k, v in base_pool.metrics.items()}
    rows: list[PairedRow] = []
    notes: list[str] = []
    if len(order) < 2:
        notes.append('one round: no spread between rounds to judge by, so every verdict is "same"; run more rounds')
    for lab in labels:
        if lab == baseline:
            continue
        other = pooled[lab]
        skipped = [
            n for n in {*base_pool.metrics, *other.metrics} if not (n in base_pool.metrics and n in other.metrics)
        ]
        if skipped:
            notes.append(
                f"{lab}: not measured in every round of both configurations, not compared: "
                + ", ".join(sorted(skipped))
            )
        for name, ms in other.metrics.items():
            b = base_pool.metrics.get(name)
            if b is None:
                continue
            pairs = [
                (metrics[rounds[k][baseline]].metrics[name].values, metrics[rounds[k][lab]].metrics[name].values)
                for k in order
            ]
            pd = paired_difference(pairs, higher_is_better=ms.higher_is_better, conf=conf, min_change=min_change)
            cells = tuple(
                RoundCell(
                    round=k,
                    baseline_run=rounds[k][baseline],
                    run=rounds[k][lab],
                    baseline_median=median(p[0]),
                    median=median(p[1]),
                )
                for k, p in zip(order, pairs, strict=True)
            )
            ud = difference(
                b.values, ms.values, higher_is_better=ms.higher_is_better, conf=conf, min_change=min_change, seed=seed
            )
            rows.append(
                PairedRow(
                    label=lab,
                    runs=tuple(rounds[k][lab] for k in order),
                    metric=name,
                    unit=ms.unit,
                    higher_is_better=ms.higher_is_better,
                    n=len(ms.values),
                    median=median(ms.values),
                    baseline_median=base_stats[name].median,
                    per_round=cells,
                    paired=pd,
                    unpaired=ud,
                    min_change=min_change,
                )
            )
    if not rows:
        raise InputError(
            f"nothing to compare: no metric was measured in every round of {baseline} and another configuration",
            hint="compare runs of the same workloads",
        )
    return PairedComparison(
        baseline=base_pool,
        baseline_stats=base_stats,
        others=[pooled[lab] for lab in labels if lab != baseline],
        rounds={k: dict(rounds[k]) for k in order},
        rows=rows,
        conf=conf,
        min_change=min_change,
        sweep=sweep,
        mode=mode,
        notes=notes,
    )


def sweep_rounds(db: ResultsDB, sid: str) -> tuple[dict[str, Any], dict[int, dict[str, int]]]:
    """An interleaved sweep's record and its complete rounds."""
    spec = db.sweep(sid)
    if spec is None:
        raise InputError(f"no sweep {sid!r}", hint="see `moetune results list` for sweep ids")
    if not spec.get("interleave"):
        raise InputError(
            f"sweep {sid} did not interleave its plans: its runs are not paired",
            hint=f"compare it unpaired: moetune compare --sweep {sid}",
        )
    labels = [p["label"] for p in spec.get("plans", [])]
    return spec, complete_rounds(tagged_runs(db.runs(sweep_id=sid)), labels)


def _load(db: ResultsDB, rounds: dict[int, dict[str, int]]) -> dict[int, RunMetrics]:
    out: dict[int, RunMetrics] = {}
    for runs in rounds.values():
        for run_id in runs.values():
            r = db.run(run_id)
            rm = extract(r, db.iter_samples(run_id))
            if not rm.metrics:
                raise InputError(f"run {run_id} ({r.label}) has no measured samples to compare")
            out[run_id] = rm
    return out


def load_sweep(
    db: ResultsDB,
    sid: str,
    *,
    baseline: str | None = None,
    conf: float = DEFAULT_CONF,
    min_change: float = DEFAULT_MIN_CHANGE,
    seed: int = 0,
) -> PairedComparison:
    """An interleaved sweep's complete rounds, compared (baseline: ``baseline``, else the sweep's,
    else its first plan)."""
    spec, rounds = sweep_rounds(db, sid)
    labels = [p["label"] for p in spec.get("plans", [])]
    base = baseline or spec.get("baseline") or labels[0]
    if base not in labels and baseline is not None and (baseline.isdigit() or baseline == "latest"):
        base = db.resolve(baseline).label  # --baseline RUN, as compare takes it
    if base not in labels:
        raise InputError(f"--baseline {base!r} is not one of the sweep's plans ({', '.join(labels)})")
    mode = (spec.get("interleave") or {}).get("mode")
    return paired_compare(
        rounds, _load(db, rounds), base, conf=conf, min_change=min_change, seed=seed, sweep=sid, mode=mode
    )


def load_refs(
    db: ResultsDB,
    refs: list[str],
    *,
    baseline: str | None = None,
    conf: float = DEFAULT_CONF,
    min_change: float = DEFAULT_MIN_CHANGE,
    seed: int = 0,
) -> PairedComparison:
    """Runs named on the command line, paired in order: an id names one run, a label every run
    with that label; the k-th run of each label (by id) is round k. The baseline is ``baseline``'s
    label (a run or a label), else the first one named."""
    runs: dict[int, Run] = {}
    for ref in refs:
        if ref.isdigit() or ref == "latest":
            r = db.resolve(ref)
            if r.status != RunStatus.DONE:
                raise InputError(
                    f"run {r.id} ({r.label}) is {r.status}: a paired round needs complete runs",
                    hint="leave it out, with its partner in the same round",
                )
            runs[r.id] = r
        else:
            runs.update((r.id, r) for r in _labelled(db, ref))
    labels = list(dict.fromkeys(r.label for r in runs.values()))
    base = db.resolve(baseline).label if baseline is not None else (labels[0] if labels else "")
    if base not in labels:
        labels.insert(0, base)
    if len(labels) < 2:
        raise InputError(
            f"a paired comparison needs runs of two configurations (labels): these runs are all labelled {base!r}",
            hint="label each configuration's runs (bench --label A / --label B)",
        )
    rounds = rounds_by_order([(r.id, r.label) for r in runs.values()], [base, *[x for x in labels if x != base]])
    return paired_compare(rounds, _load(db, rounds), base, conf=conf, min_change=min_change, seed=seed)


def _labelled(db: ResultsDB, label: str) -> list[Run]:
    """Every completed run with this label (interrupted ones have no partner to pair with)."""
    db.resolve(label)  # says so when there is no such run
    return [r for r in db.runs(status=RunStatus.DONE) if r.label == label]


def pooled_metrics(c: PairedComparison) -> list[RunMetrics]:
    """Baseline first, then the others: every round's samples pooled (for plots)."""
    return [c.baseline, *c.others]
