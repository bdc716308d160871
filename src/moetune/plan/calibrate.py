"""Calibrating the decode speed model from measured runs: least squares with a prior.

Per token, the model's decode time is linear in seven constants: a fixed cost, the inverse
efficiencies of CPU and accelerator memory reads (bytes read at full bandwidth, divided by the
efficiency), a cost per graph split and one per RPC hop, and the inverse throughputs of attention
over the context on the CPU (per core) and on accelerators; what else it adds (activations over RPC
links) is known and kept as it was predicted. Every measured TG of a benchmarked plan, at its depth,
is one equation. With few runs the system is underdetermined, so the fit is pulled toward the
current constants (ridge on relative changes): two runs move what they can see and leave the rest.
Pure: observations in, constants and their leave-one-out error out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from moetune.plan.speed import SpeedConstants

MIB = 1 << 20
PRIOR_WEIGHT = 1e-6  # ridge weight per constant, on its relative change from the prior
# (name, lower bound) of the fitted unknowns, in the order of the design matrix
UNKNOWNS = (("token_overhead_us", 1.0), ("cpu_bw_eff", 0.02), ("gpu_bw_eff", 0.02), ("split_us", 0.1),
            ("rpc_hop_us", 0.1), ("cpu_ctx_gflops_per_core", 0.05), ("gpu_ctx_tflops", 0.05))


@dataclass(frozen=True, slots=True)
class Observation:
    run: int  # the run it came from (leave-one-out leaves runs out, not single workloads)
    measured_tg: float  # tokens/s
    expect: dict[str, Any]  # the plan's prediction for the workload (speed.at_depth)


def _row(o: Observation) -> tuple[np.ndarray, float]:
    """The design row (seconds per token per unit of each unknown's term) and the known remainder."""
    cpu = sum(d["read_mib_per_token"] * MIB / (float(d["bw_gbs"]) * 1e9) for d in o.expect["per_device"]
              if d["device"] == "CPU" and d.get("bw_gbs"))
    acc = sum(d["read_mib_per_token"] * MIB / (float(d["bw_gbs"]) * 1e9) for d in o.expect["per_device"]
              if d["device"] != "CPU" and d.get("bw_gbs"))
    splits, hops = float(o.expect.get("graph_splits") or 0), float(o.expect.get("rpc_hops") or 0)
    cpu_ctx = sum(d.get("ctx_gflop_per_token", 0.0) / d["cores"] for d in o.expect["per_device"]
                  if d["device"] == "CPU" and d.get("cores"))
    acc_ctx = sum(d.get("ctx_gflop_per_token", 0.0) for d in o.expect["per_device"] if d["device"] != "CPU")
    # unknowns: us, 1/eff, 1/eff, us, us, core-s per GFLOP, s per GFLOP (x 1000: per TFLOP)
    x = np.array([1e-6, cpu, acc, splits * 1e-6, hops * 1e-6, cpu_ctx, acc_ctx / 1000])
    k = SpeedConstants(**{n: v for n, v in (o.expect.get("constants") or {}).items()
                          if n in SpeedConstants.__dataclass_fields__})
    known = 1.0 / o.expect["tg_tok_s"] - float(x @ _theta(k))  # e.g. activations crossing RPC links
    return x, known


def _theta(k: SpeedConstants) -> np.ndarray:
    return np.array([k.token_overhead_us, 1 / k.cpu_bw_eff, 1 / k.gpu_bw_eff, k.split_us, k.rpc_hop_us,
                     1 / k.cpu_ctx_gflops_per_core, 1 / k.gpu_ctx_tflops])


def _constants(base: SpeedConstants, th: np.ndarray) -> SpeedConstants:
    lo = {n: b for n, b in UNKNOWNS}
    over = max(th[0], lo["token_overhead_us"])
    cpu_eff = min(1.0, max(1 / max(th[1], 1e-9), lo["cpu_bw_eff"]))
    gpu_eff = min(1.0, max(1 / max(th[2], 1e-9), lo["gpu_bw_eff"]))
    return replace(base, token_overhead_us=float(over), cpu_bw_eff=float(cpu_eff), gpu_bw_eff=float(gpu_eff),
                   split_us=float(max(th[3], lo["split_us"])), rpc_hop_us=float(max(th[4], lo["rpc_hop_us"])),
                   cpu_ctx_gflops_per_core=float(max(1 / max(th[5], 1e-9), lo["cpu_ctx_gflops_per_core"])),
                   gpu_ctx_tflops=float(max(1 / max(th[6], 1e-9), lo["gpu_ctx_tflops"])))


def fit(obs: list[Observation], prior: SpeedConstants | None = None) -> SpeedConstants:
    """The constants that best explain the measured TGs (relative errors), pulled toward ``prior``.
    Solved for each constant's multiple of its prior value, so every unknown weighs alike: a data
    row's entries are the shares of the token's time each term takes."""
    prior = prior or SpeedConstants()
    th0 = _theta(prior)
    rows, targets = [], []
    for o in obs:
        x, known = _row(o)
        t = 1.0 / o.measured_tg
        rows.append(x * th0 / t)
        targets.append((t - known) / t)
    w = np.sqrt(PRIOR_WEIGHT)
    for j in range(len(th0)):
        e = np.zeros(len(th0))
        e[j] = w
        rows.append(e)
        targets.append(w)
    m, *_ = np.linalg.lstsq(np.array(rows), np.array(targets), rcond=None)
    return _constants(prior, th0 * m)


def predict_tg(o: Observation, k: SpeedConstants) -> float:
    x, known = _row(o)
    return 1.0 / (known + float(x @ _theta(k)))


@dataclass(frozen=True, slots=True)
class Calibration:
    constants: SpeedConstants
    runs: tuple[int, ...]
    observations: int
    loo_tg_median_abs_pct: float | None  # leave-one-run-out error on the runs it was fitted on
    before_tg_median_abs_pct: float  # the prior's error on the same observations

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {"constants": asdict(self.constants), "runs": len(self.runs), "run_ids": list(self.runs),
                "observations": self.observations,
                "error": {"tg_median_abs_pct": self.loo_tg_median_abs_pct, "pp_median_abs_pct": None,
                          "tg_median_abs_pct_before": self.before_tg_median_abs_pct}}


def calibrate(obs: list[Observation], prior: SpeedConstants | None = None) -> Calibration:
    prior = prior or SpeedConstants()
    runs = tuple(sorted({o.run for o in obs}))
    k = fit(obs, prior)
    errs = []
    if len(runs) > 1:
        for r in runs:
            kr = fit([o for o in obs if o.run != r], prior)
            errs += [abs(predict_tg(o, kr) - o.measured_tg) / o.measured_tg * 100 for o in obs if o.run == r]
    before = [abs(predict_tg(o, prior) - o.measured_tg) / o.measured_tg * 100 for o in obs]
    return Calibration(k, runs, len(obs), round(float(np.median(errs)), 2) if errs else None,
                       round(float(np.median(before)), 2))
