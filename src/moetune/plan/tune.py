"""The tuner's pure core: the candidates it may try, and which one to launch next.

A candidate is one set of plan options (expert placement, threads, ubatch, flash attention, cache
types). Its objective is predicted by the calibrated speed model; what that model still misses is
learned from the candidates measured so far, as a smooth correction over the candidates' features
(a Gaussian process on ``log(measured / predicted)``: a constant part, for a model that is off
everywhere by the same factor, plus a part that fades with distance, so that a measurement corrects
its neighbours more than distant candidates). The next candidate is the one with the largest
expected improvement over the best measurement; the search stops when no candidate expects to gain
more than the measurements' own noise. Everything here is a function of numbers: no launches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from moetune.plan.settings import Settings

OBJECTIVES = ("tg", "pp", "ttft")
BIAS_SD = 0.35  # prior spread of the model's overall log error (before any measurement)
LOCAL_SD = 0.25  # prior spread of its error that differs between candidates
LENGTH = 0.6  # how far (in feature units) a measurement's correction reaches
# log-space noise of one launch's measured median, at least: its runs may agree within 1%, but a
# launch is one draw of the machine's state (two launches of one plan differ by 15-25% on the shared
# 2-core test machine, by a few percent on a quiet one)
LAUNCH_NOISE = 0.05


@dataclass(frozen=True, slots=True)
class Candidate:
    strategy: str
    threads: int | None = None  # None: the engine's default (every core)
    ubatch: int = 512
    batch: int = 2048
    flash_attn: bool = True
    ctk: str = "f16"
    ctv: str = "f16"
    repack: bool = False  # CPU weight repacking (mainline's default, ik's -rtr): faster CPU matmuls for some types

    @property
    def label(self) -> str:
        parts = [self.strategy, f"t{self.threads}" if self.threads else "t-default", f"ub{self.ubatch}",
                 "fa" if self.flash_attn else "no-fa"]
        if (self.ctk, self.ctv) != ("f16", "f16"):
            parts.append(f"k{self.ctk}-v{self.ctv}")
        if self.repack:
            parts.append("repack")
        return " ".join(parts)

    def settings(self, base: Settings) -> Settings:
        return replace(base, threads=self.threads, ubatch=self.ubatch, batch=max(self.batch, self.ubatch),
                       flash_attn=self.flash_attn, ctk=self.ctk, ctv=self.ctv, repack=self.repack)

    @classmethod
    def of(cls, strategy: str, s: Settings) -> Candidate:
        return cls(strategy, s.threads, s.ubatch, s.batch, s.flash_attn, s.ctk, s.ctv, s.repack)


@dataclass(frozen=True, slots=True)
class Axes:
    """What the search may change; each axis lists the values to try."""

    strategies: tuple[str, ...]
    threads: tuple[int | None, ...]
    ubatches: tuple[int, ...]
    flash_attn: tuple[bool, ...]
    cache_types: tuple[tuple[str, str], ...]
    repack: tuple[bool, ...] = (False,)


def default_axes(base: Settings, strategy: str, cores: int, moe_layers: int, accelerators: int) -> Axes:
    """The values worth trying around the user's options: every placement family (where there is an
    accelerator to place on), all cores and fewer, a quarter and four times the ubatch, flash
    attention on and off, a q8_0 cache beside f16, and CPU weight repacking on and off."""
    strategies = [strategy]
    if accelerators:
        ladder = sorted({max(1, moe_layers * i // 4) for i in (1, 2, 3)})
        strategies += ["auto", "cpu-moe", *(f"n-cpu-moe:{n}" for n in ladder)]
    threads: list[int | None] = [base.threads, *(t for t in (max(1, cores // 2), max(1, cores * 3 // 4))
                                                 if t != (base.threads or cores))]
    ubs = [base.ubatch, max(32, base.ubatch // 4), base.ubatch * 4]
    caches = [(base.ctk, base.ctv)] + ([("q8_0", "q8_0")] if (base.ctk, base.ctv) == ("f16", "f16") else [])
    return Axes(tuple(dict.fromkeys(strategies)), tuple(dict.fromkeys(threads)), tuple(dict.fromkeys(ubs)),
                (base.flash_attn, not base.flash_attn), tuple(dict.fromkeys(caches)), (base.repack, not base.repack))


def space(axes: Axes, base: Settings) -> list[Candidate]:
    """Every combination the axes allow and the engine accepts (a quantized V cache needs flash
    attention)."""
    out = []
    for st in axes.strategies:
        for t in axes.threads:
            for ub in axes.ubatches:
                for fa in axes.flash_attn:
                    for ctk, ctv in axes.cache_types:
                        if ctv != "f16" and not fa:
                            continue
                        for rp in axes.repack:
                            out.append(Candidate(st, t, ub, max(base.batch, ub), fa, ctk, ctv, rp))
    return list(dict.fromkeys(out))


def features(c: Candidate, cpu_expert_share: float, cores: int) -> np.ndarray:
    """Where a candidate sits, for judging which measurements say something about it: the share of
    expert bytes left on the CPU, the share of cores used (both weigh most: they move decode speed
    in ways the model knows least), log ubatch, flash attention, cache bits, repacking."""
    threads = c.threads or cores
    return np.array([2.0 * cpu_expert_share, 2.0 * min(1.0, threads / max(1, cores)), math.log2(c.ubatch) / 4,
                     0.5 if c.flash_attn else 0.0, 0.5 if c.ctk != "f16" or c.ctv != "f16" else 0.0,
                     0.5 if c.repack else 0.0])


@dataclass(frozen=True, slots=True)
class Measured:
    index: int  # of the candidate
    value: float  # the measured objective (higher is better)
    rel_se: float  # its standard error over its value (the noise of one measurement)


@dataclass(frozen=True, slots=True)
class Belief:
    """What the search believes of each candidate's objective: log mean and log standard deviation."""

    mean: np.ndarray
    sd: np.ndarray

    def value(self, i: int) -> float:
        return float(math.exp(self.mean[i]))


