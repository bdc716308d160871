"""Serving under concurrency, predicted: what `moetune tune --objective goodput` corrects with its
measurements.

The load is serve-bench's closed loop: ``C`` streams, each sending its next request (a prompt of
``input_len`` tokens, ``output_len`` generated) as soon as its previous one ends, against a server
with ``C`` slots. With equal prompts and outputs the streams stay in step: every round, the ``C``
prompts arrive together, are prefilled together (``C x input_len`` tokens in ubatches), and the
``C`` sequences then decode together, one token each per step. So, from the single-stream model's
work (:mod:`moetune.plan.speed`):

- one decode step of ``C`` sequences reads the non-expert weights once, of each layer's experts
  the share ``C`` tokens touch (``1 - (1 - k/E)^C`` instead of ``k/E``), each sequence's own KV
  cache, and multiplies ``C - 1`` more tokens than one stream does (at the prefill throughput);
- TTFT = the prefill of ``C x input_len`` tokens; ITL and TPOT = one step;
  E2E = TTFT + (output_len - 1) steps; requests/s = C / E2E.

Goodput is the rate of requests that meet every latency target. A prediction that drops to zero
wherever the predicted TTFT or ITL misses its target would leave a search nothing to rank by, and
its error in log space would be unbounded. So what the search corrects with its measurements is
the smooth part, the request rate (the measured requests/s over the predicted: how much faster the
machine serves than the model says), and the targets are applied afterwards: a speed ``r`` times
the predicted one shortens every latency by ``r`` and raises the rate by it, and the share of
requests meeting a target is the chance that a request's latency, log-normal around the typical
one with spread :data:`SLO_LOG_SD`, stays within it. The search's belief about ``r`` (a log-normal)
is carried through that function by Gauss-Hermite quadrature (:func:`expected_goodput`), which
gives each candidate's expected goodput and expected gain over the best measured goodput. Pure:
numbers in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from moetune.plan.settings import Settings
from moetune.plan.speed import (
    SpeedConstants,
    Work,
    decode_context,
    decode_seconds,
    device_decode_seconds,
    held_touched,
    prefill_tok_s,
    switch_seconds,
)

SLO_LOG_SD = 0.3  # spread (log scale) of one request's latency around the typical one
_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(24)  # E[f(Z)], Z ~ N(0, 1): sum(w f(x)) / sqrt(2 pi)
_GH_W = _GH_W / math.sqrt(2 * math.pi)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeLoad:
    """serve-bench's closed loop as `tune --objective goodput` runs it."""

    concurrency: int
    requests: int  # per candidate
    input_len: int
    output_len: int
    slo: tuple[tuple[str, float], ...]  # (key, ms) in moetune.bench.analysis.slo.SLO_KEYS order

    @property
    def targets(self) -> dict[str, float]:
        return dict(self.slo)

    @property
    def per_slot(self) -> int:
        """Tokens a slot needs: a prompt and its output."""
        return self.input_len + self.output_len

    def to_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "input_len": self.input_len,
            "output_len": self.output_len,
            "slo": self.targets,
        }


