"""`serve-bench TARGET --replay FILE`: a session `moetune record` wrote, sent again to a server.

The requests (:mod:`moetune.bench.record.schedule`) go through serve-bench's own load generator
as one level (:func:`~moetune.bench.serve.load.run_level`, open loop on the recorded arrival
offsets, or closed loop at ``--speed max``), each request stored as serve-bench stores one, so the
run is a serve-bench run like any other (`serve-report`, `compare`, `report`), whose workload
says what it replayed: the file's path and sha256, the speed, the requests kept and skipped.
A warning says when the replay generated other token counts than the recording.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune import __version__
from moetune.bench.analysis.serve import request_metrics, summarize_level
from moetune.bench.analysis.warnings import Code, Warning, run_warnings
from moetune.bench.http.client import StreamingHttp, connect
from moetune.bench.http.clock import run as run_loop
from moetune.bench.record.schedule import (
    ReplayRequest,
    choose_model,
    due_offsets,
    parse_speed,
    replay_body,
    replay_concurrency,
    replay_requests,
    token_differences,
)
from moetune.bench.record.session import Exchange
from moetune.bench.serve.load import LoadMeter, LoadSpec, Prepared, RequestOptions, ServerGone, run_level
from moetune.bench.serve.run import SampleWriter, finish_levels, report_doc
from moetune.bench.server import model_ref, probe
from moetune.bench.servers import PlanServers, ServerSource
from moetune.errors import InputError, RuntimeFailure
from moetune.jsonread import mapping
from moetune.kinds import RunKind, RunStatus
from moetune.monitor.sampler import RunMonitor, Watch, watches_for_url, watches_of_launch
from moetune.monitor.snapshot import Snapshot
from moetune.store.db import ResultsDB
from moetune.store.record import HostRef, RunMeta, ServerInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplaySpec:
    file: Path
    speed: str = "1x"  # 1x, Nx or max
    concurrency: int | None = None  # client slots; None: as many as the recording had in flight
    model: str | None = None  # every request's model field; None: the recorded one, if the target serves it
    timeout_s: float = 600
    label: str | None = None
    slo: dict[str, float] | None = None
    repeats: int = 1  # passes over the whole session measured, one after another
    warmup: int = 0  # passes before them, stored apart (phase warmup)
    pin_tokens: bool = False  # each request generates exactly the recorded completion tokens
    sweep_id: str | None = None  # files the run under a sweep or a tune (`tune --objective replay:FILE`)
    objective: str | None = None  # the tune objective it measures, stored with the run (details.objective)

    @property
    def passes(self) -> int:
        return self.warmup + self.repeats


@dataclass(frozen=True, slots=True)
class Session:
    path: Path
    sha256: str
    exchanges: list[Exchange]
    torn_tail: bool  # its last line was cut off (the recorder was killed while writing it)


def load_session(path: Path) -> Session:
    """A session file; an InputError that names the line for anything else."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"--replay {path}: cannot read it ({e.strerror or e})") from None
    lines = data.decode("utf-8", errors="replace").split("\n")
    out, torn = [], False
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(Exchange.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError) as e:
            if i == len(lines):  # no newline after it: a line cut off mid-write
                torn = True
                continue
            raise InputError(
                f"--replay {path}: line {i} is not a recorded request ({type(e).__name__}: {e})",
                hint="give a file `moetune record` wrote",
            ) from None
    if not out:
        raise InputError(f"--replay {path}: no recorded requests in it", hint="give a file `moetune record` wrote")
    return Session(path, hashlib.sha256(data).hexdigest(), out, torn)


async def served_models(http: StreamingHttp) -> list[str]:
    with contextlib.suppress(Exception):
        status, doc = await http.get_json("/v1/models")
        if status == 200 and isinstance(doc, dict) and isinstance(doc.get("data"), list):
            return [str(m["id"]) for m in doc["data"] if isinstance(m, dict) and m.get("id")]
    return []


def _watches(src: ServerSource) -> Callable[[], list[Watch]]:
    if isinstance(src, PlanServers):
        return lambda: watches_of_launch(src.launch_id) if src.launch_id else []
    return watches_for_url(src.target)


