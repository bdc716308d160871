"""A link test's figures from its raw samples (`moetune link-test`): round-trip times, and the
throughput of each bandwidth test. Pure, like the other kinds' extractors, so `results show`,
`export` and `compare` treat link tests as they treat benchmarks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from moetune.bench.analysis.stats import MetricSamples
from moetune.jsonread import number


def link_metric_samples(samples: Iterable[Mapping[str, object]]) -> dict[str, MetricSamples]:
    out: dict[str, MetricSamples] = {}
    for s in samples:
        rtt, size, seconds = s.get("rtt_s"), number(s.get("bytes")), number(s.get("seconds"))
        if s.get("test") == "latency" and rtt and isinstance(rtt, list):
            out["rtt"] = MetricSamples(
                values=tuple(float(x) * 1e6 for x in rtt), higher_is_better=False, unit="µs", family="rtt"
            )
        elif s.get("test") == "throughput" and seconds and size is not None:
            gbit = float(size) * 8 / float(seconds) / 1e9
            key = f"throughput:{s.get('streams')} stream{'s' if s.get('streams') != 1 else ''}"
            out[key] = MetricSamples(
                values=(gbit,),
                higher_is_better=True,
                unit="Gbit/s",
                family="throughput",
                x=float(number(s.get("streams")) or 1),
                x_label="streams",
            )
    return out
