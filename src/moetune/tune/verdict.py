"""A tune's judgement of its measurements: each candidate's median and noise for the search, and
its verdict against the baseline by the rule of `compare` (the winner must beat the baseline)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from moetune.bench.analysis.stats import DEFAULT_N_BOOT, FASTER, SAME, bootstrap_ci, difference, verdict
from moetune.plan import tune as core
from moetune.plan.plan import Plan


class Judged(Protocol):
    """What a verdict reads of a candidate (``moetune.tune.loop.Entry``)."""

    @property
    def plan(self) -> Plan: ...
    @property
    def failed(self) -> str | None: ...
    @property
    def fits(self) -> bool: ...


def measurements(values: dict[int, list[float]]) -> list[core.Measured]:
    """Each measured candidate's median and its relative standard error (stdev / sqrt(n), over the median)."""
    out = []
    for i, v in values.items():
        if not v:
            continue
        med = statistics.median(v)
        if med <= 0:
            continue
        se = statistics.stdev(v) / len(v) ** 0.5 / med if len(v) > 1 else 0.1
        out.append(core.Measured(i, med, se))
    return out


def change_text(ratio: float, *, as_time: bool = False) -> str:
    """A ratio of medians as a change: ``+12.5%``, or of a time (``as_time``: 1 / the ratio) ``-11.1% time``."""
    return f"{(1 / ratio - 1) * 100:+.1f}% time" if as_time else f"{(ratio - 1) * 100:+.1f}%"


def compare(base: list[float], other: list[float], *, as_time: bool = False) -> tuple[str, str]:
    """The rule of `compare` (verdict, and how it reads). Goodput windows may be zero (no request of
    the window met the targets), and so may a resampled median: a baseline whose median is zero is
    beaten by a candidate whose median's interval stays above zero, and otherwise the ratio's
    interval counts a zero baseline median as an infinite ratio (:func:`_ratio_ci`). ``as_time``:
    the values are rates of a time (passes per second of a replay), and the change reads as the
    time's (1 / the ratio of medians)."""
    if statistics.median(base) > 0:
        if min(base) > 0:
            d = difference(base, other, higher_is_better=True)
            ratio, ci = d.ratio, (d.ratio_ci_low, d.ratio_ci_high)
        else:
            ratio, ci = statistics.median(other) / statistics.median(base), _ratio_ci(base, other)
        v = verdict(ratio, ci, higher_is_better=True)
        return v, f"{v} ({change_text(ratio, as_time=as_time)} vs baseline)"
    if statistics.median(other) > 0 and bootstrap_ci(other)[0] > 0:
        return FASTER, f"{FASTER} (the baseline met no target)"
    return SAME, f"{SAME} (neither met the targets)" if statistics.median(other) <= 0 else f"{SAME} (vs baseline)"


def _ratio_ci(base: list[float], other: list[float], n_boot: int = DEFAULT_N_BOOT) -> tuple[float, float]:
    """The 95% bootstrap interval of median(other) / median(base) as `compare` draws it, where a
    resampled baseline median of zero gives an infinite ratio (and 0 / 0 none: 1)."""
    rng = np.random.default_rng(0)
    a, b = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    ra = np.median(a[rng.integers(0, a.size, size=(n_boot, a.size))], axis=1)
    rb = np.median(b[rng.integers(0, b.size, size=(n_boot, b.size))], axis=1)
    big = np.finfo(float).max
    ratios = np.where(ra > 0, rb / np.where(ra > 0, ra, 1.0), np.where(rb > 0, big, 1.0))
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def verdicts(
    entries: Sequence[Judged],
    values: dict[int, list[float]],
    expect: np.ndarray | None,
    rejected: dict[int, str] | None = None,
    *,
    as_time: bool = False,
) -> tuple[dict[int, str], int | None]:
    """Each candidate's verdict, and the best: of the measured candidates that beat the baseline (the
    rule of `compare`), the one the search believes fastest (its measurement pooled with its
    neighbours': one lucky launch does not win), else the baseline; with no baseline measured (it
    failed), the one believed fastest of those measured; None when nothing was measured (a baseline
    that failed is never the best). ``rejected``: candidates that may not win, each with its reason
    (a TG winner that gives up more PP than --max-pp-loss), said in place of a win."""
    out: dict[int, str] = {}
    base = values.get(0) or []
    winners = []
    for i, e in enumerate(entries):
        if not e.fits:
            sf = e.plan.shortfalls
            out[i] = "does not fit" + (f": {sf[0].message}" if sf else "")
        elif e.failed is not None:
            out[i] = "failed: " + e.failed.splitlines()[0]
        elif not values.get(i):
            out[i] = "not launched"
        elif i == 0:
            out[i] = "baseline"
        elif not base and rejected and i in rejected:
            out[i] = rejected[i]
        elif not base:
            out[i] = "measured"
            winners.append((float(expect[i]) if expect is not None else statistics.median(values[i]), i))
        else:
            verdict, out[i] = compare(base, values[i], as_time=as_time)
            if rejected and i in rejected:
                out[i] = f"{rejected[i]}; {out[i]}"
            elif verdict == FASTER:
                winners.append((float(expect[i]) if expect is not None else statistics.median(values[i]), i))
    best = max(winners)[1] if winners else 0 if base else None
    if best:
        out[best] = f"best, {out[best]}"
    elif best == 0:
        out[0] = "baseline, best (nothing beat it)" if len(values) > 1 else "baseline"
    return out, best
