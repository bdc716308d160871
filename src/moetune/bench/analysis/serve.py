"""Figures derived from stored raw request samples (pure: no I/O, no clock).

Definitions, per request (times from the moment the request was sent):

- TTFT: the first event that carries a generated token, reasoning or content;
- TTFC: the first event with content text (later than TTFT when the model thinks first);
- ITL: the gap between consecutive token events, divided evenly among the tokens the later one
  carries (a chunk of 3 tokens after 30 ms gives three 10 ms ITLs). Event times are the
  kernel's receive times; events that queued up while the client was not reading come out of
  one read with the latest one's time, and are spread over the interval they arrived in
  (:func:`event_times`). A server that neither counts tokens per event (llama-server's
  ``timings``, a running ``usage``) nor sends one token per event (its final ``usage`` says more
  tokens than events) leaves a request's ITL unknown (``itl_unknown``), never guessed;
- TPOT: (last token event - first token event) / (output tokens - 1);
- server ITL: the same gaps by the server's clock (``timings.predicted_ms`` of each event, from
  llama-server with ``timings_per_token``): what decoding took, without the HTTP and network path;
- E2E: until the stream ended; latency: from when the request was due (its arrival time, or
  when a worker took it) to the end, which includes the wait for a client slot;
- server wait: TTFT minus the server's own prompt time (llama-server's ``timings.prompt_ms``):
  the time the request spent queued for a server slot, plus the network.

A level's throughput counts only successful requests, over the level's span from the first
request due to the last one ended.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

import numpy as np

from moetune.bench.analysis.level_summary import LevelSummary, Percentiles, PromptTokenError, Slowest
from moetune.bench.analysis.slo import goodput
from moetune.bench.analysis.stats import MetricSamples
from moetune.jsonread import mapping, number, optional_integer, text

PERCENTILES = (50, 90, 99)
# a request this many times the level's E2E p50, and this much longer, is a latency outlier
SLOW_FACTOR = 5.0
SLOW_MIN_MS = 500.0

Sample = Mapping[str, object]  # one stored sample of a serving run (the JSON edge)
S = TypeVar("S", bound=Mapping[str, object])


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestMetrics:
    error: str | None
    ttft_s: float | None
    ttfc_s: float | None
    e2e_s: float | None
    latency_s: float | None  # queue-inclusive: from due to end
    slot_wait_s: float | None  # waiting for a client slot
    itl_s: tuple[float, ...]
    server_itl_s: tuple[float, ...]  # the same gaps by the server's own clock (llama-server timings)
    tpot_s: float | None
    output_tokens: int
    reasoning_tokens: int
    prompt_tokens: int | None  # counted before sending (None: the server has no tokenizer endpoint)
    server_prompt_tokens: int | None
    cached_tokens: int
    server_wait_s: float | None
    retries: int
    max_tokens: int
    itl_known: bool = True  # tokens per event known (counted by the server, or one each as usage confirms)
    usage: bool = True  # the response carried usage.completion_tokens (else tokens are counted per event)
    prompt_predicted: bool = False  # prompt_tokens is a local tokenizer's prediction (serve-bench --tokenizer)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def input_tokens(self) -> int | None:
        """The prompt's length: as counted before sending, else as the server reported it (which
        also wins over a local tokenizer's prediction: the prediction's error is reported apart)."""
        if self.prompt_predicted and self.server_prompt_tokens is not None:
            return self.server_prompt_tokens
        return self.prompt_tokens if self.prompt_tokens is not None else self.server_prompt_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestFigures:
    """One successful request's figures, as every per-request table reads them (one source: the
    contention rows, `compare`'s serve-bench metrics, tune's figures under load): latencies in ms,
    rates in tokens/s; None where the request has none (one token: no TPOT nor ITL)."""

    ttft_ms: float | None = None
    itl_ms: float | None = None  # the request's mean inter-token latency
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    decode_tok_s: float | None = None  # 1 / TPOT
    prefill_tok_s: float | None = None  # prompt tokens over the time to the first token

    def families(self) -> dict[str, float]:
        """The known figures by family name: ttft, itl, tpot, e2e (ms), decode, prefill (tokens/s)."""
        pairs = (
            ("ttft", self.ttft_ms),
            ("itl", self.itl_ms),
            ("tpot", self.tpot_ms),
            ("e2e", self.e2e_ms),
            ("decode", self.decode_tok_s),
            ("prefill", self.prefill_tok_s),
        )
        return {k: v for k, v in pairs if v is not None}


def request_figures(m: RequestMetrics) -> RequestFigures | None:
    """A request's figures (:class:`RequestFigures`); None for a failed one."""
    if not m.ok:
        return None
    n_in = m.input_tokens
    return RequestFigures(
        ttft_ms=None if m.ttft_s is None else m.ttft_s * 1000,
        itl_ms=sum(m.itl_s) / len(m.itl_s) * 1000 if m.itl_s else None,
        tpot_ms=None if m.tpot_s is None else m.tpot_s * 1000,
        e2e_ms=None if m.e2e_s is None else m.e2e_s * 1000,
        decode_tok_s=1 / m.tpot_s if m.tpot_s else None,
        prefill_tok_s=n_in / m.ttft_s if m.ttft_s and n_in else None,
    )