def slotted(s: Settings, load: ServeLoad) -> Settings:
    """The settings with one slot per stream and each slot's share of the context kept (at least a
    prompt and its output): serve-bench's ``--match-slots``, planned, so the ledger counts the
    cache of every slot."""
    per_slot = max(load.per_slot, s.ctx // max(1, s.slots))
    return replace(s, slots=load.concurrency, ctx=per_slot * load.concurrency)


def step_seconds(w: Work, depth: float, k: SpeedConstants, streams: int) -> float:
    """Seconds for one decode step of ``streams`` sequences at context depth ``depth`` each."""
    if streams <= 1:
        return decode_seconds(w, depth, k)
    t = k.token_overhead_us * 1e-6 + switch_seconds(w, k)
    t += w.rpc_activation_s * streams
    for d in w.devices:
        share = held_touched(d, w.expert_share, streams)
        read = d.read_bytes - d.held_expert_bytes * w.expert_share + d.held_expert_bytes * share
        batched = replace(
            d,
            read_bytes=read,
            kv_bytes_per_ctx=d.kv_bytes_per_ctx * streams,
            ctx_flop_per_ctx=d.ctx_flop_per_ctx * streams,
            kv_bytes_windowed=d.kv_bytes_windowed * streams,
            ctx_flop_windowed=d.ctx_flop_windowed * streams,
        )
        t += device_decode_seconds(batched, depth, k)
        flop = 2 * d.active_params * (streams - 1)
        rate = max(1, d.threads) * k.cpu_gflops_per_core * 1e9 if d.cpu else (d.tflops or k.gpu_tflops) * 1e12
        t += flop / rate
    return t


def _prefill_seconds(w: Work, k: SpeedConstants, tokens: int) -> float:
    rate = prefill_tok_s(w, k, tokens)
    return tokens / rate if rate > 0 else math.inf


def _meets(predicted_ms: float, target_ms: float) -> float:
    """The chance a value predicted at ``predicted_ms`` is at most ``target_ms``."""
    if predicted_ms <= 0:
        return 1.0
    z = math.log(target_ms / predicted_ms) / SLO_LOG_SD
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class ServePrediction:
    ttft_ms: float
    itl_ms: float  # one decode step of all the streams: the gap between a stream's tokens
    e2e_ms: float
    request_s: float  # completed requests per second
    met: float  # the share of requests expected to meet every target
    goodput_req_s: float

    def to_json(self) -> dict[str, float]:
        return {
            "ttft_ms": round(self.ttft_ms, 3),
            "itl_ms": round(self.itl_ms, 3),
            "e2e_ms": round(self.e2e_ms, 3),
            "request_s": round(self.request_s, 4),
            "met": round(self.met, 4),
            "goodput_req_s": round(self.goodput_req_s, 4),
        }


def predict_serving(w: Work, k: SpeedConstants, load: ServeLoad) -> ServePrediction:
    c = max(1, load.concurrency)
    ttft = _prefill_seconds(w, k, c * load.input_len)
    step = step_seconds(w, decode_context(0, load.input_len, load.output_len), k, c)
    e2e = ttft + max(0, load.output_len - 1) * step
    rate = c / e2e if e2e > 0 else 0.0
    values = {"ttft_ms": ttft * 1e3, "itl_ms": step * 1e3, "tpot_ms": step * 1e3, "e2e_ms": e2e * 1e3}
    met = _met(values, load.targets)
    return ServePrediction(
        ttft_ms=ttft * 1e3, itl_ms=step * 1e3, e2e_ms=e2e * 1e3, request_s=rate, met=met, goodput_req_s=rate * met
    )


def goodput_at(p: ServePrediction, targets: Mapping[str, float], ratio: float) -> float:
    """The goodput if the machine serves ``ratio`` times as fast as predicted."""
    values = {
        "ttft_ms": p.ttft_ms / ratio,
        "itl_ms": p.itl_ms / ratio,
        "tpot_ms": p.itl_ms / ratio,
        "e2e_ms": p.e2e_ms / ratio,
    }
    return p.request_s * ratio * _met(values, targets)


def expected_goodput(
    preds: Sequence[ServePrediction],
    targets: Mapping[str, float],
    log_rate_mean: np.ndarray,
    log_rate_sd: np.ndarray,
    *,
    best: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate's expected goodput, and its expected gain over ``best`` (a measured goodput,
    or the least one a measurement can tell when none met the targets) as a share of it:
    ``E[max(0, G - best)] / best``, the belief about its request rate being log-normal with these
    means and spreads (logs of requests/s)."""
    mean = np.zeros(len(preds))
    gain = np.zeros(len(preds))
    for i, p in enumerate(preds):
        if p.request_s <= 0:
            continue
        shift = float(log_rate_mean[i]) - math.log(p.request_s)
        g = np.array([goodput_at(p, targets, math.exp(shift + float(log_rate_sd[i]) * x)) for x in _GH_X])
        mean[i] = float(_GH_W @ g)
        gain[i] = float(_GH_W @ np.maximum(0.0, g - best)) / best
    return mean, gain


def _met(values: Mapping[str, float], targets: Mapping[str, float]) -> float:
    p = 1.0
    for key, target in targets.items():
        p *= _meets(values[key], target)
    return p
