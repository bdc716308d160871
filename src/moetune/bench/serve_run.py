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
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moetune import __version__
from moetune.bench.serve_client import RequestRecord, ServerInfo, probe_server
from moetune.bench.serve_clock import run as run_loop
from moetune.bench.serve_dataset import (
    ServerTokenCounter,
    dataset_prompts,
    load_sharegpt,
    synthetic_prompts,
)
from moetune.bench.serve_http import DEFAULT_LIBRARY, StreamingHttp, make_client
from moetune.bench.serve_load import LoadSpec, Prompt, RequestOptions, run_level
from moetune.bench.serve_metrics import summarize_level
from moetune.bench.serve_servers import RunningServer, ServerSource
from moetune.bench.serve_warnings import Advice, annotate, run_advice
from moetune.errors import InputError, RuntimeFailure

KIND = "serve-bench"


@dataclass(frozen=True, slots=True)
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
    library: str = DEFAULT_LIBRARY
    label: str | None = None
    extra_meta: dict[str, Any] = field(default_factory=dict)

    def level_requests(self, c: int) -> int | None:
        if self.duration_s is not None:
            return self.requests
        return self.requests if self.requests is not None else max(8, 4 * c)

    def prompt_pool(self, c: int) -> int:
        n = self.level_requests(c)
        return n if n is not None else 4 * c + 16


class SampleWriter:
    """Hands samples to ``db.add_sample`` on a background thread, in order."""

    def __init__(self, db: Any, run_id: int) -> None:
        self.db, self.run_id = db, run_id
        self.q: queue.Queue[tuple[dict[str, Any], str] | None] = queue.Queue()
        self.error: BaseException | None = None
        self.count = 0
        self.thread = threading.Thread(target=self._loop, name="serve-bench-store", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (item := self.q.get()) is not None:
            try:
                self.db.add_sample(self.run_id, item[0], phase=item[1])
                self.count += 1
            except BaseException as e:  # reported by close(); keep draining
                self.error = e

    def add(self, data: dict[str, Any], phase: str = "measure") -> None:
        self.q.put((data, phase))

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise RuntimeFailure(f"storing samples failed: {self.error}")


def _sink(writer: SampleWriter, phase: str) -> Callable[[RequestRecord], None]:
    return lambda r: writer.add(r.to_sample(), phase)


async def _reachable(http: StreamingHttp, url: str) -> None:
    try:
        status, _ = await http.get_json("/health")
    except Exception as e:
        raise RuntimeFailure(f"cannot reach {url}: {http.classify(e)} ({e})",
                             hint="start the server, or check the URL and port") from None
    if status == 503:
        raise RuntimeFailure(f"{url} is still loading its model (/health: 503)", hint="wait until it is ready")


async def _model_name(http: StreamingHttp) -> str:
    with contextlib.suppress(Exception):
        status, doc = await http.get_json("/v1/models")
        if status == 200 and isinstance(doc, dict) and doc.get("data"):
            return str(doc["data"][0].get("id") or "moetune")
    return "moetune"


def check_context(spec: ServeBenchSpec, info: ServerInfo) -> None:
    """Synthetic prompts must fit a slot's context with their output; say how to make them fit."""
    if spec.dataset is not None or info.n_ctx_slot is None:
        return
    need = spec.input_len + (spec.output_len or 64)
    if need > info.n_ctx_slot:
        slots = info.slots or 1
        raise InputError(
            f"--input-len {spec.input_len} + --output-len {spec.output_len or 64} = {need} tokens do not fit the "
            f"server's per-slot context of {info.n_ctx_slot} tokens ({slots} slot(s))",
            hint=f"lower them, or restart llama-server with --parallel {slots} -c {slots * need} or more")


def _model_fingerprint(info: ServerInfo) -> str | None:
    if not info.model_path or not Path(info.model_path).is_file():
        return None
    try:
        from moetune.model.profile import fingerprint, load_profile

        return fingerprint(load_profile(info.model_path))
    except Exception:
        return None


async def _prompts(spec: ServeBenchSpec, counter: ServerTokenCounter, info: ServerInfo, n: int,
                   run_tag: str) -> tuple[list[Prompt], int]:
    unique = not spec.prefix_cache
    if spec.dataset is None:
        return await synthetic_prompts(counter, n, spec.input_len, spec.output_len or 64, seed=spec.seed,
                                       run_tag=run_tag, unique=unique), 0
    pick = await dataset_prompts(counter, load_sharegpt(spec.dataset), n, output_len=spec.output_len,
                                 n_ctx_slot=info.n_ctx_slot, seed=spec.seed, run_tag=run_tag, unique=unique)
    return pick.prompts, pick.skipped_overlong


def _level_line(lv: dict[str, Any]) -> str:
    def f(x: Any) -> str:
        return "-" if x is None else f"{x:.1f}"

    errs = sum(lv["errors"].values())
    return (f"c={lv['concurrency']}: {lv['ok']}/{lv['requests']} ok{f', {errs} errors' if errs else ''}, "
            f"TTFT p50 {f(lv['ttft_ms']['p50'])} ms, ITL p50 {f(lv['itl_ms']['p50'])} ms, "
            f"{f(lv['output_tok_s'])} tok/s ({f(lv['duration_s'])} s)")


@dataclass
class _Run:
    """What the first level sets up and the others reuse."""

    run_id: int
    writer: SampleWriter
    prompts: list[Prompt]
    pools: list[int]
    options: RequestOptions
    meta: dict[str, Any]
    advice: list[Advice]
    label: str


async def _setup(spec: ServeBenchSpec, http: StreamingHttp, info: ServerInfo, target: str, db: Any,
                 log: Callable[[str], None]) -> _Run:
    model = spec.model or await _model_name(http)
    counter = ServerTokenCounter(http, spec.thinking)
    run_tag = os.urandom(2).hex()
    pools = [spec.prompt_pool(c) for c in spec.concurrency]
    t = time.monotonic()
    prompts, skipped = await _prompts(spec, counter, info, spec.warmup + sum(pools), run_tag)
    log(f"prepared {len(prompts)} prompts with exact token counts ({counter.calls} tokenizer calls, "
        f"{time.monotonic() - t:.1f} s)")
    advice = run_advice(info.to_json(), list(spec.concurrency), skipped)
    workload = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()
                if k not in ("url", "label", "extra_meta", "library")}
    meta: dict[str, Any] = {
        "target": target, "server": info.to_json(), "engine_build": info.build, "model": model,
        "model_fingerprint": _model_fingerprint(info), "hardware": _hardware(),
        "workload": workload, "client": {"library": spec.library, "moetune": __version__},
        "run_tag": run_tag, "skipped_overlong": skipped, "started_unix": time.time(), **spec.extra_meta}
    label = spec.label or f"serve c={','.join(map(str, spec.concurrency))}"
    run_id = db.create_run(kind=KIND, label=label, target=target, meta=meta)
    options = RequestOptions(model=model, cache_prompt=spec.prefix_cache, thinking=spec.thinking,
                             timeout_s=spec.timeout_s)
    return _Run(run_id, SampleWriter(db, run_id), prompts, pools, options, meta, advice, label)


