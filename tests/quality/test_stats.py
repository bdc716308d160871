"""The quality statistics, checked by hand."""

from __future__ import annotations

import math

import pytest

from moetune.quality import stats


def test_per_chunk_values_from_running_means() -> None:
    # chunks 0.2, 0.4, 0.9 -> running means 0.2, 0.3, 0.5
    assert stats.per_chunk([0.2, 0.3, 0.5]) == pytest.approx([0.2, 0.4, 0.9])
    nll = stats.per_chunk_ppl([math.exp(1.0), math.exp(1.5)])
    assert nll == pytest.approx([1.0, 2.0])


def test_mcnemar_exact_by_hand() -> None:
    # b = 1, c = 6: n = 7, P(X <= 1) = (1 + 7) / 128 = 0.0625, two-sided 0.125
    assert stats.mcnemar_exact(1, 6) == pytest.approx(0.125)
    # b = 0, c = 6: 2 / 64 = 0.03125
    assert stats.mcnemar_exact(0, 6) == pytest.approx(0.03125)
    assert stats.mcnemar_exact(3, 3) == 1.0 and stats.mcnemar_exact(0, 0) == 1.0
    assert stats.paired_verdict(0, 6) == (pytest.approx(0.03125), "better")
    assert stats.paired_verdict(6, 0)[1] == "worse"
    assert stats.paired_verdict(1, 6)[1] == "same"


def test_paired_table() -> None:
    base = [("A", True), ("B", True), ("C", False), ("A", True), (None, False)]
    cand = [("A", True), ("C", False), ("B", True), ("D", False), (None, False)]
    p = stats.paired(base, cand)
    assert (p.n, p.both_right, p.only_baseline, p.only_candidate, p.both_wrong) == (5, 1, 2, 1, 1)
    assert p.same_answer == 2 and p.agreement == pytest.approx(0.4)  # A/A and unparsable twice
    assert p.p_value == pytest.approx(1.0) and p.verdict == "same"


def test_wilson_by_hand() -> None:
    # 8 of 10 at 95 %: the textbook interval (0.490, 0.943)
    lo, hi = stats.wilson(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert stats.wilson(0, 0) == (0.0, 1.0)
    assert stats.wilson(10, 10)[1] == 1.0


def test_interval_bootstrap_or_engine() -> None:
    chunks = [0.010, 0.012, 0.011, 0.009, 0.013, 0.010]
    iv = stats.interval(0.0108, 0.0001, chunks)
    assert iv.method == "bootstrap" and iv.ci_low < 0.0108 < iv.ci_high and iv.n == 6
    few = stats.interval(0.5, 0.1, [0.4, 0.6])
    assert few.method == "engine" and few.ci_low == pytest.approx(0.5 - 1.96 * 0.1, abs=1e-3)


@pytest.mark.parametrize(("high", "verdict"), [(0.0005, "same"), (0.005, "close"), (0.02, "worse")])
def test_kld_verdict(high: float, verdict: str) -> None:
    assert (
        stats.kld_verdict(stats.Interval(mean=high / 2, ci_low=0.0, ci_high=high, method="bootstrap", n=8)) == verdict
    )
