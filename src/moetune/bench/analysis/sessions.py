"""Agent sessions' figures from their raw samples: per turn, per session, and TG against context.

Pure, like :mod:`moetune.bench.analysis.serve`, whose per-request metrics (TTFT, TPOT, tokens)
these build on. A session's sample is a serve-bench request sample with ``session`` and ``turn``.

Prompt tokens of a turn, as the server reports them (never guessed):

- llama-server: ``timings.prompt_n`` tokens processed, ``timings.cache_n`` reused from the slot's
  prefix cache; the context is their sum (= ``usage.prompt_tokens``); ik_llama.cpp's timings have
  no ``cache_n``: there the reused tokens are ``usage.prompt_tokens`` (the whole prompt, its
  ``slot.n_prompt_tokens``) minus ``timings.prompt_n``;
- an OpenAI-style server that reports ``usage.prompt_tokens_details.cached_tokens`` (vLLM with
  ``--enable-prompt-tokens-details``, SGLang): reused = cached, processed = prompt_tokens - cached;
- otherwise processed and reused are null (the context is ``usage.prompt_tokens`` where given), and
  a warning says so.

TG of a turn is its decode rate seen by the client, 1 / TPOT (tokens/s, the first token's wait
aside), which puts the decode rate against the context the turn ran at.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from moetune.bench.analysis.serve import (
    PERCENTILES,
    LevelSeries,
    RequestMetrics,
    Sample,
    percentiles_ms,
    request_metrics,
)
from moetune.bench.analysis.stats import MetricSamples
from moetune.jsonread import mapping, number

CACHE_SOURCES = ("timings", "usage")


@dataclass(frozen=True, slots=True)
class PromptCache:
    context: int | None  # the prompt's length in tokens
    processed: int | None  # evaluated for this request
    reused: int | None  # served from the prefix cache
    source: str | None  # timings | usage | None (the server reports neither)


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def prompt_cache(s: Sample) -> PromptCache:
    """Processed and reused prompt tokens of one request, from what the server reported."""
    timings = mapping(s.get("timings"))
    usage = mapping(s.get("usage"))
    prompt_tokens = _int(usage.get("prompt_tokens"))
    n, cached = _int(timings.get("prompt_n")), _int(timings.get("cache_n"))
    if n is not None and cached is not None:
        return PromptCache(n + cached, n, cached, "timings")
    if n is not None and prompt_tokens is not None and prompt_tokens >= n:  # ik_llama.cpp: no cache_n
        return PromptCache(prompt_tokens, n, prompt_tokens - n, "timings")
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    if cached is not None and prompt_tokens is not None:
        return PromptCache(prompt_tokens, prompt_tokens - cached, cached, "usage")
    return PromptCache(prompt_tokens, None, None, None)


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnSample:
    """One turn of one session: what the figures are made of."""

    session: int
    turn: int
    metrics: RequestMetrics
    cache: PromptCache
    stripped_chars: int

    @property
    def ok(self) -> bool:
        return self.metrics.ok

    @property
    def tg_tok_s(self) -> float | None:
        t = self.metrics.tpot_s
        return 1 / t if t else None


def session_turn(s: Sample) -> tuple[int, int] | None:
    """The (session, turn) of an agent-sessions sample, else None."""
    session, turn = s.get("session"), s.get("turn")
    return (session, turn) if isinstance(session, int) and isinstance(turn, int) else None


def is_session_sample(s: Sample) -> bool:
    return session_turn(s) is not None


def turn_samples(samples: Iterable[Sample]) -> list[TurnSample]:
    return [
        TurnSample(
            session=st[0],
            turn=st[1],
            metrics=request_metrics(s),
            cache=prompt_cache(s),
            stripped_chars=int(number(s.get("stripped_chars")) or 0),
        )
        for s in samples
        if (st := session_turn(s)) is not None
    ]


def percentiles(values: Iterable[float | int | None], digits: int = 3) -> dict[str, float | None]:
    """``{p50, p90, p99, mean}`` of the values given (None left out), as the levels give theirs."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return dict.fromkeys([*(f"p{p}" for p in PERCENTILES), "mean"])
    qs = np.percentile(np.asarray(xs), PERCENTILES)
    out: dict[str, float | None] = {f"p{p}": round(float(q), digits) for p, q in zip(PERCENTILES, qs, strict=True)}
    out["mean"] = round(float(np.mean(xs)), digits)
    return out


def _share(reused: int | None, processed: int | None) -> float | None:
    if reused is None or processed is None or reused + processed == 0:
        return None
    return round(reused / (reused + processed), 4)


def _sum(xs: Iterable[int | None]) -> int | None:
    vals = list(xs)
    return None if not vals or any(v is None for v in vals) else sum(v for v in vals if v is not None)