def _workload(
    spec: ReplaySpec, session: Session, reqs: list[ReplayRequest], *, skipped: int, concurrency: int, model: str | None
) -> dict[str, object]:
    return {
        "replay": {
            "file": str(session.path.resolve()),
            "sha256": session.sha256,
            "speed": spec.speed,
            "requests": len(reqs),
            "skipped": skipped,
            "repeats": spec.repeats,
            "warmup": spec.warmup,
            "pin_tokens": spec.pin_tokens,
            "recorded_concurrency": replay_concurrency(session.exchanges),
            "recorded_span_s": round(reqs[-1].offset_s, 3) if reqs else 0.0,
            "redacted": any(e.redacted for e in session.exchanges),
            "model": model,
        },
        "concurrency": [concurrency],
        "timeout_s": spec.timeout_s,
        "prefix_cache": True,
    }  # the session's requests may meet the cache they fill: no warning for it


def _token_advice(reqs: list[ReplayRequest], samples: list[dict[str, object]]) -> list[Warning]:
    by_index = {s["index"]: request_metrics(s) for s in samples}
    counts = [m.output_tokens if (m := by_index.get(i)) is not None and m.ok else None for i in range(len(reqs))]
    differ = token_differences(reqs, counts)
    if not differ:
        return []
    i = differ[0]
    return [
        Warning(
            code=Code.REPLAY_TOKENS,
            message=f"{len(differ)} of {len(reqs)} replayed requests generated another number "
            f"of tokens than recorded (request {i}, recorded #{reqs[i].seq}: "
            f"{reqs[i].recorded_completion_tokens} recorded, {counts[i]} now)",
            remedy="the same counts need the same model and deterministic lengths: record requests with max_tokens "
            "and ignore_eos (or temperature 0 and a seed), and replay against the same model",
            subject="replay",
        )
    ]


def _run_meta(
    spec: ReplaySpec,
    session: Session,
    source: ServerSource,
    *,
    info: ServerInfo,
    served: list[str],
    reqs: list[ReplayRequest],
    skipped: int,
    c: int,
) -> RunMeta:
    """What the replay's run records: the server, the model, the launch and the workload replayed."""
    ln = source.current
    return RunMeta(
        kind=RunKind.SERVE_BENCH,
        moetune_version=__version__,
        argv=tuple(sys.argv),
        started_unix=time.time(),
        server=info,
        model=model_ref(info.model_path, name=spec.model or (served[0] if served else None)),
        host=HostRef.here(),
        engine_build=(ln.engine_build if ln else None) or info.build,
        plan=source.plan.doc if isinstance(source, PlanServers) else None,
        launch_run=ln.launch_run if ln else None,
        launch=ln.facts if ln else None,
        details={
            "workload": _workload(spec, session, reqs, skipped=skipped, concurrency=c, model=spec.model),
            "client": {"library": "asyncio", "moetune": __version__},
            "run_tag": None,
            "skipped_overlong": 0,
            "slo": dict(spec.slo) if spec.slo else None,
            **(
                {
                    "objective": {
                        "name": spec.objective,
                        "file": str(session.path.resolve()),
                        "sha256": session.sha256,
                    }
                }
                if spec.objective
                else {}
            ),
        },
    )


