"""A serving benchmark run: probe the server, prepare exact prompts, sweep the load levels, store
every request as it ends, and derive the figures from the stored samples.

Storing happens on a thread of its own, so SQLite commits never stall the event loop that is
timestamping tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from moetune import __version__
from moetune.bench.analysis.level_summary import LevelGoodput, LevelSummary, PromptTokenError
from moetune.bench.analysis.serve import RequestMetrics, level_summaries, level_summary
from moetune.bench.analysis.sessions import is_session_sample, summarize_sessions
from moetune.bench.analysis.warnings import Warning, annotate, run_warnings
from moetune.bench.http.client import StreamingHttp, connect
from moetune.bench.http.clock import run as run_loop
from moetune.bench.serve.dataset import (
    TokenCounter,
    dataset_prompts,
    load_sharegpt,
    probed_prompts,
    synthetic_prompts,
)
from moetune.bench.serve.load import LoadMeter, LoadSpec, Prompt, RequestOptions, ServerGone, run_level
from moetune.bench.serve.request import RequestRecord
from moetune.bench.serve.sessions import SessionSpec
from moetune.bench.serve.tokenizer import (
    SOURCE,
    TokenizerCounter,
    load_tokenizer,
    prepared_line,
    token_counter,
)
from moetune.bench.server import model_ref, probe
from moetune.bench.servers import PlanServers, RunningServer, ServerSource, why_gone
from moetune.bench.target import resolve, with_transport
from moetune.errors import InputError, RuntimeFailure
from moetune.kinds import RunKind, RunStatus
from moetune.monitor.sampler import RunMonitor, Watch, watches_for_url, watches_of_launch
from moetune.monitor.snapshot import Snapshot
from moetune.store.db import ResultsDB, Run
from moetune.store.record import HostRef, RunMeta, ServerInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeBenchSpec:
    url: str
    concurrency: tuple[int, ...] = (1,)
    rate: float | None = None
    arrivals: str = "poisson"
    dataset: Path | None = None
    input_len: int = 128
    output_len: int | None = None  # None: 64 for synthetic prompts, the reply's length for a dataset
    requests: int | None = None  # per level; None with no duration: 4 x concurrency, at least 8
    duration_s: float | None = None
    warmup: int = 2
    seed: int = 0
    prefix_cache: bool = False
    thinking: bool | None = None
    timeout_s: float = 600
    model: str | None = None
    label: str | None = None
    slo: dict[str, float] | None = None  # latency targets in ms (moetune.bench.analysis.slo): goodput per level
    sessions: SessionSpec | None = None  # agent sessions (moetune.bench.serve.session_run) instead of levels
    tokenizer: Path | None = None  # a tokenizer.json that counts prompts for a server without /tokenize

    def level_requests(self, c: int) -> int | None:
        if self.duration_s is not None:
            return self.requests
        return self.requests if self.requests is not None else max(8, 4 * c)

    def prompt_pool(self, c: int) -> int:
        n = self.level_requests(c)
        return n if n is not None else 4 * c + 16


class SampleWriter:
    """Hands samples to ``db.add_sample`` on a background thread, in order."""

    def __init__(self, db: ResultsDB, run_id: int) -> None:
        self.db, self.run_id = db, run_id
        self.q: queue.Queue[tuple[dict[str, object], str] | None] = queue.Queue()
        self.error: BaseException | None = None
        self.count = 0
        self.stored: dict[str, int] = {}  # samples stored, by phase
        self.thread = threading.Thread(target=self._loop, name="serve-bench-store", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (item := self.q.get()) is not None:
            try:
                self.db.add_sample(self.run_id, item[0], phase=item[1])
                self.count += 1
                self.stored[item[1]] = self.stored.get(item[1], 0) + 1
            except BaseException as e:  # reported by flush() and close(); keep draining
                self.error = e
            finally:
                self.q.task_done()

    def add(self, data: dict[str, object], phase: str = "measure") -> None:
        self.q.put((data, phase))

    def flush(self) -> None:
        """Return once every sample added so far is stored."""
        self.q.join()
        if self.error is not None:
            raise RuntimeFailure(f"storing samples failed: {self.error}")

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise RuntimeFailure(f"storing samples failed: {self.error}")


def _sink(writer: SampleWriter, phase: str) -> Callable[[RequestRecord], None]:
    return lambda r: writer.add(r.to_sample(), phase)


async def _model_name(http: StreamingHttp) -> str:
    with contextlib.suppress(Exception):
        status, doc = await http.get_json("/v1/models")
        if status == 200 and isinstance(doc, dict) and doc.get("data"):
            return str(doc["data"][0].get("id") or "moetune")
    return "moetune"


def check_context(spec: ServeBenchSpec, info: ServerInfo) -> None:
    """Synthetic prompts must fit a slot's context with their output; say how to make them fit."""
    if spec.sessions is not None and info.n_ctx_slot is not None:
        ss, slots = spec.sessions, info.slots or 1
        if (need := ss.context_need()) > info.n_ctx_slot:
            raise InputError(
                f"--system-tokens {ss.system_tokens} + --turns {ss.turns} x (--turn-tokens {ss.turn_tokens} + "
                f"--output-len {ss.output_len}) = {need} tokens do not fit the server's per-slot context of "
                f"{info.n_ctx_slot} tokens ({slots} slot(s)), chat template aside",
                hint=f"lower them, or restart llama-server with --parallel {slots} -c {slots * need * 5 // 4} or more",
            )
        return
    if spec.dataset is not None or info.n_ctx_slot is None:
        return
    need = spec.input_len + (spec.output_len or 64)
    if need > info.n_ctx_slot:
        slots = info.slots or 1
        raise InputError(
            f"--input-len {spec.input_len} + --output-len {spec.output_len or 64} = {need} tokens do not fit the "
            f"server's per-slot context of {info.n_ctx_slot} tokens ({slots} slot(s))",
            hint=f"lower them, or restart llama-server with --parallel {slots} -c {slots * need} or more",
        )