def _figures(ts: Sequence[TurnSample]) -> dict[str, object]:
    ok = [t for t in ts if t.ok]
    return {
        "requests": len(ts),
        "ok": len(ok),
        "errors": dict(sorted(Counter(t.metrics.error for t in ts if t.metrics.error is not None).items())),
        "context_tokens": percentiles((t.cache.context for t in ok), 1),
        "prompt_tokens_processed": percentiles((t.cache.processed for t in ok), 1),
        "prompt_tokens_reused": percentiles((t.cache.reused for t in ok), 1),
        "reused_share": percentiles((_share(t.cache.reused, t.cache.processed) for t in ok), 4),
        "ttft_ms": percentiles_ms(t.metrics.ttft_s for t in ok),
        "tg_tok_s": percentiles((t.tg_tok_s for t in ok), 2),
        "output_tokens": sum(t.metrics.output_tokens for t in ok),
        "reasoning_tokens": sum(t.metrics.reasoning_tokens for t in ok),
    }


def per_turn(ts: Sequence[TurnSample]) -> list[dict[str, object]]:
    """One entry per turn: each figure over the sessions that reached it."""
    by: dict[int, list[TurnSample]] = {}
    for t in ts:
        by.setdefault(t.turn, []).append(t)
    return [{"turn": n, **_figures(by[n])} for n in sorted(by)]


def per_session(ts: Sequence[TurnSample]) -> list[dict[str, object]]:
    """One entry per session: its turns, its last context, the tokens it had processed and reused
    over all its turns (and the share reused), its TTFT and TG over its turns."""
    by: dict[int, list[TurnSample]] = {}
    for t in ts:
        by.setdefault(t.session, []).append(t)
    out = []
    for s in sorted(by):
        turns = sorted(by[s], key=lambda t: t.turn)
        ok = [t for t in turns if t.ok]
        processed = _sum(t.cache.processed for t in ok)
        reused = _sum(t.cache.reused for t in ok)
        out.append(
            {
                "session": s,
                "turns": len(turns),
                "ok": len(ok),
                "errors": dict(sorted(Counter(t.metrics.error for t in turns if t.metrics.error).items())),
                "context_tokens": ok[-1].cache.context if ok else None,
                "prompt_tokens_processed": processed,
                "prompt_tokens_reused": reused,
                "reused_share": _share(reused, processed),
                "ttft_ms": percentiles_ms(t.metrics.ttft_s for t in ok),
                "tg_tok_s": percentiles((t.tg_tok_s for t in ok), 2),
                "stripped_chars": sum(t.stripped_chars for t in turns),
            }
        )
    return out


