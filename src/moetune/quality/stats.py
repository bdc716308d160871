"""Statistics of quality measurements. Pure.

Teacher-forced metrics (llama-perplexity). The engine prints, after each chunk, the mean over the
chunks so far; chunks are of equal length (``n_ctx - 1 - n_ctx/2`` scored tokens each), so chunk
k's own value is ``k·m_k - (k-1)·m_(k-1)`` (:func:`per_chunk`; PPL through its logarithm,
:func:`per_chunk_ppl`). Tokens within a chunk share their context and are not independent, so the
interval resamples whole chunks: the percentile bootstrap of the mean over chunks
(:func:`bootstrap_mean`), used when there are at least :data:`MIN_BOOTSTRAP_CHUNKS` chunks.
Otherwise the interval is the engine's own ``±`` (the standard error over tokens, as if they were
independent) times the normal quantile. Each interval says which it is (``method``). The running
means are printed to 5 decimals (KLD) or 3 decimals of a percent (Same top p): the recovered
chunk values carry that rounding, which widens a bootstrap interval, never shifts its centre.

Multiple choice. Accuracy is k of n with the Wilson score interval (:func:`wilson`). Two
configurations answering the same questions are compared on the questions where exactly one of them
is right (the discordant pairs ``b``: only the baseline right, ``c``: only the candidate right) by
McNemar's exact test, a two-sided binomial test of ``c`` among ``b + c`` at p = 1/2
(:func:`mcnemar_exact`); the verdict (:func:`paired_verdict`) is ``same`` when p >= alpha, else
``better`` (c > b) or ``worse``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

DEFAULT_CONF = 0.95
MIN_BOOTSTRAP_CHUNKS = 5
N_BOOT = 5000
BOOTSTRAP, ENGINE = "bootstrap", "engine"

# KLD verdict thresholds, from llama.cpp's published table (tools/perplexity/README.md, build 11434):
# q8_0 weights cost Llama-3-8B 0.0014 and Llama-2-7B 0.0004; q4_K_M 0.031 and 0.0127
SAME_KLD = 0.001  # the interval's upper end below this: numerically the reference (under q8_0 weights)
CLOSE_KLD = 0.01  # below this: a small loss (about q6_K); above: worse
SAME, CLOSE, WORSE, BETTER = "same", "close", "worse", "better"


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    mean: float
    ci_low: float
    ci_high: float
    method: str  # bootstrap (over chunks) | engine (its ± over tokens)
    n: int  # chunks (bootstrap) or chunks seen (engine)

    def to_json(self) -> dict[str, float | str | int]:
        return {
            "mean": self.mean,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "method": self.method,
            "n_chunks": self.n,
        }


def z_of(conf: float) -> float:
    return NormalDist().inv_cdf(0.5 + conf / 2.0)


def per_chunk(running: Sequence[float]) -> list[float]:
    """Each chunk's own value from the running means over chunks 1..k (equal-length chunks)."""
    out: list[float] = []
    prev = 0.0
    for k, m in enumerate(running, start=1):
        out.append(k * m - (k - 1) * prev)
        prev = m
    return out


def per_chunk_ppl(running_ppl: Sequence[float]) -> list[float]:
    """Each chunk's mean negative log-likelihood from the running perplexities (PPL = exp(mean NLL))."""
    return per_chunk([math.log(p) for p in running_ppl])


