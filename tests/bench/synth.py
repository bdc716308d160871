"""Raw bench samples made to order (the shape :mod:`moetune.bench.single.runner` stores)."""

from __future__ import annotations

from typing import Any


def sample(
    workload: str = "short-json",
    *,
    tg: float = 20.0,
    pp: float = 25.0,
    prompt_n: int = 30,
    predicted_n: int = 61,
    cache_n: int | None = 0,
    overhead_ms: float = 4.0,
    depth: int | None = None,
    thinking: bool | None = False,
    reasoning_chunks: int = 0,
    expect_cached: int | None = 0,
    expect_prompt_n: int | None = None,
    ignore_eos: bool = False,
    ik: bool = False,
) -> dict[str, Any]:
    prompt_ms = prompt_n / pp * 1000
    predicted_ms = predicted_n / tg * 1000
    wall_s = (prompt_ms + predicted_ms + overhead_ms) / 1000
    first = prompt_ms / 1000 + 0.001
    step = predicted_ms / 1000 / max(1, predicted_n - 1)
    chunks = [round(first + i * step, 6) for i in range(predicted_n)]
    timings: dict[str, Any] = {
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
    }
    if not ik and cache_n is not None:
        timings["cache_n"] = cache_n
    cached = cache_n or 0
    return {
        "workload": workload,
        "kind": "depth" if depth is not None else "chat",
        "depth": depth,
        "repeat": 0,
        "thinking": thinking,
        "ignore_eos": ignore_eos,
        "max_tokens": predicted_n,
        "expect_cached": expect_cached,
        "expect_prompt_n": expect_prompt_n,
        "path": "/v1/chat/completions",
        "t_unix_s": 1.8e9,
        "headers_s": 0.001,
        "end_s": wall_s,
        "content_chunk_s": chunks[reasoning_chunks:],
        "reasoning_chunk_s": chunks[:reasoning_chunks],
        "content_chars": predicted_n - reasoning_chunks,
        "reasoning_chars": reasoning_chunks,
        "finish_reason": "length",
        "timings": timings,
        "usage": {"prompt_tokens": prompt_n + cached, "completion_tokens": predicted_n},
        "tokens_cached": None,
        "tokens_evaluated": None,
    }


def run_samples(
    tgs: list[float], pps: list[float] | None = None, workload: str = "short-json", **kw: Any
) -> list[dict[str, Any]]:
    pps = pps or [25.0] * len(tgs)
    return [sample(workload, tg=t, pp=p, **kw) for t, p in zip(tgs, pps, strict=True)]
