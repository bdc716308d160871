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

from collections.abc import Iterable
from typing import Any

from moetune.bench.analysis.stats import MetricSamples

TG, PP = "tg", "pp"
DEPTH_AXIS = "context depth (tokens)"


def timings(s: dict[str, Any]) -> dict[str, Any]:
    return s.get("timings") or {}


def pp_tps(s: dict[str, Any]) -> float | None:
    t = timings(s)
    n, ms = t.get("prompt_n"), t.get("prompt_ms")
    if not n or not ms or ms <= 0:
        return None
    return float(n) / float(ms) * 1000.0


def tg_tps(s: dict[str, Any]) -> float | None:
    t = timings(s)
    n, ms = t.get("predicted_n"), t.get("predicted_ms")
    if not n or n < 2 or not ms or ms <= 0:  # one token: no decode interval to time
        return None
    return float(n) / float(ms) * 1000.0


def server_ms(s: dict[str, Any]) -> float:
    t = timings(s)
    return float(t.get("prompt_ms") or 0.0) + float(t.get("predicted_ms") or 0.0)


def wall_ms(s: dict[str, Any]) -> float:
    return float(s["end_s"]) * 1000.0


def overhead_ms(s: dict[str, Any]) -> float | None:
    """Wall time outside the server's two timers; None without them (not llama-server)."""
    return wall_ms(s) - server_ms(s) if timings(s) else None


def source(ss: list[dict[str, Any]]) -> str:
    """Where a workload's TG and PP come from: ``server`` (llama.cpp's timings) or ``client``."""
    return "server" if any(timings(s) for s in ss) else "client"


def output_tokens(s: dict[str, Any]) -> int | None:
    """Tokens generated: the server's ``predicted_n``, else the response's ``usage.completion_tokens``."""
    n = timings(s).get("predicted_n", (s.get("usage") or {}).get("completion_tokens"))
    return int(n) if isinstance(n, int | float) else None


def client_ttft_ms(s: dict[str, Any]) -> float | None:
    firsts = [x[0] for x in (s.get("content_chunk_s"), s.get("reasoning_chunk_s")) if x]
    return min(firsts) * 1000.0 if firsts else None


def client_tg_tps(s: dict[str, Any]) -> float | None:
    """Decode rate seen by the client: tokens after the first over the first-to-last chunk interval."""
    chunks = sorted([*(s.get("content_chunk_s") or []), *(s.get("reasoning_chunk_s") or [])])
    n = output_tokens(s)
    if len(chunks) < 2 or not n or n < 2 or chunks[-1] <= chunks[0]:
        return None
    return (float(n) - 1.0) / (float(chunks[-1]) - float(chunks[0]))


def client_pp_tps(s: dict[str, Any]) -> float | None:
    """Prompt rate seen by the client: prompt tokens processed (less those the server says it had
    cached) over the time to the first chunk, which also holds the HTTP exchange, any queueing and
    the first token's sampling."""
    total, ttft = prompt_tokens(s), client_ttft_ms(s)
    if not total or not ttft or ttft <= 0:
        return None
    return float(total - (cached_tokens(s) or 0)) / ttft * 1000.0


def prompt_tokens(s: dict[str, Any]) -> int | None:
    usage = s.get("usage") or {}
    total = usage.get("prompt_tokens", s.get("tokens_evaluated"))
    return int(total) if total is not None else None


def cached_tokens(s: dict[str, Any]) -> int | None:
    t = timings(s)
    if t.get("cache_n") is not None:
        return int(t["cache_n"])
    total = prompt_tokens(s)
    if total is not None and t.get("prompt_n") is not None:
        return total - int(t["prompt_n"])
    details = (s.get("usage") or {}).get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        return int(details["cached_tokens"])
    return None


def cache_confirmed(s: dict[str, Any]) -> bool | None:
    """Did the server's cache hold what the runner expected (``expect_cached``, ``expect_prompt_n``)?
    None when nothing was expected or the server does not tell."""
    exp = s.get("expect_cached")
    if exp is None:
        return None
    got = cached_tokens(s)
    if got is None:
        return None
    ok = got == int(exp)
    if s.get("expect_prompt_n") is not None:
        ok = ok and timings(s).get("prompt_n") == int(s["expect_prompt_n"])
    return ok


def reasoning_share(s: dict[str, Any]) -> float:
    """Share of streamed chunks that were reasoning (thinking) rather than answer."""
    r, c = len(s.get("reasoning_chunk_s") or []), len(s.get("content_chunk_s") or [])
    return r / (r + c) if r + c else 0.0


def workload_names(samples: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for s in samples:
        seen.setdefault(str(s.get("workload", "?")), None)
    return list(seen)


def by_workload(samples: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        out.setdefault(str(s.get("workload", "?")), []).append(s)
    return out


def bench_metrics(samples: Iterable[dict[str, Any]]) -> dict[str, MetricSamples]:
    """The "bench" kind's extractor: ``tg:WORKLOAD`` and ``pp:WORKLOAD`` in tokens/s, by the
    server's timings, or by the client's clock where the server has none (:func:`source`)."""
    out: dict[str, MetricSamples] = {}
    for w, ss in by_workload(samples).items():
        depth = ss[0].get("depth")
        x = float(depth) if depth is not None else None
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
