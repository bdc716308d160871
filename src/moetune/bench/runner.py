"""Single-stream benchmark against a running server: warm-up, repeats, every sample stored as it
arrives. The imperative shell around :mod:`workloads` (what to send), :mod:`client` (how) and
:mod:`summary` (what it means).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from moetune import __version__
from moetune.bench import client as http
from moetune.bench.summary import run_summary
from moetune.bench.workloads import CHAT, FILLER_TEXT, Workload, chat_body, completion_body, depth_prompts
from moetune.errors import InputError, MoetuneError, RuntimeFailure
from moetune.hardware.fingerprint import fingerprint as hw_fingerprint
from moetune.hardware.fingerprint import machine_facts
from moetune.store.db import ResultsDB

Progress = Callable[[str, int, int], None]  # (what, done, total)
META_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class BenchOptions:
    repeats: int = 5
    warmup: int = 1
    cache_bust: bool = True  # cache_prompt=false on chat workloads: every run processes the whole prompt
    timeout_s: float = 600.0
    seed: int = 0  # bootstrap seed


def model_identity(model_path: str | None) -> dict[str, Any]:
    """Path and structural fingerprint of the served model, when its file is readable from here."""
    if not model_path:
        return {"path": None, "fingerprint": None}
    from moetune.model.profile import fingerprint, load_profile

    p = Path(model_path)
    try:
        return {"path": str(p.resolve()), "fingerprint": fingerprint(load_profile(p))}
    except (MoetuneError, OSError, ValueError) as e:
        return {"path": model_path, "fingerprint": None, "note": f"not readable here: {e}"}


def run_meta(info: http.ServerInfo, workloads: list[Workload], options: BenchOptions, *,
             plan: dict[str, Any] | None = None, engine_build: str | None = None,
             model_path: str | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    return {
        "schema_version": META_SCHEMA_VERSION,
        "moetune_version": __version__,
        "argv": list(sys.argv if argv is None else argv),
        "plan": plan,
        "server": info.to_json(),
        "engine_build": engine_build or info.build_info,
        "model": model_identity(model_path or info.model_path),
        "hardware_fingerprint": hw_fingerprint(),
        "hardware": machine_facts(),
        "workloads": [w.to_json() for w in workloads],
        "options": asdict(options),
    }


def _check_depths(info: http.ServerInfo, workloads: list[Workload]) -> None:
    for w in workloads:
        if w.kind == CHAT or info.n_ctx is None:
            continue
        need = w.depth + w.pp_tokens + w.max_tokens
        if need > info.n_ctx:
            raise InputError(f"workload {w.name}: depth {w.depth} + pp {w.pp_tokens} + tg {w.max_tokens} = {need} "
                             f"tokens, more than the server's context per slot ({info.n_ctx})",
                             hint="lower --depth, --pp-tokens or --tg-tokens, or start the server with a larger -c")


class _Session:
    def __init__(self, db: ResultsDB, run_id: int, url: str, cl: httpx.Client, options: BenchOptions,
                 progress: Progress | None, total: int) -> None:
        self.db, self.run_id, self.url, self.cl, self.opt = db, run_id, url, cl, options
        self.progress, self.total, self.done = progress, total, 0
        self._filler: list[int] | None = None

    def _tick(self, what: str) -> None:
        self.done += 1
        if self.progress:
            self.progress(what, self.done, self.total)

    def _base(self, w: Workload, i: int) -> dict[str, Any]:
        return {"workload": w.name, "kind": w.kind, "depth": w.depth if w.kind != CHAT else None, "repeat": i,
                "thinking": w.thinking, "ignore_eos": w.ignore_eos, "max_tokens": w.max_tokens}

    def chat(self, w: Workload) -> None:
        for i in range(self.opt.warmup + self.opt.repeats):
            phase = "warmup" if i < self.opt.warmup else "measure"
            body = chat_body(w, cache_prompt=not self.opt.cache_bust)
            raw = http.stream(self.cl, self.url, "/v1/chat/completions", body, timeout_s=self.opt.timeout_s)
            sample = {**self._base(w, i - self.opt.warmup if phase == "measure" else i),
                      "expect_cached": 0 if self.opt.cache_bust else None, **raw}
            self.db.add_sample(self.run_id, sample, phase=phase)
            self._tick(f"{w.name} {phase}")

    def depth(self, w: Workload) -> None:
        if self._filler is None:
            self._filler = http.tokenize(self.cl, self.url, FILLER_TEXT)
        count = self.opt.warmup + self.opt.repeats
        fill, blocks = depth_prompts(self._filler, w.depth, w.pp_tokens, count)
        for i, block in enumerate(blocks):
            phase = "warmup" if i < self.opt.warmup else "measure"
            if fill:  # leaves exactly the fill in slot 0's cache (see workloads.depth_prompts)
                raw = http.stream(self.cl, self.url, "/completion", completion_body(fill, 1),
                                  timeout_s=self.opt.timeout_s)
                self.db.add_sample(self.run_id, {**self._base(w, i), "fill_tokens": len(fill), **raw}, phase="fill")
            body = completion_body(fill + block, w.max_tokens, cache_prompt=bool(fill))
            raw = http.stream(self.cl, self.url, "/completion", body, timeout_s=self.opt.timeout_s)
            sample = {**self._base(w, i - self.opt.warmup if phase == "measure" else i),
                      "expect_cached": len(fill), "expect_prompt_n": len(block), **raw}
            self.db.add_sample(self.run_id, sample, phase=phase)
            self._tick(f"{w.name} {phase}")


def default_label(info: http.ServerInfo) -> str:
    where = info.url.split("://", 1)[-1]
    return f"{info.model_alias}@{where}" if info.model_alias else where


def bench(db: ResultsDB, url: str, workloads: list[Workload], options: BenchOptions, *, label: str | None = None,
          target: str | None = None, plan: dict[str, Any] | None = None, engine_build: str | None = None,
          model_path: str | None = None, sweep_id: str | None = None, extra_meta: dict[str, Any] | None = None,
          progress: Progress | None = None, on_start: Callable[[int], None] | None = None) -> int:
    """Benchmark the server at ``url``; return the run's id. Every sample is committed as it comes;
    on Ctrl-C the run is marked interrupted (its samples stay) and KeyboardInterrupt propagates."""
    if options.repeats < 1 or options.warmup < 0:
        raise InputError("--repeats must be at least 1 and --warmup at least 0")
    url = url.rstrip("/")
    with httpx.Client() as cl:
        info = http.probe(cl, url)
        _check_depths(info, workloads)
        meta = {**run_meta(info, workloads, options, plan=plan, engine_build=engine_build, model_path=model_path),
                **(extra_meta or {})}
        label = label or default_label(info)
        run_id = db.create_run(kind="bench", label=label, target=target or url, meta=meta, sweep_id=sweep_id)
        if on_start:
            on_start(run_id)
        s = _Session(db, run_id, url, cl, options, progress, len(workloads) * (options.warmup + options.repeats))
        if progress:
            progress("starting", 0, s.total)
        try:
            for w in workloads:
                (s.chat if w.kind == CHAT else s.depth)(w)
        except KeyboardInterrupt:
            db.finish_run(run_id, "interrupted", _safe_summary(db, run_id, options))
            raise
        except (MoetuneError, httpx.HTTPError, ValueError) as e:
            summary = _safe_summary(db, run_id, options) or {}
            summary["error"] = str(e)
            db.finish_run(run_id, "failed", summary)
            if isinstance(e, MoetuneError):
                raise
            raise RuntimeFailure(f"{url}: {e}") from None
    db.finish_run(run_id, "done", run_summary(db.samples(run_id), seed=options.seed))
    return run_id


def _safe_summary(db: ResultsDB, run_id: int, options: BenchOptions) -> dict[str, Any] | None:
    samples = db.samples(run_id)
    return run_summary(samples, seed=options.seed) if samples else None
