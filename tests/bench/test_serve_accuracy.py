"""serve-bench's TTFT and ITL against the mock server's known schedule, at 64 concurrent streams.

Schedule: TTFT 60/70/80/90/100 ms by arrival order, ITL 20/30/40/50/60 ms by token; five equal
buckets put p50 and p90 in the middle of a bucket and p99 inside the top one, so a percentile
never falls on the jump between two values. 64 streams x 2 requests x 40 gaps: ~1500 token events
per second on this 2-core machine.

The truth is the schedule as the mock realized it (its recorded write times, on the clock all
processes share): the client's error must stay under 2 ms for all six percentiles. The nominal
schedule also carries the mock process's own timer lateness on a busy VM (about 0.3 ms at p50,
1.5-3 ms at p99, measured), which is no error of the client's: p50s must agree with it within
2 ms too. A noisy neighbour can disturb one run, so the test tries twice.
"""

from __future__ import annotations

from benchmarks.serve_accuracy import Accuracy, measure

BOUND_MS = 2.0


def _passes(a: Accuracy) -> bool:
    nominal = a.gaps_ms("nominal")
    return (
        a.errors == 0
        and max(a.gaps_ms("realized").values()) < BOUND_MS
        and nominal["ttft_ms p50"] < BOUND_MS
        and nominal["itl_ms p50"] < BOUND_MS
    )


def test_ttft_and_itl_agree_with_the_mock_schedule_at_64_streams() -> None:
    tries = []
    for _ in range(2):
        a = measure(64)
        tries.append(a)
        print(
            f"\nlag {a.lag_ms} ms, TTFT error {a.ttft_err_ms} ms, ITL error {a.itl_err_ms} ms, "
            f"mock lateness {a.mock_late_ms} ms, {a.event_rate_per_s} events/s"
        )
        print(f"reported {a.reported}\nrealized gaps {a.gaps_ms('realized')}\nnominal gaps {a.gaps_ms('nominal')}")
        if _passes(a):
            break
    a = tries[-1]
    assert a.requests == 128 and a.errors == 0
    assert a.events == 128 * 41
    assert max(a.gaps_ms("realized").values()) < BOUND_MS, a.gaps_ms("realized")
    assert a.gaps_ms("nominal")["ttft_ms p50"] < BOUND_MS
    assert a.gaps_ms("nominal")["itl_ms p50"] < BOUND_MS
    assert a.reported["itl_ms"]["p50"] is not None


def test_a_stalled_client_still_reports_the_right_itl() -> None:
    """The client's process stops for 300 ms mid-stream (as when a CPU-bound server on the same
    host takes the cores). The events that queued up meanwhile come out of one read with the
    kernel's time of the last; the server's own clock (timings.predicted_ms) places the others.
    Stamping on reading would be off by up to 300 ms."""
    import asyncio
    import itertools
    import time

    from benchmarks.http_adapters import make_client

    from moetune.bench.analysis.serve import request_metrics
    from moetune.bench.http.clock import run
    from moetune.bench.serve.load import LoadSpec, Prompt, RequestOptions, run_level
    from tests.bench.mock_server import MockConfig, mock_server

    async def go(url: str) -> tuple[list[object], dict[str, object]]:
        http = make_client(url)
        asyncio.get_running_loop().call_later(0.5, time.sleep, 0.3)  # the stall
        recs = await run_level(
            http,
            [Prompt("hi", 0, 31)],
            LoadSpec(concurrency=16, requests=16),
            options=RequestOptions(),
            on_sample=lambda r: None,
        )
        _, log = await http.get_json("/mock/log")
        await http.aclose()
        return list(recs), log

    def measure() -> list[float]:
        with mock_server(MockConfig(ttft_ms=(50.0,), itl_ms=(40.0,))) as url:
            recs, log = run(go(url))
        errors = []
        for r in recs:
            writes = log[r.response_id]["writes"]  # type: ignore[attr-defined,index]
            gaps = [b - a for a, b in itertools.pairwise(writes)]
            m = request_metrics(r.to_sample())  # type: ignore[attr-defined]
            errors += [abs(x - g) * 1000 for x, g in zip(m.itl_s, gaps, strict=True)]
        return sorted(errors)

    # a second try when the first missed: on a busy 2-core machine the mock server itself can be
    # descheduled between noting a write and making it, which no client can see
    errors = measure()
    if errors[int(len(errors) * 0.99)] >= BOUND_MS:
        errors = min(errors, measure(), key=lambda e: e[int(len(e) * 0.99)])
    print(
        f"\nITL error after a 300 ms client stall: p50 {errors[len(errors) // 2]:.3f} ms, "
        f"p99 {errors[int(len(errors) * 0.99)]:.3f} ms, max {errors[-1]:.3f} ms"
    )
    assert errors[len(errors) // 2] < 0.5
    assert errors[int(len(errors) * 0.99)] < BOUND_MS
    assert errors[-1] < 10.0
