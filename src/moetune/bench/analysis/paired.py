"""Paired differences: two configurations measured in alternating rounds, judged round by round.

A plain comparison (:func:`moetune.bench.analysis.stats.difference`) sets every sample of one run
against every sample of the other. When the machine drifts between the runs (clock, heat, another
program, the page cache), that drift is read as a difference between the configurations. An
interleaved sweep measures them in rounds (A B, B A, A B, …), so that within a round both saw the
same machine; this module's rule uses only the differences within rounds:

1. per round i, r_i = median(other_i) / median(baseline_i), and d_i = ln r_i;
2. the paired ratio is exp(mean d_i), the geometric mean of the per-round ratios;
3. its confidence interval is Student's t interval of the mean of the d_i (n − 1 degrees of
   freedom), exponentiated: exp(mean ± t · sd / √n). The spread between rounds covers the noise
   within each round and whatever drift did not cancel within them;
4. the verdict is :func:`moetune.bench.analysis.stats.verdict`'s, the words ``compare`` uses.

Why t and not a bootstrap: a few rounds are the usual case (each may be two launches of a huge
model), and a bootstrap over three rounds has ten distinct resamples and an interval too narrow
to trust; the t interval is exact for normal log ratios and honest about small n. With one round
there is no spread to judge by and the verdict is "same", as for single samples.

Why the order alternates: a steady drift within a round makes whichever configuration runs second
look better (or worse) by the same amount every round; reversing the order every other round
flips the sign of that bias, so over an even number of rounds it cancels in the mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from moetune.bench.analysis.stats import DEFAULT_CONF, DEFAULT_MIN_CHANGE, SAME, RatioChange, median, verdict


@dataclass(frozen=True, slots=True, kw_only=True)
class PairedDifference(RatioChange):
    ratios: tuple[float, ...]  # per round: median(other) / median(baseline)
    ratio: float  # exp(mean log ratio)
    ratio_ci_low: float
    ratio_ci_high: float
    verdict: str  # faster | slower | same

    @property
    def rounds(self) -> int:
        return len(self.ratios)


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom (Abramowitz & Stegun 26.7.3-4:
    a finite sum in cos(theta), exact for integer df)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:
        term, acc = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            acc += term
        return 2.0 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * acc if df > 1 else 0.0))
    term, acc = 1.0, 1.0
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        acc += term
    return math.sin(theta) * acc


def t_quantile(conf: float, df: int) -> float:
    """The t such that P(|T| <= t) = ``conf`` (the two-sided critical value; 12.706 for 95 % and
    one degree of freedom), by bisection on the exact distribution function."""
    if df < 1 or not 0.0 < conf < 1.0:
        raise ValueError("t_quantile needs df >= 1 and 0 < conf < 1")
    lo, hi = 0.0, 1.0
    while _t_two_sided(hi, df) < conf:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if _t_two_sided(mid, df) < conf:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2.0


def round_ratio(baseline: Sequence[float], other: Sequence[float]) -> float:
    """One round's ratio of medians (other over baseline)."""
    mb, mo = median(baseline), median(other)
    if mb <= 0 or mo <= 0:
        raise ValueError("ratios need positive medians")
    return mo / mb


def paired_difference(
    rounds: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    higher_is_better: bool,
    conf: float = DEFAULT_CONF,
    min_change: float = DEFAULT_MIN_CHANGE,
) -> PairedDifference:
    """Is ``other`` different from ``baseline``, judged within rounds? ``rounds`` holds one
    ``(baseline samples, other samples)`` pair per round. The rule is in the module docstring."""
    if not rounds:
        raise ValueError("no rounds")
    return paired_from_ratios(
        [round_ratio(b, o) for b, o in rounds], higher_is_better=higher_is_better, conf=conf, min_change=min_change
    )


def paired_from_ratios(
    ratios: Sequence[float],
    *,
    higher_is_better: bool,
    conf: float = DEFAULT_CONF,
    min_change: float = DEFAULT_MIN_CHANGE,
) -> PairedDifference:
    """The paired verdict from per-round ratios (each positive)."""
    if not ratios or any(r <= 0 or not math.isfinite(r) for r in ratios):
        raise ValueError("paired ratios must be positive and finite")
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    ratio = math.exp(mean)
    if n < 2:
        ci = (0.0, math.inf)  # one round has no spread to judge by: never significant
    else:
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
        half = t_quantile(conf, n - 1) * sd / math.sqrt(n)
        ci = (math.exp(mean - half), math.exp(mean + half))
    return PairedDifference(
        ratios=tuple(ratios),
        ratio=ratio,
        ratio_ci_low=ci[0],
        ratio_ci_high=ci[1],
        verdict=verdict(ratio, ci, higher_is_better=higher_is_better, min_change=min_change),
    )


def noisy(verdict_: str, ratio: float, min_change: float) -> bool:
    """ "same (noisy)": the change passes the threshold, but the interval is too wide to tell."""
    return verdict_ == SAME and abs(ratio - 1.0) >= min_change
