"""Single-stream benchmark against a running server: warm-up, repeats, every sample stored as it
arrives. The imperative shell around :mod:`workloads` (what to send), :mod:`request` (how) and
:mod:`moetune.bench.analysis.summary` (what it means).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from moetune import __version__
from moetune.bench.analysis.summary import run_summary
from moetune.bench.http.client import StreamingHttp, connect
from moetune.bench.http.clock import run as run_loop
from moetune.bench.server import model_ref, probe, tokenize
from moetune.bench.single.request import stream
from moetune.bench.single.workloads import (
    CHAT,
    FILLER_TEXT,
    Workload,
    chat_body,
    completion_body,
    depth_prompts,
)
from moetune.bench.target import Target
from moetune.errors import InputError, MoetuneError, RuntimeFailure
from moetune.jsonread import mapping, number
from moetune.kinds import RunKind, RunStatus
from moetune.monitor.sampler import RunMonitor, watches_for_url, watches_of_launch
from moetune.monitor.snapshot import Snapshot
from moetune.store.db import ResultsDB
from moetune.store.record import HostRef, LaunchRef, RunMeta, ServerInfo

Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    repeats: int = 5
    warmup: int = 1
    cache_bust: bool = True  # cache_prompt=false on chat workloads: every run processes the whole prompt
    timeout_s: float = 600.0
    seed: int = 0  # bootstrap seed


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """What moetune knows of a server it launched for the benchmark (none for a bare URL)."""

    plan: dict[str, object]
    engine_build: str | None
    model_path: str | None
    launch_run: str
    service: str | None = None  # the plan's service the benchmark measures
    facts: LaunchRef | None = None  # the transport asked and confirmed, the load time

    def uncertainty(self) -> dict[str, float]:
        """The stated band of the plan's prediction, in percent (its calibration's, else the built-in one)."""
        from moetune.plan.calibrate import UNCALIBRATED_PCT

        said = mapping(mapping(self.plan.get("speed_calibration")).get("uncertainty"))
        return {
            "tg_pct": number(said.get("tg_pct")) or UNCALIBRATED_PCT,
            "pp_pct": number(said.get("pp_pct")) or UNCALIBRATED_PCT,
        }

    def predicted(self) -> dict[str, object] | None:
        """The plan's speed prediction for the measured service (``Prediction.to_json()``)."""
        listed = self.plan.get("services")
        services = [mapping(s) for s in listed] if isinstance(listed, list) else []
        sj = next((s for s in services if s.get("name") == self.service), services[0] if services else None)
        predicted = sj.get("predicted") if sj else None
        return dict(predicted) if isinstance(predicted, Mapping) and predicted.get("work") else None


def run_meta(
    info: ServerInfo,
    workloads: list[Workload],
    options: BenchOptions,
    *,
    launch: Launch | None = None,
    argv: list[str] | None = None,
    details: Mapping[str, Any] | None = None,
) -> RunMeta:
    return RunMeta(
        kind=RunKind.BENCH,
        moetune_version=__version__,
        argv=tuple(sys.argv if argv is None else argv),
        started_unix=time.time(),
        server=info,
        model=model_ref((launch.model_path if launch else None) or info.model_path, name=info.model_alias),
        host=HostRef.here(),
        engine_build=(launch.engine_build if launch else None) or info.build,
        plan=launch.plan if launch else None,
        launch_run=launch.launch_run if launch else None,
        launch=launch.facts if launch else None,
        details={
            "workloads": [w.to_json() for w in workloads],
            "options": asdict(options),
            **_expected(launch, workloads),
            **(details or {}),
        },
    )


def _expected(launch: Launch | None, workloads: list[Workload]) -> dict[str, object]:
    """``{"predicted": {workload: the plan's prediction for it}}`` when a plan was launched."""
    predicted = launch.predicted() if launch else None
    if predicted is None:
        return {}
    from moetune.bench.analysis.predicted import expected

    return {
        "predicted": expected(
            predicted,
            [
                (w.name, 0, None, w.tg_depth) if w.kind == CHAT else (w.name, w.depth, w.pp_tokens, w.tg_depth)
                for w in workloads
            ],
        ),
        "prediction_uncertainty": launch.uncertainty() if launch else None,
    }


def _check_depths(info: ServerInfo, workloads: list[Workload]) -> None:
    depths = [w.name for w in workloads if w.kind != CHAT]
    if depths and not info.caps.depth:
        missing = [
            e
            for e, ok in (
                ("/props", info.caps.props),
                ("/tokenize", info.caps.tokenize),
                ("timings", info.caps.timings),
            )
            if not ok
        ]
        raise InputError(
            f"depth workloads ({', '.join(depths)}) need llama-server: token-id prompts on /completion "
            f"pinned to a slot, and the cache confirmed by its timings; {info.url} has no "
            f"{', '.join(missing)} (an OpenAI-compatible server that is not llama-server)",
            hint="drop --depth (chat workloads work against any OpenAI-compatible server), or point "
            "bench at a llama-server",
        )
    for w in workloads:
        if w.kind == CHAT or info.n_ctx_slot is None:
            continue
        need = w.depth + w.pp_tokens + w.max_tokens
        if need > info.n_ctx_slot:
            raise InputError(
                f"workload {w.name}: depth {w.depth} + pp {w.pp_tokens} + tg {w.max_tokens} = {need} "
                f"tokens, more than the server's context per slot ({info.n_ctx_slot})",
                hint="lower --depth, --pp-tokens or --tg-tokens, or start the server with a larger -c",
            )


