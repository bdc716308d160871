"""The load generator against the mock server: closed and open loop, misbehaving servers."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterator
from typing import Any

import pytest
from benchmarks.http_adapters import LIBRARIES, make_client

from moetune.bench.analysis.serve import summarize_level
from moetune.bench.http.clock import run
from moetune.bench.serve.load import LoadSpec, Prompt, RequestOptions, arrival_offsets, run_level
from moetune.bench.serve.request import RequestRecord
from tests.bench.mock_server import MockConfig, mock_server


def test_constant_arrivals() -> None:
    assert list(itertools.islice(arrival_offsets(4.0, "constant", 0), 4)) == pytest.approx([0, 0.25, 0.5, 0.75])


def test_poisson_arrivals_have_the_asked_rate() -> None:
    xs = list(itertools.islice(arrival_offsets(10.0, "poisson", 3), 2001))
    gaps = [b - a for a, b in itertools.pairwise(xs)]
    assert statistics.mean(gaps) == pytest.approx(0.1, rel=0.1)
    assert statistics.stdev(gaps) == pytest.approx(0.1, rel=0.15)  # exponential: sd = mean
    assert xs[:5] == list(itertools.islice(arrival_offsets(10.0, "poisson", 3), 5))  # seeded


def load(
    url: str,
    spec: LoadSpec,
    *,
    library: str = "asyncio",
    prompt: Prompt | None = None,
    options: RequestOptions | None = None,
) -> tuple[list[RequestRecord], list[dict[str, Any]], dict[str, Any]]:
    stored: list[dict[str, Any]] = []

    async def go() -> tuple[list[RequestRecord], dict[str, Any]]:
        http = make_client(url, library=library, timeout_s=30)
        try:
            recs = await run_level(
                http,
                [prompt or Prompt("hello", 30, 5)],
                spec,
                options=options or RequestOptions(),
                on_sample=lambda r: stored.append(r.to_sample()),
            )
            _, stats = await http.get_json("/mock/stats")
            return recs, stats
        finally:
            await http.aclose()

    recs, stats = run(go())
    return recs, stored, stats


@pytest.fixture(scope="module")
def fast_mock() -> Iterator[str]:
    with mock_server(MockConfig(ttft_ms=(10.0,), itl_ms=(5.0,))) as url:
        yield url


def test_closed_loop_runs_the_requests_and_stores_each(fast_mock: str) -> None:
    recs, stored, _ = load(fast_mock, LoadSpec(concurrency=3, requests=9))
    assert len(recs) == len(stored) == 9
    assert sorted(s["index"] for s in stored) == list(range(9))
    lv = summarize_level(stored)
    assert lv["ok"] == 9 and lv["errors"] == {}
    assert lv["ttft_ms"]["p50"] == pytest.approx(10, abs=3)
    assert lv["itl_ms"]["p50"] == pytest.approx(5, abs=1)
    assert lv["slot_wait_ms"]["p99"] == 0.0  # closed loop: a worker never waits for a slot


def test_open_loop_shows_the_client_queue(fast_mock: str) -> None:
    # 1 slot, requests ~30 ms long, due every 5 ms: they wait for the slot, and the wait is recorded
    # from when each was due (no coordinated omission)
    recs, stored, _ = load(fast_mock, LoadSpec(concurrency=1, requests=6, rate=200.0, arrivals="constant"))
    lv = summarize_level(stored)
    assert lv["slot_wait_ms"]["p99"] > 50
    assert lv["latency_ms"]["p99"] > lv["e2e_ms"]["p99"] + 50
    due = sorted(r.t_sched for r in recs)
    assert [b - a for a, b in itertools.pairwise(due)] == pytest.approx([0.005] * 5, abs=1e-6)


def test_duration_mode(fast_mock: str) -> None:
    recs, _, _ = load(fast_mock, LoadSpec(concurrency=2, duration_s=0.3))
    assert 4 <= len(recs) <= 40
    assert max(r.t_slot for r in recs) - min(r.t_slot for r in recs) < 0.3 + 0.05


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_server_that_drops_requests_on_reused_connections_loses_no_sample(library: str) -> None:
    with mock_server(MockConfig(ttft_ms=(5.0,), itl_ms=(2.0,), drop_reused_every=2)) as url:
        _, stored, stats = load(url, LoadSpec(concurrency=2, requests=12), library=library)
    assert len(stored) == 12
    assert all(s["error"] is None for s in stored), [s["error"] for s in stored]
    retries = sum(len(s["retries"]) for s in stored)
    assert retries >= 1 and stats["dropped"] >= 1
    assert stats["requests"] == 12  # every sample is a request the server answered
    assert summarize_level(stored)["retries"] == retries


def test_a_server_that_closes_idle_connections() -> None:
    with mock_server(MockConfig(ttft_ms=(5.0,), itl_ms=(2.0,), idle_close_s=0.05)) as url:
        _, stored, stats = load(url, LoadSpec(concurrency=1, requests=4, rate=8.0, arrivals="constant"))
    assert [s["error"] for s in stored] == [None] * 4
    assert stats["idle_closed"] >= 1 and stats["requests"] == 4


def test_http_400_is_a_counted_error_not_a_crash() -> None:
    with mock_server(MockConfig(ttft_ms=(5.0,), itl_ms=(2.0,), max_prompt_tokens=20)) as url:
        _, stored, stats = load(url, LoadSpec(concurrency=2, requests=4))
    lv = summarize_level(stored)
    assert lv["requests"] == 4 and lv["ok"] == 0
    assert lv["errors"] == {"http_400:exceed_context_size_error": 4}
    assert "exceeds the available context size" in stored[0]["detail"]
    assert stats["rejected"] == 4


def test_multi_token_chunks_and_reasoning() -> None:
    cfg = MockConfig(ttft_ms=(10.0,), itl_ms=(4.0,), tokens_per_chunk=(1, 3), reasoning_tokens=4)
    with mock_server(cfg) as url:
        _, stored, _ = load(url, LoadSpec(concurrency=1, requests=2), prompt=Prompt("hi", 30, 9))
    lv = summarize_level(stored)
    assert lv["output_tokens"] == 18 and lv["reasoning_tokens"] == 8
    # chunks of 1 and 3 tokens written when their last token is due: every ITL is 4 ms
    assert lv["itl_ms"]["p50"] == pytest.approx(4, abs=1)
    assert lv["ttfc_ms"]["p50"] > lv["ttft_ms"]["p50"] + 10


def test_a_request_past_its_timeout_is_an_error() -> None:
    with mock_server(MockConfig(ttft_ms=(400.0,), itl_ms=(2.0,))) as url:
        recs, stored, _ = load(url, LoadSpec(concurrency=2, requests=2), options=RequestOptions(timeout_s=0.1))
    assert [s["error"] for s in stored] == ["timeout", "timeout"]
    assert all(0.09 < r.t_end - r.t_first_send < 0.3 for r in recs)
