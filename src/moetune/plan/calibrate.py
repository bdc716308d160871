"""Calibrating the speed model from measured runs: non-linear least squares with a prior.

Every benchmark of a plan stores the plan's work (:class:`moetune.plan.speed.Work`): what each device
reads and computes per token and per ubatch. A measured TG or PP of that workload is one equation in
the constants of :class:`SpeedConstants`, through the same :func:`decode_seconds` and
:func:`prefill_tok_s` that made the prediction. The fit minimises the squared log ratio of predicted
to measured (a relative error, alike for fast and slow runs) over the logs of the constants, so that
every constant stays positive and weighs alike; a pull toward the current constants (doubling one
costs what a miss of the measurements' noise does: :func:`prior_weight`) keeps what the runs cannot
see where it was: two runs move what they can see and leave the rest.

The error a calibration reports is leave-one-run-out: each run predicted by a fit that did not see
it. Its stated uncertainty (a ~95% band, twice the RMS of those log errors, at least the noise
floor) is what a measurement is checked against. Pure: observations in, constants out.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import asdict, dataclass

import numpy as np

from moetune.plan.speed import SpeedConstants, Work, decode_seconds, prefill_tok_s

NOISE_FLOOR_PCT = 3.0  # no calibration claims to predict closer than a run repeats on a quiet machine
UNCALIBRATED_PCT = 50.0  # the stated uncertainty of the built-in constants
FITTED = (
    "token_overhead_us",
    "cpu_bw_eff",
    "gpu_bw_eff",
    "cpu_core_gbs",
    "split_us",
    "rpc_hop_us",
    "rpc_wake_us",
    "cpu_ctx_gflops_per_core",
    "gpu_ctx_tflops",
    "gpu_tflops",
    "cpu_gflops_per_core",
    "ik_cpu_gflops_per_core",
    "ubatch_overhead_us",
    "cpu_noflash_ctx_factor",
    "cpu_noflash_layer_us",
    "cpu_ctx_quant_factor",
    "cpu_ctx_quant_layer_us",
    "cpu_pp_ctx_gflops_per_core",
    "cpu_pp_noflash_ctx_factor",
    "cpu_pp_ctx_quant_factor",
    "cpu_repack_gain",
)
AT_MOST = {"cpu_bw_eff": 1.0, "gpu_bw_eff": 1.0}  # a share of the bandwidth


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    run: int  # the run it came from (leave-one-out leaves runs out, not single workloads)
    work: Work  # what the plan asked of the hardware
    depth: int  # context depth the PP measurement starts from
    measured_tg: float | None  # tokens/s
    measured_pp: float | None = None
    prompt_tokens: int | None = None  # of the PP measurement (None: one full ubatch)
    # the mean context of the TG measurement's tokens (speed.decode_context; None: ``depth``)
    tg_depth: float | None = None

    @property
    def decode_depth(self) -> float:
        return self.depth if self.tg_depth is None else self.tg_depth


def predict_tg(o: Observation, k: SpeedConstants) -> float:
    return 1.0 / decode_seconds(o.work, o.decode_depth, k)


def predict_pp(o: Observation, k: SpeedConstants) -> float:
    return prefill_tok_s(o.work, k, o.prompt_tokens, o.depth)


def _with(base: SpeedConstants, logs: np.ndarray, names: tuple[str, ...] = FITTED) -> SpeedConstants:
    vals: dict[str, float] = {
        n: min(math.exp(float(v)), AT_MOST.get(n, math.inf)) for n, v in zip(names, logs, strict=True)
    }
    return SpeedConstants.from_json({**asdict(base), **vals})


def _residuals(obs: list[Observation], k: SpeedConstants) -> np.ndarray:
    r = []
    for o in obs:
        if o.measured_tg:
            r.append(math.log(predict_tg(o, k) / o.measured_tg))
        if o.measured_pp:
            r.append(math.log(predict_pp(o, k) / o.measured_pp))
    return np.array(r)


def prior_weight(noise_pct: float) -> float:
    """The weight of the pull toward the prior, per constant, on the square of its log change:
    doubling a constant costs what a miss of the measurements' noise does, so a constant moves far
    only for a gain the runs can tell from noise (a maximum a posteriori fit with log-normal noise
    of ``noise_pct`` on each measurement and a prior of a factor 2 on each constant). With a weight
    of 1e-5 (a doubling for a 0.2% gain), two runs of one placement pushed what they could not see:
    on the testbed, TG of the other 14 configurations was off by 10.9% median over all pairs, 7.3%
    with this weight."""
    return (math.log1p(noise_pct / 100) / math.log(2)) ** 2


def fit(
    obs: list[Observation],
    prior: SpeedConstants | None = None,
    iterations: int = 60,
    noise_pct: float = NOISE_FLOOR_PCT,
    *,
    names: tuple[str, ...] = FITTED,
) -> SpeedConstants:
    """The constants that best explain the measurements (Levenberg-Marquardt on log constants),
    measurements being off by ``noise_pct`` as runs repeat; ``names``: the constants it may move
    (the rest stay at the prior's)."""
    prior = prior or SpeedConstants()
    th0 = np.array([math.log(getattr(prior, n)) for n in names])
    w = math.sqrt(prior_weight(noise_pct))

    def res(th: np.ndarray) -> np.ndarray:
        return np.concatenate([_residuals(obs, _with(prior, th, names)), w * (th - th0)])

    th, lam = th0.copy(), 1e-2
    r = res(th)
    cost = float(r @ r)
    for _ in range(iterations):
        h = 1e-5
        jac = np.empty((len(r), len(th)))
        for j in range(len(th)):
            d = th.copy()
            d[j] += h
            jac[:, j] = (res(d) - r) / h
        g = jac.T @ r
        a = jac.T @ jac
        improved = False
        while lam < 1e8:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12), -g)
            cand = th + step
            # a share of the bandwidth cannot pass 1: hold the log there
            for j, n in enumerate(names):
                if n in AT_MOST:
                    cand[j] = min(cand[j], math.log(AT_MOST[n]))
            rc = res(cand)
            c = float(rc @ rc)
            if c < cost:
                th, r, cost, lam, improved = cand, rc, c, max(lam / 3, 1e-9), True
                break
            lam *= 4
        if not improved or float(np.max(np.abs(step))) < 1e-7:
            break
    return _with(prior, th, names)


