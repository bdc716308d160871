"""Serving figures derived from raw samples (pure), table-tested."""

from __future__ import annotations

from typing import Any

import pytest

from moetune.bench.analysis.serve import (
    percentiles_ms,
    request_metrics,
    serve_metric_samples,
    summarize_level,
    summarize_levels,
)
from moetune.bench.analysis.sessions import serve_run_metrics, session_metric_samples
from moetune.bench.analysis.stats import MetricSamples


def sample(
    chunks: list[list[float]],
    *,
    t_send: float = 10.0,
    t_sched: float | None = None,
    t_slot: float | None = None,
    t_end: float | None = None,
    error: str | None = None,
    usage: dict[str, Any] | None = None,
    timings: dict[str, Any] | None = None,
    c: int = 1,
    max_tokens: int = 0,
    prompt_tokens: int | None = 16,
    retries: int = 0,
    count_source: str = "",
) -> dict[str, Any]:
    return {
        "concurrency": c,
        "rate": None,
        "t_sched": t_send if t_sched is None else t_sched,
        "t_slot": t_send if t_slot is None else t_slot,
        "t_send": t_send,
        "t_end": (chunks[-1][0] if chunks else t_send) + 0.001 if t_end is None else t_end,
        "chunks": chunks,
        "error": error,
        "usage": usage,
        "timings": timings,
        "max_tokens": max_tokens,
        "prompt_tokens": prompt_tokens,
        "retries": [[0.0, "disconnected"]] * retries,
        "count_source": count_source,
    }


def test_one_token_per_event() -> None:
    m = request_metrics(sample([[10.100, 1, 1, 0], [10.120, 1, 1, 0], [10.150, 1, 1, 0]], t_end=10.2))
    assert m.ttft_s == pytest.approx(0.100)
    assert m.ttfc_s == pytest.approx(0.100)
    assert m.itl_s == pytest.approx((0.020, 0.030))
    assert m.tpot_s == pytest.approx(0.025)
    assert m.e2e_s == pytest.approx(0.2)
    assert m.output_tokens == 3


def test_a_chunk_of_several_tokens_splits_its_gap() -> None:
    # 3 tokens arrive together 30 ms after the first: three ITLs of 10 ms
    m = request_metrics(sample([[10.1, 1, 1, 0], [10.13, 3, 3, 0]]))
    assert m.itl_s == pytest.approx((0.01, 0.01, 0.01))
    assert m.output_tokens == 4
    assert m.tpot_s == pytest.approx(0.01)


TEXT_CHUNKS = [[10.1, 1, 4, 0], [10.13, 1, 12, 0], [10.15, 1, 8, 0]]  # three chunks, counted one token each


@pytest.mark.parametrize(
    ("usage", "source", "itl", "known"),
    [
        # usage at the end says 6 tokens in 3 chunks, none counted per chunk: ITL unknown, not guessed
        ({"completion_tokens": 6, "prompt_tokens": 40}, "text", (), False),
        # ... says 3: one token per chunk, as counted
        ({"completion_tokens": 3, "prompt_tokens": 40}, "text", (0.03, 0.02), True),
        # a running usage counted each chunk's tokens (vLLM's continuous_usage_stats)
        ({"completion_tokens": 3, "prompt_tokens": 40}, "usage", (0.03, 0.02), True),
    ],
)
def test_itl_needs_tokens_per_chunk(usage: dict[str, Any], source: str, itl: tuple[float, ...], known: bool) -> None:
    s = sample(TEXT_CHUNKS, usage=usage, count_source=source, prompt_tokens=None)
    m = request_metrics(s)
    assert (m.itl_s == pytest.approx(itl), m.itl_known, m.usage) == (True, known, True)
    assert m.output_tokens == usage["completion_tokens"]
    assert m.tpot_s == pytest.approx(0.05 / (usage["completion_tokens"] - 1))  # from usage either way
    lv = summarize_level([s, s])
    assert lv["itl_unknown"] == (0 if known else 2)
    assert (lv["itl_ms"]["p50"] is None) == (not known)
    # not counted before sending: the length is the server's, and nothing to disagree with
    assert (lv["prompt_tokens_mean"], lv["prompt_token_mismatches"]) == (40, 0)