def _num(x: object) -> float | None:
    if type(x) is float:  # the common case first: a long run calls this tens of millions of times
        return x if math.isfinite(x) else None
    if type(x) is int:
        return float(x)
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


class TokenEvent(NamedTuple):
    """One streamed event of a request, as its figures read it (stored as a list: :func:`token_event`)."""

    t: float  # when it arrived (the kernel's receive time of the read that brought it)
    tokens: int  # the new tokens it brought
    content: int  # the content characters it carried
    reasoning: int  # the reasoning characters it carried
    server_ms: float | None = None  # the server's clock (llama-server's ``timings.predicted_ms``)
    earliest: float | None = None  # the earliest it can have arrived (< t: read late, with later events)


_make_event = TokenEvent._make


def token_event(c: Sequence[Any]) -> TokenEvent:
    """The one reader of a stored event: ``[t, tokens, content chars, reasoning chars, server ms,
    earliest t]`` (:class:`moetune.bench.serve.request.RequestRecord`); events of older runs lack
    the last two fields, which read as None, as do values that are not finite numbers."""
    n = len(c)
    # _make: a long run reads tens of millions of events, and keywords cost twice the time
    return _make_event((c[0], c[1], c[2], c[3], _num(c[4]) if n > 4 else None, _num(c[5]) if n > 5 else None))


def event_times(tok: Sequence[TokenEvent], server: Sequence[float | None] | None = None) -> list[float]:
    """Each token event's arrival time. Events read together share the kernel's time of the last
    of them; they arrived between the read's earliest time (``earliest``, or the previous event)
    and that time. They are placed in that interval by the server's own clock when every one of
    them carries it (llama-server's ``timings.predicted_ms``), else evenly. When the client read
    at once, the interval is empty and they all keep the read's time. ``server``: each event's
    server time (ms), when the caller has them already."""
    if server is None:
        server = [e.server_ms for e in tok]
    out: list[float] = []
    i = 0
    while i < len(tok):
        t = float(tok[i].t)
        j = i
        while j + 1 < len(tok) and tok[j + 1].t == tok[i].t:
            j += 1
        earliest = tok[i].earliest
        lo = t if earliest is None else earliest
        if out:
            lo = max(lo, out[-1])
        lo = min(lo, t)
        n = j + 1 - i
        group = server[i : j + 1]
        if n > 1 and all(x is not None for x in group):
            last = group[-1]
            out += [min(max(t - (last - x) / 1000, lo), t) for x in group]  # type: ignore[operator]
        else:
            out += [lo + (t - lo) * k / n for k in range(1, n + 1)]
        i = j + 1
    return out


