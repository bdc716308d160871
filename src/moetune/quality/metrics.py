"""A quality run's samples as the metrics `moetune compare` reads: per chunk, ``kld`` and ``ppl``
(lower is better) and ``top1_agree`` (higher is better)."""

from __future__ import annotations

from collections.abc import Iterable

from moetune.bench.analysis.stats import MetricSamples

_METRICS = (("kld", False, "nats"), ("top1_agree", True, "fraction"), ("ppl", False, "ppl"))


def quality_metrics(samples: Iterable[dict[str, object]]) -> dict[str, MetricSamples]:
    values: dict[str, list[float]] = {name: [] for name, _, _ in _METRICS}
    for s in samples:
        for name, _, _ in _METRICS:
            v = s.get(name)
            if isinstance(v, int | float):
                values[name].append(float(v))
    return {
        name: MetricSamples(values=tuple(values[name]), higher_is_better=hib, unit=unit, family="quality")
        for name, hib, unit in _METRICS
        if values[name]
    }


def qa_metrics(samples: Iterable[dict[str, object]]) -> dict[str, MetricSamples]:
    """A soak's per-question latency (seconds). Its accuracy is not a median's business: two soaks
    are judged question by question, paired (`moetune quality --qa`, McNemar's exact test)."""
    lat = [float(v) for s in samples if isinstance(v := s.get("latency_s"), int | float)]
    return (
        {"qa_latency": MetricSamples(values=tuple(lat), higher_is_better=False, unit="s", family="qa")} if lat else {}
    )
