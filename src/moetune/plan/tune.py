"""The tuner's pure core: the candidates it may try, and which one to launch next.

A candidate is one set of plan options (expert placement, threads, ubatch, flash attention, cache
types, CPU repacking; with ik_llama.cpp also -amb, the MLA mode, fused MoE and -muge). Its objective is predicted by the calibrated speed model; what that model still misses is
learned from the candidates measured so far, as a smooth correction over the candidates' features
(a Gaussian process on ``log(measured / predicted)``: a constant part, for a model that is off
everywhere by the same factor, plus a part that fades with distance, so that a measurement corrects
its neighbours more than distant candidates). The next candidate is the one with the largest
expected improvement over the best measurement; the search stops when no candidate expects to gain
more than the measurements' own noise. Everything here is a function of numbers: no launches.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from moetune.errors import InputError
from moetune.kinds import StrategyKind
from moetune.plan.placement import head_tail_name, parse_strategy
from moetune.plan.settings import Settings

OBJECTIVES = ("tg", "pp", "ttft", "goodput", "replay", "turn", "weighted")
BIAS_SD = 0.35  # prior spread of the model's overall log error (before any measurement)
LOCAL_SD = 0.25  # prior spread of its error that differs between candidates
LENGTH = 0.6  # how far (in feature units) a measurement's correction reaches
# log-space noise of one launch's measured median, at least: its runs may agree within 1%, but a
# launch is one draw of the machine's state (two launches of one plan differ by 15-25% on the shared
# 2-core test machine, by a few percent on a quiet one)
LAUNCH_NOISE = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    strategy: str
    threads: int | None = None  # None: the engine's default (every core)
    ubatch: int = 512
    batch: int = 2048
    flash_attn: bool = True
    ctk: str = "f16"
    ctv: str = "f16"
    repack: bool = False  # CPU weight repacking (mainline's default, ik's -rtr): faster CPU matmuls for some types
    # ik_llama.cpp's own options (Settings' fields of the same names; mainline leaves them at these defaults)
    amb_mib: int = 0
    mla: int = 3
    fused_moe: bool = True
    merge_up_gate: bool = False
    transport: str = "tcp"  # how the server talks to its RPC workers (a launch option, not the plan's)

    @property
    def label(self) -> str:
        parts = [
            self.strategy,
            f"t{self.threads}" if self.threads else "t-default",
            f"ub{self.ubatch}",
            "fa" if self.flash_attn else "no-fa",
        ]
        if (self.ctk, self.ctv) != ("f16", "f16"):
            parts.append(f"k{self.ctk}-v{self.ctv}")
        if self.repack:
            parts.append("repack")
        if self.amb_mib:
            parts.append(f"amb{self.amb_mib}")
        if self.mla != 3:
            parts.append(f"mla{self.mla}")
        if not self.fused_moe:
            parts.append("no-fmoe")
        if self.merge_up_gate:
            parts.append("muge")
        if self.transport != "tcp":
            parts.append(self.transport)
        return " ".join(parts)

    def settings(self, base: Settings) -> Settings:
        """The base's settings with this candidate's options (repacking stays the base's own word,
        auto included, where it agrees)."""
        repack = base.repack if self.repack == base.repacks else self.repack
        return replace(
            base,
            threads=self.threads,
            ubatch=self.ubatch,
            batch=max(self.batch, self.ubatch),
            flash_attn=self.flash_attn,
            ctk=self.ctk,
            ctv=self.ctv,
            repack=repack,
            amb_mib=self.amb_mib,
            mla=self.mla,
            fused_moe=self.fused_moe,
            merge_up_gate=self.merge_up_gate,
        )

    @classmethod
    def of(cls, strategy: str, s: Settings) -> Candidate:
        return cls(
            strategy=strategy,
            threads=s.threads,
            ubatch=s.ubatch,
            batch=s.batch,
            flash_attn=s.flash_attn,
            ctk=s.ctk,
            ctv=s.ctv,
            repack=s.repacks,
            amb_mib=s.amb_mib,
            mla=s.mla,
            fused_moe=s.fused_moe,
            merge_up_gate=s.merge_up_gate,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Axes:
    """What the search may change; each axis lists the values to try."""

    strategies: tuple[str, ...]
    threads: tuple[int | None, ...]
    ubatches: tuple[int, ...]
    flash_attn: tuple[bool, ...]
    cache_types: tuple[tuple[str, str], ...]
    repack: tuple[bool, ...] = (False,)
    amb_mib: tuple[int, ...] = (0,)
    mla: tuple[int, ...] = (3,)
    fused_moe: tuple[bool, ...] = (True,)
    merge_up_gate: tuple[bool, ...] = (False,)
    transports: tuple[str, ...] = ("tcp",)  # RPC transports (``--try-transport``, where the link has RDMA)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOptions:
    """The engine's own options worth searching, as far as the build renders them (its dialect) and
    the model makes them matter: ik_llama.cpp's; mainline has none of them."""

    amb: bool = False  # -amb: bounds the attention's scratch (MLA models, or attention without flash attention)
    mla_model: bool = False  # the model uses MLA attention (where -amb also bounds it with flash attention)
    mla: bool = False  # -mla N for an MLA model
    fused_moe: bool = False  # the build can run the MoE up/gate fused and unfused
    merge_up_gate: bool = False  # -muge