class _Session:
    def __init__(
        self,
        db: ResultsDB,
        run_id: int,
        url: str,
        *,
        http: StreamingHttp,
        options: BenchOptions,
        progress: Progress | None,
        total: int,
        model: str | None,
        monitor: RunMonitor,
    ) -> None:
        self.db, self.run_id, self.url, self.http, self.opt = db, run_id, url, http, options
        self.model = model
        self.monitor = monitor
        self.progress, self.total, self.done = progress, total, 0
        self._filler: list[int] | None = None

    def _tick(self, what: str) -> None:
        self.done += 1
        if self.progress:
            self.progress(what, self.done, self.total)

    def _base(self, w: Workload, i: int) -> dict[str, object]:
        return {
            "workload": w.name,
            "kind": w.kind,
            "depth": w.depth if w.kind != CHAT else None,
            "repeat": i,
            "thinking": w.thinking,
            "ignore_eos": w.ignore_eos,
            "max_tokens": w.max_tokens,
        }

    async def _stream(self, path: str, body: dict[str, object]) -> dict[str, object]:
        return await stream(self.http, self.url, path, body, timeout_s=self.opt.timeout_s)

    async def chat(self, w: Workload) -> None:
        for i in range(self.opt.warmup + self.opt.repeats):
            phase = "warmup" if i < self.opt.warmup else "measure"
            self.monitor.phase(f"{w.name} {phase}")
            body = chat_body(w, cache_prompt=not self.opt.cache_bust, model=self.model)
            raw = await self._stream("/v1/chat/completions", body)
            sample = {
                **self._base(w, i - self.opt.warmup if phase == "measure" else i),
                "expect_cached": 0 if self.opt.cache_bust else None,
                **raw,
            }
            self.db.add_sample(self.run_id, sample, phase=phase)
            self._tick(f"{w.name} {phase}")

    async def depth(self, w: Workload) -> None:
        if self._filler is None:
            self._filler = await tokenize(self.http, self.url, FILLER_TEXT)
        count = self.opt.warmup + self.opt.repeats
        fill, blocks = depth_prompts(self._filler, w.depth, w.pp_tokens, count)
        for i, block in enumerate(blocks):
            phase = "warmup" if i < self.opt.warmup else "measure"
            self.monitor.phase(f"{w.name} {phase}")
            if fill:  # leaves exactly the fill in slot 0's cache (see workloads.depth_prompts)
                raw = await self._stream("/completion", completion_body(fill, 1))
                self.db.add_sample(self.run_id, {**self._base(w, i), "fill_tokens": len(fill), **raw}, phase="fill")
            body = completion_body(fill + block, w.max_tokens, cache_prompt=bool(fill))
            raw = await self._stream("/completion", body)
            sample = {
                **self._base(w, i - self.opt.warmup if phase == "measure" else i),
                "expect_cached": len(fill),
                "expect_prompt_n": len(block),
                **raw,
            }
            self.db.add_sample(self.run_id, sample, phase=phase)
            self._tick(f"{w.name} {phase}")


def default_label(info: ServerInfo) -> str:
    where = info.url.split("://", 1)[-1]
    return f"{info.model_alias}@{where}" if info.model_alias else where


def bench(
    db: ResultsDB,
    url: str,
    workloads: list[Workload],
    options: BenchOptions,
    *,
    label: str | None = None,
    target: str | None = None,
    launch: Launch | None = None,
    sweep_id: str | None = None,
    progress: Progress | None = None,
    on_start: Callable[[int], None] | None = None,
    monitor: RunMonitor | None = None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
    explain: Callable[[], str | None] | None = None,
    details: Mapping[str, Any] | None = None,
) -> int:
    """Benchmark the server at ``url``; return the run's id. Every sample is committed as it comes;
    on Ctrl-C the run is marked interrupted (its samples stay) and KeyboardInterrupt propagates.

    The machine is sampled throughout (``monitor``, started by the caller while a plan's server
    loads; else one watching ``url``'s server from now, its snapshots also given to ``on_snapshot``).
    When a request fails, ``explain`` may say why (a launched server that died: its log's last error).
    ``details`` go into the run's record beside the workloads (an interleaved sweep's round tag)."""
    if options.repeats < 1 or options.warmup < 0:
        raise InputError("--repeats must be at least 1 and --warmup at least 0")
    url = url.rstrip("/")
    with contextlib.ExitStack() as stack:
        if monitor is None:
            monitor = stack.enter_context(RunMonitor(watches_for_url(url), on_snapshot=on_snapshot))
        return run_loop(
            _bench(
                db,
                url,
                workloads,
                options,
                label=label,
                target=target,
                launch=launch,
                sweep_id=sweep_id,
                progress=progress,
                on_start=on_start,
                monitor=monitor,
                explain=explain,
                details=details,
            )
        )


