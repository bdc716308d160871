"""A link test's figures from its raw samples (`moetune link-test`): round-trip times, and the
throughput of each bandwidth test. Pure, like the other kinds' extractors, so `results show`,
`export` and `compare` treat link tests as they treat benchmarks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from moetune.bench.analysis.stats import MetricSamples


def link_metric_samples(samples: Iterable[dict[str, Any]]) -> dict[str, MetricSamples]:
    out: dict[str, MetricSamples] = {}
    for s in samples:
        if s.get("test") == "latency" and s.get("rtt_s"):
            out["rtt"] = MetricSamples(
                values=tuple(float(x) * 1e6 for x in s["rtt_s"]), higher_is_better=False, unit="µs", family="rtt"
            )
        elif s.get("test") == "throughput" and s.get("seconds"):
            gbit = float(s["bytes"]) * 8 / float(s["seconds"]) / 1e9
            key = f"throughput:{s.get('streams')} stream{'s' if s.get('streams') != 1 else ''}"
            out[key] = MetricSamples(
                values=(gbit,),
                higher_is_better=True,
                unit="Gbit/s",
                family="throughput",
                x=float(s.get("streams") or 1),
                x_label="streams",
            )
    return out
