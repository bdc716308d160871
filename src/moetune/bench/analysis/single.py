"""Figures derived from raw bench samples (never stored: computed on read).

Primary figures come from the server's own ``timings``: PP = prompt_n / prompt_ms, TG =
predicted_n / predicted_ms. The client's clock gives the secondary ones: wall time, time to the
first streamed chunk, and the decode rate seen from the chunks' arrival. Overhead = client wall
time − (prompt_ms + predicted_ms): HTTP, template, tokenizer and sampling work outside the
server's two timers.

Cached prompt tokens: ``timings.cache_n`` where the server reports it (llama.cpp); otherwise
(ik_llama.cpp has no ``cache_n``) the prompt's token count less ``prompt_n``, from
``usage.prompt_tokens`` or ``tokens_evaluated``.

A server that is not llama-server (vLLM, SGLang, LM Studio, Ollama) sends no ``timings``: its
samples have no server figures (``pp_tps``, ``tg_tps``, ``overhead_ms`` are None) and the run's
TG and PP are the client's, labelled ``source: client`` (:func:`source`): TG = (output tokens - 1)
over the first-to-last chunk interval, PP = prompt tokens over the time to the first chunk, with
the token counts from the response's ``usage``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from moetune.bench.analysis.stats import MetricSamples
from moetune.jsonread import mapping, number

TG, PP = "tg", "pp"
DEPTH_AXIS = "context depth (tokens)"

Sample = Mapping[str, object]  # one stored sample of a single-stream bench (the JSON edge)
S = TypeVar("S", bound=Mapping[str, object])


def _whole(x: object) -> int | None:
    n = number(x)
    return int(n) if n is not None else None


def _chunks(s: Sample, key: str) -> list[float]:
    xs = s.get(key)
    return [v for x in xs if (v := number(x)) is not None] if isinstance(xs, list | tuple) else []


def timings(s: Sample) -> Mapping[str, object]:
    return mapping(s.get("timings"))


def pp_tps(s: Sample) -> float | None:
    t = timings(s)
    n, ms = number(t.get("prompt_n")), number(t.get("prompt_ms"))
    if not n or not ms or ms <= 0:
        return None
    return float(n) / float(ms) * 1000.0


def tg_tps(s: Sample) -> float | None:
    t = timings(s)
    n, ms = number(t.get("predicted_n")), number(t.get("predicted_ms"))
    if not n or n < 2 or not ms or ms <= 0:  # one token: no decode interval to time
        return None
    return float(n) / float(ms) * 1000.0


def server_ms(s: Sample) -> float:
    t = timings(s)
    return float(number(t.get("prompt_ms")) or 0.0) + float(number(t.get("predicted_ms")) or 0.0)


def wall_ms(s: Sample) -> float:
    end = number(s["end_s"])
    if end is None:
        raise TypeError(f"a sample's end_s is not a number: {s['end_s']!r}")
    return float(end) * 1000.0


def overhead_ms(s: Sample) -> float | None:
    """Wall time outside the server's two timers; None without them (not llama-server)."""
    return wall_ms(s) - server_ms(s) if timings(s) else None


def source(ss: Iterable[Sample]) -> str:
    """Where a workload's TG and PP come from: ``server`` (llama.cpp's timings) or ``client``."""
    return "server" if any(timings(s) for s in ss) else "client"


def output_tokens(s: Sample) -> int | None:
    """Tokens generated: the server's ``predicted_n``, else the response's ``usage.completion_tokens``."""
    t = timings(s)
    n = t["predicted_n"] if "predicted_n" in t else mapping(s.get("usage")).get("completion_tokens")
    return _whole(n)


def client_ttft_ms(s: Sample) -> float | None:
    firsts = [x[0] for x in (_chunks(s, "content_chunk_s"), _chunks(s, "reasoning_chunk_s")) if x]
    return min(firsts) * 1000.0 if firsts else None


