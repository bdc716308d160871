"""Statistics, table-tested: medians, intervals, outliers, and the verdict rule."""

from __future__ import annotations

import math

import pytest

from moetune.bench.analysis import stats
from moetune.bench.analysis.stats import FASTER, SAME, SLOWER, difference, summarize

QUIET_A = [20.1, 20.3, 19.9, 20.2, 20.0]
QUIET_A2 = [20.2, 20.0, 20.1, 19.9, 20.3]
QUIET_15 = [23.1, 23.3, 22.9, 23.2, 23.0]  # +15 %
NOISY = [14.0, 26.0, 18.0, 23.0, 21.0]


@pytest.mark.parametrize(
    ("xs", "median"),
    [
        ([1.0], 1.0),
        ([3.0, 1.0, 2.0], 2.0),
        ([4.0, 1.0, 3.0, 2.0], 2.5),
        (QUIET_A, 20.1),
    ],
)
def test_median(xs: list[float], median: float) -> None:
    assert stats.median(xs) == pytest.approx(median)


@pytest.mark.parametrize(
    ("xs", "cv"),
    [
        ([5.0], 0.0),
        ([5.0, 5.0, 5.0], 0.0),
        ([9.0, 11.0], math.sqrt(2) / 10),
        ([-1.0, 1.0], math.inf),
    ],
)
def test_cv(xs: list[float], cv: float) -> None:
    assert stats.cv(xs) == pytest.approx(cv)


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError):
        stats.median([])


@pytest.mark.parametrize("xs", [QUIET_A, NOISY, [1.0, 2.0, 3.0, 4.0, 100.0], [7.0, 7.0]])
def test_ci_brackets_the_median_within_the_sample_range(xs: list[float]) -> None:
    lo, hi = stats.bootstrap_ci(xs)
    assert min(xs) <= lo <= stats.median(xs) <= hi <= max(xs)


def test_ci_is_seeded_and_single_samples_have_a_point_interval() -> None:
    assert stats.bootstrap_ci(NOISY, seed=3) == stats.bootstrap_ci(NOISY, seed=3)
    assert stats.bootstrap_ci([4.2]) == (4.2, 4.2)


def test_ci_narrows_with_quieter_samples() -> None:
    lo_q, hi_q = stats.bootstrap_ci(QUIET_A)
    lo_n, hi_n = stats.bootstrap_ci(NOISY)
    assert hi_q - lo_q < (hi_n - lo_n) / 5


@pytest.mark.parametrize(
    ("xs", "outliers"),
    [
        ([10.0, 10.1, 9.9, 10.0, 10.2], ()),
        ([10.0, 10.1, 9.9, 10.0, 30.0], (4,)),
        ([2.0, 10.1, 9.9, 10.0, 10.2, 10.1], (0,)),
        ([5.0, 5.0, 5.0, 5.0, 9.0], (4,)),  # zero MAD: the mean absolute deviation stands in
        ([5.0, 5.0, 5.0], ()),
        ([1.0, 100.0], ()),  # too few to tell
    ],
)
def test_outliers(xs: list[float], outliers: tuple[int, ...]) -> None:
    assert stats.outliers(xs) == outliers


@pytest.mark.parametrize(
    ("xs", "higher_is_better", "slower"),
    [
        ([8.0, 20.1, 20.3, 19.9, 20.2], True, True),  # tokens/s: a low first run is slow
        ([32.0, 20.1, 20.3, 19.9, 20.2], True, False),  # a fast first run is not hyperfine's warning
        ([32.0, 20.1, 20.3, 19.9, 20.2], False, True),  # latency: a high first run is slow
        ([20.1, 20.3, 19.9, 8.0, 20.2], True, False),  # an outlier, but not the first run
        ([8.0, 20.0], True, False),
    ],
)
def test_first_run_slower(xs: list[float], higher_is_better: bool, slower: bool) -> None:
    assert stats.first_run_slower(xs, higher_is_better=higher_is_better) is slower


def test_summary_fields() -> None:
    s = summarize(QUIET_A)
    assert (s.n, s.min, s.max) == (5, 19.9, 20.3)
    assert s.median == pytest.approx(20.1)
    assert s.ci_low <= s.median <= s.ci_high
    assert s.outliers == ()
    assert set(s.to_json()) >= {"median", "ci_low", "ci_high", "n", "cv"}


