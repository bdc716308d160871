"""Goodput: the share and the rate of requests that met every given latency target (SLO).

The rule is vLLM's ``benchmark_serving --goodput`` (``calculate_metrics``): a request is *good*
when, for every target given, its own value is at most the target (``value <= target``, in ms),
and goodput is the good requests over the level's wall time. What is compared, per request:

- ``ttft_ms``: the request's TTFT (first generated token, reasoning or content);
- ``tpot_ms``: the request's TPOT, (last token - first token) / (output tokens - 1); a request of
  one token has none and meets it (vLLM counts its TPOT as 0). vLLM takes (E2E - TTFT) /
  (tokens - 1), which also counts the time from the last token to the end of the stream;
- ``e2e_ms``: the request's end-to-end time, from sending it to the end of its stream (vLLM's e2el);
- ``itl_ms`` (vLLM has no ITL target): the request's *largest* inter-token gap, so the target
  reads "no token of the request came more than B ms after the one before". A request without
  gaps (one token, or all of them in one event) meets it; one whose tokens per event the server
  did not say (``itl_unknown``) cannot be judged and counts as not met (``unknown``).

Failed requests count as not met; ``of`` is every request of the level, failed ones included.
``req_s`` is met requests over the level's span (first request due to last one ended), the span
``request_s`` uses. Everything here is derived from the stored raw samples, so a stored run can
be judged again with other targets (``moetune serve-report RUN --slo ...``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from moetune.bench.analysis.level_summary import LevelGoodput
from moetune.errors import InputError


class RequestMetrics(Protocol):
    """What goodput reads of a request (``moetune.bench.analysis.serve.RequestMetrics``)."""

    @property
    def ok(self) -> bool: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def e2e_s(self) -> float | None: ...
    @property
    def tpot_s(self) -> float | None: ...
    @property
    def itl_s(self) -> tuple[float, ...]: ...
    @property
    def itl_known(self) -> bool: ...
    @property
    def output_tokens(self) -> int: ...


# key -> how tables and messages name the value compared
SLO_KEYS: dict[str, str] = {"ttft_ms": "TTFT", "itl_ms": "max ITL", "tpot_ms": "TPOT", "e2e_ms": "E2E"}
SLO_EXAMPLE = "ttft_ms=500,itl_ms=100,e2e_ms=5000"


def parse_slo(text: str, option: str = "--slo") -> dict[str, float]:
    """``KEY=MS[,KEY=MS...]`` as {key: ms}, in :data:`SLO_KEYS` order; every problem named in
    one :class:`InputError` (exit 2) with the accepted keys."""
    problems: list[str] = []
    got: dict[str, float] = {}
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        problems.append("no targets given")
    for part in parts:
        if not part:
            continue
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq:
            problems.append(f"{part!r} is not KEY=MS")
            continue
        if key not in SLO_KEYS:
            guess = f" (did you mean {key}_ms?)" if f"{key}_ms" in SLO_KEYS else ""
            problems.append(f"unknown key {key!r}{guess}")
        try:
            ms = float(value)
        except ValueError:
            problems.append(f"{key}={value!r}: not a number of milliseconds")
            continue
        if not math.isfinite(ms) or ms <= 0:
            problems.append(f"{key}={value}: the target must be a positive number of milliseconds")
        elif key in got:
            problems.append(f"{key} given twice")
        elif key in SLO_KEYS:
            got[key] = ms
    if problems:
        raise InputError(
            f"{option} {text!r}: {'; '.join(problems)}; accepted keys: {', '.join(SLO_KEYS)} "
            f"(milliseconds, any subset)",
            hint=f"e.g. {option} {SLO_EXAMPLE}",
        )
    return {k: got[k] for k in SLO_KEYS if k in got}


def slo_text(slo: Mapping[str, float]) -> str:
    """``TTFT ≤ 500 ms, max ITL ≤ 100 ms``."""
    return ", ".join(f"{SLO_KEYS[k]} ≤ {v:g} ms" for k, v in slo.items())


def request_values(m: RequestMetrics) -> dict[str, float | None]:
    """The request's value (ms) for each SLO key; None where it cannot be judged."""
    ms = 1000.0
    tpot = m.tpot_s * ms if m.tpot_s is not None else (0.0 if m.output_tokens <= 1 else None)
    itl = max(m.itl_s, default=0.0) * ms if m.itl_known else None
    return {
        "ttft_ms": None if m.ttft_s is None else m.ttft_s * ms,
        "itl_ms": itl,
        "tpot_ms": tpot,
        "e2e_ms": None if m.e2e_s is None else m.e2e_s * ms,
    }


def goodput(ms: Sequence[RequestMetrics], slo: Mapping[str, float], span_s: float | None) -> LevelGoodput:
    """One level's goodput: ``share`` (met / of), ``req_s`` (met / span), ``met``, ``of``, the
    targets, and for each target how many successful requests ``missed`` it; ``failed`` and
    ``unknown`` (successful requests a target could not judge) count as not met."""
    met = unknown = 0
    missed = dict.fromkeys(slo, 0)
    for m in ms:
        if not m.ok:
            continue
        values = request_values(m)
        judged = [values[k] for k in slo]
        over = [k for k, v in zip(slo, judged, strict=True) if v is not None and v > slo[k]]
        for k in over:
            missed[k] += 1
        unknown += any(v is None for v in judged)
        met += not over and all(v is not None for v in judged)
    n = len(ms)
    return LevelGoodput(
        share=round(met / n, 4) if n else None,
        req_s=round(met / span_s, 4) if span_s else None,
        slo=dict(slo),
        met=met,
        of=n,
        missed=missed,
        failed=sum(1 for m in ms if not m.ok),
        unknown=unknown,
    )


def wilson(met: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """Wilson score interval of a share (95 % by default); None without requests."""
    if n <= 0:
        return None
    p = met / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)
