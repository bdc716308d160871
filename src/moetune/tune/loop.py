"""The tuner's loop: plan every candidate, launch the baseline, then launch -> bench -> refit ->
choose, until the budget is spent or no candidate expects to beat the best by more than the noise.

Every candidate is planned (and checked against the memory ledger) before anything starts; one
that does not fit is never launched. Each launch is an ordinary benchmark of an ordinary plan file,
stored in the history under the tune's id (a sweep id derived from what defines the search), so
running the same command again resumes: measured candidates are not launched again, and the
candidates that failed (their diagnosis kept in the sweep record) are not retried. After each
measurement the speed constants are refitted to every measurement of this search (starting from
the stored calibration for this hardware, if any), and the search's belief is corrected by what
the model still misses (:mod:`moetune.plan.tune`). The winner must beat the baseline by the
comparison rule of `compare` (CI of the ratio of medians excludes 1, change at least 3%); when
none does, the baseline stays.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from moetune.bench.analysis.predicted import observations
from moetune.bench.analysis.single import bench_metrics
from moetune.bench.analysis.stats import FASTER, difference
from moetune.bench.analysis.summary import run_summary
from moetune.bench.single.runner import BenchOptions, Progress, bench_target
from moetune.bench.single.workloads import Workload
from moetune.bench.target import plan_target
from moetune.engine import registry
from moetune.errors import InputError, MoetuneError
from moetune.hardware import inventory
from moetune.kinds import RunStatus
from moetune.model.profile import is_url, open_model
from moetune.monitor.snapshot import Snapshot
from moetune.paths import data_dir
from moetune.plan import tune as core
from moetune.plan.calibrate import fit
from moetune.plan.plan import Plan, ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.plan.speed import SpeedConstants, Work, decode_seconds, prefill_tok_s
from moetune.planfiles import absolute, calibration_for, document
from moetune.store import calibrations
from moetune.store.db import ResultsDB
from moetune.tune.engine_axes import check_engine_axes, engine_options
from moetune.tune.history import calibrate_and_save, gather

Status = Callable[[str], None]
MIN_NOISE = 0.01  # the search stops when no candidate expects to gain this share, at least


@dataclass(frozen=True, slots=True)
class TuneRequest:
    hw: str
    model: str
    base: Settings  # the user's plan options (the baseline's)
    workload: Workload
    options: BenchOptions
    strategy: str = "auto"
    engine: str | None = None
    port: int = 8080
    objective: str = "tg"
    budget: int = 5
    axes: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # overrides of default_axes, by field name
    launch_timeout_s: float = 600.0


@dataclass
class Entry:
    """One candidate: its plan, what the model says, and what happened."""

    candidate: core.Candidate
    plan: Plan
    doc: dict[str, Any]
    work: Work
    cpu_expert_share: float
    run: int | None = None
    failed: str | None = None

    @property
    def fits(self) -> bool:
        return self.plan.fits


@dataclass
class TuneResult:
    tune_id: str
    objective: str
    entries: list[Entry]
    baseline: int  # index into entries
    best: int
    launches: int
    stopped: str
    constants: SpeedConstants
    values: dict[int, list[float]]  # measured objective samples per entry (higher is better)
    summaries: dict[int, dict[str, Any]]
    verdicts: dict[int, str]
    plan_dir: Path
    workload: Workload

    def plan_path(self, i: int) -> Path:
        return self.plan_dir / f"{_slug(self.entries[i].candidate.label)}.json"


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label)


def objective_value(objective: str, tg: float | None, pp: float | None, prompt_tokens: int) -> float | None:
    """The objective as a rate, higher is better: TG or PP tokens/s; for ttft, first tokens per
    second of a request (1 / (prompt/PP + 1/TG))."""
    if objective == "tg":
        return tg
    if objective == "pp":
        return pp
    if not tg or not pp:
        return None
    return 1.0 / (prompt_tokens / pp + 1.0 / tg)


def predicted_rates(e: Entry, k: SpeedConstants, w: Workload) -> tuple[float, float]:
    return 1.0 / decode_seconds(e.work, w.depth, k), prefill_tok_s(e.work, k, w.pp_tokens)


def _tune_id(req: TuneRequest, plan: Plan, labels: list[str]) -> str:
    key = {"model": [str(f) for f in plan.main.spec.model.files], "hw": plan.hw.name or plan.hw.source or req.hw,
           "engine": req.engine, "objective": req.objective, "base": asdict(req.base), "strategy": req.strategy,
           "workload": req.workload.to_json(), "port": req.port, "candidates": labels,
           "options": {k: v for k, v in asdict(req.options).items() if k in ("repeats", "warmup")}}
    return "tu-" + hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _cpu_share(plan: Plan) -> float:
    experts = plan.main.placement.experts()
    sizes = {t.name: t.nbytes for t in plan.main.spec.model.tensors if t.name in experts}
    total = sum(sizes.values())
    return sum(b for n, b in sizes.items() if experts[n] == "CPU") / total if total else 0.0


def candidates(req: TuneRequest, status: Status) -> tuple[list[Entry], SpeedConstants]:
    """Every candidate planned (the baseline first), and the constants to start from (the stored
    calibration for this hardware, else the built-in ones)."""
    hw = inventory.load(req.hw)
    engine, kind = registry.resolve(req.engine)
    base = replace(req.base, engine=kind)
    model = req.model if is_url(req.model) else absolute(req.model)
    profile = open_model(model)
    calib = calibration_for(hw, kind)
    k = SpeedConstants.from_json(calib["constants"]) if calib else SpeedConstants()
    moe_layers = len({t.layer for t in profile.tensors if t.is_expert})
    options = engine_options(engine, kind, profile.is_mla)
    check_engine_axes(req.axes, base, options, kind)
    axes = core.default_axes(base, req.strategy, hw.local.cores, moe_layers, len(hw.accelerators()), options)
    axes = replace(axes, **req.axes) if req.axes else axes
    baseline = core.Candidate.of(req.strategy, base)
    cands = [baseline, *(c for c in core.space(axes, base, mla_model=profile.is_mla) if c != baseline)]
    status(f"planning {len(cands)} candidates")
    entries = []
    for c in cands:
        try:
            s = c.settings(base)
            plan = make_plan([ServiceSpec("main", profile, s, c.strategy, req.port, engine=engine)], hw, k)
        except InputError as e:
            if c == baseline:
                raise
            status(f"{c.label}: skipped ({e})")
            continue
        doc = document(plan, engine, calib, [req.model])
        doc["label"] = c.label
        entries.append(Entry(c, plan, doc, plan.main.prediction.work, _cpu_share(plan)))
    return entries, k


def tune(db: ResultsDB, req: TuneRequest, *, status: Status,
         progress_for: Callable[[str], Progress | None] | None = None,
         on_snapshot: Callable[[Snapshot], None] | None = None) -> TuneResult:
    if req.objective not in core.OBJECTIVES:
        raise InputError(f"--objective {req.objective}: choose {', '.join(core.OBJECTIVES)}")
    entries, prior = candidates(req, status)
    if not entries[0].fits:
        raise InputError(f"the baseline ({entries[0].candidate.label}) does not fit: "
                         f"{entries[0].plan.shortfalls[0].message}",
                         hint="`moetune plan` with the same options shows why; give options that fit "
                              "(a smaller --ctx or -ub, --strategy cpu-moe) as the baseline")
    tid = _tune_id(req, entries[0].plan, [e.candidate.label for e in entries])
    feats = np.array([core.features(e.candidate, e.cpu_expert_share, entries[0].plan.hw.local.cores)
                      for e in entries])
    plan_dir = data_dir() / "tune" / tid
    plan_dir.mkdir(parents=True, exist_ok=True)
    spec: dict[str, Any] = {"kind": "tune", "objective": req.objective, "hw": req.hw, "model": req.model,
                            "workload": req.workload.to_json(), "candidates": [e.candidate.label for e in entries],
                            "failed": {}}
    if not db.create_sweep(tid, spec):
        spec = db.sweep(tid) or spec
        status(f"resuming tune {tid}")
    failed: dict[str, str] = dict(spec.get("failed") or {})
    by_label = {e.candidate.label: i for i, e in enumerate(entries)}
    for r in db.runs(sweep_id=tid):
        if r.status == RunStatus.DONE and r.label in by_label and entries[by_label[r.label]].run is None:
            entries[by_label[r.label]].run = r.id
    for label, why in failed.items():
        if label in by_label:
            entries[by_label[label]].failed = why
    values: dict[int, list[float]] = {}
    summaries: dict[int, dict[str, Any]] = {}
    wname = req.workload.name

    def measured(i: int) -> None:
        run = entries[i].run
        assert run is not None
        samples = db.samples(run)
        summaries[i] = run_summary(samples)
        ms = bench_metrics(samples)
        tg, pp = ms.get(f"tg:{wname}"), ms.get(f"pp:{wname}")
        if req.objective == "tg":
            values[i] = list(tg.values) if tg else []
        elif req.objective == "pp":
            values[i] = list(pp.values) if pp else []
        else:
            values[i] = [v for a, b in zip(tg.values if tg else (), pp.values if pp else (), strict=False)
                         if (v := objective_value("ttft", a, b, req.workload.pp_tokens)) is not None]

    def refit() -> SpeedConstants:
        obs = [o for i in summaries for o in observations(entries[i].run or 0, summaries[i],
                                                          dict(db.run(entries[i].run or 0).meta.details))]
        return fit(obs, prior) if obs else prior

    for i, e in enumerate(entries):
        if e.run is not None:
            measured(i)
    k = refit()
    launches = sum(1 for e in entries if e.run is not None or e.failed is not None)
    stopped = "budget spent"
    while True:
        if launches >= req.budget:
            break
        open_ = [i for i, e in enumerate(entries) if e.fits and e.run is None and e.failed is None]
        if not open_:
            stopped = "every candidate that fits was tried"
            break
        if entries[0].run is None and entries[0].failed is None:
            nxt = 0
        else:
            meas = _measurements(values)
            if not meas:
                nxt = max(open_, key=lambda j: _objective(entries[j], k, req))
            else:
                preds = [_objective(e, k, req) for e in entries]
                b = core.belief(preds, feats, meas)
                best = max(statistics.median(v) for v in values.values() if v)
                noise = max(MIN_NOISE, statistics.median(m.rel_se for m in meas))
                choice, gain = core.choose(b, best, open_, noise)
                if choice is None:
                    stopped = (f"no candidate expects to gain more than the noise ({gain * 100:.1f}% < "
                               f"{noise * 100:.1f}%)")
                    break
                nxt = choice
                status(f"next: {entries[nxt].candidate.label} (expects {b.value(nxt):.4g}, gain {gain * 100:.1f}%)")
        e = entries[nxt]
        path = plan_dir / f"{_slug(e.candidate.label)}.json"
        path.write_text(json.dumps(e.doc, indent=2))
        launches += 1
        status(f"launch {launches}/{req.budget}: {e.candidate.label}")
        try:
            e.run = bench_target(db, plan_target(path), [req.workload], req.options, label=e.candidate.label,
                                 sweep_id=tid, launch_timeout_s=req.launch_timeout_s, status=status,
                                 progress_for=progress_for, on_snapshot=on_snapshot)
        except MoetuneError as err:  # out of memory at launch, say: recorded, skipped, the search goes on
            e.failed = str(err)
            failed[e.candidate.label] = e.failed
            db.update_sweep(tid, {**spec, "failed": failed})
            status(f"{e.candidate.label}: failed: {str(err).splitlines()[0]}")
            continue
        measured(nxt)
        k = refit()
    meas = _measurements(values)
    smooth = core.belief([_objective(e, k, req) for e in entries], feats, meas) if meas else None
    verdicts, best = _verdicts(entries, values, smooth)
    result = TuneResult(tid, req.objective, entries, 0, best, launches, stopped, k, values, summaries, verdicts,
                        plan_dir, req.workload)
    if not result.plan_path(best).exists():
        result.plan_path(best).write_text(json.dumps(entries[best].doc, indent=2))
    _save_calibration(db, calibrations.plan_key(entries[0].doc))
    return result


def _objective(e: Entry, k: SpeedConstants, req: TuneRequest) -> float:
    tg, pp = predicted_rates(e, k, req.workload)
    return objective_value(req.objective, tg, pp, req.workload.pp_tokens) or 0.0


def _measurements(values: dict[int, list[float]]) -> list[core.Measured]:
    """Each measured candidate's median and its relative standard error (stdev / sqrt(n), over the median)."""
    out = []
    for i, v in values.items():
        if not v:
            continue
        med = statistics.median(v)
        se = statistics.stdev(v) / len(v) ** 0.5 / med if len(v) > 1 and med else 0.1
        out.append(core.Measured(i, med, se))
    return out