def request_metrics(s: Sample) -> RequestMetrics:
    t_send = _num(s.get("t_send"))
    t_end = _num(s.get("t_end"))
    t_sched = _num(s.get("t_sched"))
    t_slot = _num(s.get("t_slot"))
    raw = s.get("chunks")
    events = raw if isinstance(raw, list) else []
    chunks = [e for e in map(token_event, events) if e.tokens > 0 or e.content > 0 or e.reasoning > 0]
    tok = [e for e in chunks if e.tokens > 0]  # events that brought new tokens
    server_ms = [e.server_ms for e in tok]
    times = event_times(tok, server_ms)
    first = times[0] if times else (chunks[0].t if chunks else None)
    ttft = first - t_send if first is not None and t_send is not None else None
    ttfc = next((e.t - t_send for e in chunks if e.content > 0), None) if t_send is not None else None
    counted = sum(int(e.tokens) for e in tok)
    usage = mapping(s.get("usage"))
    reported = usage.get("completion_tokens")
    itl_known = s.get("count_source") in ("timings", "usage") or not isinstance(reported, int) or reported == counted
    itl: list[float] = []
    for (a, b), e in zip(itertools.pairwise(times), tok[1:], strict=True):
        itl.extend([(b - a) / int(e.tokens)] * int(e.tokens))
    if not itl_known:
        itl = []
    server_itl: list[float] = []
    for (ms0, ms1), e in zip(itertools.pairwise(server_ms), tok[1:], strict=True):
        if ms0 is not None and ms1 is not None:
            server_itl.extend([(ms1 - ms0) / 1000 / int(e.tokens)] * int(e.tokens))
    reasoning = sum(int(e.tokens) for e in tok if e.reasoning > 0 and e.content == 0)
    out_tokens: int = reported if isinstance(reported, int) else counted
    tpot = (times[-1] - times[0]) / (out_tokens - 1) if len(times) > 1 and out_tokens > 1 else None
    timings = mapping(s.get("timings"))
    details = usage.get("prompt_tokens_details")
    cached_any = details.get("cached_tokens") if isinstance(details, Mapping) else timings.get("cache_n")
    cached: int = cached_any if isinstance(cached_any, int) else 0
    prompt_ms = _num(timings.get("prompt_ms"))
    server_wait = ttft - prompt_ms / 1000 if ttft is not None and prompt_ms is not None else None
    return RequestMetrics(
        error=text(s.get("error")),
        ttft_s=ttft,
        ttfc_s=ttfc,
        e2e_s=t_end - t_send if t_end is not None and t_send is not None else None,
        latency_s=t_end - t_sched if t_end is not None and t_sched is not None else None,
        slot_wait_s=t_slot - t_sched if t_slot is not None and t_sched is not None else None,
        itl_s=tuple(itl),
        server_itl_s=tuple(server_itl),
        tpot_s=tpot,
        output_tokens=out_tokens,
        reasoning_tokens=reasoning,
        prompt_tokens=pt if isinstance(pt := s.get("prompt_tokens"), int) else None,
        server_prompt_tokens=spt if isinstance(spt := usage.get("prompt_tokens"), int) else None,
        cached_tokens=cached,
        server_wait_s=server_wait,
        retries=len(r) if isinstance(r := s.get("retries"), list) else 0,
        max_tokens=int(number(s.get("max_tokens")) or 0),
        itl_known=itl_known,
        usage=isinstance(reported, int),
        prompt_predicted=s.get("prompt_source") == "tokenizer",
    )


def percentiles_ms(values_s: Iterable[float | None]) -> dict[str, float | None]:
    xs = np.fromiter((v for v in values_s if v is not None), dtype=float) * 1000
    out: dict[str, float | None] = dict.fromkeys([*(f"p{p}" for p in PERCENTILES), "mean"])
    if xs.size:
        qs = np.percentile(xs, PERCENTILES)
        out = {f"p{p}": round(float(q), 3) for p, q in zip(PERCENTILES, qs, strict=True)}
        out["mean"] = round(float(np.mean(xs)), 3)
    return out


def _rate(times: Iterable[float | None]) -> float | None:
    """Events per second over the span of these times: (n - 1) / (last - first)."""
    ts = sorted(t for t in times if t is not None)
    return round((len(ts) - 1) / (ts[-1] - ts[0]), 4) if len(ts) > 2 and ts[-1] > ts[0] else None