async def level_prompts(
    spec: ServeBenchSpec, counter: TokenCounter, info: ServerInfo, *, n: int, run_tag: str
) -> tuple[list[Prompt], int]:
    """``n`` prompts of the spec's workload (synthetic, or from its dataset), counted exactly where
    the server or a tokenizer can; and how many dataset entries were too long for a slot."""
    unique = not spec.prefix_cache
    predicted = isinstance(counter, TokenizerCounter)
    counted = info.caps.exact_prompts or predicted
    if spec.dataset is None:
        fit = synthetic_prompts if counted else probed_prompts
        prompts = await fit(
            counter, n, spec.input_len, spec.output_len or 64, seed=spec.seed, run_tag=run_tag, unique=unique
        )
        skipped = 0
    else:
        pick = await dataset_prompts(
            counter if counted else None,
            load_sharegpt(spec.dataset),
            n,
            output_len=spec.output_len,
            n_ctx_slot=info.n_ctx_slot,
            seed=spec.seed,
            run_tag=run_tag,
            unique=unique,
        )
        prompts, skipped = pick.prompts, pick.skipped_overlong
    return ([replace(p, source=SOURCE) for p in prompts] if predicted else prompts), skipped


def _level_line(lv: LevelSummary) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    errs = lv.error_count
    return (
        f"c={lv.concurrency}: {lv.ok}/{lv.requests} ok{f', {errs} errors' if errs else ''}, "
        f"TTFT p50 {f(lv.ttft_ms.p50)} ms, ITL p50 {f(lv.itl_ms.p50)} ms, "
        f"{f(lv.output_tok_s)} tok/s ({f(lv.duration_s)} s)"
        + _goodput_part(lv.goodput)
        + _predicted_part(lv.prompt_token_error)
    )


