"""Calibrations from the history: every benchmark of a plan, grouped by the hardware and engine
kind its plan was made for, fitted and stored (`moetune calibrate`, and `moetune tune` after its
search)."""

from __future__ import annotations

from typing import Any

from moetune.bench.analysis.predicted import observations
from moetune.bench.analysis.summary import run_summary
from moetune.kinds import RunKind
from moetune.plan.calibrate import Calibration, Observation, calibrate
from moetune.plan.speed import SpeedConstants
from moetune.store import calibrations
from moetune.store.db import ResultsDB, Run

Key = tuple[str | None, str]  # (hardware, engine kind)


def gather(db: ResultsDB, runs: list[Run] | None = None) -> dict[Key, list[Observation]]:
    """The runs' measurements (default: every bench run) as speed-model equations, per calibration key."""
    groups: dict[Key, list[Observation]] = {}
    for r in db.runs(RunKind.BENCH) if runs is None else runs:
        plan = r.meta.plan
        obs = observations(r.id, run_summary(db.samples(r.id)), dict(r.meta.details)) if plan else []
        if plan and obs:
            groups.setdefault(calibrations.plan_key(plan), []).extend(obs)
    return groups


def calibrate_and_save(key: Key, obs: list[Observation], prior: SpeedConstants | None = None) -> tuple[Calibration, dict[str, Any]]:
    """Fit, store as the calibration for ``key``; the calibration and the stored entry."""
    cal = calibrate(obs, prior)
    return cal, calibrations.save(key[0], key[1], cal.to_json())
