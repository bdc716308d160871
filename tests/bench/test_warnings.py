"""One warning type for every benchmark: single-stream warnings read off raw samples, serving
warnings off load levels (queueing behind slots above all). Pure."""

from __future__ import annotations

from typing import Any

import pytest

from moetune.bench.analysis.summary import run_summary
from moetune.bench.analysis.warnings import (
    TEXT,
    Code,
    Warning,
    annotate,
    bench_warnings,
    grouped,
    level_warnings,
    queueing_signature,
    run_warnings,
)
from moetune.store.record import Capabilities, ServerInfo
from tests.bench.synth import run_samples, sample


def codes(samples: list[dict[str, Any]]) -> set[Code]:
    return {w.code for w in bench_warnings(samples)}


def test_quiet_runs_warn_of_nothing() -> None:
    assert codes(run_samples([20.0, 20.1, 19.9, 20.2, 20.0])) == set()


def test_first_run_slower_and_noise() -> None:
    assert Code.FIRST_RUN_SLOWER in codes(run_samples([9.0, 20.1, 19.9, 20.2, 20.0]))
    c = codes(run_samples([20.0, 20.1, 35.0, 20.2, 20.0]))
    assert Code.OUTLIERS in c and Code.FIRST_RUN_SLOWER not in c
    assert Code.NOISY in codes(run_samples([14.0, 26.0, 18.0, 23.0, 21.0]))
    assert Code.FEW_SAMPLES in codes(run_samples([20.0, 20.0]))


def test_cache_warnings() -> None:
    hit = [sample(cache_n=29, prompt_n=1), *run_samples([20.0, 20.1, 19.9])]
    assert Code.CACHE_HIT in codes(hit)
    miss = [sample(cache_n=100, prompt_n=476, expect_cached=512, expect_prompt_n=64, depth=512, workload="d512")]
    assert Code.CACHE_MISS in codes(miss)
    ik = run_samples([20.0, 20.1, 19.9], ik=True)
    for s in ik:
        s["usage"] = None
    assert Code.CACHE_UNKNOWN in codes(ik)
    assert Code.CACHE_UNKNOWN not in codes(run_samples([20.0, 20.1, 19.9], ik=True))  # derived from usage


def test_thinking_short_output_and_overhead() -> None:
    think = run_samples([20.0, 20.1, 19.9], thinking=True, predicted_n=355, reasoning_chunks=294)
    assert Code.THINKING_DOMINATES in codes(think)
    assert Code.SHORT_OUTPUT in codes(run_samples([20.0, 20.1, 19.9], predicted_n=12))
    assert Code.SHORT_OUTPUT not in codes(run_samples([20.0, 20.1, 19.9], predicted_n=12, ignore_eos=True))
    assert Code.HIGH_OVERHEAD in codes(run_samples([20.0, 20.1, 19.9], overhead_ms=10_000))


def test_every_warning_has_a_remedy_and_reaches_the_summary() -> None:
    for c in TEXT:
        w = Warning.of(c, "tg:x", "d")
        assert w.message.startswith("tg:x: ") and w.remedy
        assert Warning.from_json(w.to_json()) == w
    s = run_summary(run_samples([9.0, 20.1, 19.9, 20.2, 20.0]))
    (w,) = s["warnings"]
    assert w["code"] == "first_run_slower" and w["remedy"].startswith("use more warm-up")
    assert set(s["tg"]) >= {"median", "ci_low", "ci_high", "n"}


def test_small_or_few_deviations_do_not_warn() -> None:
    assert Code.OUTLIERS not in codes(run_samples([20.0, 20.01, 20.02, 20.01, 20.6]))  # an outlier by z, but 3 %
    assert Code.OUTLIERS not in codes(run_samples([20.0, 20.1, 35.0, 20.2]))  # four runs say little
    assert Code.FIRST_RUN_SLOWER not in codes(run_samples([19.5, 20.01, 20.02, 20.01, 20.0]))


# -- serving levels ----------------------------------------------------------------------------


