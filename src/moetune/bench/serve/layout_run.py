"""`serve-bench LAYOUT_PLAN --load SERVICE=SPEC ...`: every named service of a layout driven at once.

The layout is launched once (every server and RPC worker of the plan). Each service given a
``--load`` is probed and its workload prepared (:mod:`moetune.bench.serve.loadspec`: synthetic,
dataset, sessions or a replay, each at its own concurrency); then, in each round:

- alone: each service in turn runs its workload while the others sit idle (their servers up);
- shared: every service runs its workload at the same moment. A service that finishes first keeps
  its load on (its requests past the measured ones are stored apart, phase ``fill``) until the
  last one is done, so every measured request of every service ran under the whole shared load.

Rounds alternate the order (alone then shared, shared then alone), so a drift of the machine falls
on both. Everything is ONE serve-bench run: every request a sample that names its service and load
(``service``, ``load``: alone | shared), every service a ``run_services`` row, the sampler's
snapshots phase by phase (``alone NAME``, ``shared``: which process and device was busy). Its
figures (:mod:`moetune.bench.analysis.layout`): per service and load the level's figures, and the
contention: each service's slowdown under the shared load with its interval.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from moetune import __version__
from moetune.bench.analysis.layout import SHARED_PHASE, alone_phase, busy, contention
from moetune.bench.analysis.level_summary import LevelSummary
from moetune.bench.analysis.serve import ALONE, LOAD, SERVICE, SHARED, level_summaries
from moetune.bench.analysis.warnings import Code, Warning, annotate, run_warnings
from moetune.bench.http.client import StreamingHttp, connect
from moetune.bench.http.clock import run as run_loop
from moetune.bench.serve.load import (
    LoadMeter,
    LoadSpec,
    Prepared,
    Prompt,
    RequestOptions,
    ServerGone,
    run_level,
)
from moetune.bench.serve.loadspec import REPLAY, SESSIONS, ServiceLoad
from moetune.bench.serve.request import RequestRecord
from moetune.bench.serve.run import SampleWriter, _model_name, check_context, level_prompts, report_doc
from moetune.bench.serve.sessions import SessionTexts
from moetune.bench.server import model_ref, probe
from moetune.bench.servers import Launched, launched_servers, new_launch_id
from moetune.bench.target import Target
from moetune.errors import InputError, RuntimeFailure
from moetune.jsonread import integer, mapping
from moetune.kinds import RunKind, RunStatus
from moetune.monitor.sampler import RunMonitor, watches_of_launch
from moetune.monitor.snapshot import Snapshot
from moetune.store.db import ResultsDB, Run
from moetune.store.record import HostRef, ModelRef, RunMeta, ServerInfo, ServiceRecord

Log = Callable[[str], None]
PASS_INDEX = 1_000_000  # a pass's requests are indexed from pass x this (their order within the run)


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutSpec:
    loads: tuple[ServiceLoad, ...]
    rounds: int = 1
    label: str | None = None
    slo: dict[str, float] | None = None
    launch_timeout_s: float = 600.0
    sweep_id: str | None = None  # the search the run belongs to (tune --with-load)


@dataclass(kw_only=True)
class _Service:
    """One loaded service, once prepared: its connection and what each pass sends."""

    load: ServiceLoad
    launched: Launched
    http: StreamingHttp
    info: ServerInfo
    model: str
    options: RequestOptions
    concurrency: int
    prompts: list[Prompt] = field(default_factory=list)  # synthetic or dataset: warm-up ones first
    prepared: list[Prepared] = field(default_factory=list)  # a replay's requests
    offsets: tuple[float, ...] | None = None  # a replay's due times (None: as fast as the slots allow)
    texts: list[list[SessionTexts]] = field(default_factory=list)  # sessions: one set per measured pass
    advice: list[Warning] = field(default_factory=list)
    skipped: int = 0

    @property
    def name(self) -> str:
        return self.load.service

    async def warmup(self, sink: Callable[[RequestRecord], None]) -> None:
        n = self.load.spec.warmup
        if not n or self.load.kind == REPLAY:
            return
        warm = (
            self.prompts[:n]
            if self.load.kind != SESSIONS
            else [
                Prompt(f"w{i} {self.texts[0][0].turns[0]}", None, self.load.spec.sessions.output_len)  # type: ignore[union-attr]
                for i in range(n)
            ]
        )
        await run_level(
            self.http, warm, LoadSpec(concurrency=1, requests=n), options=self.options, on_sample=sink, first_index=-n
        )

    async def run_pass(self, n: int, sink: Callable[[dict[str, object]], None], meter: LoadMeter | None) -> None:
        """The service's workload once (pass ``n`` of the run); each request to ``sink`` as it ends."""
        from moetune.bench.serve.session_run import run_sessions

        spec = self.load.spec
        first = n * PASS_INDEX
        if self.load.kind == SESSIONS:
            assert spec.sessions is not None
            await run_sessions(
                self.http,
                self.texts[min(n, len(self.texts) - 1)],
                spec.sessions,
                options=self.options,
                on_sample=sink,
                meter=meter,
            )
            return
        if self.load.kind == REPLAY:
            load = LoadSpec(concurrency=self.concurrency, requests=len(self.prepared), offsets=self.offsets)
            await run_level(
                self.http,
                self.prepared,
                load,
                options=self.options,
                on_sample=lambda r: sink(r.to_sample()),
                first_index=first,
                meter=meter,
                keep=False,
            )
            return
        c = self.concurrency
        load = LoadSpec(
            concurrency=c,
            requests=spec.level_requests(c),
            duration_s=spec.duration_s,
            rate=spec.rate,
            arrivals=spec.arrivals,
            seed=spec.seed + c + n,
        )
        await run_level(
            self.http,
            self.prompts[spec.warmup :] or self.prompts,
            load,
            options=self.options,
            on_sample=lambda r: sink(r.to_sample()),
            first_index=first,
            meter=meter,
            keep=False,
        )


