"""One single-stream bench run's figures as a typed document (:class:`BenchSummary`).

:func:`moetune.bench.analysis.summary.bench_summary` builds it from raw samples; modules read its
attributes; :meth:`BenchSummary.to_json` gives the dict ``bench --json`` prints and a run's stored
summary keeps (one key order, unchanged since the dict era), and :meth:`BenchSummary.from_json` is
the one reader of a stored one. The stored form carries ``schema_version``
(:data:`SUMMARY_SCHEMA_VERSION`); the reader takes every shape written so far (a key a summary of
an older moetune lacks reads as its empty value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from moetune.bench.analysis.stats import Summary
from moetune.bench.analysis.warnings import Warning
from moetune.jsonread import integer as _i
from moetune.jsonread import mapping as _m
from moetune.jsonread import number as _f

SUMMARY_SCHEMA_VERSION = 1


def _warning(x: object) -> Warning | None:
    try:
        return Warning.from_json(dict(_m(x)))
    except ValueError:  # a code this moetune no longer knows
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Stat:
    """One figure's statistics over a workload's repeats (:class:`moetune.bench.analysis.stats.Summary`)
    and its ``source``: ``server`` (llama.cpp's timings) or ``client`` (its clock)."""

    median: float
    ci_low: float
    ci_high: float
    n: int
    mean: float
    stdev: float
    cv: float
    min: float
    max: float
    outliers: tuple[int, ...] = ()
    source: str

    @classmethod
    def of(cls, s: Summary, source: str) -> Stat:
        return cls(
            median=s.median,
            ci_low=s.ci_low,
            ci_high=s.ci_high,
            n=s.n,
            mean=s.mean,
            stdev=s.stdev,
            cv=s.cv,
            min=s.min,
            max=s.max,
            outliers=s.outliers,
            source=source,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "median": self.median,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "n": self.n,
            "mean": self.mean,
            "stdev": self.stdev,
            "cv": self.cv,
            "min": self.min,
            "max": self.max,
            "outliers": list(self.outliers),
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: object) -> Stat | None:
        if not isinstance(d, Mapping) or _f(d.get("median")) is None:
            return None
        outliers = d.get("outliers")
        return cls(
            median=_f(d.get("median")) or 0.0,
            ci_low=_f(d.get("ci_low")) or 0.0,
            ci_high=_f(d.get("ci_high")) or 0.0,
            n=_i(d.get("n")),
            mean=_f(d.get("mean")) or 0.0,
            stdev=_f(d.get("stdev")) or 0.0,
            cv=_f(d.get("cv")) or 0.0,
            min=_f(d.get("min")) or 0.0,
            max=_f(d.get("max")) or 0.0,
            outliers=tuple(_i(o) for o in outliers) if isinstance(outliers, list | tuple) else (),
            source=str(d.get("source") or ""),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientFigures:
    """A workload's medians by the client's own clock (None: not measured)."""

    tg: float | None = None
    pp: float | None = None
    ttft_ms: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {"tg": self.tg, "pp": self.pp, "ttft_ms": self.ttft_ms}

    @classmethod
    def from_json(cls, d: object) -> ClientFigures:
        d = _m(d)
        return cls(tg=_f(d.get("tg")), pp=_f(d.get("pp")), ttft_ms=_f(d.get("ttft_ms")))


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSummary:
    """One workload's figures (:func:`moetune.bench.analysis.summary.workload_summary`): TG and PP
    with their intervals, medians of the rest over its repeats, and ``n`` repeats."""

    kind: str | None = None
    depth: int | None = None
    thinking: bool | None = None
    tg: Stat | None = None
    pp: Stat | None = None
    overhead_ms: float | None = None
    wall_ms: float | None = None
    client: ClientFigures = field(default_factory=ClientFigures)
    prompt_tokens: float | None = None
    prompt_n: float | None = None
    predicted_n: float | None = None
    cached_n: float | None = None
    cache_confirmed: float | None = None
    reasoning_share: float | None = None
    n: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "depth": self.depth,
            "thinking": self.thinking,
            "tg": None if self.tg is None else self.tg.to_json(),
            "pp": None if self.pp is None else self.pp.to_json(),
            "overhead_ms": self.overhead_ms,
            "wall_ms": self.wall_ms,
            "client": self.client.to_json(),
            "prompt_tokens": self.prompt_tokens,
            "prompt_n": self.prompt_n,
            "predicted_n": self.predicted_n,
            "cached_n": self.cached_n,
            "cache_confirmed": self.cache_confirmed,
            "reasoning_share": self.reasoning_share,
            "n": self.n,
        }

    @classmethod
    def from_json(cls, d: object) -> WorkloadSummary:
        d = _m(d)
        kind, depth, thinking = d.get("kind"), d.get("depth"), d.get("thinking")
        return cls(
            kind=kind if isinstance(kind, str) else None,
            depth=depth if isinstance(depth, int) and not isinstance(depth, bool) else None,
            thinking=thinking if isinstance(thinking, bool) else None,
            tg=Stat.from_json(d.get("tg")),
            pp=Stat.from_json(d.get("pp")),
            overhead_ms=_f(d.get("overhead_ms")),
            wall_ms=_f(d.get("wall_ms")),
            client=ClientFigures.from_json(d.get("client")),
            prompt_tokens=_f(d.get("prompt_tokens")),
            prompt_n=_f(d.get("prompt_n")),
            predicted_n=_f(d.get("predicted_n")),
            cached_n=_f(d.get("cached_n")),
            cache_confirmed=_f(d.get("cache_confirmed")),
            reasoning_share=_f(d.get("reasoning_share")),
            n=_i(d.get("n")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchSummary:
    """A bench run's figures per workload (in the order the workloads ran), its warnings and how
    many samples it measured. ``tg``, ``pp`` and ``overhead_ms`` are the first workload's."""

    workloads: Mapping[str, WorkloadSummary] = field(default_factory=dict)
    warnings: tuple[Warning, ...] = ()
    n_samples: int = 0

    @property
    def head(self) -> WorkloadSummary | None:
        """The first workload's figures (None for a run without one)."""
        return next(iter(self.workloads.values()), None)

    @property
    def tg(self) -> Stat | None:
        return self.head.tg if self.head else None

    @property
    def pp(self) -> Stat | None:
        return self.head.pp if self.head else None

    @property
    def overhead_ms(self) -> float | None:
        return self.head.overhead_ms if self.head else None

    def median(self, workload: str, family: str) -> float | None:
        """The median of a workload's ``tg`` or ``pp`` (None: no such workload or figure)."""
        w = self.workloads.get(workload)
        s = None if w is None else w.tg if family == "tg" else w.pp if family == "pp" else None
        return None if s is None else s.median

    def to_json(self) -> dict[str, object]:
        """The run's figures as ``bench --json`` prints them and a run's summary stores them."""
        head = self.head
        return {
            "schema_version": SUMMARY_SCHEMA_VERSION,
            "tg": None if head is None or head.tg is None else head.tg.to_json(),
            "pp": None if head is None or head.pp is None else head.pp.to_json(),
            "overhead_ms": None if head is None else head.overhead_ms,
            "workloads": {name: w.to_json() for name, w in self.workloads.items()},
            "warnings": [w.to_json() for w in self.warnings],
            "n_samples": self.n_samples,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> BenchSummary:
        """A stored summary (:meth:`to_json`, or what an older moetune stored: keys it lacks read
        as their empty value); keys beside the figures (``error``, a report's) are left."""
        warnings = d.get("warnings")
        ws = [_warning(w) for w in warnings] if isinstance(warnings, list | tuple) else []
        return cls(
            workloads={str(k): WorkloadSummary.from_json(v) for k, v in _m(d.get("workloads")).items()},
            warnings=tuple(w for w in ws if w is not None),
            n_samples=_i(d.get("n_samples")),
        )