async def _bench(
    db: ResultsDB,
    url: str,
    workloads: list[Workload],
    options: BenchOptions,
    *,
    label: str | None,
    target: str | None,
    launch: Launch | None,
    sweep_id: str | None,
    progress: Progress | None,
    on_start: Callable[[int], None] | None,
    monitor: RunMonitor,
    explain: Callable[[], str | None] | None,
    details: Mapping[str, Any] | None = None,
) -> int:
    http = connect(url, timeout_s=options.timeout_s)
    try:
        info = await probe(http, url)
        _check_depths(info, workloads)
        meta = run_meta(info, workloads, options, launch=launch, details=details)
        run_id = db.create_run(meta, label=label or default_label(info), target=target or url, sweep_id=sweep_id)
        monitor.attach(db, run_id)
        if on_start:
            on_start(run_id)
        s = _Session(
            db,
            run_id,
            url,
            http=http,
            options=options,
            progress=progress,
            total=len(workloads) * (options.warmup + options.repeats),
            model=info.model_alias,
            monitor=monitor,
        )
        if progress:
            progress("starting", 0, s.total)
        try:
            for w in workloads:
                await (s.chat(w) if w.kind == CHAT else s.depth(w))
        except (KeyboardInterrupt, asyncio.CancelledError):
            db.finish_run(run_id, RunStatus.INTERRUPTED, _safe_summary(db, run_id, options))
            raise
        except (MoetuneError, ValueError) as e:
            note = explain() if explain else None  # a launched server that died says why
            summary = _safe_summary(db, run_id, options) or {}
            summary["error"] = message = f"{e}; {note}" if note else str(e)
            db.finish_run(run_id, RunStatus.FAILED, summary)
            if note:
                raise RuntimeFailure(
                    message,
                    hint=f"`moetune doctor` reads the launch's logs; the "
                    f"{len(db.samples(run_id))} samples measured before are kept in run {run_id}",
                ) from None
            if isinstance(e, MoetuneError):
                raise
            raise RuntimeFailure(f"{url}: {e}") from None
    finally:
        await http.aclose()
    db.finish_run(run_id, RunStatus.DONE, run_summary(db.samples(run_id), seed=options.seed))
    return run_id


def bench_target(
    db: ResultsDB,
    t: Target,
    workloads: list[Workload],
    options: BenchOptions,
    *,
    label: str | None = None,
    launch_timeout_s: float = 600.0,
    sweep_id: str | None = None,
    status: Callable[[str], None] | None = None,
    progress_for: Callable[[str], Progress | None] | None = None,
    on_start: Callable[[int], None] | None = None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
    details: Mapping[str, Any] | None = None,
) -> int:
    """:func:`bench` of a target: the server at its URL, or its plan's server, launched for the
    benchmark and stopped after it (sampled from its start)."""
    if t.url is not None:
        lab = label or t.url.split("://", 1)[-1]
        return bench(
            db,
            t.url,
            workloads,
            options,
            label=label,
            target=t.name,
            sweep_id=sweep_id,
            progress=progress_for(lab) if progress_for else None,
            on_start=on_start,
            on_snapshot=on_snapshot,
            details=details,
        )
    from moetune.bench.servers import launched, new_launch_id, why_gone

    assert t.doc is not None
    lab = label or str(t.label)
    launch_id = new_launch_id()
    with (
        RunMonitor(lambda: watches_of_launch(launch_id), phase="launch", on_snapshot=on_snapshot) as monitor,
        launched(t, timeout_s=launch_timeout_s, status=status, launch_id=launch_id) as srv,
    ):
        try:
            return bench(
                db,
                srv.url,
                workloads,
                options,
                label=lab,
                target=t.name,
                sweep_id=sweep_id,
                launch=Launch(
                    plan=t.doc,
                    engine_build=srv.engine_build,
                    model_path=srv.model_path,
                    launch_run=srv.launch_run,
                    service=t.server,
                    facts=srv.facts,
                ),
                progress=progress_for(lab) if progress_for else None,
                on_start=on_start,
                monitor=monitor,
                explain=lambda: why_gone(srv),
                details=details,
            )
        finally:
            monitor.close()  # its last sample while the processes still run


def _safe_summary(db: ResultsDB, run_id: int, options: BenchOptions) -> dict[str, object] | None:
    samples = db.samples(run_id)
    return run_summary(samples, seed=options.seed) if samples else None