def client_tg_tps(s: Sample) -> float | None:
    """Decode rate seen by the client: tokens after the first over the first-to-last chunk interval."""
    chunks = sorted([*_chunks(s, "content_chunk_s"), *_chunks(s, "reasoning_chunk_s")])
    n = output_tokens(s)
    if len(chunks) < 2 or not n or n < 2 or chunks[-1] <= chunks[0]:
        return None
    return (float(n) - 1.0) / (float(chunks[-1]) - float(chunks[0]))


def client_pp_tps(s: Sample) -> float | None:
    """Prompt rate seen by the client: prompt tokens processed (less those the server says it had
    cached) over the time to the first chunk, which also holds the HTTP exchange, any queueing and
    the first token's sampling."""
    total, ttft = prompt_tokens(s), client_ttft_ms(s)
    if not total or not ttft or ttft <= 0:
        return None
    return float(total - (cached_tokens(s) or 0)) / ttft * 1000.0


def prompt_tokens(s: Sample) -> int | None:
    usage = mapping(s.get("usage"))
    return _whole(usage["prompt_tokens"] if "prompt_tokens" in usage else s.get("tokens_evaluated"))


def cached_tokens(s: Sample) -> int | None:
    t = timings(s)
    if (cache_n := _whole(t.get("cache_n"))) is not None:
        return cache_n
    total = prompt_tokens(s)
    if total is not None and (prompt_n := _whole(t.get("prompt_n"))) is not None:
        return total - prompt_n
    details = mapping(mapping(s.get("usage")).get("prompt_tokens_details"))
    return _whole(details.get("cached_tokens"))


def cache_confirmed(s: Sample) -> bool | None:
    """Did the server's cache hold what the runner expected (``expect_cached``, ``expect_prompt_n``)?
    None when nothing was expected or the server does not tell."""
    exp = _whole(s.get("expect_cached"))
    if exp is None:
        return None
    got = cached_tokens(s)
    if got is None:
        return None
    ok = got == exp
    if (exp_n := _whole(s.get("expect_prompt_n"))) is not None:
        ok = ok and timings(s).get("prompt_n") == exp_n
    return ok


def reasoning_share(s: Sample) -> float:
    """Share of streamed chunks that were reasoning (thinking) rather than answer."""
    r, c = len(_chunks(s, "reasoning_chunk_s")), len(_chunks(s, "content_chunk_s"))
    return r / (r + c) if r + c else 0.0


def workload_names(samples: Iterable[Sample]) -> list[str]:
    seen: dict[str, None] = {}
    for s in samples:
        seen.setdefault(str(s.get("workload", "?")), None)
    return list(seen)


def by_workload(samples: Iterable[S]) -> dict[str, list[S]]:
    out: dict[str, list[S]] = {}
    for s in samples:
        out.setdefault(str(s.get("workload", "?")), []).append(s)
    return out


def _depth(ss: Sequence[Sample]) -> float | None:
    return number(ss[0].get("depth"))


def bench_metrics(samples: Iterable[Sample]) -> dict[str, MetricSamples]:
    """The "bench" kind's extractor: ``tg:WORKLOAD`` and ``pp:WORKLOAD`` in tokens/s, by the
    server's timings, or by the client's clock where the server has none (:func:`source`)."""
    out: dict[str, MetricSamples] = {}
    for w, ss in by_workload(samples).items():
        d = _depth(ss)
        x = float(d) if d is not None else None
        server = source(ss) == "server"
        for fam, fn in ((TG, tg_tps if server else client_tg_tps), (PP, pp_tps if server else client_pp_tps)):
            vals = tuple(v for v in (fn(s) for s in ss) if v is not None)
            if vals:
                out[f"{fam}:{w}"] = MetricSamples(
                    values=vals,
                    higher_is_better=True,
                    unit="tokens/s",
                    family=fam,
                    x=x,
                    x_label=DEPTH_AXIS if x is not None else None,
                )
    return out