def _sink(
    writer: SampleWriter, svc: _Service, load: str | None, *, rnd: int, phase: str = "measure"
) -> Callable[[dict[str, object]], None]:
    tags = {SERVICE: svc.name, **({LOAD: load} if load else {}), "round": rnd}
    return lambda s: writer.add({**s, **tags}, phase)


async def _prepare(ld: ServiceLoad, ln: Launched, passes: int, log: Log) -> _Service:
    spec = ld.spec
    http = connect(ln.url, timeout_s=spec.timeout_s)
    try:
        info = await probe(http, ln.url)
        if ld.kind == REPLAY:  # the recorded requests, as they are
            return await _prepare_replay(ld, ln, http, info=info, log=log)
        check_context(spec, info)
        from moetune.bench.serve.tokenizer import TokenizerCounter, token_counter

        model = spec.model or await _model_name(http)
        run_tag = os.urandom(2).hex()
        counter = token_counter(
            http,
            info,
            model,
            spec.thinking,
            tokenizer=spec.tokenizer,
            log=log,
            probe_tag=f"{run_tag}.probe",
            seed=spec.seed,
        )
        local = counter.describe() if isinstance(counter, TokenizerCounter) else None
        t = time.monotonic()
        if ld.kind == SESSIONS:
            from moetune.bench.serve.session_run import session_texts

            assert spec.sessions is not None
            exact = info.caps.tokenize or bool(local)
            texts = [
                await session_texts(counter, spec.sessions, f"{run_tag}.{p}", seed=spec.seed, exact=exact)
                for p in range(passes)
            ]
            options = RequestOptions(model=model, cache_prompt=True, thinking=spec.thinking, timeout_s=spec.timeout_s)
            svc = _Service(
                load=ld,
                launched=ln,
                http=http,
                info=info,
                model=model,
                options=options,
                concurrency=spec.sessions.sessions,
                texts=texts,
            )
            log(f"{ld.service}: prepared {passes} x {spec.sessions.sessions} sessions ({time.monotonic() - t:.1f} s)")
        else:
            c = spec.concurrency[0]
            prompts, skipped = await level_prompts(
                spec, counter, info, n=spec.warmup + spec.prompt_pool(c), run_tag=run_tag
            )
            options = RequestOptions(
                model=model, cache_prompt=spec.prefix_cache, thinking=spec.thinking, timeout_s=spec.timeout_s
            )
            svc = _Service(
                load=ld,
                launched=ln,
                http=http,
                info=info,
                model=model,
                options=options,
                concurrency=c,
                prompts=prompts,
                skipped=skipped,
            )
            log(f"{ld.service}: prepared {len(prompts)} prompts ({time.monotonic() - t:.1f} s)")
        svc.advice = run_warnings(info, [svc.concurrency], svc.skipped, tokenizer=local)
        return svc
    except InputError as e:  # its workload does not suit its server: say which service
        await http.aclose()
        raise InputError(f"--load {ld.service}: {e}", hint=e.hint) from None
    except BaseException:
        await http.aclose()
        raise