def _predicted_part(e: PromptTokenError | None) -> str:
    if e is None:
        return ""
    return (
        f", prompt lengths predicted within {e.mean_pct:.2f}% of the server's (mean; max "
        f"{e.max_pct:.2f}%, {e.mismatched} of {e.requests} off)"
    )


def _goodput_part(g: LevelGoodput | None) -> str:
    if g is None:
        return ""
    rate = "-" if g.req_s is None else f"{g.req_s:.2f}"
    return f", goodput {g.met}/{g.of} met the targets, {rate} req/s"


@dataclass(kw_only=True)
class _Run:
    """What the first level sets up and the others reuse."""

    run_id: int
    writer: SampleWriter
    prompts: list[Prompt]
    pools: list[int]
    options: RequestOptions
    meta: RunMeta
    advice: list[Warning]
    label: str


def serve_run_meta(
    spec: ServeBenchSpec,
    source: ServerSource,
    info: ServerInfo,
    *,
    model: str,
    run_tag: str,
    skipped: int = 0,
    sessions: Mapping[str, object] | None = None,
    tokenizer: Mapping[str, object] | None = None,
    details: Mapping[str, object] | None = None,
) -> RunMeta:
    """What a serve-bench run records: the server, the model, the launch behind it, and the
    workload (``sessions``: a sessions run's; ``tokenizer``: how prompts were counted)."""
    workload = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items() if k not in ("url", "label", "slo")
    }
    ln = source.current
    return RunMeta(
        kind=RunKind.SERVE_BENCH,
        moetune_version=__version__,
        argv=tuple(sys.argv),
        started_unix=time.time(),
        server=info,
        model=model_ref(info.model_path, name=model),
        host=HostRef.here(),
        engine_build=(ln.engine_build if ln else None) or info.build,
        plan=source.plan.doc if isinstance(source, PlanServers) else None,
        launch_run=ln.launch_run if ln else None,
        launch=ln.facts if ln else None,
        details={
            "workload": workload,
            "client": {"library": "asyncio", "moetune": __version__},
            "run_tag": run_tag,
            "skipped_overlong": skipped,
            **({"sessions": dict(sessions)} if sessions is not None else {}),
            "slo": dict(spec.slo) if spec.slo else None,
            **({"tokenizer": dict(tokenizer)} if tokenizer is not None else {}),
            **(details or {}),
        },
    )


async def _setup(
    spec: ServeBenchSpec,
    http: StreamingHttp,
    info: ServerInfo,
    *,
    source: ServerSource,
    db: ResultsDB,
    log: Callable[[str], None],
    monitor: RunMonitor,
    sweep_id: str | None = None,
) -> _Run:
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
    pools = [spec.prompt_pool(c) for c in spec.concurrency]
    t = time.monotonic()
    prompts, skipped = await level_prompts(spec, counter, info, n=spec.warmup + sum(pools), run_tag=run_tag)
    if isinstance(counter, TokenizerCounter):
        await counter.calibrate()  # done by the first count already
    log(prepared_line(f"{len(prompts)} prompts", counter, time.monotonic() - t))
    tokenizer = counter.describe() if isinstance(counter, TokenizerCounter) else None
    advice = run_warnings(info, list(spec.concurrency), skipped, tokenizer=tokenizer)
    meta = serve_run_meta(spec, source, info, model=model, run_tag=run_tag, skipped=skipped, tokenizer=tokenizer)
    label = spec.label or f"serve c={','.join(map(str, spec.concurrency))}"
    run_id = db.create_run(meta, label=label, target=source.target, sweep_id=sweep_id)
    monitor.attach(db, run_id)
    options = RequestOptions(
        model=model, cache_prompt=spec.prefix_cache, thinking=spec.thinking, timeout_s=spec.timeout_s
    )
    return _Run(
        run_id=run_id,
        writer=SampleWriter(db, run_id),
        prompts=prompts,
        pools=pools,
        options=options,
        meta=meta,
        advice=advice,
        label=label,
    )


