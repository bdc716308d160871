"""A layout run's figures (`serve-bench LAYOUT_PLAN --load SERVICE=SPEC ...`): every service
measured alone (the others idle) and under the shared load (every loaded service busy at once).

- :func:`contention`: per service and metric, the shared level's median against the alone one's,
  the slowdown (how many times longer a latency got; for decode speed, how many times slower) with
  its bootstrap interval and the verdict (:func:`moetune.bench.analysis.stats.difference`'s rule).
- :func:`busy`: what the sampler saw per phase of the run (each service alone, the shared load):
  every engine process's CPU (cores) and every GPU's utilisation, so the table says which process
  and which device was busy while a service slowed down.

Pure: samples and snapshots in, plain rows out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moetune.bench.analysis.serve import ALONE, LOAD, SERVICE, SHARED, request_figures, request_metrics
from moetune.bench.analysis.stats import DEFAULT_CONF, DEFAULT_MIN_CHANGE, difference, median
from moetune.monitor.snapshot import Snapshot

# (family, higher is better, unit): per request, as `compare` takes them
FAMILIES: tuple[tuple[str, bool, str], ...] = (
    ("ttft", False, "ms"),
    ("itl", False, "ms"),
    ("tpot", False, "ms"),
    ("decode", True, "tokens/s"),
)
SHARED_PHASE = "shared"
_FAMILY_NAMES = frozenset(f for f, _, _ in FAMILIES)


def alone_phase(service: str) -> str:
    """The sampler's phase while ``service`` is measured alone."""
    return f"alone {service}"


def is_layout_sample(s: Mapping[str, Any]) -> bool:
    return bool(s.get(SERVICE))


def _values(s: Mapping[str, Any]) -> dict[str, float]:
    """A request's figures of :data:`FAMILIES` (:func:`moetune.bench.analysis.serve.request_figures`)."""
    f = request_figures(request_metrics(dict(s)))
    return {} if f is None else {k: v for k, v in f.families().items() if k in _FAMILY_NAMES}


@dataclass(frozen=True, slots=True, kw_only=True)
class Slowdown:
    """One service's metric under the shared load against alone."""

    service: str
    metric: str
    unit: str
    n_alone: int
    n_shared: int
    alone: float  # median
    shared: float
    slowdown: float  # > 1: worse under the shared load (a latency longer, a speed lower), times
    ci_low: float
    ci_high: float
    verdict: str  # slower | faster | same (the shared level against the alone one)

    def to_json(self) -> dict[str, object]:
        return {
            "service": self.service,
            "metric": self.metric,
            "unit": self.unit,
            "n_alone": self.n_alone,
            "n_shared": self.n_shared,
            "alone_median": self.alone,
            "shared_median": self.shared,
            "slowdown": _finite(self.slowdown),
            "slowdown_ci": [_finite(self.ci_low), _finite(self.ci_high)],
            "verdict": self.verdict,
        }


def _finite(x: float) -> float | None:
    """A ratio as JSON keeps it: an unbounded one (a speed whose interval reaches 0) as null."""
    return x if math.isfinite(x) else None


