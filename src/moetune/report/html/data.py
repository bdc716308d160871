"""What a report page is made of: typed records that :mod:`.gather` fills and the sections read.

Plan documents stay the JSON the planner writes (`moetune plan -o`, and the ``plan`` a launched
run records): a report shows any plan, including one written by an older moetune, and each
section reads only the keys it draws. The phases of a run (the shaded bands of its time series)
are worked out here, from the sampler's snapshots or else from the run's own samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from moetune.jsonread import number
from moetune.monitor.snapshot import Snapshot
from moetune.report.compare import Comparison
from moetune.report.paired import PairedComparison
from moetune.store.db import Run, SampleRow


@dataclass(frozen=True, slots=True)
class PlanSource:
    """A plan document and where it came from (a file, or the runs that recorded it)."""

    title: str
    doc: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PhaseBand:
    """A phase of a run on the wall clock (seconds since the epoch)."""

    label: str
    t0: float
    t1: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RunReport:
    """One run as the page shows it: its record, its figures derived from its samples, the
    prediction beside them, the machine's snapshots and its phases, and (serve-bench) its levels."""

    run: Run
    counts: Mapping[str, int]
    derived: Mapping[str, Any]  # moetune.report.results_view.derived
    prediction: Mapping[str, Any] | None = None  # moetune.bench.analysis.predicted.report
    snapshots: tuple[Snapshot, ...] = ()
    phases: tuple[PhaseBand, ...] = ()
    serve: Mapping[str, Any] | None = None  # moetune.bench.serve.run.stored_report


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportData:
    plans: tuple[PlanSource, ...] = ()
    runs: tuple[RunReport, ...] = ()
    comparison: Comparison | None = None
    paired: PairedComparison | None = None  # runs made in alternation, judged round by round (instead)
    compare_notes: tuple[str, ...] = ()  # why runs were left out, noise warnings
    generated_at: str = ""
    version: str = ""
    db_path: str | None = None


def iso_epoch(iso: str) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except (TypeError, ValueError):
        return None


def snapshot_phases(snaps: Sequence[Snapshot]) -> list[PhaseBand]:
    """Runs of consecutive snapshots with the same phase, each lasting until the next snapshot."""
    out: list[PhaseBand] = []
    for i, s in enumerate(snaps):
        end = snaps[i + 1].t if i + 1 < len(snaps) else s.t
        if s.phase is None:
            continue
        if out and out[-1].label == s.phase and i and snaps[i - 1].phase == s.phase:
            out[-1] = PhaseBand(s.phase, out[-1].t0, end)
        else:
            out.append(PhaseBand(s.phase, s.t, end))
    return out


def _sample_label(row: SampleRow) -> str | None:
    d = row.data
    if d.get("workload") is not None:
        return str(d["workload"])
    if (c := number(d.get("concurrency"))) is not None:
        rate = d.get("rate")
        return f"c={int(c)}" + (f" @{rate}/s" if rate else "")
    return None


def _sample_span(row: SampleRow) -> tuple[float, float] | None:
    """When a raw sample's request ran, on the wall clock: from its start (``t_unix_s``) or from
    when it was stored less its duration (``end_s``, or ``t_end - t_sched`` of a serve request)."""
    d = row.data
    stored = iso_epoch(row.created_at)
    dur = d.get("end_s")
    t_end, t_sched = d.get("t_end"), d.get("t_sched")
    if not isinstance(dur, int | float) and isinstance(t_end, int | float) and isinstance(t_sched, int | float):
        dur = t_end - t_sched
    dur = float(dur) if isinstance(dur, int | float) and dur >= 0 else 0.0
    start = d.get("t_unix_s")
    if isinstance(start, int | float):
        return float(start), float(start) + dur
    if stored is None:
        return None
    return stored - dur, stored


def sample_phases(rows: Iterable[SampleRow]) -> list[PhaseBand]:
    """The run's workloads (bench) or load levels (serve-bench) in the order they ran, each from its
    first request's start to its last one's end; warm-up samples count toward their workload."""
    out: list[PhaseBand] = []
    for row in rows:
        label, span = _sample_label(row), _sample_span(row)
        if label is None or span is None:
            continue
        if out and out[-1].label == label:
            out[-1] = PhaseBand(label, min(out[-1].t0, span[0]), max(out[-1].t1, span[1]))
        else:
            out.append(PhaseBand(label, span[0], span[1]))
    return out


def phases(snaps: Sequence[Snapshot], rows: Iterable[SampleRow]) -> tuple[PhaseBand, ...]:
    """The phases the snapshots name; where none does, those the samples tell (read only then)."""
    from_snaps = snapshot_phases(snaps)
    return tuple(from_snaps or sample_phases(rows))