def test_a_response_without_usage_counts_chunks_and_says_so() -> None:
    lv = summarize_level([sample(TEXT_CHUNKS, count_source="text", prompt_tokens=None)])
    assert (lv["output_tokens"], lv["no_usage"], lv["itl_unknown"], lv["prompt_tokens_mean"]) == (3, 1, 0, None)


def test_server_itl_from_llama_server_timings() -> None:
    m = request_metrics(sample([[10.1, 1, 1, 0, 0.0], [10.13, 2, 2, 0, 20.0], [10.14, 1, 1, 0, 31.0]]))
    assert m.itl_s == pytest.approx((0.015, 0.015, 0.01))
    assert m.server_itl_s == pytest.approx((0.010, 0.010, 0.011))
    assert request_metrics(sample([[10.1, 1, 1, 0], [10.2, 1, 1, 0]])).server_itl_s == ()


@pytest.mark.parametrize(
    ("earliest", "itl"),
    [
        # the client was away for 90 ms: three events came out of one read with the kernel's time of
        # the last; they arrived after the previous event, and are spread evenly
        (10.1, (0.03, 0.03, 0.03)),
        # the client read at once (the server wrote them together): they keep the read's time
        (10.19, (0.09, 0.0, 0.0)),
        # somewhere in between
        (10.13, (0.05, 0.02, 0.02)),
    ],
)
def test_events_read_together_are_spread_over_their_interval(earliest: float, itl: tuple[float, ...]) -> None:
    m = request_metrics(sample([[10.1, 1, 1, 0, None, 10.1]] + [[10.19, 1, 1, 0, None, earliest]] * 3))
    assert m.itl_s == pytest.approx(itl)


def test_reasoning_first_then_content() -> None:
    m = request_metrics(sample([[10.05, 1, 0, 5], [10.06, 1, 0, 5], [10.2, 1, 4, 0]]))
    assert m.ttft_s == pytest.approx(0.05)  # the first reasoning token
    assert m.ttfc_s == pytest.approx(0.2)  # the first answer token
    assert m.reasoning_tokens == 2


def test_usage_overrides_the_event_count_and_caches_are_read() -> None:
    usage = {"completion_tokens": 5, "prompt_tokens": 17, "prompt_tokens_details": {"cached_tokens": 8}}
    m = request_metrics(sample([[10.1, 1, 1, 0], [10.2, 1, 1, 0]], usage=usage, timings={"prompt_ms": 40.0}))
    assert m.output_tokens == 5
    assert m.tpot_s == pytest.approx(0.1 / 4)
    assert m.cached_tokens == 8
    assert m.server_prompt_tokens == 17
    assert m.server_wait_s == pytest.approx(0.1 - 0.04)


def test_queue_inclusive_latency_and_slot_wait() -> None:
    m = request_metrics(sample([[10.1, 1, 1, 0]], t_sched=9.5, t_slot=9.9, t_send=10.0, t_end=10.3))
    assert m.slot_wait_s == pytest.approx(0.4)
    assert m.latency_s == pytest.approx(0.8)
    assert m.e2e_s == pytest.approx(0.3)


def test_an_event_with_text_but_no_new_token_is_not_an_itl() -> None:
    # llama-server may send the text of a token it counted earlier (timings say 0 new tokens)
    m = request_metrics(sample([[10.1, 1, 1, 0], [10.12, 0, 2, 0], [10.14, 1, 1, 0]]))
    assert m.itl_s == pytest.approx((0.04,))