async def _connect(spec: ServeBenchSpec, url: str) -> tuple[StreamingHttp, ServerInfo]:
    http = make_client(url, timeout_s=spec.timeout_s, library=spec.library)
    try:
        await _reachable(http, url)
        info = await probe_server(http)
        check_context(spec, info)
    except BaseException:
        await http.aclose()
        raise
    return http, info


async def _bench(spec: ServeBenchSpec, source: ServerSource, db: Any, log: Callable[[str], None]) -> dict[str, Any]:
    http: StreamingHttp | None = None
    run: _Run | None = None
    levels: list[dict[str, Any]] = []
    status = "failed"
    try:
        offset = spec.warmup
        for i, c in enumerate(spec.concurrency):
            url, fresh = source.url_for(c)
            if http is None or fresh:
                if http is not None:
                    await http.aclose()
                http, info = await _connect(spec, url)
            if run is None:
                run = await _setup(spec, http, info, source.target, db, log)
            if spec.warmup and (i == 0 or fresh):
                await run_level(http, run.prompts[:spec.warmup], LoadSpec(1, requests=spec.warmup), run.options,
                                _sink(run.writer, "warmup"), first_index=-spec.warmup)
            pool = run.pools[i]
            level_prompts = run.prompts[offset:offset + pool] or run.prompts
            offset += pool
            load = LoadSpec(c, requests=spec.level_requests(c), duration_s=spec.duration_s, rate=spec.rate,
                            arrivals=spec.arrivals, seed=spec.seed + c)
            records = await run_level(http, level_prompts, load, run.options, _sink(run.writer, "measure"),
                                      first_index=offset)
            level = summarize_level([r.to_sample() for r in records])
            level["server"] = {**info.to_json(), **source.level_info(c)}
            levels.append(level)
            log(_level_line(level))
        status = "done"
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = "interrupted"
        raise
    finally:
        if http is not None:
            await http.aclose()
        if run is not None:
            try:
                run.writer.close()
            finally:
                annotate(levels, slots=run.meta["server"]["slots"], prefix_cache=spec.prefix_cache)
                db.finish_run(run.run_id, status, {"levels": levels, "warnings": [a.to_json() for a in run.advice]})
    assert run is not None
    return {"run": {"id": run.run_id, "kind": KIND, "label": run.label, "target": source.target, "status": status,
                    "server": run.meta["server"], "model": run.meta["model"], "client": run.meta["client"],
                    "workload": run.meta["workload"], "warnings": [a.message for a in run.advice],
                    "advice": [a.to_json() for a in run.advice], "samples": run.writer.count},
            "levels": levels}


def _hardware() -> str | None:
    try:
        from moetune.hardware.fingerprint import fingerprint

        return fingerprint()
    except Exception:
        return None


def serve_bench(spec: ServeBenchSpec, db: Any, log: Callable[[str], None] = lambda s: None,
                source: ServerSource | None = None) -> dict[str, Any]:
    """Run the benchmark against ``spec.url`` (or the servers ``source`` launches); store it in
    ``db`` (a ResultsDB); return the result document (``run`` and ``levels``)."""
    if not spec.concurrency or min(spec.concurrency) < 1:
        raise InputError("--concurrency: give one or more positive integers, e.g. 1,2,4")
    src = source or RunningServer(spec.url)
    try:
        return run_loop(_bench(spec, src, db, log))
    finally:
        src.close()
