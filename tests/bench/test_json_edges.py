"""The JSON edges of bench/ that its readers narrow (issue #28): the stored shapes, pinned key by
key, and what a reader makes of a value of the wrong type."""

from __future__ import annotations

import json

import pytest

from moetune.bench.analysis import single as m
from moetune.bench.analysis.link import link_metric_samples
from moetune.bench.analysis.summary import workload_figures
from moetune.bench.serve.session_run import _turn_line
from moetune.bench.single.runner import Launch
from moetune.bench.single.workloads import REFERENCE_SAMPLING, Workload
from moetune.plan.calibrate import UNCALIBRATED_PCT

GOLDEN_WORKLOAD = {
    "name": "w",
    "kind": "chat",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hi"}],
    "ignore_eos": True,
    "thinking": None,
    "sampling": {"temperature": 0.0},
    "extra": {"seed": 1},
    "depth": 0,
    "pp_tokens": 0,
}


def test_workload_json_is_the_golden_shape_and_reads_back() -> None:
    w = Workload(
        name="w",
        kind="chat",
        max_tokens=64,
        messages=({"role": "user", "content": "hi"},),
        ignore_eos=True,
        thinking=None,
        sampling={"temperature": 0.0},
        extra={"seed": 1},
    )
    d = w.to_json()
    assert list(d) == list(GOLDEN_WORKLOAD)
    for k, v in GOLDEN_WORKLOAD.items():
        assert d[k] == v, k
    assert Workload.from_json(json.loads(json.dumps(d))) == w


def test_a_stored_workload_without_the_later_fields_reads_with_their_defaults() -> None:
    w = Workload.from_json({"name": "old", "kind": "depth", "max_tokens": 32})
    assert w == Workload(name="old", kind="depth", max_tokens=32)
    assert w.sampling == REFERENCE_SAMPLING and w.thinking is False
    with pytest.raises(KeyError):
        Workload.from_json({"name": "no kind", "max_tokens": 1})


def test_a_sample_with_values_of_the_wrong_type_reads_as_unknown() -> None:
    s = {
        "workload": "w",
        "end_s": 1.0,
        "timings": {"prompt_n": "12", "prompt_ms": 10.0, "predicted_n": 10, "predicted_ms": 100.0},
        "usage": {"prompt_tokens": 20, "completion_tokens": True},
        "content_chunk_s": [0.1, "x", 0.5],
        "kind": 3,
        "depth": 512,
        "thinking": "yes",
    }
    assert m.pp_tps(s) is None  # a prompt_n that is a string is no count
    assert m.tg_tps(s) == pytest.approx(100.0)
    assert m.output_tokens(s) == 10  # the server's predicted_n first
    assert m.cached_tokens(s) is None  # no cache_n, no numeric prompt_n, no details
    assert m.client_ttft_ms(s) == pytest.approx(100.0)  # the string chunk is left out
    f = workload_figures("w", [s])
    assert (f.kind, f.depth, f.thinking) == (None, 512, None)


def test_link_samples_give_rtt_and_throughput_and_skip_what_they_cannot_read() -> None:
    ms = link_metric_samples(
        [
            {"test": "latency", "rtt_s": [0.001, 0.002]},
            {"test": "throughput", "bytes": 1_000_000_000, "seconds": 2.0, "streams": 4},
            {"test": "throughput", "bytes": "many", "seconds": 2.0, "streams": 8},
        ]
    )
    assert set(ms) == {"rtt", "throughput:4 streams"}
    assert ms["rtt"].values == pytest.approx((1000.0, 2000.0))
    assert ms["throughput:4 streams"].values == pytest.approx((4.0,))
    assert ms["throughput:4 streams"].x == 4.0


def test_the_turn_line_reads_a_per_turn_entry() -> None:
    entry = {
        "turn": 2,
        "ok": 3,
        "requests": 4,
        "context_tokens": {"p50": 1500.0},
        "prompt_tokens_processed": {"p50": 100.0},
        "prompt_tokens_reused": {"p50": None},
        "ttft_ms": {"p50": 12.34},
        "tg_tok_s": "not a mapping",
    }
    assert _turn_line(entry) == (
        "turn 2: 3/4 ok, context p50 1500, processed p50 100, reused p50 - tokens, TTFT p50 12.3 ms, TG p50 - tok/s"
    )


def _launch(plan: dict[str, object], service: str | None = None) -> Launch:
    return Launch(plan=plan, engine_build=None, model_path=None, launch_run="r", service=service)


def test_a_launch_reads_the_plans_uncertainty_and_its_services_prediction() -> None:
    pred = {"tg_tok_s": 10.0, "work": {"layers": 1}}
    plan: dict[str, object] = {
        "speed_calibration": {"uncertainty": {"tg_pct": 12.5, "pp_pct": "?"}},
        "services": [{"name": "a", "predicted": {"tg_tok_s": 1.0}}, {"name": "b", "predicted": pred}],
    }
    assert _launch(plan).uncertainty() == {"tg_pct": 12.5, "pp_pct": UNCALIBRATED_PCT}
    assert _launch(plan, "b").predicted() == pred
    assert _launch(plan, "a").predicted() is None  # a prediction without its work
    assert _launch({"services": "none"}).predicted() is None
    assert _launch({}).uncertainty() == {"tg_pct": UNCALIBRATED_PCT, "pp_pct": UNCALIBRATED_PCT}