def slowest(samples: Sequence[Sample], ms: Sequence[RequestMetrics]) -> Slowest | None:
    """The successful request that took longest end to end, with what tells a stall from a long answer,
    and how many requests took :data:`SLOW_FACTOR` times the median or more (``outliers``)."""
    done = [(m.e2e_s, i) for i, m in enumerate(ms) if m.ok and m.e2e_s is not None]
    if not done:
        return None
    e2e, i = max(done)
    m = ms[i]
    p50 = float(np.median([e for e, _ in done]))
    outliers = sum(1 for e, _ in done if e >= SLOW_FACTOR * p50 and (e - p50) * 1000 >= SLOW_MIN_MS)
    return Slowest(
        index=optional_integer(samples[i].get("index")),
        e2e_ms=round(e2e * 1000, 3),
        outliers=outliers,
        ttft_ms=None if m.ttft_s is None else round(m.ttft_s * 1000, 3),
        output_tokens=m.output_tokens,
        median_output_tokens=float(np.median([x.output_tokens for x in ms if x.ok])),
    )


def prompt_token_error(ms: Sequence[RequestMetrics]) -> PromptTokenError | None:
    """How far the prompt lengths a local tokenizer predicted (serve-bench ``--tokenizer``) were from
    the server's ``usage.prompt_tokens``, over the requests with both: the mean and largest error per
    request and the bias of the total, in percent of the server's count. None without predictions."""
    pairs = [
        (m.prompt_tokens, m.server_prompt_tokens)
        for m in ms
        if m.prompt_predicted and m.prompt_tokens is not None and m.server_prompt_tokens
    ]
    if not pairs:
        return None
    errors = [100 * abs(p - s) / s for p, s in pairs]
    served = sum(s for _, s in pairs)
    return PromptTokenError(
        requests=len(pairs),
        mismatched=sum(1 for p, s in pairs if p != s),
        mean_pct=round(sum(errors) / len(errors), 3),
        max_pct=round(max(errors), 3),
        bias_pct=round(100 * (sum(p for p, _ in pairs) - served) / served, 3),
    )


def level_span(samples: Iterable[Sample]) -> float | None:
    """A level's wall time (s): from the first request due to the last one ended."""
    t0 = min((t for s in samples if (t := _num(s.get("t_sched"))) is not None), default=None)
    t1 = max((t for s in samples if (t := _num(s.get("t_end"))) is not None), default=None)
    return t1 - t0 if t0 is not None and t1 is not None and t1 > t0 else None


# what a level's figures need of a sample beside its metrics: not its events, which a long level has millions of
_HEAD = ("index", "concurrency", "rate", "t_sched", "t_end", "service", "load")

# a layout run's samples (`serve-bench LAYOUT_PLAN --load SERVICE=SPEC`) say which service they were
# sent to and whether the others were loaded at the time: part of their level, beside concurrency and rate
SERVICE, LOAD = "service", "load"
ALONE, SHARED = "alone", "shared"
LevelKey = tuple[str | None, str | None, int, float | None]  # (service, load, concurrency, rate)


def _gaps_taken(m: RequestMetrics, itl: array[float], server_itl: array[float]) -> RequestMetrics:
    """``m`` with its per-token gaps moved into the level's arrays (8 bytes a gap, not a float object
    and a pointer): it keeps only its largest ITL, which is what a latency target judges."""
    if m.ok:
        itl.extend(m.itl_s)
        server_itl.extend(m.server_itl_s)
    return replace(m, itl_s=(max(m.itl_s),) if m.itl_s else (), server_itl_s=())


class LevelFigures:
    """One load level's figures, its raw samples taken one at a time: each sample's events are let
    go once its metrics are taken (its per-token gaps move into the level's arrays), so a long
    level can be streamed from the history."""

    def __init__(self) -> None:
        self.ms: list[RequestMetrics] = []
        self.heads: list[dict[str, object]] = []
        self.itl, self.server_itl = array("d"), array("d")  # every successful request's gaps, in order

    def add(self, s: Sample, m: RequestMetrics | None = None) -> None:
        """One sample (``m``: its metrics, when the caller has them)."""
        self.ms.append(_gaps_taken(m or request_metrics(s), self.itl, self.server_itl))
        self.heads.append({k: s.get(k) for k in _HEAD})

    def summary(self, slo: Mapping[str, float] | None = None) -> LevelSummary:
        """The figures (:func:`level_summary`)."""
        return _summary(self.ms, self.heads, self.itl, server_itl=self.server_itl, slo=slo)