def level(c: int, ttft: float, itl: float, tput: float, **kw: Any) -> dict[str, Any]:
    lv: dict[str, Any] = {
        "concurrency": c,
        "rate": None,
        "requests": 50,
        "ok": 50,
        "errors": {},
        "ttft_ms": {"p50": ttft, "p90": ttft, "p99": ttft},
        "itl_ms": {"p50": itl},
        "server_wait_ms": {"p50": None},
        "slot_wait_ms": {"p90": 0.0},
        "ttfc_ms": {"p50": ttft},
        "output_tok_s": tput,
        "output_tokens": 1000,
        "reasoning_tokens": 0,
        "cached_tokens": 0,
        "short_outputs": 0,
        "prompt_token_mismatches": 0,
        "retries": 0,
    }
    lv.update(kw)
    return lv


# reference 004, GLM-5.2 on two DGX Sparks: --parallel 1 at c=2 queued (TTFT 3.2 s -> 23.9 s,
# throughput +12 %, ITL ~119 ms both); --parallel matched to c scaled (TTFT 3.2 -> 3.9 s, +88 % at c=4)
REF_C1 = level(1, 3200, 119, 8.2)
REF_C2_QUEUED = level(2, 23900, 119, 9.2)
REF_C4_PARALLEL = level(4, 3900, 266, 15.4)


def test_reference_004_queueing_is_recognised_from_the_numbers() -> None:
    sig = queueing_signature(REF_C2_QUEUED, REF_C1)
    assert sig is not None and "queueing" in sig and "x7.5" in sig


def test_true_parallelism_is_not_queueing() -> None:
    assert queueing_signature(REF_C4_PARALLEL, REF_C1) is None


def test_more_concurrency_than_slots_warns_about_the_queue_even_without_a_baseline() -> None:
    adv = level_warnings(level(2, 500, 20, 40, server_wait_ms={"p50": 250.0}), slots=1, base=None, prefix_cache=False)
    q = [a for a in adv if a.code == Code.QUEUEING]
    assert len(q) == 1
    assert "queue" in q[0].message and "250 ms" in q[0].message
    assert "--parallel 2" in q[0].remedy


def test_no_queue_warning_within_the_slots() -> None:
    adv = level_warnings(level(4, 30, 2, 400), slots=4, base=level(1, 25, 1.5, 150), prefix_cache=False)
    assert adv == []


def test_signature_without_slot_info() -> None:
    adv = level_warnings(REF_C2_QUEUED, slots=None, base=REF_C1, prefix_cache=False)
    assert [a.code for a in adv] == [Code.QUEUEING]
    assert "queue" in adv[0].message


def test_other_warnings() -> None:
    lv = level(
        2,
        100,
        10,
        50,
        errors={"http_400:exceed_context_size_error": 3},
        retries=2,
        cached_tokens=64,
        reasoning_tokens=900,
        rate=5.0,
        slot_wait_ms={"p90": 250.0},
        e2e_ms={"p50": 1000.0},
    )
    kinds = [a.code for a in level_warnings(lv, slots=8, base=None, prefix_cache=False)]
    assert kinds == [Code.CLIENT_QUEUE, Code.ERRORS, Code.RETRIES, Code.CACHE_HIT, Code.THINKING]
    err = next(a for a in level_warnings(lv, slots=8, base=None, prefix_cache=False) if a.code == Code.ERRORS)
    assert "3 of 50" in err.message and "context" in err.remedy
    assert Code.CACHE_HIT not in [a.code for a in level_warnings(lv, slots=8, base=None, prefix_cache=True)]


def open_level(
    c: int,
    rate: float,
    *,
    wait_p90: float,
    e2e_p50: float,
    offered: float | None = None,
    completed: float | None = None,
) -> dict[str, Any]:
    return level(
        c,
        20,
        1.3,
        500,
        rate=rate,
        slot_wait_ms={"p90": wait_p90},
        e2e_ms={"p50": e2e_p50},
        offered_request_s=offered if offered is not None else rate,
        completed_request_s=completed,
    )


