"""The serving client's own error, measured against the mock server's known token schedule.

The mock (a separate process) writes each token at a time fixed in advance and records when it
really wrote it; both processes read the same monotonic clock. For every request this gives:

- lag: client arrival stamp - mock write time, per event (the client's own delay in seeing bytes);
- TTFT error: the TTFT serve-bench reports - the realized one (mock's first write - client's send);
- ITL error: each ITL serve-bench reports - the mock's realized gap, token by token;
- intake: mock's receipt of the request - client's send stamp (the server side's delay in
  reading a request; part of a true TTFT, not the client's error);
- the mock's own lateness against its nominal schedule (the machine's timer jitter, not the
  client's error).

It also compares the percentiles serve-bench reports (:func:`summarize_level`) with the same
percentiles of the realized and of the nominal schedule.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from benchmarks.http_adapters import DEFAULT_LIBRARY, make_client
from tests.bench.mock_server import MockConfig, mock_server

from moetune.bench.analysis.serve import PERCENTILES, request_metrics, summarize_level
from moetune.bench.http.clock import run as run_loop
from moetune.bench.serve.load import LoadSpec, Prompt, RequestOptions, run_level
from moetune.bench.serve.request import RequestRecord


def _dist(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(xs, dtype=float)
    q = np.percentile(a, PERCENTILES)
    return {
        "p50": round(float(q[0]), 4),
        "p90": round(float(q[1]), 4),
        "p99": round(float(q[2]), 4),
        "max": round(float(a.max()), 4),
    }


def _pct(xs: list[float]) -> dict[str, float]:
    q = np.percentile(np.asarray(xs, dtype=float), PERCENTILES)
    return {f"p{p}": round(float(v), 4) for p, v in zip(PERCENTILES, q, strict=True)}


@dataclass(frozen=True, slots=True)
class Accuracy:
    library: str
    streams: int
    requests: int
    events: int
    event_rate_per_s: float  # token events per second the client received, on average
    errors: int
    lag_ms: dict[str, float | None]
    ttft_err_ms: dict[str, float | None]  # absolute, per request
    itl_err_ms: dict[str, float | None]  # absolute, per token gap
    intake_ms: dict[str, float | None]  # mock received the request - client sent it
    mock_late_ms: dict[str, float | None]  # mock's write - its nominal due time
    reported: dict[str, dict[str, float | None]]  # serve-bench's ttft_ms / itl_ms percentiles
    realized: dict[str, dict[str, float]]  # the same percentiles of the mock's realized times
    nominal: dict[str, dict[str, float]]  # ... and of the nominal schedule

    def gaps_ms(self, against: str = "realized") -> dict[str, float]:
        """|reported - truth| for TTFT and ITL p50/p90/p99 (``ttft_ms p99``: ...)."""
        truth = self.realized if against == "realized" else self.nominal
        return {
            f"{m} {q}": round(abs(float(self.reported[m][q] or 0) - truth[m][q]), 4)
            for m in ("ttft_ms", "itl_ms")
            for q in ("p50", "p90", "p99")
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RequestErrors:
    """One request's timing error: what serve-bench reports (from its stored sample) against what the
    mock did (its receipt of the request, the times it wrote each token, the times they were due)."""

    lag_ms: list[float]  # per event: client's arrival stamp - mock's write
    ttft_err_ms: float | None  # |reported TTFT - realized TTFT|
    itl_err_ms: list[float]  # per gap: |reported ITL - mock's realized gap|
    late_ms: list[float]  # per write: mock's write - its due time (the machine's jitter, not the client's)
    intake_ms: float  # mock received the request - client sent it
    real_ttft_ms: float | None
    real_itl_ms: list[float]


def request_errors(sample: dict[str, Any], recv: float, writes: list[float], due: list[float]) -> RequestErrors:
    """:class:`RequestErrors` of one successful request, from its raw sample (as serve-bench stores it)."""
    t_send = float(sample["t_send"])
    ts = [float(c[0] or 0) for c in sample["chunks"] if (c[1] or 0) > 0]
    m = request_metrics(sample)  # what serve-bench reports, against what the mock did
    real_ttft = (writes[0] - t_send) * 1000 if writes else None
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(writes)]
    return RequestErrors(
        lag_ms=[(t - w) * 1000 for t, w in zip(ts, writes, strict=False)],
        ttft_err_ms=abs(m.ttft_s * 1000 - real_ttft) if m.ttft_s is not None and real_ttft is not None else None,
        itl_err_ms=[abs(x * 1000 - g) for x, g in zip(m.itl_s, gaps, strict=False)],
        late_ms=[(w - d) * 1000 for w, d in zip(writes, due, strict=False)],
        intake_ms=(recv - t_send) * 1000,
        real_ttft_ms=real_ttft,
        real_itl_ms=gaps,
    )


async def _collect(
    url: str, streams: int, requests: int, output_tokens: int, library: str
) -> tuple[list[RequestRecord], dict[str, Any]]:
    http = make_client(url, library=library)
    try:
        prompts = [Prompt("hello", 0, output_tokens)]
        records = await run_level(
            http,
            prompts,
            LoadSpec(concurrency=streams, requests=requests),
            options=RequestOptions(),
            on_sample=lambda r: None,
        )
        _, log = await http.get_json("/mock/log")
    finally:
        await http.aclose()
    return records, log


def measure(
    streams: int,
    *,
    ttft_ms: tuple[float, ...] = (60.0, 70.0, 80.0, 90.0, 100.0),
    itl_ms: tuple[float, ...] = (20.0, 30.0, 40.0, 50.0, 60.0),
    output_tokens: int = 41,
    rounds: int = 2,
    library: str = DEFAULT_LIBRARY,
) -> Accuracy:
    """Run ``streams`` concurrent streams, ``rounds`` requests each, against a mock with this schedule."""
    cfg = MockConfig(ttft_ms=ttft_ms, itl_ms=itl_ms)
    requests = streams * rounds
    with mock_server(cfg) as url:
        if library == "asyncio":
            records, log = run_loop(_collect(url, streams, requests, output_tokens, library))
        else:
            import asyncio

            records, log = asyncio.run(_collect(url, streams, requests, output_tokens, library))
    lag, ttft_err, itl_err, late, intake = [], [], [], [], []
    real_ttft, real_itl, nom_ttft, nom_itl = [], [], [], []
    errors = 0
    t0 = min(r.t_sched for r in records)
    t1 = max(r.t_end for r in records)
    for r in records:
        entry = log.get(r.response_id or "")
        if r.error or entry is None:
            errors += 1
            continue
        no = int((r.response_id or "mock-0").split("-")[1])
        e = request_errors(r.to_sample(), entry["recv"], entry["writes"], entry["due"])
        lag += e.lag_ms
        late += e.late_ms
        intake.append(e.intake_ms)
        if e.ttft_err_ms is not None and e.real_ttft_ms is not None:
            ttft_err.append(e.ttft_err_ms)
            real_ttft.append(e.real_ttft_ms)
        nom_ttft.append(cfg.ttft_ms[no % len(cfg.ttft_ms)])
        itl_err += e.itl_err_ms
        real_itl += e.real_itl_ms
        nom_itl += [cfg.itl_ms[(k - 1) % len(cfg.itl_ms)] for k in range(1, output_tokens)]
    level = summarize_level([r.to_sample() for r in records])
    return Accuracy(
        library=library,
        streams=streams,
        requests=len(records),
        events=len(lag),
        event_rate_per_s=round(len(lag) / (t1 - t0), 1) if t1 > t0 else 0.0,
        errors=errors,
        lag_ms=_dist(lag),
        ttft_err_ms=_dist(ttft_err),
        itl_err_ms=_dist(itl_err),
        intake_ms=_dist(intake),
        mock_late_ms=_dist(late),
        reported={
            "ttft_ms": {q: level["ttft_ms"][q] for q in ("p50", "p90", "p99")},
            "itl_ms": {q: level["itl_ms"][q] for q in ("p50", "p90", "p99")},
        },
        realized={"ttft_ms": _pct(real_ttft), "itl_ms": _pct(real_itl)},
        nominal={"ttft_ms": _pct(nom_ttft), "itl_ms": _pct(nom_itl)},
    )
