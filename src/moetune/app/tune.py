"""`moetune tune`: search for the fastest plan in a budget of launches, then (``max_kld``) guard the
winner's quality, and write the winning plan where asked.

The request is what the user gave, parsed (the objective still as its text); this module reads it
into the search's own request (:class:`moetune.tune.loop.TuneRequest`): the objective's workload
(replay, turn), the serving load of goodput, a weighted objective's terms, the axes tried."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.app.progress import Callbacks
from moetune.errors import InputError, RuntimeFailure
from moetune.option_defaults import DEFAULT_SYSTEM_TOKENS, DEFAULT_TURNS
from moetune.plan.settings import Settings

if TYPE_CHECKING:
    from moetune.plan.serving import ServeLoad
    from moetune.tune import loop
    from moetune.tune.loop import TuneResult
    from moetune.tune.weighted import Weighted
    from moetune.tune.workload import WorkObjective


@dataclass(frozen=True, slots=True, kw_only=True)
class Axes:
    """The values to try per axis (``--try-*``; None: the search's default for the axis). The names
    are the search's (:func:`moetune.tune.core.default_axes`)."""

    strategies: tuple[str, ...] | None = None  # --try-strategy as given (split here)
    threads: tuple[int, ...] | None = None
    ubatches: tuple[int, ...] | None = None
    flash_attn: tuple[bool, ...] | None = None
    cache_types: tuple[tuple[str, str], ...] | None = None
    repack: tuple[bool, ...] | None = None
    amb_mib: tuple[int, ...] | None = None
    mla: tuple[int, ...] | None = None
    fused_moe: tuple[bool, ...] | None = None
    merge_up_gate: tuple[bool, ...] | None = None
    transports: tuple[str, ...] | None = None

    def given(self) -> dict[str, tuple[Any, ...]]:
        """The axes asked for, by name (the strategies split as `--try-strategy` reads them)."""
        from moetune.plan.tune import split_strategies

        out = {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}
        if self.strategies:
            out["strategies"] = split_strategies(self.strategies)
        else:
            out.pop("strategies", None)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneRequest:
    """What `moetune tune` was asked: MODEL (or one ``service`` of a ``layout``) on ``hw``."""

    hw: str
    model: str | None = None
    layout: Path | None = None
    service: str | None = None
    with_load: tuple[str, ...] = ()  # SERVICE=SPEC: the layout's other services' loads
    settings: Settings = field(default_factory=Settings)  # the plan options (the baseline's)
    routing: Path | None = None
    strategy: str = "auto"
    engine: str | None = None
    port: int = 8080
    budget: int = 5
    confirm: int = 0  # after the search, launch the best this many once more each
    objective: str = "tg"  # tg|pp|ttft|goodput|turn|replay:FILE|weighted:...
    replay_speed: str | None = None
    turns: int | None = None
    slo: str | None = None  # ttft_ms=500,itl_ms=100
    concurrency: int | None = None
    requests: int | None = None
    depth: int | None = None
    pp_tokens: int = 512
    tg_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    axes: Axes = field(default_factory=Axes)
    transport: str | None = None
    rdma_dev: str | None = None
    max_pp_loss: float = 0.10  # a fraction of the baselines' PP
    launch_timeout_s: float = 600.0
    timeout_s: float = 600.0
    wait_quiet_s: float | None = None  # None: a busy machine stops the search
    max_kld: float | None = None  # the quality guard's limit (None: no guard)
    output: Path | None = None  # also write the winning plan here
    db_path: Path | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuned:
    """The search's result, its document (what --json prints), and the KLD the guard measured by
    candidate index (None without a guard)."""

    result: TuneResult
    doc: dict[str, Any]
    kld: dict[int, float] | None

    def best_shell(self) -> str | None:
        """The recommended plan's command, as a shell line (None: nothing was measured)."""
        path = self.result.recommended_path()
        return None if path is None else str(json.loads(path.read_text())["shell"])

    def failure(self, output: Path | None = None) -> RuntimeFailure | None:
        """The error to exit with once the result is shown: no launch was measured."""
        if self.result.best is not None:
            return None
        return RuntimeFailure(
            f"no configuration was measured: every launch of tune {self.result.tune_id} failed"
            + (f" (-o {output} not written)" if output else ""),
            hint="the table's verdicts say why; give options that launch (a smaller -ub or --ctx, "
            "--strategy cpu-moe) and run it again",
        )


def search_request(req: TuneRequest) -> loop.TuneRequest:
    """The search's request: the objective read, its workload and load built, the axes split."""
    from moetune.bench.single.runner import BenchOptions
    from moetune.bench.single.workloads import expand
    from moetune.tune import loop
    from moetune.tune.under_load import check as check_loads

    axes = req.axes.given()
    weighted = _weighted(req.objective, req.slo)
    objective, work = _work(req)
    serve = _serve_load(req, objective)
    depth = 0 if work else req.depth or 0
    (workload,) = expand([], [], depths=[depth], pp_tokens=req.pp_tokens, tg_tokens=req.tg_tokens)
    loads = check_loads(req.with_load, req.layout, req.service, objective)
    return loop.TuneRequest(
        hw=req.hw,
        model=req.model or "",
        base=req.settings,
        workload=workload,
        options=BenchOptions(repeats=req.repeats, warmup=req.warmup, timeout_s=req.timeout_s),
        strategy=req.strategy,
        engine=req.engine,
        port=req.port,
        objective=objective,
        budget=req.budget,
        confirm=req.confirm,
        axes=axes,
        launch_timeout_s=req.launch_timeout_s,
        serve=serve,
        routing=req.routing,
        transport=req.transport or "tcp",
        rdma_dev=req.rdma_dev,
        max_pp_loss=req.max_pp_loss,
        layout=req.layout,
        service=req.service,
        work=work,
        with_load=tuple(loads),
        weighted=weighted,
    )


def tune(req: TuneRequest, cb: Callbacks | None = None) -> Tuned:
    """Search, guard the winner's quality (``max_kld``), write the winner to ``output``."""
    from moetune.store.db import ResultsDB
    from moetune.tune.loop import tune as search
    from moetune.tune.quiet import QuietGate
    from moetune.tune.report import result_json

    cb = cb or Callbacks()
    status = cb.status or _quiet
    sreq = search_request(req)
    with ResultsDB.open(req.db_path) as db:
        result = search(
            db,
            sreq,
            status=status,
            progress_for=cb.progress_for,
            on_snapshot=cb.on_snapshot,
            quiet=QuietGate(status, req.wait_quiet_s),
        )
        kld: dict[int, float] | None = None
        guarded: dict[str, object] | None = None
        if req.max_kld is not None:
            from moetune.jsonread import mapping, real
            from moetune.tune.quality_guard import guard

            result, checked = guard(db, result, req.max_kld, status=status)
            kld = {i: real(mapping(q.get("kld")).get("mean")) for i, q in checked.items()}
            guarded = {
                "max_kld": req.max_kld,
                "checked": {result.entries[i].candidate.label: q for i, q in checked.items()},
            }
        doc = result_json(result, kld)
        doc["quality_guard"] = guarded
    best_plan = result.recommended_path()
    if best_plan is None:
        doc["plan"] = None
    else:
        if req.output:
            req.output.write_text(best_plan.read_text())
        doc["plan"] = str(req.output or best_plan)
    return Tuned(result=result, doc=doc, kld=kld)


def _quiet(_: str) -> None:
    pass


def _work(req: TuneRequest) -> tuple[str, WorkObjective | None]:
    """--objective's name, and the workload of replay:FILE and turn (None for the others)."""
    from moetune.tune import workload as wl

    name, path = wl.parse(req.objective)
    if req.replay_speed is not None and name != "replay":
        raise InputError("--replay-speed paces --objective replay:FILE", hint="drop --replay-speed")
    if req.turns is not None and name != "turn":
        raise InputError("--turns: only with --objective turn", hint="drop --turns")
    if name == "replay":
        assert path is not None
        if req.depth:
            raise InputError("--depth: the replay sends the recorded requests as they are", hint="drop --depth")
        return name, wl.replay_objective(path, req.replay_speed or "max")
    if name == "turn":
        if req.depth is not None and req.depth < wl.MIN_SYSTEM_TOKENS:
            raise InputError(
                f"--depth {req.depth}: with --objective turn the system prompt each session starts with, "
                f"at least {wl.MIN_SYSTEM_TOKENS} tokens (it begins with the session's own tag, so no "
                "session reuses another's cache)",
                hint=f"--depth {DEFAULT_SYSTEM_TOKENS}, or drop it",
            )
        return name, wl.turn_objective(
            system_tokens=DEFAULT_SYSTEM_TOKENS if req.depth is None else req.depth,
            turns=req.turns or DEFAULT_TURNS,
            turn_tokens=req.pp_tokens,
            output_len=req.tg_tokens,
            repeats=req.repeats,
        )
    return name, None


def _weighted(objective: str, slo: str | None) -> Weighted | None:
    """The terms of --objective weighted:... (None for the other objectives), with --slo's targets."""
    from moetune.bench.analysis.slo import parse_slo
    from moetune.tune import weighted as wt

    if not objective.strip().startswith("weighted"):
        return None
    w = wt.parse(objective)
    return replace(w, slo=tuple(parse_slo(slo).items())) if slo else w


def _serve_load(req: TuneRequest, objective: str) -> ServeLoad | None:
    """The serving load of --objective goodput (None for the single-stream objectives)."""
    from moetune.bench.analysis.slo import parse_slo
    from moetune.plan.serving import ServeLoad

    if objective != "goodput":
        given = [
            n
            for n, v in (("--slo", req.slo), ("--concurrency", req.concurrency), ("--requests", req.requests))
            if v is not None and not (n == "--slo" and objective == "weighted")
        ]
        if given:
            raise InputError(f"{', '.join(given)}: only with --objective goodput")
        return None
    if req.slo is None:
        raise InputError("--objective goodput needs latency targets", hint="--slo ttft_ms=500,itl_ms=100")
    if req.depth:
        raise InputError(
            "--depth: a single-stream workload; --objective goodput sends fresh prompts of --pp-tokens",
            hint="drop --depth",
        )
    c = req.concurrency or 4
    n = req.requests if req.requests is not None else max(16, 8 * c)
    if n < 2 * c:
        raise InputError(
            f"--requests {n}: at least 2 x --concurrency ({2 * c}), two rounds of the streams, "
            "for the goodput's interval"
        )
    return ServeLoad(
        concurrency=c,
        requests=n,
        input_len=req.pp_tokens,
        output_len=req.tg_tokens,
        slo=tuple(parse_slo(req.slo).items()),
    )