@pytest.mark.parametrize(
    ("lv", "says"),
    [
        # the report's case: 20/s offered, 20.25/s achieved, E2E p50 71 ms (4 streams: ~56/s): no queue to speak of
        (open_level(4, 20.0, wait_p90=40, e2e_p50=71, completed=20.25), None),
        # waits but short ones: nothing
        (open_level(4, 20.0, wait_p90=5, e2e_p50=900, completed=4.4), None),
        # finished clearly slower than they came due: behind
        (open_level(4, 20.0, wait_p90=2637, e2e_p50=150, completed=8.9), "came due at 20/s and finished at 8.9/s"),
        # 4 streams at 900 ms cannot carry 20/s, whatever the end times say
        (
            open_level(4, 20.0, wait_p90=300, e2e_p50=900, completed=19.5),
            "4 streams at E2E p50 900 ms complete about 4.44/s",
        ),
        (open_level(1, 200.0, wait_p90=1770, e2e_p50=25, completed=19.7), "more than 1 stream complete"),
        # enough streams on average, but Poisson arrivals bunch up: the waits outlast a request
        (open_level(4, 20.0, wait_p90=400, e2e_p50=71, completed=19.9), "in bursts (p90 400 ms, 5.6x what"),
        (open_level(4, 20.0, wait_p90=64, e2e_p50=45, completed=20.4), None),  # a few short waits: nothing
        # closed loop: never
        (level(4, 20, 1.3, 500, slot_wait_ms={"p90": 500.0}, e2e_ms={"p50": 900.0}), None),
    ],
)
def test_client_queue_needs_evidence_that_the_rate_exceeds_the_streams(lv: dict[str, Any], says: str | None) -> None:
    got = [a for a in level_warnings(lv, slots=8, base=None, prefix_cache=False) if a.code == Code.CLIENT_QUEUE]
    if says is None:
        assert got == []
    else:
        (w,) = got
        assert says in w.message and w.remedy


def slow_level(
    e2e_p50: float, worst: float, *, n: int, ttft: float = 20.0, tokens: int = 64, median_tokens: float = 64
) -> dict[str, Any]:
    return level(
        2,
        20,
        5,
        300,
        e2e_ms={"p50": e2e_p50},
        slowest={
            "index": 17,
            "e2e_ms": worst,
            "ttft_ms": ttft,
            "output_tokens": tokens,
            "median_output_tokens": median_tokens,
            "outliers": n,
        },
    )


@pytest.mark.parametrize(
    ("lv", "says", "remedy"),
    [
        # the report's case: one request of 54.6 s against a 560 ms p50
        (
            slow_level(560, 54600, n=1),
            "1 of 50 requests took 5x the E2E p50 or more: the slowest 54.6 s against 560 ms (request 17",
            "stalled while generating",
        ),
        (slow_level(560, 54600, n=1, ttft=54000), "TTFT 54.0 s", "waited before its first token"),
        (
            slow_level(560, 9000, n=2, tokens=2000, median_tokens=120),
            "2000 output tokens against 120 on median",
            "--output-len",
        ),
        (slow_level(560, 1200, n=0), None, None),  # a tail, not an outlier
    ],
)
def test_latency_outliers_in_a_serving_level(lv: dict[str, Any], says: str | None, remedy: str | None) -> None:
    got = [a for a in level_warnings(lv, slots=8, base=None, prefix_cache=False) if a.code == Code.LATENCY_OUTLIER]
    if says is None:
        assert got == []
    else:
        (w,) = got
        assert says in w.message and remedy in w.remedy and w.subject == "c=2"


def test_annotate_fills_warnings_as_strings_and_retries_as_notes() -> None:
    levels = [level(1, 100, 10, 50, retries=2), level(2, 900, 10, 52)]
    annotate(levels, slots=1, prefix_cache=False)
    assert levels[0]["warnings"] == []
    assert levels[0]["notes"] and "sent again" in levels[0]["notes"][0]
    assert any("queue" in w for w in levels[1]["warnings"])
    assert levels[1]["advice"][0]["code"] == Code.QUEUEING
    assert levels[1]["advice"][0]["subject"] == "c=2"


