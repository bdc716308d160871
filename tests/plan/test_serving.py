"""The serving prediction `tune --objective goodput` corrects: one decode step of C streams, TTFT of
a round's prompts, the smooth share meeting the targets, and the expected goodput under a belief."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moetune.plan.serving import (
    SLO_LOG_SD,
    ServeLoad,
    expected_goodput,
    goodput_at,
    predict_serving,
    slotted,
    step_seconds,
)
from moetune.plan.settings import Settings
from moetune.plan.speed import DeviceWork, SpeedConstants, Work, decode_seconds, prefill_tok_s

K = SpeedConstants()
# one CPU holding everything: 100 MB of dense weights and 1,600 MB of experts (k/E = 1/16)
CPU = DeviceWork(
    device="CPU",
    cpu=True,
    bw_gbs=20.0,
    threads=2,
    cores=2,
    read_bytes=100e6 + 1600e6 / 16,
    kv_bytes_per_ctx=1e4,
    ctx_flop_per_ctx=1e4,
    active_params=1e8,
    held_expert_bytes=1600e6,
)
W = Work(devices=(CPU,), graph_splits=1, rpc_hops=0, ubatch=512, expert_share=1 / 16)


def load(c: int = 4, slo: dict[str, float] | None = None, n_in: int = 128, n_out: int = 64) -> ServeLoad:
    return ServeLoad(
        concurrency=c, requests=8 * c, input_len=n_in, output_len=n_out, slo=tuple((slo or {"ttft_ms": 1e9}).items())
    )


def test_one_stream_steps_as_the_single_stream_model_decodes() -> None:
    assert step_seconds(W, 300, K, 1) == pytest.approx(decode_seconds(W, 300, K))


@pytest.mark.parametrize("c", [2, 4, 16, 64])
def test_c_streams_share_a_step_that_reads_more_experts_but_not_c_times_the_weights(c: int) -> None:
    one, many, half = step_seconds(W, 0, K, 1), step_seconds(W, 0, K, c), step_seconds(W, 0, K, c // 2)
    assert one < many < c * one  # a step of c streams is slower, but far from c single steps
    assert c / many > (c // 2) / half  # so the aggregate tokens/s still rises with the streams


def test_the_share_of_experts_a_step_reads_saturates() -> None:
    # at 64 streams nearly every expert is touched: 1 - (15/16)^64 = 98.4%; the step's read is then
    # close to the whole model, and more streams add only their own compute and cache
    dense_only = Work(
        devices=(DeviceWork(device="CPU", cpu=True, bw_gbs=20.0, threads=2, cores=2, read_bytes=1700e6),),
        graph_splits=1,
        rpc_hops=0,
        ubatch=512,
    )
    assert step_seconds(W, 0, K, 64) == pytest.approx(
        step_seconds(dense_only, 0, K, 1) + 63 * 2 * 1e8 / (2 * K.cpu_gflops_per_core * 1e9), rel=0.03
    )


def test_a_round_prefills_every_streams_prompt_before_the_first_token() -> None:
    p = predict_serving(W, K, load(4, n_in=128, n_out=64))
    assert p.ttft_ms == pytest.approx(4 * 128 / prefill_tok_s(W, K, 512) * 1e3)
    assert p.e2e_ms == pytest.approx(p.ttft_ms + 63 * p.itl_ms)
    assert p.request_s == pytest.approx(4 / (p.e2e_ms / 1e3))
    assert p.itl_ms == pytest.approx(step_seconds(W, 128 + 63 / 2, K, 4) * 1e3)  # the mean context of the 64 tokens


def test_the_share_meeting_a_target_is_smooth_and_half_at_the_target() -> None:
    base = predict_serving(W, K, load(4))
    assert base.met == pytest.approx(1.0)
    at = predict_serving(W, K, load(4, {"ttft_ms": base.ttft_ms}))
    assert at.met == pytest.approx(0.5)
    shares = [predict_serving(W, K, load(4, {"itl_ms": base.itl_ms * f})).met for f in (0.5, 0.8, 1.0, 1.25, 2.0)]
    assert shares == sorted(shares) and 0.0 < shares[0] < 0.5 < shares[-1] < 1.0
    # one SLO_LOG_SD below the target: 84% of requests meet it
    p = predict_serving(W, K, load(4, {"e2e_ms": base.e2e_ms * math.exp(SLO_LOG_SD)}))
    assert p.met == pytest.approx(0.8413, abs=1e-3)
    both = predict_serving(W, K, load(4, {"ttft_ms": base.ttft_ms, "itl_ms": base.itl_ms}))
    assert both.met == pytest.approx(0.25) and both.goodput_req_s == pytest.approx(0.25 * both.request_s)


def test_a_faster_machine_than_predicted_shortens_every_latency() -> None:
    p = predict_serving(W, K, load(4, {"ttft_ms": 1.0, "itl_ms": 1.0}))  # far out of reach as predicted
    assert p.goodput_req_s < 1e-6
    assert goodput_at(p, {"ttft_ms": 1.0, "itl_ms": 1.0}, 1e4) > 0.99 * 1e4 * p.request_s


def test_expected_goodput_under_a_belief() -> None:
    slo = {"ttft_ms": 500.0, "itl_ms": 50.0}
    p = predict_serving(W, K, load(4, slo))
    mean_log = np.array([math.log(p.request_s)])
    sure, gain0 = expected_goodput([p], slo, mean_log, np.array([1e-6]), best=p.goodput_req_s)
    assert sure[0] == pytest.approx(p.goodput_req_s, rel=1e-4) and gain0[0] == pytest.approx(0.0, abs=1e-4)
    # uncertainty about the speed: some chance of more, so a gain over the point value
    _, gain = expected_goodput([p], slo, mean_log, np.array([0.3]), best=p.goodput_req_s)
    assert gain[0] > 0.01
    # believed twice as fast: the expected goodput rises
    fast, _ = expected_goodput([p], slo, mean_log + math.log(2), np.array([1e-6]), best=1.0)
    assert fast[0] > sure[0]


def test_slots_for_the_streams_keep_each_slots_context() -> None:
    s = slotted(Settings(ctx=4096, slots=1), load(4, n_in=128, n_out=64))
    assert (s.slots, s.ctx) == (4, 4 * 4096)
    s = slotted(Settings(ctx=1024, slots=4), load(2, n_in=400, n_out=200))  # 256 per slot: too small for 600
    assert (s.slots, s.ctx) == (2, 1200)