async def _replay(
    spec: ReplaySpec,
    session: Session,
    source: ServerSource,
    *,
    db: ResultsDB,
    log: Callable[[str], None],
    monitor: RunMonitor,
    meter: LoadMeter,
) -> dict[str, object]:
    reqs, skipped = replay_requests(session.exchanges)
    offsets = due_offsets(reqs, parse_speed(spec.speed))
    c = spec.concurrency or replay_concurrency(session.exchanges)
    monitor.phase("launch" if isinstance(source, PlanServers) else None)
    url, _ = source.url_for(c)
    http = connect(url, timeout_s=spec.timeout_s)
    run_id: int | None = None
    writer: SampleWriter | None = None
    levels: list[dict[str, object]] = []
    advice: list[Warning] = []
    slots: int | None = None
    status, error = RunStatus.FAILED, None
    try:
        info = await probe(http, url)
        slots = info.slots
        served = await served_models(http)
        models = [choose_model(r.body.get("model"), served, spec.model) for r in reqs]
        swapped = {(str(r.body.get("model")), m) for r, m in zip(reqs, models, strict=True) if m is not None}
        for old, new in sorted(swapped):
            log(f"model {old!r} is sent as {new!r}" + ("" if spec.model else f" (the model {url} serves)"))
        tag = os.urandom(2).hex()

        def prepared(p: int) -> list[Prepared]:  # one pass; several passes: each its own salt
            salt = f"{tag}.r{p}" if spec.passes > 1 else None
            return [
                Prepared(
                    replay_body(r, m, salt=salt, pin=spec.pin_tokens),
                    (r.recorded_completion_tokens or r.max_tokens) if spec.pin_tokens else r.max_tokens,
                    r.target,
                )
                for r, m in zip(reqs, models, strict=True)
            ]

        log(
            f"replaying {len(reqs)} requests from {session.path} at {spec.speed} with up to {c} in flight"
            + (f", {spec.repeats} times after {spec.warmup} warmup pass(es)" if spec.passes > 1 else "")
            + (f" ({skipped} other recorded requests skipped)" if skipped else "")
        )
        if session.torn_tail:
            log(f"{session.path}: its last line was cut off (the recorder was killed while writing it); left out")
        advice = [w for w in run_warnings(info, [c], 0) if w.code != Code.NO_TOKENIZER]
        meta = _run_meta(spec, session, source, info=info, served=served, reqs=reqs, skipped=skipped, c=c)
        run_id = db.create_run(
            meta,
            label=spec.label or f"replay {session.path.name} {spec.speed}",
            target=source.target,
            sweep_id=spec.sweep_id,
        )
        monitor.attach(db, run_id)
        writer = sink = SampleWriter(db, run_id)
        load = LoadSpec(concurrency=c, requests=len(reqs), offsets=offsets)
        samples: list[dict[str, object]] = []
        first: list[dict[str, object]] = []
        for p in range(spec.passes):
            k = p - spec.warmup  # the measured pass's number; negative: a warmup pass
            phase = "warmup" if k < 0 else "measure"
            monitor.phase(
                f"replay warmup {p + 1}"
                if k < 0
                else f"replay c={c}" + (f" pass {k + 1}/{spec.repeats}" if spec.repeats > 1 else "")
            )
            mark: dict[str, object] = (
                {"replay": {"sha256": session.sha256[:16], "repeat": k}} if spec.passes > 1 else {}
            )

            def store(r: Any, mark: dict[str, object] = mark, phase: str = phase, k: int = k) -> None:
                sink.add({**r.to_sample(), **_at(mark, r.index - k * len(reqs))}, phase)

            try:
                records = await run_level(
                    http,
                    prepared(p),
                    load,
                    options=RequestOptions(timeout_s=spec.timeout_s),
                    on_sample=store,
                    meter=meter,
                    first_index=k * len(reqs),
                )
            except ServerGone as gone:
                level = summarize_level([*samples, *({**r.to_sample(), **mark} for r in gone.records)], spec.slo)
                level["stopped"] = str(gone)
                levels.append(level)
                error = f"replay: {gone}"
                raise RuntimeFailure(error, hint=gone.hint) from None
            if k >= 0:
                done = [{**r.to_sample(), **_at(mark, r.index - k * len(reqs))} for r in records]
                samples += done
                first = first or [{**d, "index": r.index - k * len(reqs)} for d, r in zip(done, records, strict=True)]
        level = summarize_level(samples, spec.slo)
        level["server"] = {**info.to_json(), **source.level_info(c)}
        levels.append(level)
        advice += _token_advice(reqs, first)
        status = RunStatus.DONE
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = RunStatus.INTERRUPTED
        raise
    finally:
        await http.aclose()
        if run_id is not None and writer is not None:
            finish_levels(
                db,
                run_id,
                writer,
                status=status,
                levels=levels,
                advice=advice,
                slots=slots,
                prefix_cache=True,
                error=error,
            )
    assert run_id is not None and writer is not None
    return report_doc(db.run(run_id), levels, advice, samples=writer.count, slo=spec.slo)


def _at(mark: dict[str, object], position: int) -> dict[str, object]:
    """A pass's mark with the request's position in the session."""
    return {"replay": {**mapping(mark.get("replay")), "request": position}} if mark else {}


def replay_bench(
    spec: ReplaySpec,
    db: ResultsDB,
    source: ServerSource,
    *,
    log: Callable[[str], None] = lambda s: None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
) -> dict[str, Any]:
    """Replay ``spec.file`` against ``source`` (a running server, or a plan moetune launches),
    store it in ``db`` as a serve-bench run, and return serve-bench's document (one level)."""
    parse_speed(spec.speed)  # a bad one is an input error before anything starts
    session = load_session(spec.file)
    reqs, _ = replay_requests(session.exchanges)
    if not reqs:
        raise InputError(
            f"--replay {spec.file}: it records no chat or completions request to replay",
            hint="record a client's POST /v1/chat/completions or /v1/completions traffic",
        )
    meter = LoadMeter()
    try:
        with RunMonitor(_watches(source), load=meter.figures, on_snapshot=on_snapshot) as monitor:
            return run_loop(_replay(spec, session, source, db=db, log=log, monitor=monitor, meter=meter))
    finally:
        source.close()