def _abs_pct(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas * 100.0


def _errors(obs: list[Observation], k: SpeedConstants) -> tuple[list[float], list[float]]:
    tg = [_abs_pct(predict_tg(o, k), o.measured_tg) for o in obs if o.measured_tg]
    pp = [_abs_pct(predict_pp(o, k), o.measured_pp) for o in obs if o.measured_pp]
    return tg, pp


def _median(xs: list[float]) -> float | None:
    return round(float(np.median(xs)), 2) if xs else None


def _band(xs: list[float]) -> float | None:
    """Twice the RMS of the log errors, in percent, at least the noise floor."""
    if not xs:
        return None
    rms = math.sqrt(sum(math.log1p(x / 100.0) ** 2 for x in xs) / len(xs))
    return round(max(NOISE_FLOOR_PCT, (math.exp(2 * rms) - 1) * 100.0), 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    constants: SpeedConstants
    runs: tuple[int, ...]
    observations: int
    loo_tg_median_abs_pct: float | None  # leave-one-run-out error on the runs it was fitted on
    loo_pp_median_abs_pct: float | None
    before_tg_median_abs_pct: float | None  # the prior's error on the same observations
    before_pp_median_abs_pct: float | None
    uncertainty_tg_pct: float  # the stated ~95% band of a prediction
    uncertainty_pp_pct: float
    held: tuple[str, ...] = ()  # constants kept at the prior's values (what `moetune hw attention` measured)

    def to_json(self) -> dict[str, object]:
        return {
            "constants": asdict(self.constants),
            "runs": len(self.runs),
            "run_ids": list(self.runs),
            "observations": self.observations,
            "held": list(self.held),
            "error": {
                "tg_median_abs_pct": self.loo_tg_median_abs_pct,
                "pp_median_abs_pct": self.loo_pp_median_abs_pct,
                "tg_median_abs_pct_before": self.before_tg_median_abs_pct,
                "pp_median_abs_pct_before": self.before_pp_median_abs_pct,
            },
            "uncertainty": {"tg_pct": self.uncertainty_tg_pct, "pp_pct": self.uncertainty_pp_pct},
        }


def calibrate(
    obs: list[Observation], prior: SpeedConstants | None = None, *, held: Collection[str] = ()
) -> Calibration:
    """Fit :data:`FITTED` but ``held`` (kept at the prior's values: a plan puts the hardware file's
    measured CPU terms over any calibration, so fitting them would store values no plan uses), and
    score the fit leaving each run out."""
    prior = prior or SpeedConstants()
    names = tuple(n for n in FITTED if n not in held)
    runs = tuple(sorted({o.run for o in obs}))
    k = fit(obs, prior, names=names)
    loo_tg: list[float] = []
    loo_pp: list[float] = []
    if len(runs) > 1:
        for r in runs:
            kr = fit([o for o in obs if o.run != r], prior, names=names)
            tg, pp = _errors([o for o in obs if o.run == r], kr)
            loo_tg += tg
            loo_pp += pp
    before_tg, before_pp = _errors(obs, prior)
    return Calibration(
        constants=k,
        runs=runs,
        observations=len(obs),
        loo_tg_median_abs_pct=_median(loo_tg),
        loo_pp_median_abs_pct=_median(loo_pp),
        before_tg_median_abs_pct=_median(before_tg),
        before_pp_median_abs_pct=_median(before_pp),
        uncertainty_tg_pct=_band(loo_tg) or UNCALIBRATED_PCT,
        uncertainty_pp_pct=_band(loo_pp) or UNCALIBRATED_PCT,
        held=tuple(n for n in FITTED if n in held),
    )


def not_applicable(cal: Calibration) -> str | None:
    """Why a calibration must not replace the built-in constants for a hardware: its stated
    uncertainty is worse than theirs (:data:`UNCALIBRATED_PCT`); None when it may."""
    worse = [
        f"{fam} +/-{u:g}%"
        for fam, u in (("TG", cal.uncertainty_tg_pct), ("PP", cal.uncertainty_pp_pct))
        if u > UNCALIBRATED_PCT
    ]
    if not worse:
        return None
    return (
        f"its stated uncertainty ({', '.join(worse)}) is worse than the built-in constants' (+/-{UNCALIBRATED_PCT:g}%)"
    )
