"""The serve-bench level summary as a typed document: the JSON shape users see (keys, their order
and their types) pinned, and the one reader of stored summaries (old shapes included)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from moetune.bench.analysis.level_summary import LevelGoodput, LevelSummary, Percentiles, PromptTokenError, Slowest
from moetune.bench.analysis.serve import level_summaries, level_summary, summarize_level, summarize_levels
from tests.bench.test_serve_metrics import sample

PCT = {"p50": float, "p90": float, "p99": float, "mean": float}
NUM = (int, float)
# the level's keys in the order `serve-bench --json` prints them, and each one's type when it has a value
SHAPE: dict[str, Any] = {
    "service": str,
    "load": str,
    "concurrency": int,
    "rate": NUM,
    "requests": int,
    "ok": int,
    "errors": {"timeout": int},
    "duration_s": float,
    "ttft_ms": PCT,
    "ttfc_ms": PCT,
    "itl_ms": PCT,
    "server_itl_ms": PCT,
    "tpot_ms": PCT,
    "e2e_ms": PCT,
    "latency_ms": PCT,
    "slot_wait_ms": PCT,
    "server_wait_ms": PCT,
    "output_tokens": int,
    "reasoning_tokens": int,
    "output_tok_s": float,
    "request_s": float,
    "goodput": {
        "share": float,
        "req_s": float,
        "slo": {"ttft_ms": NUM, "itl_ms": NUM},
        "met": int,
        "of": int,
        "missed": {"ttft_ms": int, "itl_ms": int},
        "failed": int,
        "unknown": int,
    },
    "offered_request_s": float,
    "completed_request_s": float,
    "slowest": {
        "index": int,
        "e2e_ms": float,
        "outliers": int,
        "ttft_ms": float,
        "output_tokens": int,
        "median_output_tokens": float,
    },
    "prompt_tokens_mean": float,
    "prompt_token_mismatches": int,
    "prompt_token_error": {"requests": int, "mismatched": int, "mean_pct": float, "max_pct": float, "bias_pct": float},
    "itl_unknown": int,
    "no_usage": int,
    "cached_tokens": int,
    "short_outputs": int,
    "retries": int,
    "warnings": list,
}
SLO = {"ttft_ms": 150, "itl_ms": 40.5}


def _samples() -> list[dict[str, Any]]:
    """A layout run's open-loop level of three requests (one failed), every figure with a value."""
    out = []
    for i in range(3):
        t = 10.0 + i * 0.5
        chunks = [[t + 0.1, 1, 0, 4, t + 0.09, 5.0], [t + 0.13, 2, 2, 0, t + 0.12, 35.0], [t + 0.16, 1, 1, 0, 70.0]]
        s = sample(
            chunks,
            t_send=t,
            t_sched=t - 0.01,
            t_slot=t - 0.005,
            c=2,
            max_tokens=8,
            usage={"completion_tokens": 4, "prompt_tokens": 17 + i, "prompt_tokens_details": {"cached_tokens": 3}},
            timings={"prompt_ms": 60.0},
            retries=i % 2,
            count_source="timings",
        )
        out.append({**s, "index": i, "rate": 2.0, "service": "main", "load": "shared", "prompt_source": "tokenizer"})
    out.append({**out[0], "index": 3, "chunks": [], "error": "timeout", "t_sched": 11.4, "t_end": 11.9})
    return out


def _check(value: Any, want: Any, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(value, dict), where
        assert list(value) == list(want), where
        for k, w in want.items():
            _check(value[k], w, f"{where}.{k}")
        return
    assert value is not None, f"{where} has no value"
    assert isinstance(value, want) and not isinstance(value, bool), f"{where}: {type(value).__name__}"


def test_the_json_shape_of_a_level_is_pinned() -> None:
    d = summarize_level(_samples(), SLO)
    _check(d, SHAPE, "level")
    assert (d["service"], d["load"], d["concurrency"], d["rate"]) == ("main", "shared", 2, 2.0)
    assert (d["requests"], d["ok"], d["errors"], d["retries"], d["warnings"]) == (4, 3, {"timeout": 1}, 1, [])
    assert d["ttft_ms"] == {"p50": 100.0, "p90": 100.0, "p99": 100.0, "mean": 100.0}
    assert d["goodput"]["met"] == 3 and d["goodput"]["of"] == 4
    assert d["prompt_token_error"]["mismatched"] == 3  # 16 predicted, 17..19 served


def test_a_run_of_one_server_has_no_service_keys_and_nulls_where_nothing_was_measured() -> None:
    d = summarize_level([sample([], error="timeout")])
    assert list(d) == [k for k in SHAPE if k not in ("service", "load")]
    assert d["ttft_ms"] == {"p50": None, "p90": None, "p99": None, "mean": None}
    assert (d["goodput"], d["slowest"], d["prompt_token_error"], d["rate"]) == (None, None, None, None)


@pytest.mark.parametrize("slo", [SLO, None])
def test_to_json_and_from_json_round_trip(slo: dict[str, float] | None) -> None:
    lv = level_summary(_samples(), slo)
    assert isinstance(lv.ttft_ms, Percentiles) and isinstance(lv.slowest, Slowest)
    assert isinstance(lv.prompt_token_error, PromptTokenError)
    assert isinstance(lv.goodput, LevelGoodput) == (slo is not None)
    stored = json.loads(json.dumps(lv.to_json()))  # as the history keeps it
    assert LevelSummary.from_json(stored) == lv
    assert json.dumps(LevelSummary.from_json(stored).to_json()) == json.dumps(lv.to_json())
    assert summarize_levels(_samples(), slo) == [x.to_json() for x in level_summaries(_samples(), slo)]


def test_a_stored_level_of_an_older_moetune_reads() -> None:
    # before server ITL, the tokenizer's error and the queueing figures; with the keys a report adds
    old = {
        "concurrency": 4,
        "rate": None,
        "requests": 8,
        "ok": 7,
        "errors": {"HTTP 500": 1},
        "duration_s": 3.5,
        "ttft_ms": {"p50": 120.0, "p90": 150.0, "p99": 151.0, "mean": 125.5},
        "itl_ms": {"p50": 20.0, "p90": 22.0, "p99": 30.0, "mean": 20.5},
        "output_tok_s": 80.25,
        "request_s": 2.0,
        "goodput": None,
        "warnings": ["queued behind slots"],
        "server": {"slots": 4},
        "advice": [],
    }
    lv = LevelSummary.from_json(old)
    assert (lv.concurrency, lv.rate, lv.ok, lv.error_count, lv.output_tok_s) == (4, None, 7, 1, 80.25)
    assert lv.ttft_ms == Percentiles(p50=120.0, p90=150.0, p99=151.0, mean=125.5)
    assert lv.server_itl_ms == Percentiles() and lv.prompt_token_error is None and lv.slowest is None
    assert lv.warnings == ("queued behind slots",) and lv.service is None
