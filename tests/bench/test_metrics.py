"""Figures from raw samples: server timings first, the client's clock beside them, cache state
from cache_n or (ik_llama.cpp) from the prompt's token count."""

from __future__ import annotations

import pytest

from moetune.bench.analysis import single as m
from tests.bench.synth import run_samples, sample


def test_primary_figures_come_from_the_servers_timings() -> None:
    # reference/000 run A: prompt eval 1323.95 ms / 30 tokens, eval 3238.59 ms / 61 tokens
    s = sample()
    s["timings"] = {"prompt_n": 30, "prompt_ms": 1323.95, "predicted_n": 61, "predicted_ms": 3238.59, "cache_n": 0}
    assert m.pp_tps(s) == pytest.approx(22.66, abs=0.01)
    assert m.tg_tps(s) == pytest.approx(18.84, abs=0.01)


def test_overhead_is_wall_time_less_the_servers_two_timers() -> None:
    s = sample(overhead_ms=7.5)
    assert m.overhead_ms(s) == pytest.approx(7.5)
    assert m.wall_ms(s) == pytest.approx(m.server_ms(s) + 7.5)


def test_client_figures_from_chunk_timestamps() -> None:
    s = sample(tg=20.0, pp=25.0, prompt_n=30, predicted_n=61)
    assert m.client_ttft_ms(s) == pytest.approx(1201.0)
    assert m.client_tg_tps(s) == pytest.approx(20.0 * 60 / 61, rel=1e-3)


@pytest.mark.parametrize(("n", "ms", "tps"), [(1, 50.0, None), (0, 0.0, None), (2, 0.0, None), (10, 500.0, 20.0)])
def test_tg_needs_two_tokens_and_a_duration(n: int, ms: float, tps: float | None) -> None:
    s = sample()
    s["timings"].update(predicted_n=n, predicted_ms=ms)
    assert m.tg_tps(s) == tps


def test_cached_tokens_llama_cpp_and_ik_llama_cpp() -> None:
    assert m.cached_tokens(sample(cache_n=12, prompt_n=30)) == 12
    ik = sample(cache_n=12, prompt_n=30, ik=True)  # no cache_n: prompt tokens 42 − prompt_n 30
    assert "cache_n" not in ik["timings"]
    assert m.cached_tokens(ik) == 12
    completion = sample(ik=True)  # /completion answers carry tokens_evaluated instead of usage
    completion["usage"] = None
    completion["tokens_evaluated"] = 542
    completion["timings"]["prompt_n"] = 30
    assert m.cached_tokens(completion) == 512
    bare = sample(ik=True)
    bare["usage"] = None
    assert m.cached_tokens(bare) is None


@pytest.mark.parametrize(
    ("cache_n", "prompt_n", "expect", "expect_pn", "ik", "ok"),
    [
        (0, 30, 0, None, False, True),
        (29, 1, 0, None, False, False),  # a cache hit where none was wanted
        (512, 64, 512, 64, False, True),  # depth confirmed
        (512, 65, 512, 64, False, False),
        (511, 65, 512, 64, True, False),  # ik: derived from the prompt's token count
        (512, 64, 512, 64, True, True),
        (0, 30, None, None, False, None),  # nothing expected
    ],
)
def test_cache_confirmation(
    cache_n: int, prompt_n: int, expect: int | None, expect_pn: int | None, ik: bool, ok: bool | None
) -> None:
    s = sample(cache_n=cache_n, prompt_n=prompt_n, expect_cached=expect, expect_prompt_n=expect_pn, ik=ik)
    assert m.cache_confirmed(s) is ok


def test_reasoning_share() -> None:
    assert m.reasoning_share(sample(reasoning_chunks=0)) == 0.0
    assert m.reasoning_share(sample(predicted_n=10, reasoning_chunks=8)) == pytest.approx(0.8)


def test_bench_metrics_per_workload_with_depth_axis() -> None:
    ss = run_samples([20.0, 21.0, 19.0]) + run_samples([18.0, 18.5, 18.2], workload="d512", depth=512)
    ms = m.bench_metrics(ss)
    assert list(ms) == ["tg:short-json", "pp:short-json", "tg:d512", "pp:d512"]
    assert ms["tg:short-json"].values == pytest.approx((20.0, 21.0, 19.0))
    assert ms["tg:short-json"].higher_is_better and ms["tg:short-json"].x is None
    assert ms["pp:d512"].x == 512 and ms["pp:d512"].family == "pp"


def test_event_stream_lines_split_at_lf_only() -> None:
    """A model's text may hold U+2028 or U+0085, which JSON leaves unescaped: not line breaks."""
    from moetune.bench.http.client import sse_payloads

    ev = 'data: {"content": "a\u2028b\x85c"}\r\n\r\ndata: [DONE]\n\n'.encode()
    got: list[bytes] = []
    buf = b""
    for i in range(0, len(ev), 5):  # in pieces, a CR LF split between two of them
        payloads, buf = sse_payloads(buf, ev[i : i + 5])
        got += payloads
    assert got == ['{"content": "a\u2028b\x85c"}'.encode(), b"[DONE]"] and buf == b""


def test_without_timings_the_figures_are_the_clients_and_server_ones_null() -> None:
    """Another OpenAI server: usage counts, the client's clock, a summary of the same shape."""
    from moetune.bench.analysis.summary import workload_summary

    ss = run_samples([20.0, 20.0, 20.0], cache_n=None, expect_cached=0)
    for s in ss:
        s["timings"] = None
    s = ss[0]
    assert (m.pp_tps(s), m.tg_tps(s), m.overhead_ms(s), m.cached_tokens(s), m.cache_confirmed(s)) == (None,) * 5
    assert (m.output_tokens(s), m.prompt_tokens(s), m.source(ss)) == (61, 30, "client")
    assert m.client_tg_tps(s) == pytest.approx(20.0 * 60 / 61, rel=1e-3)  # (usage tokens - 1) over the chunks
    assert m.client_pp_tps(s) == pytest.approx(30 / 1.201)  # prompt tokens over the time to the first chunk
    w = workload_summary("short-json", ss)
    assert (w["tg"]["source"], w["pp"]["source"]) == ("client", "client")
    assert w["tg"]["median"] == pytest.approx(m.client_tg_tps(s)) and w["pp"]["median"] == pytest.approx(30 / 1.201)
    assert (w["overhead_ms"], w["prompt_n"], w["cached_n"], w["cache_confirmed"]) == (None, None, None, None)
    assert (w["prompt_tokens"], w["predicted_n"]) == (30, 61)
    llama = workload_summary("short-json", run_samples([20.0, 20.0, 20.0]))
    assert set(llama) == set(w) and set(llama["tg"]) == set(w["tg"]) and llama["tg"]["source"] == "server"
