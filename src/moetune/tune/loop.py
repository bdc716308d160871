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
none does, the baseline stays. Beside the baseline the engine with no tuning flags is measured once
(:mod:`moetune.tune.defaults`), and with ``--objective tg`` a candidate that loses more than
``--max-pp-loss`` of either baseline's PP cannot win.

With ``--objective goodput`` each candidate is planned with one slot per stream and measured by
serve-bench at the search's concurrency (:mod:`moetune.tune.goodput`: the samples are completion
windows), and the search corrects the serving prediction of :mod:`moetune.plan.serving`. The speed
constants are not refitted from those runs (the calibration reads single-stream benchmarks): the
stored calibration, if any, is the prior, and the Gaussian process learns what it misses.

With ``--objective replay:FILE`` or ``turn`` (:mod:`moetune.tune.workload`) each candidate, and the
engine defaults, is planned with a slot per request the workload has in flight, launched, and
measured on the user's workload: a pass's total time over a recorded session, or an agent turn's
time. The search ranks the reciprocals (passes or turns per second), the speed model's expected
time is the prior, and the constants are not refitted from those runs either.

With ``--objective weighted:SERVICE=METRIC:WEIGHT,...`` (:mod:`moetune.tune.weighted`) each
candidate's layout is measured by the under-load path (the tuned service's single stream and every
``--with-load`` service's load at once) and ranked by its score, the weighted sum of its services'
figures each relative to the baseline's; the scores are computed again after every measurement
(they are relative to the baseline's figures), the prior is the score the speed model expects of
the tuned service's terms (the others' as the baseline's), and there is no engine-defaults run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from moetune.bench.analysis.bench_summary import BenchSummary
from moetune.bench.analysis.predicted import observations
from moetune.bench.analysis.single import bench_metrics
from moetune.bench.analysis.summary import bench_summary
from moetune.bench.serve.loadspec import ServiceLoad
from moetune.bench.single.runner import BenchOptions, Progress, bench_target
from moetune.bench.single.workloads import Workload
from moetune.bench.target import plan_target, with_transport
from moetune.errors import InputError, MoetuneError
from moetune.hardware.inventory import Inventory
from moetune.kinds import EngineKind, RunStatus
from moetune.model.profile import open_model
from moetune.monitor.snapshot import Snapshot
from moetune.paths import data_dir
from moetune.plan import tune as core
from moetune.plan.calibrate import fit
from moetune.plan.placement import Placement, accelerator_expert_layers
from moetune.plan.plan import Plan, ServiceSpec, make_plan
from moetune.plan.serving import ServeLoad, expected_goodput, predict_serving, slotted
from moetune.plan.settings import Settings
from moetune.plan.speed import SpeedConstants, Work, from_work
from moetune.planfiles import document, layout_services, model_path, read_inputs, routing_for
from moetune.store import calibrations
from moetune.store.db import ResultsDB
from moetune.tune import defaults as dflt
from moetune.tune import goodput as gp
from moetune.tune import under_load as ul
from moetune.tune import weighted as wt
from moetune.tune import workload as wl
from moetune.tune.engine_axes import check_engine_axes, engine_options
from moetune.tune.history import calibrate_and_save, gather, placements, plan_prior
from moetune.tune.quiet import QuietGate
from moetune.tune.record import TuneRecord
from moetune.tune.transport_axis import check_transport_axis, refuse_unbuilt
from moetune.tune.verdict import measurements, verdicts

Status = Callable[[str], None]
NO_SCORE = "no weighted score"
MIN_NOISE = 0.01  # the search stops when no candidate expects to gain this share, at least


@dataclass(frozen=True, slots=True, kw_only=True)
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
    serve: ServeLoad | None = None  # the load of --objective goodput
    routing: Path | None = None  # an imatrix GGUF: the model's measured expert routing
    transport: str = "tcp"  # the baseline's RPC transport (``--transport``; the axis: axes["transports"])
    rdma_dev: str | None = None
    max_pp_loss: float = dflt.MAX_PP_LOSS  # --objective tg: the share of the baselines' PP a winner may lose
    layout: Path | None = None  # tune one service of this layout (``service``), the others' placements kept
    service: str | None = None
    work: wl.WorkObjective | None = None  # the workload of --objective replay:FILE and turn
    with_load: tuple[ServiceLoad, ...] = ()  # the layout's other services' loads, on while a candidate is measured
    weighted: wt.Weighted | None = None  # --objective weighted:...: several services' figures in one score
    confirm: int = 0  # after the search, the best this many measured launched once more each (--confirm)


@dataclass(kw_only=True)
class Entry:
    """One candidate: its plan, what the model says, and what happened."""

    candidate: core.Candidate
    plan: Plan
    doc: dict[str, Any]
    work: Work
    cpu_expert_share: float
    run: int | None = None
    failed: str | None = None
    confirmed: list[int] = field(default_factory=list)  # its runs of the --confirm round

    @property
    def fits(self) -> bool:
        return self.plan.fits

    @property
    def runs(self) -> tuple[int, ...]:
        """Its launches' runs: the search's, then the confirmation's."""
        return () if self.run is None else (self.run, *self.confirmed)


@dataclass(kw_only=True)
class TuneResult:
    tune_id: str
    objective: str
    entries: list[Entry]
    baseline: int  # index into entries
    best: int | None  # None: nothing was measured (every launch failed)
    launches: int
    stopped: str
    constants: SpeedConstants
    values: dict[int, list[float]]  # measured objective samples per entry (higher is better)
    summaries: dict[int, BenchSummary]
    verdicts: dict[int, str]
    plan_dir: Path
    workload: Workload
    serve: ServeLoad | None = None
    goodputs: dict[int, gp.Goodput] = field(default_factory=dict)  # measured, with --objective goodput
    defaults: dflt.Defaults | None = None  # the engine-defaults baseline (single-stream objectives)
    rates: dict[int, dflt.Rates] = field(default_factory=dict)  # measured TG and PP, per entry
    defaults_rates: dflt.Rates = field(default_factory=dflt.Rates)
    max_pp_loss: float = dflt.MAX_PP_LOSS
    work: wl.WorkObjective | None = None  # --objective replay:FILE or turn
    works: dict[int, wl.Measured] = field(default_factory=dict)  # measured, with a workload objective
    defaults_work: wl.Measured | None = None  # the engine defaults' measurement of the workload
    defaults_values: tuple[float, ...] = ()  # the engine defaults' objective samples (higher is better)
    loaded: dict[int, ul.Measured] = field(default_factory=dict)  # measured under --with-load, per entry
    with_load: tuple[ServiceLoad, ...] = ()  # the other services' loads they were measured under
    weighted: wt.Weighted | None = None
    scores: dict[int, wt.Score] = field(default_factory=dict)  # each measured candidate's weighted score
    # --confirm: each launch's median (the search's first) of those launched again: tok/s, or a workload's seconds
    confirmed: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def plan_path(self, i: int) -> Path:
        return plan_file(self.plan_dir, self.entries[i].candidate.label)

    @functools.cached_property
    def defaults_win(self) -> str | None:
        """How the engine defaults beat the search's best, where they do (:func:`dflt.beat_best`);
        under ``--objective tg`` only within ``--max-pp-loss`` of the baseline's PP. None: the best
        stands, as it always does for a layout's service (the defaults' plan is its model alone).
        Computed once (a bootstrap; the report reads it many times): a new best is a new result
        (``dataclasses.replace``, as the quality guard makes it)."""
        if self.defaults is None or self.defaults.run is None or self.best is None:
            return None
        if len(self.entries[0].plan.services) > 1:
            return None
        won = dflt.beat_best(self.values.get(self.best, []), self.defaults_values, as_time=self.work is not None)
        base_pp, pp = self.rates[0].median("pp") if 0 in self.rates else None, self.defaults_rates.median("pp")
        if won and self.objective == "tg" and base_pp and pp:
            return None if dflt.pp_rejections({0: pp}, {"baseline": base_pp}, self.max_pp_loss) else won
        return won

    def recommended_path(self) -> Path | None:
        """The plan to run: the engine defaults' where they beat the best, else the best's (None:
        nothing was measured)."""
        if self.best is None:
            return None
        return self.plan_dir / dflt.PLAN_FILE if self.defaults_win else self.plan_path(self.best)


def plan_file(plan_dir: Path, label: str) -> Path:
    """Where a search keeps a candidate's plan document."""
    return plan_dir / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', label)}.json"


def objective_value(objective: str, tg: float | None, pp: float | None, prompt_tokens: int) -> float | None:
    """A single-stream objective as a rate, higher is better: TG or PP tokens/s; for ttft, first
    tokens per second of a request (1 / (prompt/PP + 1/TG)). (Goodput is serve-bench's.)"""
    if objective == "tg":
        return tg
    if objective == "pp":
        return pp
    if not tg or not pp:
        return None
    return 1.0 / (prompt_tokens / pp + 1.0 / tg)


def predicted_rates(e: Entry, k: SpeedConstants, w: Workload) -> tuple[float, float]:
    p = from_work(e.work, k, w.depth, w.pp_tokens, tg_depth=w.tg_depth)
    return p.tg_tok_s, p.pp_tok_s


def _tune_id(req: TuneRequest, plan: Plan, labels: list[str]) -> str:
    key: dict[str, object] = {
        "model": [str(f) for f in plan.main.spec.model.files],
        "hw": plan.hw.name or plan.hw.source or req.hw,
        "layout": None if req.layout is None else [hashlib.sha256(req.layout.read_bytes()).hexdigest(), req.service],
        "engine": req.engine,
        "objective": req.objective,
        "base": asdict(req.base),
        "strategy": req.strategy,
        "workload": req.workload.to_json(),
        "port": req.port,
        "candidates": labels,
        "options": {k: v for k, v in asdict(req.options).items() if k in ("repeats", "warmup")},
    }
    if req.serve is not None:
        key["serve"] = req.serve.to_json()
    if req.work is not None:
        key["work"] = req.work.key()
    if req.with_load:
        key["with_load"] = [ld.to_json() for ld in req.with_load]
    if req.weighted is not None:
        key["weighted"] = req.weighted.to_json()
    return "tu-" + hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _cpu_share(plan: Plan) -> float:
    experts = plan.main.placement.experts()
    sizes = {t.name: t.nbytes for t in plan.main.spec.model.tensors if t.name in experts}
    total = sum(sizes.values())
    return sum(b for n, b in sizes.items() if experts[n] == "CPU") / total if total else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuned:
    """The service a search tunes: alone (MODEL), or one of a layout's beside the others, which keep
    the placements `moetune plan --layout` gives them (their memory reserved first)."""

    spec: ServiceSpec  # the baseline: its settings and strategy
    given: str  # its model as the user gave it
    others: tuple[ServiceSpec, ...] = ()
    others_given: tuple[str, ...] = ()
    pinned: dict[str, Placement] = field(default_factory=dict)

    def services(self, strategy: str, s: Settings) -> list[ServiceSpec]:
        return [replace(self.spec, settings=s, strategy=strategy), *self.others]

    @property
    def given_models(self) -> list[str]:
        return [self.given, *self.others_given]


def tuned_service(req: TuneRequest, hw: Inventory, *, engine: str, kind: EngineKind, k: SpeedConstants) -> Tuned:
    """What ``req`` tunes. With a layout: the named service, the others as the layout's plan places them."""
    base = replace(req.base, engine=kind)
    if req.layout is None:
        profile = open_model(model_path(req.model))
        spec = ServiceSpec(
            name="main",
            model=profile,
            settings=base,
            strategy=req.strategy,
            port=req.port,
            engine=engine,
            routing=routing_for(req.routing, profile),
        )
        return Tuned(spec=spec, given=req.model)
    if req.serve is not None:
        raise InputError(
            "--layout tunes one service's single-stream speed (--objective tg, pp or ttft)",
            hint="drop --objective goodput, or tune the model alone",
        )
    services, given = layout_services(req.layout, base, req.port, engine=engine, kind=kind)
    names = [s.name for s in services]
    if req.service not in names:
        raise InputError(
            f"--service {req.service}: {req.layout} has no such service (services: {', '.join(names)})",
            hint=f"--service {names[0]}",
        )
    layout = make_plan(services, hw, k)  # as `moetune plan --layout` places it
    at = names.index(req.service)
    others = [sp.spec for sp in layout.services if sp.spec.name != req.service]
    tuned = services[at]
    if req.routing is not None:
        tuned = replace(tuned, routing=routing_for(req.routing, tuned.model))
    return Tuned(
        spec=tuned,
        given=given[at],
        others=tuple(others),
        others_given=tuple(g for i, g in enumerate(given) if i != at),
        pinned={sp.spec.name: sp.placement for sp in layout.services if sp.spec.name != req.service},
    )


def candidates(req: TuneRequest, status: Status) -> tuple[list[Entry], SpeedConstants]:
    """Every candidate planned (the baseline first), and the constants to start from (the stored
    calibration for this hardware, else the built-in ones)."""
    inputs = read_inputs(req.hw, req.engine)
    hw, calib, k = inputs.hw, inputs.calib, inputs.constants
    tuned = tuned_service(req, hw, engine=inputs.engine, kind=inputs.kind, k=k)
    if req.weighted is not None:  # its services against the layout's, before anything is planned
        wt.check(
            req.weighted,
            tuned=req.service,
            loaded=[ld.service for ld in req.with_load],
            services=[tuned.spec.name, *(o.name for o in tuned.others)] if req.layout is not None else None,
        )
    engine, kind, profile = tuned.spec.engine, tuned.spec.settings.engine, tuned.spec.model
    base = tuned.spec.settings
    if req.serve is not None:
        base = slotted(base, req.serve)
    if req.work is not None:
        base = wl.slotted(base, req.work)
    moe_layers = len({t.layer for t in profile.tensors if t.is_expert})
    options = engine_options(engine, kind, profile.is_mla)
    check_engine_axes(req.axes, base, options, kind)

    def planned(strategy: str, s: Settings) -> Plan:
        return make_plan(tuned.services(strategy, s), hw, k, pinned=tuned.pinned)

    for st in req.axes.get("strategies", ()):  # a strategy the hardware or the model refuses: one error
        if st != "auto":
            try:
                planned(st, base)
            except InputError as e:
                raise InputError(f"--try-strategy: {e}", hint=e.hint) from None
    budget = 0
    if hw.accelerators() and "strategies" not in req.axes:  # the expert budget of the head/tail splits
        with contextlib.suppress(InputError):  # `auto` is a candidate too: its own planning says why
            budget = accelerator_expert_layers(profile, planned("auto", base).main.placement)
    axes = core.default_axes(
        base,
        tuned.spec.strategy,
        cores=hw.local.cores,
        moe_layers=moe_layers,
        accelerators=len(hw.accelerators()),
        engine=options,
        expert_budget=budget,
    )
    axes = replace(axes, **req.axes) if req.axes else axes
    baseline = replace(core.Candidate.of(tuned.spec.strategy, base), transport=req.transport)
    axes = replace(axes, transports=tuple(dict.fromkeys((req.transport, *req.axes.get("transports", ())))))
    check_transport_axis(axes.transports, hw)
    cands = [baseline, *(c for c in core.space(axes, base, mla_model=profile.is_mla) if c != baseline)]
    status(f"planning {len(cands)} candidates")
    entries = []
    for c in cands:
        try:
            plan = planned(c.strategy, c.settings(base))
        except InputError as e:
            if c == baseline:
                raise
            status(f"{c.label}: skipped ({e})")
            continue
        doc = document(plan, engine, calib, tuned.given_models)
        doc["label"] = c.label
        entries.append(
            Entry(candidate=c, plan=plan, doc=doc, work=plan.main.prediction.work, cpu_expert_share=_cpu_share(plan))
        )
    return entries, k


def _check_request(req: TuneRequest) -> None:
    """The objective and the options that go with it agree."""
    if req.objective not in core.OBJECTIVES:
        raise InputError(f"--objective {req.objective}: choose {', '.join(core.OBJECTIVES)}")
    if (req.objective == "goodput") != (req.serve is not None):
        raise InputError(
            "--objective goodput is measured under a serving load with latency targets, and only it is",
            hint="--objective goodput --slo ttft_ms=A,itl_ms=B [--concurrency C --requests N]",
        )
    if (req.objective in ("replay", "turn")) != (req.work is not None) or (
        req.work is not None and req.work.name != req.objective
    ):
        raise InputError(
            f"--objective {req.objective}: the workload objectives replay:FILE and turn measure a "
            "workload, and only they do"
        )
    if (req.objective == "weighted") != (req.weighted is not None):
        raise InputError(f"--objective {req.objective}: the weighted terms come with --objective weighted:... only")
    if req.confirm and (req.serve is not None or req.with_load or req.weighted is not None):
        raise InputError(
            f"--confirm launches single-stream benchmarks and workloads again: not with --objective {req.objective}"
            + (" --with-load" if req.with_load else ""),
            hint="drop --confirm, or tune --objective tg, pp, ttft, replay:FILE or turn",
        )


def _resume(db: ResultsDB, tid: str, entries: list[Entry], failed: dict[str, str]) -> None:
    """The candidates an earlier run of this search measured (a contended one is measured again)
    or saw fail."""
    by_label = {e.candidate.label: i for i, e in enumerate(entries)}
    for r in db.runs(sweep_id=tid):
        if r.status == RunStatus.DONE and r.label in by_label and not (r.contention and r.contention.contended):
            e = entries[by_label[r.label]]
            if e.run is None:
                e.run = r.id
            else:  # launched again by --confirm
                e.confirmed.append(r.id)
    for label, why in failed.items():
        if label in by_label:
            entries[by_label[label]].failed = why


def tune(
    db: ResultsDB,
    req: TuneRequest,
    *,
    status: Status,
    progress_for: Callable[[str], Progress | None] | None = None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
    quiet: QuietGate | None = None,
) -> TuneResult:
    """The search. ``quiet`` says whether the machine is quiet enough to rank candidates, before each
    launch and after each measurement (default: a busy machine stops it, :class:`MachineBusy`)."""
    gate = quiet or QuietGate(status)
    _check_request(req)
    entries, prior = candidates(req, status)
    _check_baseline(entries[0])
    refuse_unbuilt([e.doc for e in entries], [e.candidate.transport for e in entries], req.rdma_dev)
    s = _start(db, req, entries, prior, status=status, progress_for=progress_for, on_snapshot=on_snapshot)
    defaults = _defaults(db, req, entries[0], tid=s.tid, failed=s.failed)
    s.measure_resumed()
    while True:
        if defaults is not None and defaults.pending and entries[0].run is not None:  # beside the baseline
            s.launch_defaults(defaults)
        if s.launches >= req.budget:
            break
        nxt = s.next_candidate()
        if nxt is None:
            break
        s.launch(nxt, gate)
    s.confirm(req.confirm, defaults, gate)
    result = s.result(defaults)
    if result.best is not None and not result.plan_path(result.best).exists():
        result.plan_path(result.best).write_text(json.dumps(entries[result.best].doc, indent=2))
    if defaults is not None and defaults.run is not None and not (s.plan_dir / dflt.PLAN_FILE).exists():
        (s.plan_dir / dflt.PLAN_FILE).write_text(json.dumps(defaults.doc, indent=2))
    _save_calibration(db, calibrations.plan_key(entries[0].doc))
    return result


def _check_baseline(baseline: Entry) -> None:
    if not baseline.fits:
        raise InputError(
            f"the baseline ({baseline.candidate.label}) does not fit: {baseline.plan.shortfalls[0].message}",
            hint="`moetune plan` with the same options shows why; give options that fit "
            "(a smaller --ctx or -ub, --strategy cpu-moe) as the baseline",
        )


def _start(
    db: ResultsDB,
    req: TuneRequest,
    entries: list[Entry],
    prior: SpeedConstants,
    *,
    status: Status,
    progress_for: Callable[[str], Progress | None] | None,
    on_snapshot: Callable[[Snapshot], None] | None,
) -> _Search:
    """The search's record (created, or an earlier run's resumed: what it measured and saw fail)."""
    tid = _tune_id(req, entries[0].plan, [e.candidate.label for e in entries])
    feats = np.array([core.features(e.candidate, e.cpu_expert_share, entries[0].plan.hw.local.cores) for e in entries])
    plan_dir = data_dir() / "tune" / tid
    plan_dir.mkdir(parents=True, exist_ok=True)
    record = TuneRecord(
        objective=req.objective,
        hw=req.hw,
        model=req.model,
        workload=req.workload.to_json(),
        candidates=tuple(e.candidate.label for e in entries),
        serve=req.serve.to_json() if req.serve else None,
        work=req.work.key() if req.work else None,
        weighted=req.weighted.to_json() if req.weighted else None,
    )
    if not db.create_sweep(tid, record.to_json()):
        stored = db.sweep(tid)
        record = record if stored is None else TuneRecord.from_json(stored)
        status(f"resuming tune {tid}")
    failed = dict(record.failed)
    _resume(db, tid, entries, failed)
    return _Search(
        db=db,
        req=req,
        entries=entries,
        prior=prior,
        k=prior,
        tid=tid,
        record=record,
        failed=failed,
        feats=feats,
        plan_dir=plan_dir,
        status=status,
        progress_for=progress_for,
        on_snapshot=on_snapshot,
    )


@dataclass(kw_only=True)
class _Search:
    """A search under way: its candidates, what it measured of them, and what it learned."""

    db: ResultsDB
    req: TuneRequest
    entries: list[Entry]
    prior: SpeedConstants  # the constants before this search's measurements
    k: SpeedConstants  # refitted after each measurement
    tid: str
    record: TuneRecord  # the sweep's record, as stored
    failed: dict[str, str]  # the candidates that failed to launch, and why
    feats: np.ndarray
    plan_dir: Path
    status: Status
    progress_for: Callable[[str], Progress | None] | None
    on_snapshot: Callable[[Snapshot], None] | None
    launches: int = 0
    stopped: str = "budget spent"
    values: dict[int, list[float]] = field(default_factory=dict)
    summaries: dict[int, BenchSummary] = field(default_factory=dict)
    goodputs: dict[int, gp.Goodput] = field(default_factory=dict)
    works: dict[int, wl.Measured] = field(default_factory=dict)
    loaded: dict[int, ul.Measured] = field(default_factory=dict)
    figs: dict[int, dict[wt.Term, wt.Figure]] = field(default_factory=dict)
    scores: dict[int, wt.Score] = field(default_factory=dict)

    def measure_resumed(self) -> None:
        """What an earlier run of this search measured, read back; its launches counted."""
        for i, e in enumerate(self.entries):
            if e.run is not None:
                self.measured(i)
        self.k = self.refit()
        self.launches = sum(1 for e in self.entries if e.run is not None or e.failed is not None)

    def measured(self, i: int) -> None:
        """Read entry ``i``'s run: its objective's samples (and the weighted scores, all again)."""
        req, entries = self.req, self.entries
        assert entries[i].run is not None
        by_run = [self.db.samples(r) for r in entries[i].runs]  # one run but for --confirm's
        samples = by_run[0]
        if req.weighted is not None:  # every score again: they are relative to the baseline's figures
            self.loaded[i] = ul.measured(samples, entries[i].plan.main.spec.name)
            streams = {ld.service: max(1, ld.concurrency) for ld in req.with_load}
            self.figs[i] = wt.figures(samples, req.weighted, streams)
            self.scores.clear()
            self.scores.update(wt.scores(req.weighted, self.figs))
            self.values.clear()
            self.values.update({j: list(sc.samples) for j, sc in self.scores.items()})
            for j, sc in self.scores.items():  # a score the reference's figures may give later
                if sc.problem is not None:
                    entries[j].failed = f"{NO_SCORE}: {sc.problem}"
                elif (entries[j].failed or "").startswith(NO_SCORE):
                    entries[j].failed = None
        elif req.with_load:
            self.loaded[i] = ul.measured(samples, entries[i].plan.main.spec.name)
            self.values[i] = list(self.loaded[i].shared.of(req.objective))
        elif req.work is not None:  # every launch of it pooled, as below
            self.works[i] = wl.pooled(by_run, req.work)
            self.values[i] = self.works[i].values
            if (why := self.works[i].problem()) is not None:
                entries[i].failed = why
        elif req.serve is not None:
            self.goodputs[i] = gp.measured(samples, req.serve)
            self.values[i] = list(self.goodputs[i].values)
        else:  # every launch of it pooled (--confirm launches the best again)
            pooled = [x for xs in by_run for x in xs]
            self.summaries[i] = bench_summary(pooled)
            self.values[i] = _bench_values(pooled, req)

    def refit(self) -> SpeedConstants:
        """The constants fitted to single-stream benchmarks only (serve-bench runs: the GP alone)."""
        obs = [
            o
            for i in self.summaries
            for o in observations(
                self.entries[i].run or 0, self.summaries[i], dict(self.db.run(self.entries[i].run or 0).meta.details)
            )
        ]
        return fit(obs, self.prior) if obs else self.prior

    def view(self) -> _View | None:
        return _view(self.entries, self.k, self.req, feats=self.feats, values=self.values, goodputs=self.goodputs)

    def next_candidate(self) -> int | None:
        """The candidate to launch next (the baseline first); None, with why in ``stopped``, when
        none is left or none expects to gain more than the noise."""
        entries = self.entries
        open_ = [i for i, e in enumerate(entries) if e.fits and e.run is None and e.failed is None]
        if not open_:
            self.stopped = "every candidate that fits was tried"
            return None
        if entries[0].run is None and entries[0].failed is None:
            return 0
        view = self.view()
        if view is None:
            return max(open_, key=lambda j: _objective(entries[j], self.k, self.req, entries[0]))
        choice, gain = core.choose(view.belief, view.best, open_, noise=view.noise, gains=view.gains)
        if choice is None:
            self.stopped = (
                f"no candidate expects to gain more than the noise ({gain * 100:.1f}% < {view.noise * 100:.1f}%)"
            )
            return None
        self.status(
            f"next: {entries[choice].candidate.label} (expects {view.expect[choice]:.4g}, gain {gain * 100:.1f}%)"
        )
        return choice

    def launch(self, nxt: int, gate: QuietGate) -> None:
        """Launch and measure candidate ``nxt``: a launch that fails is recorded and skipped, a
        contended measurement is dropped (to be measured again)."""
        e = self.entries[nxt]
        path = plan_file(self.plan_dir, e.candidate.label)
        path.write_text(json.dumps(e.doc, indent=2))
        self.launches += 1
        gate.before_launch()  # a busy machine: MachineBusy, or a wait with --wait-quiet
        self.status(f"launch {self.launches}/{self.req.budget}: {e.candidate.label}")
        try:
            e.run = self._run_candidate(e, path)
        except MoetuneError as err:  # out of memory at launch, say: recorded, skipped, the search goes on
            e.failed = str(err)
            self.failed[e.candidate.label] = e.failed
            self.db.update_sweep(self.tid, replace(self.record, failed=dict(self.failed)).to_json())
            self.status(f"{e.candidate.label}: failed: {str(err).splitlines()[0]}")
            return
        if not gate.accept(self.db, e.run):  # contended, and the machine waited for: measure it again
            e.run, self.launches = None, self.launches - 1
            return
        self.measured(nxt)
        self.k = self.refit()

    def _run_candidate(self, e: Entry, path: Path) -> int:
        """One candidate's run, measured as its objective is."""
        req, db, status, on_snapshot = self.req, self.db, self.status, self.on_snapshot
        if req.with_load or req.weighted is not None:
            return ul.run_candidate(
                db,
                path,
                e.plan.main.spec.name,
                loads=req.with_load,
                w=req.workload,
                options=req.options,
                label=e.candidate.label,
                sweep_id=self.tid,
                launch_timeout_s=req.launch_timeout_s,
                status=status,
                on_snapshot=on_snapshot,
                transport=e.candidate.transport,
                rdma_dev=req.rdma_dev,
                slo=dict(req.weighted.slo) if req.weighted and req.weighted.slo else None,
            )
        if req.serve is not None:
            return gp.serve_candidate(
                db,
                path,
                req.serve,
                label=e.candidate.label,
                sweep_id=self.tid,
                transport=e.candidate.transport,
                rdma_dev=req.rdma_dev,
                launch_timeout_s=req.launch_timeout_s,
                request_timeout_s=req.options.timeout_s,
                status=status,
                on_snapshot=on_snapshot,
            )
        return self._measure(path, e.candidate.label, transport=e.candidate.transport, server=e.plan.main.spec.name)

    def launch_defaults(self, d: dflt.Defaults) -> None:
        """Measure the engine with the model and no tuning flags, as every candidate is measured; not
        a launch of the budget."""
        try:
            d.run = self._run_defaults(d)
        except MoetuneError as err:
            d.failed = self.failed[dflt.LABEL] = str(err)
            self.db.update_sweep(self.tid, replace(self.record, failed=dict(self.failed)).to_json())
            self.status(f"{dflt.LABEL}: failed: {str(err).splitlines()[0]}")

    def _run_defaults(self, d: dflt.Defaults) -> int:
        path = self.plan_dir / dflt.PLAN_FILE
        path.write_text(json.dumps(d.doc, indent=2))
        self.status(f"engine defaults: {' '.join(d.argv)}")
        return self._measure(path, dflt.LABEL, transport=self.req.transport)

    def _measure(self, path: Path, label: str, *, transport: str, server: str | None = None) -> int:
        """A plan's single-stream benchmark or workload objective, as the search measures them."""
        req, db, status, on_snapshot = self.req, self.db, self.status, self.on_snapshot
        if req.work is not None:
            return wl.run_candidate(
                db,
                path,
                req.work,
                label=label,
                sweep_id=self.tid,
                repeats=req.options.repeats,
                warmup=req.options.warmup,
                transport=transport,
                rdma_dev=req.rdma_dev,
                server=server,
                launch_timeout_s=req.launch_timeout_s,
                request_timeout_s=req.options.timeout_s,
                status=status,
                on_snapshot=on_snapshot,
            )
        return bench_target(
            db,
            with_transport(plan_target(path, server), transport, req.rdma_dev),
            [req.workload],
            req.options,
            label=label,
            sweep_id=self.tid,
            launch_timeout_s=req.launch_timeout_s,
            status=status,
            progress_for=self.progress_for,
            on_snapshot=on_snapshot,
        )

    def confirm(self, n: int, defaults: dflt.Defaults | None, gate: QuietGate) -> None:
        """--confirm N: launch the N best measured on the objective once more each (the engine
        defaults among them where they rank there), so that each is judged on two launches: on a
        shared machine a whole launch runs fast or slow, and one lucky launch would otherwise win.
        The PP guard is judged after, on both launches (a candidate it rejects by one launch of the
        defaults' PP may pass by two). Not counted in --budget; one already launched again (a
        resumed search) is not."""
        if n <= 0:
            return
        # (median, label, its confirmation runs, how to launch it, its entry: None for the defaults)
        ranked: list[tuple[float, str, list[int], Callable[[], int], int | None]] = []
        for i, v in self.values.items():
            e = self.entries[i]
            if v and e.run is not None and e.failed is None:
                run_it = functools.partial(self._run_candidate, e, plan_file(self.plan_dir, e.candidate.label))
                ranked.append((statistics.median(v), e.candidate.label, e.confirmed, run_it, i))
        if defaults is not None and (d_values := self._defaults_values(defaults)):
            run_d = functools.partial(self._run_defaults, defaults)
            ranked.append((statistics.median(d_values), dflt.LABEL, defaults.confirmed, run_d, None))
        top = sorted(ranked, key=lambda t: -t[0])[:n]
        for k, (_, label, done, again, j) in enumerate(top, 1):
            if done:
                continue
            gate.before_launch()
            self.status(f"confirm {k}/{len(top)}: {label}, launched again")
            try:
                run = again()
            except MoetuneError as err:  # the first launch's figures stand
                self.status(f"{label}: its second launch failed: {str(err).splitlines()[0]}")
                continue
            if gate.accept(self.db, run):  # else contended, waited for: the first launch's figures stand
                done.append(run)
                if j is not None:
                    self.measured(j)
        self.k = self.refit()

    def _defaults_values(self, defaults: dflt.Defaults | None) -> tuple[float, ...]:
        """The engine defaults' objective samples, every launch of them pooled."""
        if defaults is None or not defaults.runs:
            return ()
        if self.req.work is not None:
            return tuple(self._defaults_work(defaults).values)
        return tuple(_bench_values([x for r in defaults.runs for x in self.db.samples(r)], self.req))

    def _defaults_work(self, defaults: dflt.Defaults) -> wl.Measured:
        assert self.req.work is not None
        return wl.pooled([self.db.samples(r) for r in defaults.runs], self.req.work)

    def _launch_figure(self, run: int) -> float | None:
        """One launch's median of the objective as a user reads it: tok/s (single-stream), or
        seconds a pass or a turn (a workload)."""
        if self.req.work is not None:
            return wl.measured(self.db.samples(run), self.req.work).median_s()
        v = _bench_values(self.db.samples(run), self.req)
        return statistics.median(v) if v else None

    def result(self, defaults: dflt.Defaults | None) -> TuneResult:
        """The search's outcome: each candidate's verdict and the best (the winner, else the baseline)."""
        db, req, entries = self.db, self.req, self.entries
        view = self.view()
        rates = {i: dflt.rates(db, e.runs, req.workload) for i, e in enumerate(entries) if e.run is not None}
        rates.update({i: dflt.Rates(m.shared.tg, m.shared.pp) for i, m in self.loaded.items()})  # under the load
        d_rates = dflt.rates(db, defaults.runs if defaults else (), req.workload)
        rejected = pp_rejections(req.objective, req.max_pp_loss, rates, d_rates)
        judged, best = verdicts(
            entries, self.values, None if view is None else view.expect, rejected, as_time=req.work is not None
        )
        d_work = None
        if req.work is not None and defaults is not None and defaults.run is not None:
            d_work = self._defaults_work(defaults)
        d_values = tuple(d_work.values) if d_work is not None else self._defaults_values(defaults)
        launched_again = [(e.candidate.label, e.runs) for e in entries if e.confirmed]
        if defaults is not None and defaults.confirmed:
            launched_again.append((dflt.LABEL, defaults.runs))
        confirmed = {
            label: tuple(v for r in runs if (v := self._launch_figure(r)) is not None) for label, runs in launched_again
        }
        return TuneResult(
            tune_id=self.tid,
            objective=req.objective,
            entries=entries,
            baseline=0,
            best=best,
            launches=self.launches,
            stopped=self.stopped,
            constants=self.k,
            values=self.values,
            summaries=self.summaries,
            verdicts=judged,
            plan_dir=self.plan_dir,
            workload=req.workload,
            serve=req.serve,
            goodputs=self.goodputs,
            defaults=defaults,
            rates=rates,
            defaults_rates=d_rates,
            max_pp_loss=req.max_pp_loss,
            work=req.work,
            works=self.works,
            defaults_work=d_work,
            defaults_values=d_values,
            loaded=self.loaded,
            with_load=req.with_load,
            weighted=req.weighted,
            scores=self.scores,
            confirmed=confirmed,
        )


def _defaults(
    db: ResultsDB, req: TuneRequest, baseline: Entry, *, tid: str, failed: dict[str, str]
) -> dflt.Defaults | None:
    """The engine-defaults baseline of a single-stream search (resumed: its run, or why it failed);
    none under --with-load (the engine's own choices take the others' memory)."""
    if req.serve is not None or req.with_load or req.weighted is not None:
        return None
    plan = baseline.plan
    if len(plan.services) > 1:  # a layout's service: the engine's own choices for its model, measured alone
        plan = make_plan([plan.main.spec], plan.hw, plan.constants)
    model = baseline.doc["services"][0].get("model_given") or req.model
    d = dflt.Defaults(dflt.defaults_doc(plan, plan.main.spec.engine or req.engine or "", str(model)))
    done = [r.id for r in db.runs(sweep_id=tid) if r.label == dflt.LABEL and r.status == RunStatus.DONE]
    d.run, d.confirmed = (done[0], done[1:]) if done else (None, [])
    d.failed = failed.get(dflt.LABEL) if d.run is None else None
    return d


def pp_rejections(
    objective: str, max_pp_loss: float, rates: dict[int, dflt.Rates], d_rates: dflt.Rates
) -> dict[int, str]:
    """--objective tg: the candidates that lose more than --max-pp-loss of a baseline's PP."""
    if objective != "tg":
        return {}
    refs = {
        name: pp
        for name, pp in (
            ("baseline", rates[0].median("pp") if 0 in rates else None),
            (dflt.LABEL, d_rates.median("pp")),
        )
        if pp
    }
    pps = {i: pp for i, r in rates.items() if i != 0 and (pp := r.median("pp")) is not None}
    return dflt.pp_rejections(pps, refs, max_pp_loss)


def _bench_values(samples: list[dict[str, object]], req: TuneRequest) -> list[float]:
    """A single-stream objective's samples from a benchmark run: one per measured run."""
    ms = bench_metrics(samples)
    tg, pp = ms.get(f"tg:{req.workload.name}"), ms.get(f"pp:{req.workload.name}")
    if req.objective == "tg":
        return list(tg.values) if tg else []
    if req.objective == "pp":
        return list(pp.values) if pp else []
    return [
        v
        for a, b in zip(tg.values if tg else (), pp.values if pp else (), strict=False)
        if (v := objective_value("ttft", a, b, req.workload.pp_tokens)) is not None
    ]


def predicted_single(e: Entry, k: SpeedConstants, w: Workload) -> wt.Predicted:
    """The speed model's single-stream figures of ``e``'s tuned service (a weighted score's prior)."""
    tg, pp = predicted_rates(e, k, w)
    return wt.Predicted(tg=tg, pp=pp, ttft_s=w.pp_tokens / pp + 1 / tg if tg > 0 and pp > 0 else 0.0)


def _objective(e: Entry, k: SpeedConstants, req: TuneRequest, base: Entry) -> float:
    """What the speed model expects of ``e``'s objective (``base``: the baseline, for the weighted score)."""
    if req.weighted is not None:
        return wt.predicted(
            req.weighted,
            e.plan.main.spec.name,
            predicted_single(e, k, req.workload),
            predicted_single(base, k, req.workload),
        )
    if req.work is not None:
        return 1.0 / max(wl.predicted_seconds(req.work, e.work, k), 1e-9)
    if req.serve is not None:
        return predict_serving(e.work, k, req.serve).goodput_req_s
    tg, pp = predicted_rates(e, k, req.workload)
    return objective_value(req.objective, tg, pp, req.workload.pp_tokens) or 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class _View:
    """What the search believes after its measurements."""

    belief: core.Belief  # of the single-stream objective, or of the request rate under the serving load
    best: float  # the best measurement the gains are counted from
    noise: float  # the measurements' relative standard error (median), at least MIN_NOISE
    gains: np.ndarray | None  # expected gains (goodput's); None: the belief's own (core.expected_gain)
    expect: np.ndarray  # each candidate's expected objective


def _view(
    entries: list[Entry],
    k: SpeedConstants,
    req: TuneRequest,
    *,
    feats: np.ndarray,
    values: dict[int, list[float]],
    goodputs: dict[int, gp.Goodput],
) -> _View | None:
    """The belief corrected by the measurements (None before any). For goodput the Gaussian process
    corrects the predicted request rate with the measured one, and the targets are applied to that
    belief (:func:`moetune.plan.serving.expected_goodput`); gains count from the best goodput
    measured, or from the least one a level can tell (half a request over it) when none met."""
    if req.serve is None:
        meas = measurements(values)
        if not meas:
            return None
        b = core.belief([_objective(e, k, req, entries[0]) for e in entries], feats, meas)
        return _View(belief=b, best=max(m.value for m in meas), noise=_noise(meas), gains=None, expect=np.exp(b.mean))
    meas = measurements({i: list(g.rates) for i, g in goodputs.items()})
    if not meas:
        return None
    sps = [predict_serving(e.work, k, req.serve) for e in entries]
    b = core.belief([p.request_s for p in sps], feats, meas)
    best = max((statistics.median(v) for v in values.values() if v), default=0.0)
    best = max(best, min(g.floor for g in goodputs.values()), 1e-9)
    expect, gains = expected_goodput(sps, req.serve.targets, log_rate_mean=b.mean, log_rate_sd=b.sd, best=best)
    return _View(belief=b, best=best, noise=_noise(meas), gains=gains, expect=expect)


def _noise(meas: list[core.Measured]) -> float:
    return max(MIN_NOISE, statistics.median(m.rel_se for m in meas))


def _save_calibration(db: ResultsDB, key: tuple[str | None, str]) -> None:
    """Every measurement of this hardware in the history, this search's included, as its calibration
    (what `moetune calibrate` would keep), so the next `plan` on it predicts from them."""
    obs = gather(db).get(key, [])
    runs = tuple(sorted({o.run for o in obs}))
    if len(runs) >= 2:
        calibrate_and_save(key, obs, plan_prior(db, obs), placements=placements(db, runs))