# a comma that starts another strategy (one of a layer set's own commas starts a DEVICE=RANGE)
_BARE = "|".join(re.escape(k) for k in StrategyKind if not k.takes_argument)
_WITH_ARGUMENT = "|".join(re.escape(k) for k in StrategyKind if k.takes_argument)
_NEXT_STRATEGY = re.compile(rf",(?=\s*(?:(?:{_BARE})\s*(?:[,;]|$)|(?:{_WITH_ARGUMENT}):))")


def split_strategies(values: Sequence[str]) -> tuple[str, ...]:
    """The strategies of ``--try-strategy`` (the option repeated, or ``;`` between strategies, or a
    comma list where each comma starts a known strategy: ``cpu-moe,layers:CUDA0=3-14,CUDA1=68-77``
    is two). Each one's syntax is checked: a bad one is one error naming it."""
    out: list[str] = []
    for value in values:
        for part in value.split(";"):
            for item in _NEXT_STRATEGY.split(part):
                if item.strip():
                    parse_strategy(item, "--try-strategy")
                    out.append(item.strip())
    if not out:
        raise InputError("--try-strategy: no strategy given", hint="--try-strategy 'cpu-moe;head-tail:12+10'")
    return tuple(dict.fromkeys(out))


def head_tail_splits(budget: int, moe_layers: int) -> list[str]:
    """Head/tail placements of an expert budget of ``budget`` MoE layers (what `auto` fits on the
    accelerators): half the head, half the tail; and 2/5 head, 2/5 tail, 1/5 spread over the middle
    (reference 000: head 12 + tail 10 beat `auto`'s tail-only set by 15%; its 20-layer set is
    8 + 8 + 4). None where the budget is every MoE layer (nothing to choose) or under two."""
    if budget < 2 or budget >= moe_layers:
        return []
    out = [head_tail_name(budget - budget // 2, budget // 2)]
    if budget >= 5:
        edge = 2 * budget // 5
        out.append(head_tail_name(edge, edge, budget - 2 * edge))
    return out


AMB_TRY_MIB = 512  # the -amb ik_llama.cpp's users start from (its DeepSeek recipes)


def default_axes(
    base: Settings,
    strategy: str,
    cores: int,
    moe_layers: int,
    *,
    accelerators: int,
    engine: EngineOptions = EngineOptions(),
    expert_budget: int = 0,
) -> Axes:
    """The values worth trying around the user's options: every placement family (where there is an
    accelerator to place on; the head/tail splits of ``expert_budget``, the MoE layers' worth of
    experts `auto` puts on the accelerators: :func:`head_tail_splits`), all cores and fewer, a quarter and four times the ubatch, flash
    attention on and off, a q8_0 cache beside f16, and CPU weight repacking on and off; with
    ik_llama.cpp, also -amb unbounded and 512 MiB, MLA modes 3 and 2 (MLA models), fused MoE on and
    off, and -muge off and on."""
    strategies = [strategy]
    if accelerators:
        ladder = sorted({max(1, moe_layers * i // 4) for i in (1, 2, 3)})
        strategies += [
            "auto",
            "cpu-moe",
            *(f"n-cpu-moe:{n}" for n in ladder),
            *head_tail_splits(expert_budget, moe_layers),
        ]
    threads: list[int | None] = [
        base.threads,
        *(t for t in (max(1, cores // 2), max(1, cores * 3 // 4)) if t != (base.threads or cores)),
    ]
    ubs = [base.ubatch, max(32, base.ubatch // 4), base.ubatch * 4]
    caches = [(base.ctk, base.ctv)] + ([("q8_0", "q8_0")] if (base.ctk, base.ctv) == ("f16", "f16") else [])
    return Axes(
        strategies=tuple(dict.fromkeys(strategies)),
        threads=tuple(dict.fromkeys(threads)),
        ubatches=tuple(dict.fromkeys(ubs)),
        flash_attn=(base.flash_attn, not base.flash_attn),
        cache_types=tuple(dict.fromkeys(caches)),
        repack=(base.repacks, not base.repacks),
        amb_mib=(base.amb_mib, AMB_TRY_MIB if base.amb_mib == 0 else 0) if engine.amb else (base.amb_mib,),
        mla=(base.mla, 2 if base.mla == 3 else 3) if engine.mla else (base.mla,),
        fused_moe=(base.fused_moe, not base.fused_moe) if engine.fused_moe else (base.fused_moe,),
        merge_up_gate=(base.merge_up_gate, not base.merge_up_gate) if engine.merge_up_gate else (base.merge_up_gate,),
    )


def space(axes: Axes, base: Settings, *, mla_model: bool = False) -> list[Candidate]:
    """Every combination the axes allow and the engine accepts (a quantized V cache needs flash
    attention); -amb only where it bounds something (an MLA model, or attention without flash
    attention) and the MLA mode only on an MLA model: elsewhere a candidate keeps the base's
    value, so no two candidates differ by nothing."""
    out = []
    for st, t, ub, fa, (ctk, ctv), rp, amb, mla, fmoe, muge in itertools.product(
        axes.strategies,
        axes.threads,
        axes.ubatches,
        axes.flash_attn,
        axes.cache_types,
        axes.repack,
        axes.amb_mib,
        axes.mla,
        axes.fused_moe,
        axes.merge_up_gate,
    ):
        if ctv != "f16" and not fa:
            continue
        if fa and not mla_model:
            amb = base.amb_mib
        if not mla_model:
            mla = base.mla
        out += [
            Candidate(
                strategy=st,
                threads=t,
                ubatch=ub,
                batch=max(base.batch, ub),
                flash_attn=fa,
                ctk=ctk,
                ctv=ctv,
                repack=rp,
                amb_mib=amb,
                mla=mla,
                fused_moe=fmoe,
                merge_up_gate=muge,
                transport=tr,
            )
            for tr in axes.transports
        ]
    return list(dict.fromkeys(out))


def features(c: Candidate, cpu_expert_share: float, cores: int) -> np.ndarray:
    """Where a candidate sits, for judging which measurements say something about it: the share of
    expert bytes left on the CPU, the share of cores used (both weigh most: they move decode speed
    in ways the model knows least), log ubatch, flash attention, cache bits, repacking, and
    ik_llama.cpp's options: how tightly -amb bounds the attention (512 MiB or less counts fully),
    an MLA mode other than 3, fused MoE off, -muge (all 0 for mainline, whose distances they leave
    alone), and a head/tail placement (which experts stay off the CPU, beside how many: the
    model's speed does not tell a head/tail split from `auto`'s layers of the same bytes, so a
    measurement of one says less of the other), and the RDMA transport (the same plan, launched
    over another link protocol)."""
    threads = c.threads or cores
    return np.array(
        [
            2.0 * cpu_expert_share,
            2.0 * min(1.0, threads / max(1, cores)),
            math.log2(c.ubatch) / 4,
            0.5 if c.flash_attn else 0.0,
            0.5 if c.ctk != "f16" or c.ctv != "f16" else 0.0,
            0.5 if c.repack else 0.0,
            0.5 * min(1.0, AMB_TRY_MIB / c.amb_mib) if c.amb_mib > 0 else 0.0,
            0.5 if c.mla != 3 else 0.0,
            0.5 if not c.fused_moe else 0.0,
            0.5 if c.merge_up_gate else 0.0,
            0.5 if parse_strategy(c.strategy).kind == StrategyKind.HEAD_TAIL else 0.0,
            0.5 if c.transport == "rdma" else 0.0,
        ]
    )


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


def choose(
    b: Belief, best: float, open_: Sequence[int], noise: float, *, gains: np.ndarray | None = None
) -> tuple[int | None, float]:
    """The open candidate with the largest expected gain, and that gain; None when no candidate
    expects to gain more than ``noise`` (a share of the best). ``gains``: expected gains computed
    otherwise (goodput's, :func:`moetune.plan.serving.expected_goodput`), else :func:`expected_gain`."""
    if not open_:
        return None, 0.0
    if gains is None:
        gains = expected_gain(b, best)
    i = max(open_, key=lambda j: (gains[j], b.mean[j]))
    g = float(gains[i])
    return (i if g > noise else None), g
