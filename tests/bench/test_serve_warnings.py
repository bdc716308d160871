"""Serving warnings: queueing behind slots above all (pure)."""

from __future__ import annotations

from typing import Any

from moetune.bench.serve_warnings import (
    CACHE_HIT,
    CLIENT_QUEUE,
    ERRORS,
    NO_SLOT_INFO,
    QUEUEING,
    RETRIES,
    THINKING,
    annotate,
    level_advice,
    queueing_signature,
    run_advice,
)


def level(c: int, ttft: float, itl: float, tput: float, **kw: Any) -> dict[str, Any]:
    lv: dict[str, Any] = {"concurrency": c, "rate": None, "requests": 50, "ok": 50, "errors": {},
                          "ttft_ms": {"p50": ttft, "p90": ttft, "p99": ttft}, "itl_ms": {"p50": itl},
                          "server_wait_ms": {"p50": None}, "slot_wait_ms": {"p90": 0.0}, "ttfc_ms": {"p50": ttft},
                          "output_tok_s": tput, "output_tokens": 1000, "reasoning_tokens": 0, "cached_tokens": 0,
                          "short_outputs": 0, "prompt_token_mismatches": 0, "retries": 0}
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
    adv = level_advice(level(2, 500, 20, 40, server_wait_ms={"p50": 250.0}), slots=1, base=None, prefix_cache=False)
    q = [a for a in adv if a.kind == QUEUEING]
    assert len(q) == 1
    assert "queue" in q[0].message and "250 ms" in q[0].message
    assert "--parallel 2" in q[0].remedy


def test_no_queue_warning_within_the_slots() -> None:
    adv = level_advice(level(4, 30, 2, 400), slots=4, base=level(1, 25, 1.5, 150), prefix_cache=False)
    assert adv == []


def test_signature_without_slot_info() -> None:
    adv = level_advice(REF_C2_QUEUED, slots=None, base=REF_C1, prefix_cache=False)
    assert [a.kind for a in adv] == [QUEUEING]
    assert "queue" in adv[0].message


def test_other_warnings() -> None:
    lv = level(2, 100, 10, 50, errors={"http_400:exceed_context_size_error": 3}, retries=2, cached_tokens=64,
               reasoning_tokens=900, rate=5.0, slot_wait_ms={"p90": 250.0})
    kinds = [a.kind for a in level_advice(lv, slots=8, base=None, prefix_cache=False)]
    assert kinds == [CLIENT_QUEUE, ERRORS, RETRIES, CACHE_HIT, THINKING]
    err = next(a for a in level_advice(lv, slots=8, base=None, prefix_cache=False) if a.kind == ERRORS)
    assert "3 of 50" in err.message and "context" in err.remedy
    assert CACHE_HIT not in [a.kind for a in level_advice(lv, slots=8, base=None, prefix_cache=True)]


def test_annotate_fills_warnings_as_strings_and_retries_as_notes() -> None:
    levels = [level(1, 100, 10, 50, retries=2), level(2, 900, 10, 52)]
    annotate(levels, slots=1, prefix_cache=False)
    assert levels[0]["warnings"] == []
    assert levels[0]["notes"] and "sent again" in levels[0]["notes"][0]
    assert any("queue" in w for w in levels[1]["warnings"])
    assert levels[1]["advice"][0]["kind"] == QUEUEING


def test_noise_within_the_slots_is_not_called_queueing() -> None:
    # a noisy machine: TTFT up, throughput down, ITL near zero; with enough slots it is no queue
    noisy = level(2, 300, 0.0001, 15)
    assert level_advice(noisy, slots=2, base=level(1, 100, 0.5, 50), prefix_cache=False) == []
    assert queueing_signature(noisy, level(1, 100, 0.5, 50)) is None  # ITL not flat, throughput fell


def test_run_advice() -> None:
    kinds = [a.kind for a in run_advice({"slots": None, "busy_slots": 0}, [1], 0)]
    assert kinds == [NO_SLOT_INFO]
    assert run_advice({"slots": 4, "busy_slots": 0}, [1], 0) == []