async def _prepare_replay(
    ld: ServiceLoad, ln: Launched, http: StreamingHttp, *, info: ServerInfo, log: Log
) -> _Service:
    from moetune.bench.record.replay import load_session, served_models
    from moetune.bench.record.schedule import (
        choose_model,
        due_offsets,
        parse_speed,
        replay_body,
        replay_concurrency,
        replay_requests,
    )

    assert ld.replay is not None
    session = load_session(ld.replay)
    reqs, skipped = replay_requests(session.exchanges)
    if not reqs:
        raise InputError(
            f"--load {ld.service}=replay:{ld.replay}: it records no chat or completions request to replay",
            hint="record a client's POST /v1/chat/completions or /v1/completions traffic",
        )
    served = await served_models(http)
    models = [choose_model(r.body.get("model"), served, ld.spec.model) for r in reqs]
    prepared = [Prepared(replay_body(r, m), r.max_tokens, r.target) for r, m in zip(reqs, models, strict=True)]
    offsets = due_offsets(reqs, parse_speed(ld.speed))
    c = ld.concurrency or replay_concurrency(session.exchanges)
    log(
        f"{ld.service}: replaying {len(reqs)} requests from {ld.replay} at {ld.speed} with up to {c} in flight"
        + (f" ({skipped} other recorded requests skipped)" if skipped else "")
    )
    svc = _Service(
        load=ld,
        launched=ln,
        http=http,
        info=info,
        model=ld.spec.model or (served[0] if served else "moetune"),
        options=RequestOptions(timeout_s=ld.spec.timeout_s),
        concurrency=c,
        prepared=prepared,
        offsets=None if offsets is None else tuple(offsets),
    )
    svc.advice = [w for w in run_warnings(info, [c], 0) if w.code != Code.NO_TOKENIZER]
    return svc


async def _alone(svc: _Service, n: int, rnd: int, *, writer: SampleWriter, meter: LoadMeter) -> None:
    try:
        await svc.run_pass(n, _sink(writer, svc, ALONE, rnd=rnd), meter)
    except ServerGone as gone:
        raise _gone(svc, gone, "alone") from None