class ContentionSeries:
    """Per service, per metric, the alone and the shared requests' values, a sample at a time."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, dict[str, list[float]]]] = {}  # service -> load -> family -> values

    def add(self, s: Mapping[str, Any]) -> None:
        service, load = s.get(SERVICE), s.get(LOAD)
        if not service or load not in (ALONE, SHARED) or "chunks" not in s:
            return
        by = self.values.setdefault(str(service), {ALONE: {}, SHARED: {}})[str(load)]
        for fam, v in _values(s).items():
            by.setdefault(fam, []).append(v)

    def rows(
        self, *, conf: float = DEFAULT_CONF, min_change: float = DEFAULT_MIN_CHANGE, seed: int = 0
    ) -> list[Slowdown]:
        out = []
        for service, loads in self.values.items():
            for fam, higher, unit in FAMILIES:
                a, b = loads[ALONE].get(fam) or [], loads[SHARED].get(fam) or []
                if not a or not b:
                    continue
                try:
                    d = difference(a, b, higher_is_better=higher, conf=conf, min_change=min_change, seed=seed)
                except ValueError:  # a median of 0 (tokens that came all at once): no ratio
                    continue
                # as a slowdown: the shared over the alone latency, or the alone over the shared speed
                if higher:
                    ratio = 1 / d.ratio if d.ratio > 0 else math.inf
                    lo = 1 / d.ratio_ci_high if d.ratio_ci_high > 0 else math.inf
                    hi = 1 / d.ratio_ci_low if d.ratio_ci_low > 0 else math.inf
                else:
                    ratio, lo, hi = d.ratio, d.ratio_ci_low, d.ratio_ci_high
                out.append(
                    Slowdown(
                        service=service,
                        metric=fam,
                        unit=unit,
                        n_alone=len(a),
                        n_shared=len(b),
                        alone=median(a),
                        shared=median(b),
                        slowdown=ratio,
                        ci_low=lo,
                        ci_high=hi,
                        verdict=d.verdict,
                    )
                )
        return out


def contention(
    samples: Iterable[Mapping[str, Any]],
    *,
    conf: float = DEFAULT_CONF,
    min_change: float = DEFAULT_MIN_CHANGE,
    seed: int = 0,
) -> list[Slowdown]:
    """Every service's slowdown under the shared load, per metric, the samples read once."""
    series = ContentionSeries()
    for s in samples:
        series.add(s)
    return series.rows(conf=conf, min_change=min_change, seed=seed)


@dataclass(frozen=True, slots=True, kw_only=True)
class Busy:
    """What was busy during one phase of a layout run: mean CPU cores per engine process (by its
    launch name), mean utilisation per GPU, over the phase's snapshots."""

    phase: str
    snapshots: int
    cpu_cores: Mapping[str, float]  # process name -> cores (100% of one core = 1.0)
    gpu_util_pct: Mapping[str, float]  # "GPU0 NAME" -> percent
    host_cpu_pct: float | None  # the machine's, all cores, 0-100

    def to_json(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "snapshots": self.snapshots,
            "cpu_cores": dict(self.cpu_cores),
            "gpu_util_pct": dict(self.gpu_util_pct),
            "host_cpu_pct": self.host_cpu_pct,
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Busy:
        return Busy(
            phase=str(d.get("phase")),
            snapshots=int(d.get("snapshots") or 0),
            cpu_cores={str(k): float(v) for k, v in (d.get("cpu_cores") or {}).items()},
            gpu_util_pct={str(k): float(v) for k, v in (d.get("gpu_util_pct") or {}).items()},
            host_cpu_pct=d.get("host_cpu_pct"),
        )


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def busy(snapshots: Iterable[Snapshot], phases: Sequence[str]) -> list[Busy]:
    """Per phase named in ``phases`` (in that order), the snapshots taken during it, averaged: which
    process and which device was busy. A snapshot's rates cover the interval since the one before
    it, so a snapshot counts for its phase only when the one before was taken in the same phase
    too (the first of each stretch covers the end of the previous phase): a phase shorter than the
    sampling interval has none."""
    stretches: dict[str, list[list[Snapshot]]] = {p: [] for p in phases}
    previous: str | None = None
    for snap in snapshots:
        if snap.phase in stretches:
            if snap.phase != previous:
                stretches[snap.phase].append([])
            stretches[snap.phase][-1].append(snap)
        previous = snap.phase
    out = []
    for phase in phases:
        snaps = [s for st in stretches[phase] for s in st[1:]]
        cpu: dict[str, list[float]] = {}
        gpu: dict[str, list[float]] = {}
        host: list[float] = []
        for s in snaps:
            for p in s.procs:
                if p.cpu_pct is not None:
                    cpu.setdefault(p.name, []).append(p.cpu_pct / 100)
            for g in s.gpus:
                if g.util_pct is not None:
                    gpu.setdefault(f"GPU{g.index} {g.name}", []).append(g.util_pct)
            if (h := s.host.cpu_total_pct) is not None:
                host.append(h)
        out.append(
            Busy(
                phase=phase,
                snapshots=len(snaps),
                cpu_cores={k: round(_mean(v), 3) for k, v in cpu.items()},
                gpu_util_pct={k: round(_mean(v), 1) for k, v in gpu.items()},
                host_cpu_pct=round(_mean(host), 1) if host else None,
            )
        )
    return out
