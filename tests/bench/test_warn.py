"""Warnings with remedies, read off raw samples."""

from __future__ import annotations

from typing import Any

from moetune.bench.summary import run_summary
from moetune.bench.warn import Code, bench_warnings
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
    for c in Code:
        assert c.text and c.remedy
    s = run_summary(run_samples([9.0, 20.1, 19.9, 20.2, 20.0]))
    (w,) = s["warnings"]
    assert w["code"] == "first_run_slower" and w["remedy"].startswith("use more warm-up")
    assert set(s["tg"]) >= {"median", "ci_low", "ci_high", "n"}


def test_small_or_few_deviations_do_not_warn() -> None:
    assert Code.OUTLIERS not in codes(run_samples([20.0, 20.01, 20.02, 20.01, 20.6]))  # an outlier by z, but 3 %
    assert Code.OUTLIERS not in codes(run_samples([20.0, 20.1, 35.0, 20.2]))  # four runs say little
    assert Code.FIRST_RUN_SLOWER not in codes(run_samples([19.5, 20.01, 20.02, 20.01, 20.0]))