async def _shared(services: list[_Service], n: int, rnd: int, *, writer: SampleWriter, meter: LoadMeter) -> None:
    """Every service's pass at once; one that finishes first keeps its load on (phase ``fill``)
    until the last is done."""
    remaining = {s.name for s in services}
    all_done = asyncio.Event()

    async def keep_busy(svc: _Service) -> None:
        while True:
            await svc.run_pass(n, _sink(writer, svc, SHARED, rnd=rnd, phase="fill"), None)

    async def one(svc: _Service) -> None:
        try:
            await svc.run_pass(n, _sink(writer, svc, SHARED, rnd=rnd), meter)
        except ServerGone as gone:
            raise _gone(svc, gone, "shared") from None
        remaining.discard(svc.name)
        if not remaining:
            all_done.set()
            return
        fill = asyncio.create_task(keep_busy(svc))
        waiter = asyncio.create_task(all_done.wait())
        await asyncio.wait({fill, waiter}, return_when=asyncio.FIRST_COMPLETED)
        fill.cancel()
        waiter.cancel()
        await asyncio.wait({fill, waiter})  # gone, without taking a cancellation of this task for theirs
        e = None if fill.cancelled() else fill.exception()
        if e is not None and not isinstance(e, ServerGone):  # a fill that stops for its server is no error
            raise e

    try:
        async with asyncio.TaskGroup() as tg:
            for svc in services:
                tg.create_task(one(svc))
    except* RuntimeFailure as eg:
        raise eg.exceptions[0] from None


def _gone(svc: _Service, gone: ServerGone, load: str) -> RuntimeFailure:
    from moetune.bench.servers import why_gone

    note = why_gone(svc.launched)
    return RuntimeFailure(f"{svc.name} ({load}): {gone}" + (f"; {note}" if note else ""), hint=gone.hint)


def _levels(
    db: ResultsDB, run_id: int, services: list[_Service] | list[ServiceRecord], slo: dict[str, float] | None
) -> list[dict[str, object]]:
    """The run's levels, per service (in the services' order) shared then alone, each annotated by
    its own server's slots."""
    levels = level_summaries(db.iter_samples(run_id), slo)
    out: list[dict[str, object]] = []
    for s in services:
        name = s.name
        info = s.info if isinstance(s, _Service) else s.server
        figures = sorted((lv for lv in levels if lv.service == name), key=lambda lv: lv.load != SHARED)
        mine = [{**lv.to_json(), "server": info.to_json()} for lv in figures]
        wl = s.load.to_json() if isinstance(s, _Service) else dict(s.workload)
        annotate(
            mine,
            slots=info.slots,
            prefix_cache=wl.get("kind") in (SESSIONS, REPLAY) or bool(mapping(wl.get("workload")).get("prefix_cache")),
        )
        out += mine
    return out


def layout_figures(db: ResultsDB, run_id: int, names: list[str], levels: list[dict[str, object]]) -> dict[str, object]:
    """The ``layout`` section of a layout run's summary and document: its services, the contention
    (each service's slowdown under the shared load) and what was busy phase by phase."""
    rows = contention(db.iter_samples(run_id))
    phases = [*(alone_phase(n) for n in names), SHARED_PHASE]
    seen = busy((Snapshot.from_json(m) for m in db.metrics(run_id)), phases)
    return {
        "services": names,
        "contention": [r.to_json() for r in rows],
        "busy": [b.to_json() for b in seen],
        "throughput": _throughput(levels),
    }