def test_failed_request() -> None:
    m = request_metrics(sample([], error="http_400:exceed_context_size_error"))
    assert not m.ok and m.ttft_s is None and m.itl_s == ()


@pytest.mark.parametrize(
    ("values", "p50", "p99"),
    [
        ([0.010], 10.0, 10.0),
        ([0.001, 0.002, 0.003], 2.0, 2.98),
        ([], None, None),
    ],
)
def test_percentiles(values: list[float], p50: float | None, p99: float | None) -> None:
    got = percentiles_ms(values)
    assert got["p50"] == (pytest.approx(p50) if p50 is not None else None)
    assert got["p99"] == (pytest.approx(p99) if p99 is not None else None)


def test_a_level_names_its_slowest_request_and_counts_outliers() -> None:
    fast = [
        sample(
            [[10.0 + i + 0.1, 1, 1, 0], [10.0 + i + 0.5, 1, 1, 0]],
            t_send=10.0 + i,
            t_end=10.0 + i + 0.56,
            max_tokens=2,
            c=2,
        )
        for i in range(9)
    ]
    stall = sample([[30.0 + 0.1, 1, 1, 0], [30.0 + 54.5, 1, 1, 0]], t_send=30.0, t_end=30.0 + 54.6, max_tokens=2, c=2)
    lv = summarize_level([*fast, {**stall, "index": 9}])
    sl = lv["slowest"]
    assert sl["e2e_ms"] == pytest.approx(54600) and sl["index"] == 9 and sl["outliers"] == 1
    assert sl["ttft_ms"] == pytest.approx(100) and sl["output_tokens"] == sl["median_output_tokens"] == 2
    assert summarize_level(fast)["slowest"]["outliers"] == 0


def test_open_loop_levels_carry_the_offered_and_the_completed_rate() -> None:
    # due every 50 ms (20/s); one stream of 150 ms each: they finish every 150 ms
    due = [100.0 + 0.05 * i for i in range(10)]
    ends = [100.15 + 0.15 * i for i in range(10)]
    ss = [
        {
            **sample([[e - 0.05, 1, 1, 0], [e, 1, 1, 0]], t_send=e - 0.15, t_end=e, max_tokens=2, c=1),
            "rate": 20.0,
            "t_sched": d,
        }
        for d, e in zip(due, ends, strict=True)
    ]
    lv = summarize_level(ss)
    assert lv["offered_request_s"] == pytest.approx(20.0) and lv["completed_request_s"] == pytest.approx(
        6.667, abs=0.01
    )
    assert summarize_level([{**s, "rate": None} for s in ss])["offered_request_s"] is None


