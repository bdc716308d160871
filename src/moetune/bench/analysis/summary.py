"""One bench run's figures, from its raw samples: the document `bench --json` prints and
`results show` renders. Pure; the same samples always give the same summary (seeded bootstrap).
"""

from __future__ import annotations

from typing import Any

from moetune.bench.analysis import single as m
from moetune.bench.analysis.stats import DEFAULT_CONF, median, summarize
from moetune.bench.analysis.warnings import bench_warnings

SUMMARY_SCHEMA_VERSION = 1


def _med(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return median(vals) if vals else None


def _stat(values: tuple[float, ...] | None, conf: float, seed: int, source: str) -> dict[str, Any] | None:
    """A figure's statistics and ``source``: ``server`` (llama.cpp's timings) or ``client`` (its clock)."""
    if not values:
        return None
    return {**summarize(values, conf=conf, seed=seed).to_json(), "source": source}


def workload_summary(
    name: str, ss: list[dict[str, Any]], *, conf: float = DEFAULT_CONF, seed: int = 0
) -> dict[str, Any]:
    ms = m.bench_metrics(ss)
    tg, pp = ms.get(f"tg:{name}"), ms.get(f"pp:{name}")
    conf_flags = [m.cache_confirmed(s) for s in ss]
    first = ss[0]
    src = m.source(ss)
    return {
        "kind": first.get("kind"),
        "depth": first.get("depth"),
        "thinking": first.get("thinking"),
        "tg": _stat(tg.values if tg else None, conf, seed, src),
        "pp": _stat(pp.values if pp else None, conf, seed, src),
        "overhead_ms": _med([m.overhead_ms(s) for s in ss]),
        "wall_ms": _med([m.wall_ms(s) for s in ss]),
        "client": {
            "tg": _med([m.client_tg_tps(s) for s in ss]),
            "pp": _med([m.client_pp_tps(s) for s in ss]),
            "ttft_ms": _med([m.client_ttft_ms(s) for s in ss]),
        },
        "prompt_tokens": _med([None if (p := m.prompt_tokens(s)) is None else float(p) for s in ss]),
        "prompt_n": _med([m.timings(s).get("prompt_n") for s in ss]),
        "predicted_n": _med([None if (n := m.output_tokens(s)) is None else float(n) for s in ss]),
        "cached_n": _med([None if (c := m.cached_tokens(s)) is None else float(c) for s in ss]),
        "cache_confirmed": None
        if all(c is None for c in conf_flags)
        else sum(1 for c in conf_flags if c) / len(conf_flags),
        "reasoning_share": _med([m.reasoning_share(s) for s in ss]),
        "n": len(ss),
    }


def run_summary(samples: list[dict[str, Any]], *, conf: float = DEFAULT_CONF, seed: int = 0) -> dict[str, Any]:
    """Per-workload figures, the first workload's figures at the top level, and warnings."""
    per = {w: workload_summary(w, ss, conf=conf, seed=seed) for w, ss in m.by_workload(samples).items()}
    head = next(iter(per.values()), None)
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "tg": head["tg"] if head else None,
        "pp": head["pp"] if head else None,
        "overhead_ms": head["overhead_ms"] if head else None,
        "workloads": per,
        "warnings": [w.to_json() for w in bench_warnings(samples)],
        "n_samples": len(samples),
    }