def _verdicts(entries: list[Entry], values: dict[int, list[float]],
              smooth: core.Belief | None) -> tuple[dict[int, str], int]:
    """Each candidate's verdict, and the best: of the measured candidates that beat the baseline (the
    rule of `compare`), the one the search believes fastest (its measurement pooled with its
    neighbours': one lucky launch does not win), else the baseline; with no baseline measured (it
    failed), the one believed fastest."""
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
        elif not base:
            out[i] = "measured"
            winners.append((float(smooth.mean[i]) if smooth else statistics.median(values[i]), i))
        else:
            d = difference(base, values[i], higher_is_better=True)
            out[i] = f"{d.verdict} ({d.change_pct:+.1f}% vs baseline)"
            if d.verdict == FASTER:
                winners.append((float(smooth.mean[i]) if smooth else statistics.median(values[i]), i))
    best = max(winners)[1] if winners else 0
    if best != 0:
        out[best] = f"best, {out[best]}"
    elif base:
        out[0] = "baseline, best (nothing beat it)" if len(values) > 1 else "baseline"
    return out, best


def _save_calibration(db: ResultsDB, key: tuple[str | None, str]) -> None:
    """Every measurement of this hardware in the history, this search's included, as its calibration
    (what `moetune calibrate` would keep), so the next `plan` on it predicts from them."""
    obs = gather(db).get(key, [])
    if len({o.run for o in obs}) >= 2:
        calibrate_and_save(key, obs)
