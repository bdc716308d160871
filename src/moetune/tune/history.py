"""Calibrations from the history: every benchmark of a plan, grouped by the hardware and engine
kind its plan was made for, fitted and stored (`moetune calibrate`, and `moetune tune` after its
search). Contended runs (another program took the CPU while they measured: :mod:`moetune.contention`)
are left out unless asked for, and a calibration whose stated uncertainty is worse than the
built-in constants' is not stored (:func:`moetune.plan.calibrate.not_applicable`)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from moetune.bench.analysis.predicted import observations
from moetune.bench.analysis.summary import bench_summary
from moetune.kinds import RunKind
from moetune.plan.calibrate import Calibration, Observation, calibrate, not_applicable
from moetune.plan.speed import SpeedConstants
from moetune.store import calibrations
from moetune.store.db import ResultsDB, Run

Key = tuple[str | None, str]  # (hardware, engine kind)


def gather(
    db: ResultsDB, runs: list[Run] | None = None, *, include_contended: bool = False, left_out: list[Run] | None = None
) -> dict[Key, list[Observation]]:
    """The runs' measurements (default: every bench run) as speed-model equations, per calibration
    key; contended runs are left out (appended to ``left_out``) unless ``include_contended``."""
    groups: dict[Key, list[Observation]] = {}
    for r in db.runs(RunKind.BENCH) if runs is None else runs:
        plan = r.meta.plan
        if plan and not include_contended and r.contention is not None and r.contention.contended:
            if left_out is not None:
                left_out.append(r)
            continue
        obs = observations(r.id, bench_summary(db.samples(r.id)), dict(r.meta.details)) if plan else []
        if plan and obs:
            groups.setdefault(calibrations.plan_key(plan), []).extend(obs)
    return groups


def placements(db: ResultsDB, run_ids: tuple[int, ...]) -> int:
    """How many distinct placements (strategy, override rules, tensor split) the runs' plans had."""
    seen = set()
    for rid in run_ids:
        services = (db.run(rid).meta.plan or {}).get("services") or [{}]
        s = services[0]
        seen.add(json.dumps([s.get("strategy"), s.get("override_rules"), s.get("tensor_split")], default=str))
    return len(seen)


@dataclass(frozen=True, slots=True)
class PlanPrior:
    """What a calibration starts from: the constants the newest of the runs' plans was predicted
    with (the hardware's measured CPU terms and the calibration it had, if any), and the names of
    those measured terms (``cpu.speed``, `moetune hw attention`), which a plan puts over any
    calibration and which are therefore held."""

    constants: SpeedConstants
    measured: tuple[str, ...] = ()


def plan_prior(db: ResultsDB, obs: list[Observation]) -> PlanPrior:
    """The :class:`PlanPrior` of the runs; the built-in constants for runs stored without them."""
    for rid in sorted({o.run for o in obs}, reverse=True):
        run = db.run(rid)
        for e in (run.meta.details.get("predicted") or {}).values():
            if isinstance(e, dict) and isinstance(e.get("constants"), dict):
                measured = (run.meta.plan or {}).get("speed_cpu_measured") or {}
                return PlanPrior(SpeedConstants.from_json(e["constants"]), tuple(sorted(measured)))
    return PlanPrior(SpeedConstants())


def calibrate_and_save(
    key: Key,
    obs: list[Observation],
    prior: PlanPrior | None = None,
    *,
    placements: int | None = None,
    left_out: int = 0,
    force: bool = False,
) -> tuple[Calibration, dict[str, object]]:
    """Fit, and store as the calibration for ``key`` unless its stated uncertainty is worse than
    the built-in one (``force`` stores it anyway); the calibration and its entry (``applied``, and
    ``not_applied``: why not)."""
    cal = calibrate(obs, prior.constants, held=prior.measured) if prior else calibrate(obs)
    doc = {**cal.to_json(), "placements": placements, "left_out_contended": left_out}
    why = None if force else not_applicable(cal)
    if why is not None:
        return cal, {**doc, "hardware": key[0], "engine": key[1], "applied": False, "not_applied": why}
    return cal, {**calibrations.save(key[0], key[1], doc), "applied": True, "not_applied": None}