def bootstrap_mean(
    values: Sequence[float], *, conf: float = DEFAULT_CONF, n_boot: int = N_BOOT, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean."""
    a = np.asarray(values, dtype=float)
    if a.size == 1:
        return float(a[0]), float(a[0])
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)
    tail = (1.0 - conf) / 2.0 * 100.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return float(lo), float(hi)


def interval(
    mean: float,
    engine_unc: float,
    chunks: Sequence[float] | None,
    *,
    conf: float = DEFAULT_CONF,
    seed: int = 0,
    n_seen: int = 0,
) -> Interval:
    """``mean`` with the bootstrap interval over ``chunks`` (its per-chunk values) when there are
    enough of them, else ``mean ± z·engine_unc``."""
    if chunks is not None and len(chunks) >= MIN_BOOTSTRAP_CHUNKS:
        lo, hi = bootstrap_mean(chunks, conf=conf, seed=seed)
        return Interval(mean=mean, ci_low=min(lo, mean), ci_high=max(hi, mean), method=BOOTSTRAP, n=len(chunks))
    unc = engine_unc if math.isfinite(engine_unc) else 0.0
    z = z_of(conf)
    return Interval(
        mean=mean,
        ci_low=mean - z * unc,
        ci_high=mean + z * unc,
        method=ENGINE,
        n=n_seen or (len(chunks) if chunks else 0),
    )


def ppl_interval(
    ppl: float, ppl_unc: float, running_ppl: Sequence[float], *, conf: float = DEFAULT_CONF, seed: int = 0
) -> Interval:
    """Perplexity with its interval: the bootstrap of the mean NLL over chunks, exponentiated."""
    if len(running_ppl) >= MIN_BOOTSTRAP_CHUNKS:
        lo, hi = bootstrap_mean(per_chunk_ppl(running_ppl), conf=conf, seed=seed)
        return Interval(
            mean=ppl,
            ci_low=min(math.exp(lo), ppl),
            ci_high=max(math.exp(hi), ppl),
            method=BOOTSTRAP,
            n=len(running_ppl),
        )
    return interval(ppl, ppl_unc, None, conf=conf, n_seen=len(running_ppl))


def kld_verdict(kld: Interval, same_below: float = SAME_KLD, close_below: float = CLOSE_KLD) -> str:
    """``same`` when the whole KLD interval is under ``same_below``, ``close`` under ``close_below``,
    else ``worse`` (a candidate cannot be closer to the reference than the reference)."""
    if kld.ci_high < same_below:
        return SAME
    if kld.ci_high < close_below:
        return CLOSE
    return WORSE


def wilson(k: int, n: int, *, conf: float = DEFAULT_CONF) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n ((0, 1) for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    z = z_of(conf)
    p = k / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: ``min(1, 2·P(X <= min(b, c)))`` for X ~ Binomial(b + c, 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


@dataclass(frozen=True, slots=True, kw_only=True)
class Paired:
    """Two configurations' answers to the same questions."""

    n: int  # questions both answered (in both runs)
    both_right: int
    only_baseline: int  # b: the baseline right, the candidate wrong
    only_candidate: int  # c: the candidate right, the baseline wrong
    both_wrong: int
    same_answer: int  # questions where the two gave the same answer (right or wrong, unparsable included)
    p_value: float
    verdict: str  # same | better | worse

    @property
    def agreement(self) -> float:
        return self.same_answer / self.n if self.n else 0.0

    def to_json(self) -> dict[str, float | int | str]:
        return {
            "n": self.n,
            "both_right": self.both_right,
            "only_baseline": self.only_baseline,
            "only_candidate": self.only_candidate,
            "both_wrong": self.both_wrong,
            "agreement": self.agreement,
            "p_value": self.p_value,
            "verdict": self.verdict,
        }


def paired_verdict(b: int, c: int, *, alpha: float = 0.05) -> tuple[float, str]:
    p = mcnemar_exact(b, c)
    if p >= alpha:
        return p, SAME
    return p, BETTER if c > b else WORSE


def paired(
    baseline: Sequence[tuple[str | None, bool]], candidate: Sequence[tuple[str | None, bool]], *, alpha: float = 0.05
) -> Paired:
    """Compare two runs question by question; each item is (answer given or None, right)."""
    if len(baseline) != len(candidate):
        raise ValueError("paired runs must answer the same questions")
    rr = sum(1 for x, y in zip(baseline, candidate, strict=True) if x[1] and y[1])
    b = sum(1 for x, y in zip(baseline, candidate, strict=True) if x[1] and not y[1])
    c = sum(1 for x, y in zip(baseline, candidate, strict=True) if not x[1] and y[1])
    same = sum(1 for x, y in zip(baseline, candidate, strict=True) if x[0] == y[0])
    p, v = paired_verdict(b, c, alpha=alpha)
    return Paired(
        n=len(baseline),
        both_right=rr,
        only_baseline=b,
        only_candidate=c,
        both_wrong=len(baseline) - rr - b - c,
        same_answer=same,
        p_value=p,
        verdict=v,
    )
