"""One streaming chat request, recorded as raw timestamps; and what the server says about itself.

The collector only records: ``time.monotonic()`` when the request was due, when a client slot was
free, when it was sent, when each SSE event arrived with the tokens it carries, and when it ended,
plus the status and any error. TTFT, ITL and the rest are derived later from these samples
(:mod:`moetune.bench.analysis.serve`), so a stored run can be re-read with other definitions.

Tokens per event come from the server's own counters when it gives them (llama-server's
``timings.predicted_n`` with ``timings_per_token``, or a running ``usage.completion_tokens``, as
vLLM and SGLang send with ``stream_options.continuous_usage_stats``); otherwise an event with text
counts as one token, and the final ``usage`` says whether that held. A request that dies before the server answers
(a keep-alive connection the server had closed) is sent again on a new connection, up to
``max_retries`` times, and each retry is recorded; any other failure, and any HTTP error, is kept
as the sample's ``error``, never dropped.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from moetune.bench.analysis.serve import TokenEvent, token_event
from moetune.bench.http.client import RETRYABLE, StreamingHttp, sse_payloads

CHAT_PATH = "/v1/chat/completions"
SAMPLE_SCHEMA = 1


@dataclass(slots=True, kw_only=True)
class RequestRecord:
    """Raw facts about one request; times are ``time.monotonic()`` seconds."""

    index: int
    concurrency: int
    rate: float | None
    prompt_tokens: int | None  # counted through the server's template and tokenizer before sending; None:
    # the server has none (its usage.prompt_tokens says the length)
    max_tokens: int
    t_sched: float  # when it was due: its arrival time, or when a closed-loop worker took it
    t_slot: float = math.nan  # when a client slot was free
    t_first_send: float = math.nan  # the first attempt began
    t_attempt: float = math.nan  # the answered (or last) attempt began, connecting included
    t_send: float = math.nan  # its request was handed to the kernel (= t_attempt when the library hides it)
    t_headers: float | None = None
    t_end: float = math.nan
    # per event: [arrival t, new tokens, content chars, reasoning chars, server's predicted_ms or None,
    # earliest arrival t (< t when it was read late, together with later events)]
    chunks: list[list[float | None]] = field(default_factory=list)
    count_source: str = ""  # timings | usage | text: where per-event token counts came from
    status: int | None = None
    error: str | None = None  # kind: http_400:exceed_context_size_error, disconnected, timeout, ...
    detail: str | None = None
    retries: list[list[Any]] = field(default_factory=list)  # [t, kind] per failed attempt
    response_id: str | None = None
    finish_reason: str | None = None
    usage: dict[str, object] | None = None
    timings: dict[str, object] | None = None  # the server's last timings object
    prompt_source: str | None = None  # "tokenizer": prompt_tokens was predicted by serve-bench --tokenizer

    def events(self) -> list[TokenEvent]:
        """Its stream events by name (``chunks`` read by :func:`token_event`)."""
        return [token_event(c) for c in self.chunks]

    def to_sample(self) -> dict[str, object]:
        d = asdict(self)
        d["schema"] = SAMPLE_SCHEMA
        for k, v in d.items():  # JSON has no NaN
            if isinstance(v, float) and math.isnan(v):
                d[k] = None
        return d


class SseParser:
    """Incremental ``text/event-stream`` parser that fills a :class:`RequestRecord`."""

    def __init__(self, rec: RequestRecord, on_text: Callable[[str, str], None] | None = None) -> None:
        self.rec = rec
        self.on_text = on_text  # given each event's (content, reasoning) text, for a client that keeps the reply
        self.buf = b""
        self.counted = 0  # cumulative tokens seen
        self.done = False  # [DONE] seen
        self.t_min = 0.0

    def feed(self, t: float, data: bytes, t_min: float | None = None) -> None:
        """Bytes that arrived at ``t`` (and not before ``t_min``, when they may have queued up)."""
        self.t_min = t if t_min is None else t_min
        payloads, self.buf = sse_payloads(self.buf, data)
        for payload in payloads:
            if payload == b"[DONE]":
                self.done = True
            elif payload:
                self._event(t, payload)

    def _event(self, t: float, payload: bytes) -> None:
        rec = self.rec
        try:
            obj = json.loads(payload)
        except ValueError:
            rec.error, rec.detail = "bad_event", payload[:200].decode(errors="replace")
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj:
            e = obj["error"]
            kind = e.get("type", "") if isinstance(e, dict) else ""
            rec.error = "stream_error" + (f":{kind}" if kind else "")
            rec.detail = str(e.get("message", e) if isinstance(e, dict) else e)[:300]
            return
        choices = obj.get("choices") or []
        deltas = _deltas(choices)
        if deltas is None:  # JSON, but not a chat completion chunk
            rec.error, rec.detail = "bad_event", payload[:200].decode(errors="replace")
            return
        content, reasoning, tool, finish = deltas
        n_content, n_reason = len(content), len(reasoning)
        if self.on_text is not None and (content or reasoning):
            self.on_text(content, reasoning)
        if finish is not None:
            rec.finish_reason = finish
        if rec.response_id is None and isinstance(obj.get("id"), str):
            rec.response_id = obj["id"]
        usage = obj.get("usage")
        if isinstance(usage, dict):
            rec.usage = usage
        timings = obj.get("timings")
        if isinstance(timings, dict):
            rec.timings = timings
        # a cumulative token counter, if this event carries one
        cum: int | None = None
        source = "text"
        if isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int):
            cum, source = timings["predicted_n"], "timings"
        elif isinstance(usage, dict) and choices and isinstance(usage.get("completion_tokens"), int):
            cum, source = usage["completion_tokens"], "usage"
        has_text = bool(n_content or n_reason or tool)
        if not rec.count_source and (has_text or (cum or 0) > 0):
            rec.count_source = source
        if rec.count_source in ("timings", "usage") and cum is not None:
            n = max(0, cum - self.counted)
            self.counted = max(self.counted, cum)
        else:
            n = 1 if has_text else 0
            self.counted += n
        if n or has_text:
            server_ms = timings.get("predicted_ms") if source == "timings" and isinstance(timings, dict) else None
            rec.chunks.append([t, n, n_content, n_reason, server_ms, self.t_min])


def _deltas(choices: Any) -> tuple[str, str, bool, str | None] | None:
    """The content and the reasoning text of an event's ``choices`` (a chat chunk's ``delta``, a
    completion chunk's ``text``), whether a tool call came, and the last finish reason; None where
    they are not shaped as a chat or completion chunk's."""
    if not isinstance(choices, list):
        return None
    contents: list[str] = []
    reasons: list[str] = []
    tool = False
    finish = None
    for c in choices:
        if not isinstance(c, dict) or not isinstance(d := c.get("delta") or {}, dict):
            return None
        content, text = d.get("content") or "", c.get("text") or ""
        reason = d.get("reasoning_content") or d.get("reasoning") or ""
        if not all(isinstance(x, str) for x in (content, text, reason)):
            return None
        contents += [content, text]
        reasons.append(reason)
        tool = tool or bool(d.get("tool_calls"))
        if c.get("finish_reason"):
            finish = str(c["finish_reason"])
    return "".join(contents), "".join(reasons), tool, finish


