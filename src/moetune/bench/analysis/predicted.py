"""The plan's prediction beside the measurement, and how close a run came to the hardware's limit.

A benchmark of a plan stores, for each workload, what the plan's speed model predicts for exactly
that workload (TG at its context depth, PP at the plan's ubatch) and each device's bytes read per
token; here those are set beside the measured medians (the error a calibration will learn from)
and turned into achieved decode bandwidth per device against the device's own (the hardware
file's figure). Pure functions over the run's summary (:class:`BenchSummary`, or its stored JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moetune.bench.analysis.bench_summary import BenchSummary
from moetune.jsonread import number
from moetune.plan.calibrate import UNCALIBRATED_PCT, Observation
from moetune.plan.speed import Work, at_depth

MIB = 1 << 20


def expected(predicted: dict[str, Any], workloads: list[tuple[str, int, int | None, float | None]]) -> dict[str, Any]:
    """What the plan predicts for each (workload name, context depth, prompt tokens or None, the
    mean context of its generated tokens or None): PP of the prompt on top of the depth, TG at that
    context (speed.decode_context)."""
    out = {}
    for name, depth, prompt, tg_depth in workloads:
        e = at_depth(predicted, depth, prompt, tg_depth)
        if e is not None:
            out[name] = e
    return out


def _err(pred: float | None, meas: float | None) -> float | None:
    if not pred or not meas:
        return None
    return (pred - meas) / meas * 100.0


def outside(error_pct: float | None, band_pct: float) -> bool:
    """Whether predicted/measured leaves the stated band: above 1 + b, or below 1 / (1 + b)."""
    if error_pct is None:
        return False
    ratio = 1 + error_pct / 100.0
    return ratio > 1 + band_pct / 100.0 or ratio < 1 / (1 + band_pct / 100.0)


def _typed(summary: BenchSummary | Mapping[str, object]) -> BenchSummary:
    return summary if isinstance(summary, BenchSummary) else BenchSummary.from_json(summary)


def versus(
    summary: BenchSummary | Mapping[str, object], expect: dict[str, Any], band: dict[str, float] | None = None
) -> dict[str, Any]:
    """Per workload: ``{tg: {predicted, measured, error_pct, band_pct, outside}, pp: {...}}`` (error
    = predicted over measured, in percent: +20 means the plan promised 20% more than it got;
    ``outside``: beyond the prediction's stated uncertainty)."""
    band = band or {}
    s = _typed(summary)
    out: dict[str, Any] = {}
    for name in s.workloads:
        e = expect.get(name)
        if e is None:
            continue
        row = {}
        for fam, key in (("tg", "tg_tok_s"), ("pp", "pp_tok_s")):
            meas = s.median(name, fam)
            err = _err(e[key], meas)
            b = float(band.get(f"{fam}_pct") or UNCALIBRATED_PCT)
            row[fam] = {
                "predicted": round(e[key], 3),
                "measured": meas,
                "error_pct": err,
                "band_pct": b,
                "outside": outside(err, b),
            }
        out[name] = row
    return out


def efficiency(expect_one: dict[str, Any], measured_tg: float | None) -> list[dict[str, Any]]:
    """Achieved decode bandwidth per device: the bytes it reads per token times the measured TG,
    against its own bandwidth."""
    if not measured_tg:
        return []
    out = []
    for d in expect_one.get("per_device", []):
        achieved = d["read_mib_per_token"] * MIB * measured_tg
        limit = float(d.get("bw_gbs") or 0.0) * 1e9
        out.append(
            {
                "device": d["device"],
                "bytes_per_s": round(achieved),
                "limit_bytes_per_s": round(limit),
                "pct": round(achieved / limit * 100.0, 1) if limit else None,
            }
        )
    return out


def report(summary: BenchSummary | Mapping[str, object], details: dict[str, Any]) -> dict[str, Any] | None:
    """The ``predicted`` / ``prediction_error`` / ``efficiency`` of a run whose details carry the
    plan's expectation (None for a run of a bare URL)."""
    expect = details.get("predicted")
    if not expect:
        return None
    s = _typed(summary)
    vs = versus(s, expect, details.get("prediction_uncertainty"))
    first = next(iter(vs), None)
    head = expect[first] if first else next(iter(expect.values()))
    meas_tg = s.median(first, "tg") if first else None
    return {
        "predicted": {"tg_tok_s": round(head["tg_tok_s"], 3), "pp_tok_s": round(head["pp_tok_s"], 3)},
        "prediction_error": vs,
        "efficiency": efficiency(head, meas_tg),
        "mispredicted": [
            {
                "workload": name,
                "family": fam,
                "error_pct": round(r[fam]["error_pct"], 1),
                "band_pct": r[fam]["band_pct"],
            }
            for name, r in vs.items()
            for fam in ("tg", "pp")
            if r[fam]["outside"]
        ],
    }


def observations(
    run_id: int, summary: BenchSummary | Mapping[str, object], details: dict[str, Any]
) -> list[Observation]:
    """The run's measurements as equations of the speed model: one per workload whose plan
    prediction carries the work (TG at its depth, PP over the prompt it processed)."""
    s = _typed(summary)
    out = []
    for name, e in (details.get("predicted") or {}).items():
        w = s.workloads.get(name)
        if w is None or not isinstance(e.get("work"), dict):
            continue
        tg, pp = s.median(name, "tg"), s.median(name, "pp")
        if tg or pp:
            prompt = w.prompt_n
            out.append(
                Observation(
                    run=run_id,
                    work=Work.from_json(e["work"]),
                    depth=int(e.get("depth") or 0),
                    measured_tg=tg,
                    measured_pp=pp,
                    prompt_tokens=int(prompt) if prompt else None,
                    tg_depth=number(e.get("tg_depth")),
                )
            )
    return out