def test_noise_within_the_slots_is_not_called_queueing() -> None:
    # a noisy machine: TTFT up, throughput down, ITL near zero; with enough slots it is no queue
    noisy = level(2, 300, 0.0001, 15)
    assert level_warnings(noisy, slots=2, base=level(1, 100, 0.5, 50), prefix_cache=False) == []
    assert queueing_signature(noisy, level(1, 100, 0.5, 50)) is None  # ITL not flat, throughput fell


def test_run_warnings() -> None:
    # an OpenAI-compatible server that is not llama-server: no slots, no timings, no tokenizer
    kinds = [a.code for a in run_warnings(ServerInfo(busy_slots=0), [1], 0)]
    assert kinds == [Code.NO_SLOT_INFO, Code.NO_SERVER_TIMINGS, Code.NO_TOKENIZER]
    assert run_warnings(ServerInfo(slots=4, busy_slots=0, caps=Capabilities.llama()), [1], 0) == []
    no_template = Capabilities(props=True, tokenize=True, timings=True)  # a build without /apply-template
    kinds = [a.code for a in run_warnings(ServerInfo(slots=4, busy_slots=0, caps=no_template), [1], 0)]
    assert kinds == [Code.NO_TOKENIZER]


def test_grouped_lists_subjects_of_a_single_stream_code_together() -> None:
    ws = [
        Warning.of(Code.NOISY, "tg:a", "CV 12%"),
        Warning.of(Code.NOISY, "pp:a", "CV 30%"),
        Warning(
            code=Code.QUEUEING,
            message="c=2 exceeds the server's 1 slot",
            remedy="start with --parallel 2",
            subject="c=2",
        ),
    ]
    (noisy, noisy_remedy), (queue, _) = grouped(ws)
    assert noisy == "the runs vary a lot: tg:a (CV 12%), pp:a (CV 30%)" and "repeats" in noisy_remedy
    assert queue == "c=2 exceeds the server's 1 slot"


def test_stored_serving_warnings_of_the_first_release_read_back() -> None:
    w = Warning.from_json({"kind": "queueing", "message": "m", "remedy": "r"})
    assert (w.code, w.message, w.remedy) == (Code.QUEUEING, "m", "r")


def test_another_openai_server_says_what_is_the_clients_and_what_is_missing() -> None:
    ss = run_samples([20.0, 20.1, 19.9], cache_n=None, overhead_ms=900.0)  # overhead that timings would show
    for s in ss:
        s["timings"] = None
    ws = {w.code: w for w in bench_warnings(ss)}
    assert {Code.CLIENT_FIGURES, Code.CACHE_UNKNOWN} <= set(ws) and Code.HIGH_OVERHEAD not in ws
    assert "--no-enable-prefix-caching" in ws[Code.CACHE_UNKNOWN].remedy
    for s in ss:
        s["usage"] = None  # a server that ignored include_usage: no counts, no figures
    (figures,) = [w for w in bench_warnings(ss) if w.code == Code.CLIENT_FIGURES]
    assert "3 without usage" in figures.detail
    assert run_summary(ss)["tg"] is None


def test_itl_unknown_and_missing_usage_are_said_per_level() -> None:
    ws = level_warnings(
        level(1, 100, 5, 50, ok=4, itl_unknown=4, no_usage=1), slots=None, base=None, prefix_cache=False
    )
    by = {w.code: w for w in ws}
    assert "4 of 4 requests" in by[Code.ITL_UNKNOWN].message and "is null" in by[Code.ITL_UNKNOWN].message
    assert "continuous_usage_stats" in by[Code.ITL_UNKNOWN].remedy
    assert "1 of 4 responses carried no usage" in by[Code.NO_USAGE].message
    assert (
        level_warnings(level(1, 100, 5, 50, itl_unknown=0, no_usage=0), slots=None, base=None, prefix_cache=False) == []
    )