def _gone_message(gone: ServerGone, concurrency: int, source: ServerSource) -> str:
    """What stopped the run, with why the server is gone when moetune launched it."""
    msg = f"level c={concurrency}: {gone}"
    note = why_gone(source.current) if source.current is not None else None
    return f"{msg}; {note}" if note else msg


def _stored_level(run: _Run, db: ResultsDB, first_seq: int, slo: dict[str, float] | None) -> LevelSummary:
    """The figures of the level whose samples are stored from ``first_seq`` on, once all are stored."""
    run.writer.flush()
    return level_summary(db.iter_samples(run.run_id, "measure", from_seq=first_seq), slo)


async def _connect(spec: ServeBenchSpec, url: str) -> tuple[StreamingHttp, ServerInfo]:
    http = connect(url, timeout_s=spec.timeout_s)
    try:
        info = await probe(http, url)
        check_context(spec, info)
    except BaseException:
        await http.aclose()
        raise
    return http, info


async def _bench(
    spec: ServeBenchSpec,
    source: ServerSource,
    db: ResultsDB,
    *,
    log: Callable[[str], None],
    monitor: RunMonitor,
    meter: LoadMeter,
    sweep_id: str | None = None,
) -> dict[str, object]:
    http: StreamingHttp | None = None
    run: _Run | None = None
    levels: list[dict[str, object]] = []
    status = RunStatus.FAILED
    error: str | None = None
    try:
        offset = spec.warmup
        for i, c in enumerate(spec.concurrency):
            monitor.phase(f"launch c={c}" if isinstance(source, PlanServers) and (i == 0 or source.match) else None)
            url, fresh = source.url_for(c)
            if http is None or fresh:
                if http is not None:
                    await http.aclose()
                http, info = await _connect(spec, url)
            if run is None:
                monitor.phase("prepare")
                run = await _setup(spec, http, info, source=source, db=db, log=log, monitor=monitor, sweep_id=sweep_id)
            if spec.warmup and (i == 0 or fresh):
                monitor.phase(f"warmup c={c}")
                await run_level(
                    http,
                    run.prompts[: spec.warmup],
                    LoadSpec(concurrency=1, requests=spec.warmup),
                    options=run.options,
                    on_sample=_sink(run.writer, "warmup"),
                    first_index=-spec.warmup,
                )
            monitor.phase(f"c={c}")
            pool = run.pools[i]
            pass_prompts = run.prompts[offset : offset + pool] or run.prompts
            offset += pool
            load = LoadSpec(
                concurrency=c,
                requests=spec.level_requests(c),
                duration_s=spec.duration_s,
                rate=spec.rate,
                arrivals=spec.arrivals,
                seed=spec.seed + c,
            )
            before = run.writer.stored.get("measure", 0)
            try:
                # the level's records are not kept: each is stored as it ends, and its figures are read
                # back from the history (a long level's records would grow without bound)
                await run_level(
                    http,
                    pass_prompts,
                    load,
                    options=run.options,
                    on_sample=_sink(run.writer, "measure"),
                    first_index=offset,
                    meter=meter,
                    keep=False,
                )
            except ServerGone as gone:
                stopped = _stored_level(run, db, before, spec.slo)
                levels.append({**stopped.to_json(), "stopped": str(gone)})
                error = _gone_message(gone, c, source)
                log(error)
                raise RuntimeFailure(error, hint=gone.hint) from None
            level = _stored_level(run, db, before, spec.slo)
            levels.append({**level.to_json(), "server": {**info.to_json(), **source.level_info(c)}})
            log(_level_line(level))
        status = RunStatus.DONE
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = RunStatus.INTERRUPTED
        raise
    finally:
        if http is not None:
            await http.aclose()
        if run is not None:
            finish_levels(
                db,
                run.run_id,
                run.writer,
                status=status,
                levels=levels,
                advice=run.advice,
                error=error,
                slots=run.meta.server.slots if run.meta.server else None,
                prefix_cache=spec.prefix_cache,
            )
    assert run is not None
    return report_doc(db.run(run.run_id), levels, run.advice, samples=run.writer.count, slo=spec.slo)