# The verdict rule: bootstrap CI of the ratio of medians; same if it holds 1 or |change| < min_change.
@pytest.mark.parametrize(
    ("base", "other", "higher_is_better", "min_change", "verdict"),
    [
        (QUIET_A, QUIET_15, True, 0.02, FASTER),  # tokens/s up 15 %
        (QUIET_15, QUIET_A, True, 0.02, SLOWER),
        (QUIET_A, QUIET_15, False, 0.02, SLOWER),  # a latency up 15 % is slower
        (QUIET_15, QUIET_A, False, 0.02, FASTER),
        (QUIET_A, QUIET_A2, True, 0.02, SAME),  # the same configuration twice
        (QUIET_A, NOISY, True, 0.02, SAME),  # different medians, but the noise covers it
        (QUIET_A, QUIET_15, True, 0.20, SAME),  # real, but under the practical threshold
        ([20.0, 20.0, 20.0], [20.2, 20.2, 20.2], True, 0.02, SAME),  # significant but only +1 %
        ([20.0, 20.0, 20.0], [20.2, 20.2, 20.2], True, 0.0, FASTER),
        ([20.0], [30.0], True, 0.02, SAME),  # one sample each: no spread, no verdict
        ([20.0, 20.1], [30.0], True, 0.02, SAME),
    ],
)
def test_verdicts(
    base: list[float], other: list[float], higher_is_better: bool, min_change: float, verdict: str
) -> None:
    d = difference(base, other, higher_is_better=higher_is_better, min_change=min_change)
    assert d.verdict == verdict


def test_difference_figures() -> None:
    d = difference(QUIET_A, QUIET_15, higher_is_better=True)
    assert d.ratio == pytest.approx(23.1 / 20.1)
    assert d.change_pct == pytest.approx((23.1 / 20.1 - 1) * 100)
    lo, hi = d.change_ci_pct
    assert 0 < lo <= d.change_pct <= hi
    assert difference(QUIET_A, QUIET_15, higher_is_better=True, seed=1) == difference(
        QUIET_A, QUIET_15, higher_is_better=True, seed=1
    )


def test_verdict_function_directly() -> None:
    assert stats.verdict(1.10, (1.05, 1.15), higher_is_better=True) == FASTER
    assert stats.verdict(1.10, (0.99, 1.15), higher_is_better=True) == SAME
    assert stats.verdict(0.90, (0.85, 0.95), higher_is_better=True) == SLOWER
    assert stats.verdict(1.01, (1.005, 1.015), higher_is_better=True) == SAME
    assert stats.verdict(1.025, (1.02, 1.03), higher_is_better=True) == SAME  # under the 3 % default
    assert stats.verdict(1.035, (1.03, 1.04), higher_is_better=True) == FASTER


def test_ratios_need_positive_medians() -> None:
    with pytest.raises(ValueError):
        difference([0.0, 0.0], [1.0, 1.0], higher_is_better=True)


def test_a_large_sample_is_resampled_in_blocks_with_the_same_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """A serve-bench level of 60,000 requests once needed 2.8 GB for its bootstrap (every resample
    held at once); drawn a block at a time, the interval is the same to the last bit."""
    import moetune.bench.analysis.stats as st

    xs = [20 + math.sin(i) + i % 7 / 10 for i in range(999)]
    whole = st.bootstrap_ci(xs, seed=5)
    monkeypatch.setattr(st, "BOOT_CELLS", 999 * 3)  # three resamples a block, and a last one of two
    assert st.bootstrap_ci(xs, seed=5) == whole
    assert st.difference(xs, [x * 1.1 for x in xs], higher_is_better=True).ratio_ci_low > 1.0


def test_order_ci_is_the_sign_tests_interval() -> None:
    xs = [float(x) for x in range(1, 10)]  # nine samples: x(2)..x(8) covers the median at 96.1%
    assert stats.order_ci(list(reversed(xs))) == (2.0, 8.0)
    assert stats.order_ci(xs, conf=0.5) == (3.0, 7.0)  # x(4)..x(6) covers only 49%
    assert stats.order_ci([1.0, 2.0, 3.0]) == (1.0, 3.0)  # too few for 95%: the range
    assert stats.order_ci([5.0]) == (5.0, 5.0)
    # wider than the bootstrap's on a small sample
    lo, hi = stats.order_ci(NOISY)
    blo, bhi = stats.bootstrap_ci(NOISY)
    assert lo <= blo and hi >= bhi