def theil_sen(points: Sequence[tuple[float, float]]) -> float | None:
    """The median of the slopes between every two points of different x: a line's slope that a
    few odd points (a turn that waited behind another session's prompt) do not pull."""
    slopes = [(y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.combinations(points, 2) if x2 != x1]
    return float(np.median(slopes)) if slopes else None


def tg_vs_context(ts: Sequence[TurnSample]) -> dict[str, object] | None:
    """TG as a function of the context a turn ran at: TG p50 and context p50 of the first and the
    last turn, the change between them, and the slope over every turn's (context, TG) in tok/s per
    1000 tokens of context (Theil–Sen). None with fewer than three points or no spread in context."""
    pts = [
        (float(t.cache.context), tg)
        for t in ts
        if t.ok and t.cache.context is not None and (tg := t.tg_tok_s) is not None
    ]
    slope = theil_sen(pts) if len(pts) >= 3 else None
    if slope is None:
        return None
    by: dict[int, list[tuple[float, float]]] = {}
    for t in ts:
        if t.ok and t.cache.context is not None and (tg := t.tg_tok_s) is not None:
            by.setdefault(t.turn, []).append((float(t.cache.context), tg))
    first, last = by[min(by)], by[max(by)]
    c0, c1 = (float(np.median([p[0] for p in x])) for x in (first, last))
    g0, g1 = (float(np.median([p[1] for p in x])) for x in (first, last))
    return {
        "points": len(pts),
        "turns": [min(by), max(by)],
        "context_tokens": [round(c0), round(c1)],
        "tg_tok_s": [round(g0, 2), round(g1, 2)],
        "change_pct": round((g1 / g0 - 1) * 100, 2) if g0 > 0 else None,
        "slope_tok_s_per_1k_tokens": round(slope * 1000, 3),
    }


def session_warnings(
    ts: Sequence[TurnSample], *, strip: bool, slots: int | None, sessions: int, sequential: bool = False
) -> list[str]:
    """What makes the session figures less than they seem, read off the samples."""
    out: list[str] = []
    ok = [t for t in ts if t.ok]
    if ok and all(t.cache.source is None for t in ok):
        out.append(
            "the server reports neither timings.cache_n nor usage.prompt_tokens_details.cached_tokens: "
            "prompt tokens processed and reused are null (vLLM reports them with "
            "--enable-prompt-tokens-details)"
        )
    later = [t for t in ok if t.turn > 1 and t.cache.reused is not None]
    if later and not any(t.cache.reused for t in later):
        out.append(
            "the server reused no prompt tokens between turns: every turn evaluated the whole history "
            "(its prefix cache is off, or the slot was given to another conversation)"
        )
    if slots is not None and sessions > slots and not sequential:
        out.append(
            f"{sessions} sessions on {slots} slot(s): a slot holds one conversation's cache at a time, so "
            "turns wait for a slot and may find another session's prefix there"
        )
    if strip and ok and not any(t.stripped_chars for t in ts):
        out.append(
            "--strip-thinking had nothing to strip: the replies carried no reasoning (the model did not "
            "think, or thinking is off)"
        )
    return out


def summarize_sessions(
    samples: Iterable[Sample], spec: Mapping[str, object], *, slots: int | None = None
) -> dict[str, object]:
    """The ``sessions`` section of the serve-bench document: the workload (``spec``, as
    :meth:`moetune.bench.serve.sessions.SessionSpec.to_json` gives it), per turn, per session,
    TG against context, the totals and the warnings."""
    ts = turn_samples(samples)
    ok = [t for t in ts if t.ok]
    sources = sorted({t.cache.source for t in ok if t.cache.source})
    processed = _sum(t.cache.processed for t in ok) if ok else None
    reused = _sum(t.cache.reused for t in ok) if ok else None
    return {
        "spec": dict(spec),
        "cache_source": sources[0] if len(sources) == 1 else (",".join(sources) or None),
        "requests": len(ts),
        "ok": len(ok),
        "prompt_tokens_processed": processed,
        "prompt_tokens_reused": reused,
        "reused_share": _share(reused, processed),
        "turns": per_turn(ts),
        "per_session": per_session(ts),
        "tg_vs_context": tg_vs_context(ts),
        "warnings": session_warnings(
            ts,
            strip=bool(spec.get("strip_thinking")),
            slots=slots,
            sessions=int(number(spec.get("sessions")) or 0),
            sequential=bool(spec.get("sequential")),
        ),
    }


def session_metric_samples(samples: Iterable[Sample]) -> dict[str, MetricSamples]:
    """Per-turn metrics for `moetune compare`, one value per session: ``ttft:turn=N`` (ms),
    ``decode:turn=N`` (tokens/s), ``processed:turn=N`` and ``reused:turn=N`` (prompt tokens; not
    for turn 1, cold by construction: each session's prompt is its own from its first tokens),
    placed on the turn axis, so a run with the history intact compares with one that strips it."""
    by: dict[int, list[TurnSample]] = {}
    for t in turn_samples(samples):
        if t.ok:
            by.setdefault(t.turn, []).append(t)
    out: dict[str, MetricSamples] = {}
    for n in sorted(by):
        ts = by[n]
        series: dict[str, tuple[list[float], bool, str]] = {
            "ttft": ([t.metrics.ttft_s * 1000 for t in ts if t.metrics.ttft_s is not None], False, "ms"),
            "decode": ([tg for t in ts if (tg := t.tg_tok_s) is not None], True, "tokens/s"),
            "processed": ([float(t.cache.processed) for t in ts if t.cache.processed is not None], False, "tokens"),
            "reused": ([float(t.cache.reused) for t in ts if t.cache.reused is not None and n > 1], True, "tokens"),
        }
        for fam, (values, higher, unit) in series.items():
            if values:
                out[f"{fam}:turn={n}"] = MetricSamples(
                    values=tuple(values),
                    higher_is_better=higher,
                    unit=unit,
                    family=f"{fam} by turn",
                    x=float(n),
                    x_label="turn",
                )
    return out


class ServeRunSeries:
    """A serve-bench run's metrics, taken a sample at a time (only an agent-sessions run's turns are
    held): its levels' (:class:`moetune.bench.analysis.serve.LevelSeries`) and per turn."""

    def __init__(self) -> None:
        self.levels = LevelSeries()
        self.turns: list[Sample] = []

    def add(self, s: Sample, m: RequestMetrics | None = None) -> None:
        self.levels.add(s, m)
        if is_session_sample(s):
            self.turns.append(s)

    def metrics(self) -> dict[str, MetricSamples]:
        return {**self.levels.metrics(), **session_metric_samples(self.turns)}


def serve_run_metrics(samples: Iterable[Sample]) -> dict[str, MetricSamples]:
    """A serve-bench run's metrics for `moetune compare` (:class:`ServeRunSeries`), the samples read once."""
    series = ServeRunSeries()
    for s in samples:
        series.add(s)
    return series.metrics()