async def stream_chat(
    http: StreamingHttp,
    body: bytes,
    rec: RequestRecord,
    *,
    max_retries: int = 2,
    timeout_s: float | None = None,
    path: str = CHAT_PATH,
    on_text: Callable[[str, str], None] | None = None,
) -> None:
    """Send one streaming chat request (or, to another ``path``, a completion) and record it. Never
    raises for transport or HTTP errors; a request not complete within ``timeout_s`` (retries
    included) ends as a ``timeout`` error. ``on_text`` gets the text of each event (content,
    reasoning) of the answered attempt."""
    try:
        async with asyncio.timeout(timeout_s):
            await _attempts(http, body, rec, max_retries=max_retries, path=path, on_text=on_text)
    except TimeoutError:
        rec.error, rec.detail = "timeout", f"no complete answer within {timeout_s} s"
    rec.t_end = time.monotonic()


async def _attempts(
    http: StreamingHttp,
    body: bytes,
    rec: RequestRecord,
    *,
    max_retries: int,
    path: str,
    on_text: Callable[[str, str], None] | None = None,
) -> None:
    clock = time.monotonic
    for attempt in range(max_retries + 1):
        rec.t_attempt = rec.t_send = clock()
        if attempt == 0:
            rec.t_first_send = rec.t_attempt
        answered = False
        parser = SseParser(rec, on_text)
        try:
            async with http.post_stream(path, body) as reply:
                rec.t_headers = clock()
                answered = True
                rec.status = reply.status
                if reply.t_sent is not None:
                    rec.t_send = reply.t_sent
                if reply.status != 200:
                    raw = b"".join([c async for _, _, c in reply.pieces])
                    rec.error, rec.detail = http_error(reply.status, raw)
                    return
                async for t, t_min, chunk in reply.pieces:
                    parser.feed(t, chunk, t_min)
            if rec.error is None and not parser.done and rec.finish_reason is None:
                rec.error, rec.detail = "incomplete_stream", "the stream ended without a finish_reason or [DONE]"
            return
        except (asyncio.CancelledError, TimeoutError):
            raise
        except Exception as e:  # a benchmark reports failures, it does not crash on them
            kind = http.classify(e)
            if not answered and kind in RETRYABLE and attempt < max_retries:
                rec.retries.append([clock(), kind])
                continue
            rec.error = kind if answered or kind not in RETRYABLE else f"{kind}_after_retries"
            rec.detail = f"{type(e).__name__}: {e}"[:300]
            return


def http_error(status: int, raw: bytes) -> tuple[str, str]:
    """``http_400:exceed_context_size_error`` and the server's message, from an error response."""
    kind = f"http_{status}"
    detail = raw[:300].decode(errors="replace")
    try:
        doc = json.loads(raw)
    except ValueError:
        return kind, detail
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        if err.get("type"):
            kind += f":{err['type']}"
        detail = str(err.get("message", detail))[:300]
    return kind, detail