def level_summary(samples: Iterable[Sample], slo: Mapping[str, float] | None = None) -> LevelSummary:
    """One load level's figures from its raw samples (all of one concurrency and rate), read once.

    Open-loop levels add ``offered_request_s`` (the rate requests came due at) and
    ``completed_request_s`` (the rate they finished at): a client that keeps up finishes them as
    fast as they come; one that falls behind finishes them at what its streams can do. With
    latency targets (``slo``), ``goodput`` is the share and rate of requests that met them all
    (:mod:`moetune.bench.analysis.slo`); without, it is None."""
    f = LevelFigures()
    for s in samples:
        f.add(s)
    return f.summary(slo)


def summarize_level(samples: Iterable[Sample], slo: Mapping[str, float] | None = None) -> dict[str, object]:
    """:func:`level_summary` as the document ``serve-bench --json`` prints (:meth:`LevelSummary.to_json`)."""
    return level_summary(samples, slo).to_json()


def level_figures(
    samples: Iterable[S],
    *,
    tap: Callable[[S, RequestMetrics], None] | None = None,
) -> dict[LevelKey, LevelFigures]:
    """Every level of a run by (service, load, concurrency, rate) (:func:`level_key`), in the order
    the levels first ran (a level that came back later is merged into its first), its samples read
    once and never held: a run of any length, streamed from the history. ``tap`` sees each sample
    and its metrics as they pass."""
    levels: dict[LevelKey, LevelFigures] = {}
    for s in samples:
        m = request_metrics(s)
        levels.setdefault(level_key(s), LevelFigures()).add(s, m)
        if tap is not None:
            tap(s, m)
    return levels


def level_summaries(
    samples: Iterable[S],
    slo: Mapping[str, float] | None = None,
    *,
    tap: Callable[[S, RequestMetrics], None] | None = None,
) -> list[LevelSummary]:
    """Every level's figures (:func:`level_figures`, :func:`level_summary`)."""
    return [f.summary(slo) for f in level_figures(samples, tap=tap).values()]


def summarize_levels(
    samples: Iterable[S],
    slo: Mapping[str, float] | None = None,
    *,
    tap: Callable[[S, RequestMetrics], None] | None = None,
) -> list[dict[str, object]]:
    """:func:`level_summaries` as documents (:meth:`LevelSummary.to_json`)."""
    return [lv.to_json() for lv in level_summaries(samples, slo, tap=tap)]


def _percentiles(values_s: Iterable[float | None]) -> Percentiles:
    return Percentiles(**percentiles_ms(values_s))


def _summary(
    ms: list[RequestMetrics],
    heads: list[dict[str, object]],
    itl: array[float],
    *,
    server_itl: array[float],
    slo: Mapping[str, float] | None,
) -> LevelSummary:
    ok = [m for m in ms if m.ok]
    starts = [_num(s.get("t_sched")) for s in heads]
    ends = [_num(s.get("t_end")) for s in heads]
    span = level_span(heads)
    out_tokens = sum(m.output_tokens for m in ok)
    first = heads[0] if heads else {}
    open_loop = bool(first.get("rate"))
    inputs = [n for m in ms if (n := m.input_tokens) is not None]
    return LevelSummary(
        service=text(first.get(SERVICE)) or None,
        load=text(first.get(LOAD)) if first.get(SERVICE) else None,
        concurrency=int(number(first.get("concurrency")) or 0),
        rate=number(first.get("rate")),
        requests=len(ms),
        ok=len(ok),
        errors=dict(sorted(Counter(m.error for m in ms if m.error is not None).items())),
        duration_s=round(span, 4) if span else None,
        ttft_ms=_percentiles(m.ttft_s for m in ok),
        ttfc_ms=_percentiles(m.ttfc_s for m in ok),
        itl_ms=_percentiles(itl),
        server_itl_ms=_percentiles(server_itl),
        tpot_ms=_percentiles(m.tpot_s for m in ok),
        e2e_ms=_percentiles(m.e2e_s for m in ok),
        latency_ms=_percentiles(m.latency_s for m in ms if m.latency_s is not None),
        slot_wait_ms=_percentiles(m.slot_wait_s for m in ms),
        server_wait_ms=_percentiles(m.server_wait_s for m in ok),
        output_tokens=out_tokens,
        reasoning_tokens=sum(m.reasoning_tokens for m in ok),
        output_tok_s=round(out_tokens / span, 3) if span else None,
        request_s=round(len(ok) / span, 4) if span else None,
        goodput=goodput(ms, slo, span) if slo else None,
        offered_request_s=_rate(starts) if open_loop else None,
        completed_request_s=_rate(e for e, m in zip(ends, ms, strict=True) if m.ok) if open_loop else None,
        slowest=slowest(heads, ms),
        prompt_tokens_mean=round(sum(inputs) / len(inputs), 1) if inputs else None,
        prompt_token_mismatches=sum(
            1 for m in ok if m.prompt_tokens is not None and m.server_prompt_tokens not in (None, m.prompt_tokens)
        ),
        prompt_token_error=prompt_token_error(ok),
        itl_unknown=sum(1 for m in ok if not m.itl_known),
        no_usage=sum(1 for m in ok if not m.usage),
        cached_tokens=sum(m.cached_tokens for m in ok),
        short_outputs=sum(1 for m in ok if m.max_tokens and m.output_tokens < m.max_tokens),
        retries=sum(m.retries for m in ms),
    )