def finish_levels(
    db: ResultsDB,
    run_id: int,
    writer: SampleWriter,
    *,
    status: RunStatus,
    levels: list[dict[str, object]],
    advice: list[Warning],
    slots: int | None,
    prefix_cache: bool,
    error: str | None,
    extra: dict[str, object] | None = None,
) -> None:
    """The end of a serve-bench run, whatever ended it: its samples drained into the history, its
    levels annotated with their warnings, its status and summary stored (``extra`` beside the levels)."""
    try:
        writer.close()
    finally:
        annotate(levels, slots=slots, prefix_cache=prefix_cache)
        db.finish_run(
            run_id,
            status,
            {
                "levels": levels,
                "warnings": [a.to_json() for a in advice],
                **(extra or {}),
                **({"error": error} if error else {}),
            },
        )


def stored_report(
    db: ResultsDB,
    run: Run,
    slo: dict[str, float] | None = None,
    *,
    tap: Callable[[dict[str, object], RequestMetrics], None] | None = None,
) -> dict[str, object]:
    """:func:`report_doc` of a stored serve-bench run, its figures and warnings derived again from
    its samples (what each level ran on, a plan relaunched per level, is read from its summary).
    Goodput is judged by ``slo`` when given, else by the targets the run was measured with. The
    samples are streamed once (a long run is never held whole); ``tap`` sees each as it passes."""
    if run.kind != RunKind.SERVE_BENCH:
        raise InputError(
            f"run {run.id} is a {run.kind} run, not {RunKind.SERVE_BENCH}", hint="see `moetune results show`"
        )
    m = run.meta
    server = None if m.server is None else m.server.to_json()
    slo = slo or m.details.get("slo") or None
    ss = m.details.get("sessions")
    turns: list[dict[str, object]] = []  # an agent-sessions run's turns, for their figures

    def stream() -> Iterator[dict[str, object]]:
        for s in db.iter_samples(run.id):
            if ss and is_session_sample(s):
                turns.append(s)
            yield s

    figures = level_summaries(stream(), slo, tap=tap)
    stored = {(lv["concurrency"], lv["rate"]): lv for lv in (run.summary or {}).get("levels", [])}
    levels = [
        {**lv.to_json(), "server": stored.get((lv.concurrency, lv.rate), {}).get("server", server)} for lv in figures
    ]
    annotate(
        levels,
        slots=m.server.slots if m.server else None,
        prefix_cache=bool(ss or m.details.get("workload", {}).get("prefix_cache")),
    )
    advice = [Warning.from_json(w) for w in (run.summary or {}).get("warnings") or []]
    sessions = None
    if ss:
        sessions = summarize_sessions(turns, ss, slots=m.server.slots if m.server else None)
    return report_doc(run, levels, advice, samples=sum(lv.requests for lv in figures), slo=slo, sessions=sessions)


def report_doc(
    run: Run,
    levels: list[dict[str, object]],
    advice: list[Warning],
    *,
    samples: int,
    slo: dict[str, float] | None = None,
    sessions: dict[str, object] | None = None,
) -> dict[str, Any]:
    """The document `serve-bench --json` and `serve-report --json` print: the run (as every
    command names it), what it measured with, its warnings, the latency targets its goodput is
    judged by (``slo``, null without), the ``--tokenizer`` that counted its prompts and the chat
    template's tokens it measured (null without), and one entry per load level; an agent-sessions
    run adds ``sessions`` (:func:`moetune.bench.analysis.sessions.summarize_sessions`)."""
    m = run.meta
    return {
        "run": {
            **run.header(),
            "server": None if m.server is None else m.server.to_json(),
            "model": m.model.to_json(),
            "client": m.details.get("client"),
            "workload": m.details.get("workload"),
            "warnings": [a.message for a in advice],
            "advice": [a.to_json() for a in advice],
            "samples": samples,
            "slo": dict(slo) if slo else None,
            "tokenizer": m.details.get("tokenizer"),
            "flags": run.flags().to_json(),
        },
        "levels": levels,
        **({"sessions": sessions} if sessions is not None else {}),
    }


