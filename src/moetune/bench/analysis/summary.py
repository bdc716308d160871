"""One bench run's figures, from its raw samples: the document `bench --json` prints and
`results show` renders (:class:`moetune.bench.analysis.bench_summary.BenchSummary`). Pure; the same
samples always give the same summary (seeded bootstrap).
"""

from __future__ import annotations

from collections.abc import Sequence

from moetune.bench.analysis import single as m
from moetune.bench.analysis.bench_summary import (
    SUMMARY_SCHEMA_VERSION,
    BenchSummary,
    ClientFigures,
    Stat,
    WorkloadSummary,
)
from moetune.bench.analysis.stats import DEFAULT_CONF, median, summarize
from moetune.bench.analysis.warnings import bench_warnings
from moetune.jsonread import flag, number, optional_integer, text

__all__ = ["SUMMARY_SCHEMA_VERSION", "bench_summary", "run_summary", "workload_figures", "workload_summary"]


def _med(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return median(vals) if vals else None


def _stat(values: tuple[float, ...] | None, conf: float, seed: int, source: str) -> Stat | None:
    """A figure's statistics and ``source``: ``server`` (llama.cpp's timings) or ``client`` (its clock)."""
    if not values:
        return None
    return Stat.of(summarize(values, conf=conf, seed=seed), source)


def _count(x: int | None) -> float | None:
    return None if x is None else float(x)


def workload_figures(
    name: str, ss: Sequence[m.Sample], *, conf: float = DEFAULT_CONF, seed: int = 0
) -> WorkloadSummary:
    """One workload's figures from its samples (all of workload ``name``)."""
    ms = m.bench_metrics(ss)
    tg, pp = ms.get(f"tg:{name}"), ms.get(f"pp:{name}")
    conf_flags = [m.cache_confirmed(s) for s in ss]
    first = ss[0]
    src = m.source(ss)
    return WorkloadSummary(
        kind=text(first.get("kind")),
        depth=optional_integer(first.get("depth")),
        thinking=flag(first.get("thinking")),
        tg=_stat(tg.values if tg else None, conf, seed, src),
        pp=_stat(pp.values if pp else None, conf, seed, src),
        overhead_ms=_med([m.overhead_ms(s) for s in ss]),
        wall_ms=_med([m.wall_ms(s) for s in ss]),
        client=ClientFigures(
            tg=_med([m.client_tg_tps(s) for s in ss]),
            pp=_med([m.client_pp_tps(s) for s in ss]),
            ttft_ms=_med([m.client_ttft_ms(s) for s in ss]),
        ),
        prompt_tokens=_med([_count(m.prompt_tokens(s)) for s in ss]),
        prompt_n=_med([number(m.timings(s).get("prompt_n")) for s in ss]),
        predicted_n=_med([_count(m.output_tokens(s)) for s in ss]),
        cached_n=_med([_count(m.cached_tokens(s)) for s in ss]),
        cache_confirmed=None
        if all(c is None for c in conf_flags)
        else sum(1 for c in conf_flags if c) / len(conf_flags),
        reasoning_share=_med([m.reasoning_share(s) for s in ss]),
        n=len(ss),
    )


def workload_summary(
    name: str, ss: Sequence[m.Sample], *, conf: float = DEFAULT_CONF, seed: int = 0
) -> dict[str, object]:
    """:func:`workload_figures` as the document (:meth:`WorkloadSummary.to_json`)."""
    return workload_figures(name, ss, conf=conf, seed=seed).to_json()


def bench_summary(samples: Sequence[m.Sample], *, conf: float = DEFAULT_CONF, seed: int = 0) -> BenchSummary:
    """Per-workload figures (the first workload's also at the top level) and warnings."""
    return BenchSummary(
        workloads={w: workload_figures(w, ss, conf=conf, seed=seed) for w, ss in m.by_workload(samples).items()},
        warnings=tuple(bench_warnings(samples)),
        n_samples=len(samples),
    )


def run_summary(samples: Sequence[m.Sample], *, conf: float = DEFAULT_CONF, seed: int = 0) -> dict[str, object]:
    """:func:`bench_summary` as the document ``bench --json`` prints (:meth:`BenchSummary.to_json`)."""
    return bench_summary(samples, conf=conf, seed=seed).to_json()