def level_of(s: Sample) -> tuple[int, float | None]:
    """The load level a raw sample was measured at: (concurrency, rate)."""
    return int(number(s.get("concurrency")) or 0), number(s.get("rate"))


def level_key(s: Sample) -> LevelKey:
    """The level a raw sample was measured at, with its service and load in a layout run (None, None
    in a run of one server)."""
    return text(s.get(SERVICE)), text(s.get(LOAD)), *level_of(s)


def level_name(concurrency: int, rate: float | None) -> str:
    """A level as metric names and tables say it: ``c=4``, ``c=8@2.0/s``."""
    return f"c={concurrency}" + (f"@{rate}/s" if rate else "")


def key_name(key: LevelKey) -> str:
    """A level of any run as metric names say it: ``c=4``; in a layout run ``main:c=1`` (under the
    shared load) and ``main:c=1:alone`` (the others idle)."""
    service, load, c, rate = key
    if service is None:
        return level_name(c, rate)
    return f"{service}:{level_name(c, rate)}" + (f":{ALONE}" if load == ALONE else "")


class LevelSeries:
    """The "serve-bench" kind's per-request values by metric and level, taken a sample at a time."""

    FAMILIES = ("ttft", "itl", "tpot", "e2e", "decode")

    def __init__(self) -> None:
        self.levels: dict[LevelKey, dict[str, list[float]]] = {}

    def add(self, s: Sample, m: RequestMetrics | None = None) -> None:
        """One sample (``m``: its metrics, when the caller has them)."""
        if "chunks" not in s:
            return
        series = self.levels.setdefault(level_key(s), {f: [] for f in self.FAMILIES})
        f = request_figures(m or request_metrics(s))
        if f is None:
            return
        for fam, v in f.families().items():
            if fam in series:
                series[fam].append(v)

    def metrics(self) -> dict[str, MetricSamples]:
        out: dict[str, MetricSamples] = {}
        for key, series in self.levels.items():
            c = key[2]
            for fam, values in series.items():
                if values:
                    higher = fam == "decode"
                    out[f"{fam}:{key_name(key)}"] = MetricSamples(
                        values=tuple(values),
                        higher_is_better=higher,
                        unit="tokens/s" if higher else "ms",
                        family=fam,
                        x=float(c),
                        x_label="concurrency",
                    )
        return out


def serve_metric_samples(samples: Iterable[Sample]) -> dict[str, MetricSamples]:
    """The "serve-bench" kind's extractor for `moetune compare`: per-request values by metric and
    level, named ``FAMILY:c=N`` (``ttft:c=4``) and placed on the concurrency axis; the samples read
    once (a run of any length, streamed from the history).

    Families: ttft, itl (each request's mean ITL), tpot and e2e in ms (lower is better), and
    decode in tokens/s (1 / TPOT, higher is better). Open-loop levels add ``@RATE/s`` to the name.
    """
    series = LevelSeries()
    for s in samples:
        series.add(s)
    return series.metrics()