def server_source(
    spec: ServeBenchSpec,
    target: str,
    *,
    match_slots: bool,
    server: str | None,
    status: Callable[[str], None],
    transport: str | None = None,
    rdma_dev: str | None = None,
) -> ServerSource:
    """TARGET (a URL, or a plan moetune launches with ``transport``) as the source of each level's server."""
    t = with_transport(resolve(target, server), transport, rdma_dev)
    if t.url is not None:
        if match_slots:
            raise InputError(
                "--match-slots resizes a server moetune starts from a plan; it cannot change a running one",
                hint="restart the server with --parallel N and -c N x per-slot context, or give a plan",
            )
        return RunningServer(t.url)
    # each slot needs room for a synthetic prompt and its output (a whole session); a dataset's vary (4096 then)
    need = spec.input_len + (spec.output_len or 64) if spec.dataset is None else 4096
    if spec.sessions is not None:
        need = spec.sessions.context_need() * 5 // 4  # and the chat template's tokens
    return PlanServers(t, match=match_slots, need_per_slot=need, status=status)


def _watches(src: ServerSource) -> Callable[[], list[Watch]]:
    """The engine processes behind the source: the launch it is starting or serving, or the server at its URL."""
    if isinstance(src, PlanServers):
        return lambda: watches_of_launch(src.launch_id) if src.launch_id else []
    return watches_for_url(src.target)


class Workload(Protocol):
    """A workload that replaces the load levels (:func:`moetune.bench.serve.session_run.bench_sessions`)."""

    def __call__(
        self,
        spec: ServeBenchSpec,
        source: ServerSource,
        db: ResultsDB,
        *,
        log: Callable[[str], None],
        monitor: RunMonitor,
        meter: LoadMeter,
    ) -> Coroutine[Any, Any, dict[str, Any]]: ...


def serve_bench(
    spec: ServeBenchSpec,
    db: ResultsDB,
    *,
    log: Callable[[str], None] = lambda s: None,
    source: ServerSource | None = None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
    workload: Workload | None = None,
    sweep_id: str | None = None,
) -> dict[str, Any]:
    """Run the benchmark against ``spec.url`` (or the servers ``source`` launches); store it in
    ``db`` (a ResultsDB); return the result document (``run`` and ``levels``). The machine and the
    load are sampled throughout, stored with the run and given to ``on_snapshot`` (a live view).
    ``workload`` runs instead of the load levels (agent sessions:
    :func:`moetune.bench.serve.session_run.serve_sessions`); ``sweep_id`` files the run under a
    sweep or a tune (`moetune tune --objective goodput`)."""
    if not spec.concurrency or min(spec.concurrency) < 1:
        raise InputError("--concurrency: give one or more positive integers, e.g. 1,2,4")
    if spec.tokenizer is not None:
        load_tokenizer(spec.tokenizer)  # a bad file is told before any server is started or probed
    src = source or RunningServer(spec.url)
    meter = LoadMeter()
    try:
        with RunMonitor(_watches(src), load=meter.figures, on_snapshot=on_snapshot) as monitor:
            if workload is not None:
                doc = run_loop(workload(spec, src, db, log=log, monitor=monitor, meter=meter))
            else:
                doc = run_loop(_bench(spec, src, db, log=log, monitor=monitor, meter=meter, sweep_id=sweep_id))
    finally:
        src.close()
    run = db.run(doc["run"]["id"])  # its CPU accounting, stored as the monitor closed
    flags = run.flags()
    doc["run"].update(contended=flags.contended, noisy=bool(flags.noisy), flags=flags.to_json())
    return doc