def test_level_summary_counts_errors_and_throughput() -> None:
    ok = [
        sample(
            [[10.0 + i + 0.1, 1, 1, 0], [10.0 + i + 0.2, 1, 1, 0]],
            t_send=10.0 + i,
            t_end=10.0 + i + 0.25,
            max_tokens=2,
            c=2,
        )
        for i in range(4)
    ]
    bad = [
        sample([], t_send=11.0, t_end=11.01, error="http_400:exceed_context_size_error", c=2),
        sample([], t_send=11.0, t_end=11.01, error="timeout", c=2),
    ]
    lv = summarize_level(ok + bad)
    assert lv["concurrency"] == 2
    assert (lv["requests"], lv["ok"]) == (6, 4)
    assert lv["errors"] == {"http_400:exceed_context_size_error": 1, "timeout": 1}
    assert lv["duration_s"] == pytest.approx(3.25)
    assert lv["output_tok_s"] == pytest.approx(8 / 3.25, rel=1e-3)
    assert lv["request_s"] == pytest.approx(4 / 3.25, rel=1e-3)
    assert lv["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert lv["itl_ms"]["p99"] == pytest.approx(100.0)
    assert lv["short_outputs"] == 0


def test_levels_grouped_in_run_order() -> None:
    s = [sample([], c=4), sample([], c=1), sample([], c=4)]
    assert [(lv["concurrency"], lv["requests"]) for lv in summarize_levels(s)] == [(4, 2), (1, 1)]


def test_compare_extractor_families_on_the_concurrency_axis() -> None:
    samples = [sample([[10.1, 1, 1, 0], [10.12, 1, 1, 0]], c=c) for c in (1, 1, 4)]
    samples.append({"phase_marker": True})  # not a request sample: ignored
    got = serve_metric_samples(samples)
    assert set(got) == {f"{f}:c={c}" for f in ("ttft", "itl", "tpot", "e2e", "decode") for c in (1, 4)}
    ttft = got["ttft:c=1"]
    assert isinstance(ttft, MetricSamples)
    assert ttft.values == pytest.approx((100.0, 100.0))
    assert (ttft.higher_is_better, ttft.unit, ttft.family, ttft.x, ttft.x_label) == (
        False,
        "ms",
        "ttft",
        1.0,
        "concurrency",
    )
    assert got["decode:c=4"].higher_is_better


def test_a_long_level_is_summarized_from_a_stream_in_little_memory() -> None:
    """serve-bench reads a level's figures back from the history as a stream of samples: each
    sample's events are let go once its metrics are taken, and the token gaps kept for the
    percentiles cost 8 bytes each. Holding each request's metrics with its gaps as float tuples
    took 9 KB a 128-token request: 630 MB at the end of the 30-minute soak at 256 streams."""
    import tracemalloc

    n, tokens = 1000, 128

    def stream() -> Any:
        for i in range(n):
            t0 = 100.0 + i
            chunks = [[t0 + 0.2 + 0.06 * k + 1e-5 * (k % 7), 1, 1, 0, 60.0 * k + 0.01 * (k % 7)] for k in range(tokens)]
            yield {**sample(chunks, t_send=t0, max_tokens=tokens, count_source="timings"), "index": i}

    tracemalloc.start()
    try:
        lv = summarize_level(stream())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lv["requests"] == lv["ok"] == n and lv["output_tokens"] == n * tokens
    assert lv["itl_ms"]["p50"] == pytest.approx(60, abs=0.1) and lv["server_itl_ms"]["p50"] == pytest.approx(
        60, abs=0.1
    )
    # the two gap arrays (2 KB a request, twice that while one grows) and the small per-request figures
    assert peak < 8000 * n, f"{peak / n:.0f} bytes a request"


class Once:
    """Samples that can be read once, as a stream from the history is: a second pass fails."""

    def __init__(self, samples: list[dict[str, Any]]) -> None:
        self.samples, self.read = samples, False

    def __iter__(self) -> Any:
        assert not self.read, "read twice: a long run's samples would have to be held whole"
        self.read = True
        return iter(self.samples)


def test_a_runs_levels_and_metrics_read_its_samples_once() -> None:
    """serve-report, results show, compare and the HTML report stream a run's samples from the
    history: every figure from one pass, equal to the figures of the samples held in a list, with
    a level that came back later (c=4, c=1, c=4) merged into the first."""
    chunks = [[10.1, 1, 1, 0], [10.13, 1, 1, 0], [10.17, 1, 1, 0]]
    s = [
        sample(chunks, c=4),
        sample(chunks, c=1, t_send=11.0, t_end=11.3),
        sample(chunks, c=4, error="timeout"),
        {"session": 0, "turn": 1, **sample(chunks, c=1)},
    ]
    assert summarize_levels(Once(s)) == [summarize_level([s[0], s[2]]), summarize_level([s[1], s[3]])]
    streamed = serve_run_metrics(Once(s))
    assert streamed.keys() == {**serve_metric_samples(s), **session_metric_samples(s)}.keys()
    assert streamed["ttft:c=4"].values == serve_metric_samples(s)["ttft:c=4"].values == pytest.approx((100.0,))
    assert "ttft:turn=1" in streamed
