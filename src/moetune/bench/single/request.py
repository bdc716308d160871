"""One streamed request of the single-stream benchmark, recorded as a raw sample.

A raw sample keeps what was observed and nothing computed: the server's ``timings`` (llama-server's;
None from other OpenAI-compatible servers) and ``usage`` verbatim, the client's clock at send, at the response headers, at every streamed chunk
and at the end (seconds from send; the arrival times are the kernel's receive times where the
client can read them, see :mod:`moetune.bench.http.client`), and counts of what came back.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from moetune.bench.http.client import RETRYABLE, StreamingHttp, sse_payloads
from moetune.bench.server import unreachable
from moetune.engine import auth
from moetune.errors import RuntimeFailure, one_line


class _Collect:
    """Fills one sample from the stream's events."""

    def __init__(self) -> None:
        self.content_s: list[float] = []
        self.reasoning_s: list[float] = []
        self.content_chars = self.reasoning_chars = 0
        self.final: dict[str, object] = {}
        self.finish_reason: str | None = None
        self.done = False

    def event(self, t: float, payload: bytes, where: str) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            ev = json.loads(payload)
        except ValueError:
            raise unreadable(where, payload, "not JSON") from None
        if not isinstance(ev, dict):
            return
        if "error" in ev:
            raise RuntimeFailure(f"{where}: the server reported an error: {one_line(str(ev['error']))}")
        choices = ev.get("choices") or []
        if not _chat_choices(choices) or not isinstance(ev.get("content") or "", str):
            raise unreadable(where, payload, "not a chat or completion chunk")
        for ch in choices:  # OpenAI chat chunks
            delta = ch.get("delta") or {}
            if delta.get("reasoning_content"):
                self.reasoning_s.append(t)
                self.reasoning_chars += len(delta["reasoning_content"])
            if delta.get("content"):
                self.content_s.append(t)
                self.content_chars += len(delta["content"])
            self.finish_reason = ch.get("finish_reason") or self.finish_reason
        if "choices" not in ev and ev.get("content"):  # /completion chunks
            self.content_s.append(t)
            self.content_chars += len(ev["content"])
        if "timings" in ev or "usage" in ev or ev.get("stop"):
            self.final.update(ev)


def _chat_choices(choices: Any) -> bool:
    """Whether an event's ``choices`` are shaped as a chat completion chunk's (deltas with text)."""
    if not isinstance(choices, list):
        return False
    for ch in choices:
        delta = (ch.get("delta") or {}) if isinstance(ch, dict) else None
        if not isinstance(delta, dict):
            return False
        if not all(isinstance(delta.get(k) or "", str) for k in ("content", "reasoning_content")):
            return False
    return True


def unreadable(where: str, payload: bytes, why: str) -> RuntimeFailure:
    shown = payload[:80].decode(errors="replace")
    return RuntimeFailure(
        f"{where}: the server sent an event moetune cannot read ({why}): {one_line(shown)}",
        hint="is this an OpenAI-compatible server? moetune reads its streamed chat chunks",
    )


async def stream(
    http: StreamingHttp, url: str, path: str, body: dict[str, object], *, timeout_s: float, attempts: int = 2
) -> dict[str, object]:
    """POST a streaming request; return the raw observations (see the module docstring). A request
    whose connection the server had closed before answering is sent again (``retried``)."""
    for attempt in range(attempts):
        answered: list[bool] = []
        try:
            async with asyncio.timeout(timeout_s):
                raw = await _stream(http, url, path, body=body, answered=answered)
        except RuntimeFailure:
            raise
        except Exception as e:
            kind = http.classify(e)
            if kind in RETRYABLE and attempt < attempts - 1 and not answered:
                continue
            if kind == "timeout":
                raise RuntimeFailure(
                    f"{url}{path}: no answer within {timeout_s:g} s", hint="raise --timeout, or lower --max-tokens"
                ) from None
            raise unreachable(url, f"request to {path} failed", f"{kind}: {e}") from None
        if attempt:
            raw["retried"] = True
        return raw
    raise AssertionError("unreachable")


async def _stream(
    http: StreamingHttp, url: str, path: str, *, body: dict[str, object], answered: list[bool]
) -> dict[str, object]:
    c = _Collect()
    t_unix = time.time()
    t0 = time.monotonic()
    headers_s: float | None = None
    buf = b""
    async with http.post_stream(path, json.dumps(body).encode()) as reply:
        headers_s = time.monotonic() - t0
        answered.append(True)
        if reply.status != 200:
            text = b"".join([p async for _, _, p in reply.pieces]).decode(errors="replace")[:500]
            raise RuntimeFailure(
                f"{url}{path}: HTTP {reply.status}: {text}",
                hint=auth.refused_hint(reply.status, "the server refused the request; its message says why"),
            )
        async for t, _, piece in reply.pieces:
            payloads, buf = sse_payloads(buf, piece)
            for payload in payloads:
                c.event(max(0.0, t - t0), payload, url + path)
                if c.done:  # nothing after [DONE] counts, whether it came in the same piece or later
                    break
            if c.done:
                break
    end_s = time.monotonic() - t0
    return {
        "path": path,
        "t_unix_s": t_unix,
        "headers_s": headers_s,
        "end_s": end_s,
        "content_chunk_s": [round(x, 6) for x in c.content_s],
        "reasoning_chunk_s": [round(x, 6) for x in c.reasoning_s],
        "content_chars": c.content_chars,
        "reasoning_chars": c.reasoning_chars,
        "finish_reason": c.finish_reason or c.final.get("stop_type"),
        "timings": c.final.get("timings"),  # llama-server's; None from other servers
        "usage": c.final.get("usage"),
        "tokens_cached": c.final.get("tokens_cached"),
        "tokens_evaluated": c.final.get("tokens_evaluated"),
    }