def _kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d2 = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
    out: np.ndarray = BIAS_SD**2 + LOCAL_SD**2 * np.exp(-d2 / (2 * LENGTH**2))
    return out


def belief(predicted: Sequence[float], feats: np.ndarray, measured: Sequence[Measured]) -> Belief:
    """The model's predictions corrected by the measurements (posterior of the log correction)."""
    mu = np.log(np.maximum(np.asarray(predicted, dtype=float), 1e-12))
    if not measured:
        return Belief(mu, np.full(len(mu), math.sqrt(BIAS_SD**2 + LOCAL_SD**2)))
    idx = np.array([m.index for m in measured])
    r = np.array([math.log(m.value) for m in measured]) - mu[idx]
    noise = np.array([max(LAUNCH_NOISE, m.rel_se) ** 2 for m in measured])
    k_mm = _kernel(feats[idx], feats[idx]) + np.diag(noise)
    k_am = _kernel(feats, feats[idx])
    alpha = np.linalg.solve(k_mm, r)
    mean = mu + k_am @ alpha
    var = (BIAS_SD**2 + LOCAL_SD**2) - np.einsum("ij,ji->i", k_am, np.linalg.solve(k_mm, k_am.T))
    return Belief(mean, np.sqrt(np.maximum(var, 1e-12)))


def expected_gain(b: Belief, best: float) -> np.ndarray:
    """Expected improvement over ``best`` (a measured objective), as a share of it: E[max(0, X/best - 1)]
    for X log-normal with the belief's mean and spread."""
    lb = math.log(best)
    m, s = b.mean, b.sd
    # E[max(0, e^Y - e^lb)] for Y ~ N(m, s^2), over e^lb
    d1 = (m - lb + s**2) / s
    d2 = (m - lb) / s
    out: np.ndarray = np.exp(m - lb + s**2 / 2) * _phi(d1) - _phi(d2)
    return out


def _phi(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    return out


def choose(b: Belief, best: float, open_: Sequence[int], noise: float) -> tuple[int | None, float]:
    """The open candidate with the largest expected gain, and that gain; None when no candidate
    expects to gain more than ``noise`` (a share of the best)."""
    if not open_:
        return None, 0.0
    gains = expected_gain(b, best)
    i = max(open_, key=lambda j: (gains[j], b.mean[j]))
    g = float(gains[i])
    return (i if g > noise else None), g