def _throughput(levels: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per service, output tokens/s and requests/s alone and shared (one figure a level: no interval)."""
    by: dict[str | None, dict[str | None, LevelSummary]] = {}
    for lv in map(LevelSummary.from_json, levels):
        by.setdefault(lv.service, {})[lv.load] = lv
    out: list[dict[str, object]] = []
    for name, d in by.items():
        a, s = d.get(ALONE), d.get(SHARED)
        ta, ts = (None if a is None else a.output_tok_s), (None if s is None else s.output_tok_s)
        out.append(
            {
                "service": name,
                "alone_output_tok_s": ta,
                "shared_output_tok_s": ts,
                "alone_request_s": None if a is None else a.request_s,
                "shared_request_s": None if s is None else s.request_s,
                "ratio": round(ts / ta, 4) if ta and ts is not None else None,
            }
        )
    return out


def _run_meta(spec: LayoutSpec, target: Target, services: list[_Service]) -> RunMeta:
    """What a layout run records: its services, rounds and loads, and the layout's first server."""
    names = [ld.service for ld in spec.loads]
    first = services[0]
    details = {
        "layout": {
            "services": names,
            "rounds": spec.rounds,
            "idle": [s.name for s in (target.spec.servers() if target.spec else ()) if s.name not in names],
        },
        "workload": {"layout": [s.load.to_json() for s in services]},
        "client": {"library": "asyncio", "moetune": __version__},
        "run_tag": None,
        "slo": dict(spec.slo) if spec.slo else None,
    }
    return RunMeta(
        kind=RunKind.SERVE_BENCH,
        moetune_version=__version__,
        argv=tuple(sys.argv),
        started_unix=time.time(),
        server=None,
        model=ModelRef(name=", ".join(f"{s.name}: {s.model}" for s in services)),
        host=HostRef.here(),
        engine_build=first.launched.engine_build or first.info.build,
        plan=target.doc,
        launch_run=first.launched.launch_run,
        launch=None,
        details=details,
    )


async def _rounds(
    spec: LayoutSpec,
    services: list[_Service],
    *,
    writer: SampleWriter,
    meter: LoadMeter,
    monitor: RunMonitor,
    log: Log,
) -> None:
    """The measured rounds: each service alone, then all at once, the order swapped every round."""
    names = [ld.service for ld in spec.loads]
    n = 0
    for rnd in range(spec.rounds):
        for load in (ALONE, SHARED) if rnd % 2 == 0 else (SHARED, ALONE):
            if load == ALONE:
                for s in services:
                    monitor.phase(alone_phase(s.name))
                    log(f"round {rnd + 1}: {s.name} alone ({s.load.describe()})")
                    await _alone(s, n, rnd, writer=writer, meter=meter)
            else:
                monitor.phase(SHARED_PHASE)
                log(f"round {rnd + 1}: {', '.join(names)} at once")
                await _shared(services, n, rnd, writer=writer, meter=meter)
            n += 1


async def _bench(
    spec: LayoutSpec,
    target: Target,
    servers: dict[str, Launched],
    *,
    db: ResultsDB,
    log: Log,
    monitor: RunMonitor,
    meter: LoadMeter,
) -> dict[str, Any]:
    services: list[_Service] = []
    run_id: int | None = None
    writer: SampleWriter | None = None
    status, error = RunStatus.FAILED, None
    levels: list[dict[str, object]] = []
    names = [ld.service for ld in spec.loads]
    passes = 2 * spec.rounds
    try:
        monitor.phase("prepare")
        for ld in spec.loads:
            services.append(await _prepare(ld, servers[ld.service], passes, log))
        meta = _run_meta(spec, target, services)
        label = spec.label or "layout " + " ".join(f"{s.name}={s.load.kind}:{s.concurrency or 'rec'}" for s in services)
        run_id = db.create_run(meta, label=label, target=target.name, sweep_id=spec.sweep_id)
        monitor.attach(db, run_id)
        for i, s in enumerate(services):
            db.add_service(
                run_id,
                ServiceRecord(
                    name=s.name,
                    position=i,
                    server=s.info,
                    model=model_ref(s.info.model_path, name=s.model),
                    launch=s.launched.facts,
                    argv=s.launched.server.argv,
                    workload=s.load.to_json(),
                ),
            )
        writer = w = SampleWriter(db, run_id)
        for s in services:
            monitor.phase(f"warmup {s.name}")
            await s.warmup(lambda r, s=s: w.add({**r.to_sample(), SERVICE: s.name}, "warmup"))  # type: ignore[misc]
        await _rounds(spec, services, writer=w, meter=meter, monitor=monitor, log=log)
        status = RunStatus.DONE
    except RuntimeFailure as e:
        error = str(e)
        raise
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = RunStatus.INTERRUPTED
        raise
    finally:
        for s in services:
            await s.http.aclose()
        if run_id is not None and writer is not None:
            monitor.phase(None)
            try:
                writer.close()
            finally:
                levels = _levels(db, run_id, services, spec.slo)
                advice = [a for s in services for a in s.advice]
                lay = layout_figures(db, run_id, names, levels)
                db.finish_run(
                    run_id,
                    status,
                    {
                        "levels": levels,
                        "warnings": [a.to_json() for a in advice],
                        "layout": lay,
                        **({"error": error} if error else {}),
                    },
                )
    assert run_id is not None
    return layout_doc(
        db.run(run_id),
        levels,
        lay,
        advice=[a for s in services for a in s.advice],
        services=db.services(run_id),
        samples=writer.count if writer else 0,
        slo=spec.slo,
    )


def layout_doc(
    run: Run,
    levels: list[dict[str, object]],
    layout: dict[str, object],
    *,
    advice: list[Warning],
    services: list[ServiceRecord],
    samples: int,
    slo: dict[str, float] | None,
) -> dict[str, object]:
    """serve-bench's document (:func:`moetune.bench.serve.run.report_doc`) with the ``layout``
    section: each service (its record), its contention and what was busy."""
    doc = report_doc(run, levels, advice, samples=samples, slo=slo)
    doc["layout"] = {
        **layout,
        "services": [s.to_json() for s in services],
        "idle": (run.meta.details.get("layout") or {}).get("idle") or [],
        "rounds": (run.meta.details.get("layout") or {}).get("rounds"),
    }
    return doc


def stored_layout_report(db: ResultsDB, run: Run, slo: dict[str, float] | None = None) -> dict[str, Any]:
    """:func:`layout_doc` of a stored layout run, its figures derived again from its samples."""
    services = db.services(run.id)
    slo = slo or run.meta.details.get("slo") or None
    levels = _levels(db, run.id, services, slo)
    lay = layout_figures(db, run.id, [s.name for s in services], levels)
    advice = [Warning.from_json(w) for w in (run.summary or {}).get("warnings") or []]
    return layout_doc(
        run,
        levels,
        lay,
        advice=advice,
        services=services,
        samples=sum(integer(lv.get("requests")) for lv in levels),
        slo=slo,
    )


def is_layout_run(run: Run) -> bool:
    return bool(run.meta.details.get("layout"))


def check_loads(target: Target, loads: tuple[ServiceLoad, ...]) -> None:
    """Every loaded service is a server of the plan; a URL has no layout."""
    if target.spec is None:
        raise InputError(
            "--load drives the services of a layout plan; TARGET is a running server's URL",
            hint="give the plan `moetune plan --layout` wrote, or drop --load",
        )
    if not loads:
        raise InputError("give at least one --load SERVICE=SPEC")
    names = [p.name for p in target.spec.servers()]
    for ld in loads:
        if ld.service not in names:
            raise InputError(
                f"--load {ld.service}=: {target.name} has no such server (servers: {', '.join(names)})",
                hint="name a service of the layout (`moetune plan --layout` named them)",
            )


def layout_bench(
    target: Target,
    spec: LayoutSpec,
    db: ResultsDB,
    *,
    log: Log = lambda s: None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
) -> dict[str, Any]:
    """Launch the layout, run the loads alone and together, store it as one run; return its
    document (:func:`layout_doc`)."""
    check_loads(target, spec.loads)
    if spec.rounds < 1:
        raise InputError("--rounds: at least 1")
    launch_id = new_launch_id()
    meter = LoadMeter()
    names = tuple(ld.service for ld in spec.loads)
    with (
        RunMonitor(
            lambda: watches_of_launch(launch_id), load=meter.figures, on_snapshot=on_snapshot, phase="launch"
        ) as monitor,
        launched_servers(target, names, timeout_s=spec.launch_timeout_s, status=log, launch_id=launch_id) as servers,
    ):
        doc = run_loop(_bench(spec, target, servers, db=db, log=log, monitor=monitor, meter=meter))
    run = db.run(doc["run"]["id"])
    flags = run.flags()
    doc["run"].update(contended=flags.contended, noisy=bool(flags.noisy), flags=flags.to_json())
    return doc
