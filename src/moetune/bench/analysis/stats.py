"""Statistics for benchmark samples: pure functions, no I/O, seeded randomness.

Summary of one metric: the median (robust to the odd slow request), a percentile-bootstrap
confidence interval of the median, the coefficient of variation, and outliers by modified
z-score (Iglewicz and Hoaglin: |0.6745·(x − median) / MAD| > 3.5).

Difference between two configurations (:func:`difference`), the rule ``moetune compare`` uses:

1. ratio = median(other) / median(baseline);
2. its 95 % confidence interval by bootstrap: both sample sets are resampled independently
   (2000 times, fixed seed) and the ratio of the resampled medians taken each time;
3. verdict "same" (no significant difference) when that interval contains 1, or when the change
   is smaller than a practical threshold (``min_change``, default 3 %); otherwise "faster" when
   the change goes the good way for the metric (more tokens/s, less latency) and "slower" when
   it does not. With fewer than two samples on either side there is no spread to judge by, and
   the verdict is "same".

Why a threshold: the interval covers the noise within each run, not the drift between runs,
which comes from the machine (clock, cache, other programs). Back-to-back runs of one unchanged
server agreed within about 1 % on a quiet 2-core machine, and drifted by 2–9 %, sometimes 30 %,
while other test suites loaded it (docs/readme/bench.md has the commands and numbers); changes
below 3 % are not evidence of a better placement. Noisy runs also get warnings (CV, outliers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moetune.option_defaults import DEFAULT_MIN_CHANGE as DEFAULT_MIN_CHANGE

FASTER, SLOWER, SAME = "faster", "slower", "same"
OUTLIER_Z = 3.5
DEFAULT_CONF = 0.95

DEFAULT_N_BOOT = 2000


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricSamples:
    """One metric's per-sample values, as an extractor derives them from raw samples.

    ``family`` groups metrics for plots (tg, pp, ttft…); ``x`` places a metric on an axis
    (context depth, concurrency) when it is one point of a series.
    """

    values: tuple[float, ...]
    higher_is_better: bool
    unit: str = "tokens/s"
    family: str = ""
    x: float | None = None
    x_label: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    n: int
    median: float
    ci_low: float
    ci_high: float
    mean: float
    stdev: float
    cv: float  # stdev / mean; 0 for fewer than two samples
    min: float
    max: float
    outliers: tuple[int, ...]  # indices into the samples

    def to_json(self) -> dict[str, float | int | list[int]]:
        return {
            "median": self.median,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "n": self.n,
            "mean": self.mean,
            "stdev": self.stdev,
            "cv": self.cv,
            "min": self.min,
            "max": self.max,
            "outliers": list(self.outliers),
        }


class RatioChange:
    """A ratio with its interval, read as a change in percent (a verdict's figures)."""

    __slots__ = ()
    ratio: float
    ratio_ci_low: float
    ratio_ci_high: float

    @property
    def change_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0

    @property
    def change_ci_pct(self) -> tuple[float, float]:
        return (self.ratio_ci_low - 1.0) * 100.0, (self.ratio_ci_high - 1.0) * 100.0


@dataclass(frozen=True, slots=True)
class Difference(RatioChange):
    ratio: float  # median(other) / median(baseline)
    ratio_ci_low: float
    ratio_ci_high: float
    verdict: str  # faster | slower | same


def _arr(xs: Sequence[float]) -> np.ndarray:
    a = np.asarray(xs, dtype=float)
    if a.size == 0:
        raise ValueError("no samples")
    return a


def median(xs: Sequence[float]) -> float:
    return float(np.median(_arr(xs)))


def cv(xs: Sequence[float]) -> float:
    a = _arr(xs)
    if a.size < 2:
        return 0.0
    m = float(a.mean())
    return float(a.std(ddof=1)) / abs(m) if m != 0 else math.inf


BOOT_CELLS = 1 << 22  # resampled values held at once (32 MiB of float64, as much again of indices)


def _boot_medians(a: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """The medians of ``n_boot`` resamples of ``a``, drawn a block of rows at a time so that a large
    sample (a serve-bench level of 60,000 requests) needs tens of MiB, not gigabytes; the draws,
    and so the medians, are those of one (n_boot, n) draw."""
    rows = max(1, BOOT_CELLS // max(1, a.size))
    meds = np.empty(n_boot)
    for i in range(0, n_boot, rows):
        k = min(rows, n_boot - i)
        meds[i : i + k] = np.median(a[rng.integers(0, a.size, size=(k, a.size))], axis=1)
    return meds


def bootstrap_ci(
    xs: Sequence[float], *, conf: float = DEFAULT_CONF, n_boot: int = DEFAULT_N_BOOT, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median."""
    a = _arr(xs)
    if a.size == 1:
        return float(a[0]), float(a[0])
    meds = _boot_medians(a, n_boot, np.random.default_rng(seed))
    tail = (1.0 - conf) / 2.0 * 100.0
    lo, hi = np.percentile(meds, [tail, 100.0 - tail])
    return float(lo), float(hi)


def order_ci(xs: Sequence[float], *, conf: float = DEFAULT_CONF) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the order statistics the sign test
    puts around it (at least ``conf`` coverage for any continuous distribution). Wider than the
    bootstrap's on small samples, where the bootstrap's is too narrow (nine rounds of two identical
    configurations measured a 0.72-1.01 interval around 0.91); with too few samples for ``conf``,
    the whole sample's range."""
    a = np.sort(_arr(xs))
    n = a.size
    # the largest k with P(Binomial(n, 1/2) < k) <= (1 - conf) / 2: the interval is x(k)..x(n+1-k)
    k, tail = 0, 0.0
    while k < (n + 1) // 2:
        tail += math.comb(n, k) / 2.0**n
        if tail > (1.0 - conf) / 2.0:
            break
        k += 1
    i = max(0, k - 1)
    return float(a[i]), float(a[n - 1 - i])


def modified_z(xs: Sequence[float]) -> list[float]:
    """Modified z-scores; with a zero MAD, the mean absolute deviation stands in (Iglewicz–Hoaglin)."""
    a = _arr(xs)
    med = np.median(a)
    dev = a - med
    mad = float(np.median(np.abs(dev)))
    if mad > 0:
        z = 0.6745 * dev / mad
    else:
        meanad = float(np.mean(np.abs(dev)))
        if meanad == 0:
            return [0.0] * int(a.size)
        z = dev / (1.253314 * meanad)
    return [float(v) for v in z]


def outliers(xs: Sequence[float], threshold: float = OUTLIER_Z) -> tuple[int, ...]:
    """Indices of samples whose modified z-score exceeds ``threshold`` (none below 3 samples)."""
    if len(xs) < 3:
        return ()
    return tuple(i for i, z in enumerate(modified_z(xs)) if abs(z) > threshold)


def first_run_slower(xs: Sequence[float], *, higher_is_better: bool, threshold: float = OUTLIER_Z) -> bool:
    """hyperfine's check: the first sample is an outlier on the slow side of the rest."""
    if len(xs) < 3 or 0 not in outliers(xs, threshold):
        return False
    rest = median(xs[1:])
    return xs[0] < rest if higher_is_better else xs[0] > rest


def summarize(
    xs: Sequence[float], *, conf: float = DEFAULT_CONF, n_boot: int = DEFAULT_N_BOOT, seed: int = 0
) -> Summary:
    a = _arr(xs)
    lo, hi = bootstrap_ci(xs, conf=conf, n_boot=n_boot, seed=seed)
    return Summary(
        n=int(a.size),
        median=float(np.median(a)),
        ci_low=lo,
        ci_high=hi,
        mean=float(a.mean()),
        stdev=float(a.std(ddof=1)) if a.size > 1 else 0.0,
        cv=cv(xs),
        min=float(a.min()),
        max=float(a.max()),
        outliers=outliers(xs),
    )


def verdict(
    ratio: float, ratio_ci: tuple[float, float], *, higher_is_better: bool, min_change: float = DEFAULT_MIN_CHANGE
) -> str:
    lo, hi = ratio_ci
    if lo <= 1.0 <= hi or abs(ratio - 1.0) < min_change:
        return SAME
    return FASTER if (ratio > 1.0) == higher_is_better else SLOWER


def difference(
    baseline: Sequence[float],
    other: Sequence[float],
    *,
    higher_is_better: bool,
    conf: float = DEFAULT_CONF,
    min_change: float = DEFAULT_MIN_CHANGE,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
) -> Difference:
    """Is ``other`` different from ``baseline``? The rule is in the module docstring."""
    a, b = _arr(baseline), _arr(other)
    ma, mb = float(np.median(a)), float(np.median(b))
    if ma <= 0 or mb < 0:
        raise ValueError("ratios need positive medians")
    ratio = mb / ma
    if min(a.size, b.size) < 2:
        ci = (0.0, math.inf)  # a single sample has no spread to judge by: never significant
    else:
        rng = np.random.default_rng(seed)
        ra = _boot_medians(a, n_boot, rng)
        rb = _boot_medians(b, n_boot, rng)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = rb / ra
        tail = (1.0 - conf) / 2.0 * 100.0
        lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
        ci = (float(lo), float(hi))
    return Difference(ratio, ci[0], ci[1], verdict(ratio, ci, higher_is_better=higher_is_better, min_change=min_change))
