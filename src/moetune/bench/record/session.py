"""A recorded session: one JSON line per request the proxy forwarded (pure: no I/O, no clock).

A line says what was asked (method, path, query, the JSON body), when (``t_start_s``: the
request's head was in, in seconds from the session's first request, which is what a replay keeps),
how it went (when it was sent on, when the answer's head, first chunk, first token and end came,
its status), how many tokens it took (``usage`` where the response carried it, else the server's
``timings``, else the streamed events that carried text) and what the proxy itself added
(:class:`ProxyDelays`). :func:`redact` makes a body shareable; :func:`summarize` is what the
proxy prints when it stops.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

SCHEMA = 1
FILLER = "loremipsumdolorsitametconsecteturadipiscingelitseddoeiusmodtempor"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyDelays:
    """What the proxy added to one request, in ms on this machine's clock."""

    forward_ms: float | None = None  # the request's last byte in → handed to the kernel for the upstream
    # (connecting included; not the send itself, after which a local upstream may run before the proxy does)
    connect_ms: float | None = None  # of which: opening a connection to the upstream (None: one was open)
    first_byte_ms: float | None = (
        None  # the upstream's first response byte reached this machine → written to the client
    )
    piece_p50_ms: float | None = None  # each piece of the response: reached this machine → written (median, largest)
    piece_max_ms: float | None = None
    pieces: int = 0

    def to_json(self) -> dict[str, object]:
        return {f.name: round(v, 4) if isinstance(v := getattr(self, f.name), float) else v for f in fields(self)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ProxyDelays:
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass(frozen=True, slots=True, kw_only=True)
class Exchange:
    """One request through the proxy and its answer: a line of the session file."""

    seq: int  # arrival order in the session, from 0
    method: str
    path: str  # without the query
    t_start_s: float  # the request's head was in, from the session's first request
    query: str = ""
    body: Any = None  # the request's JSON body; None: none, or not JSON
    body_bytes: int = 0
    t_unix: float | None = None  # wall clock at t_start_s
    t_sent_s: float | None = None  # sent on to the upstream
    t_headers_s: float | None = None  # the upstream's response head was in
    t_first_chunk_s: float | None = None  # its first body bytes
    t_first_token_s: float | None = None  # its first event with generated text or tokens
    t_end_s: float | None = None
    status: int | None = None
    stream: bool = False  # the answer was server-sent events
    events: int = 0  # events that carried generated text or tokens
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_from: str | None = None  # usage | timings | events
    usage: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None  # upstream_unreachable, upstream_closed, client_closed, interrupted, ...
    proxy: ProxyDelays = field(default_factory=ProxyDelays)
    redacted: bool = False

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"schema": SCHEMA}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float):
                v = round(v, 6) if math.isfinite(v) else None
            elif isinstance(v, ProxyDelays):
                v = v.to_json()
            elif f.name == "usage" and v is not None:
                v = dict(v)
            d[f.name] = v
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Exchange:
        """A line as written; KeyError or TypeError when it is not one."""
        if not isinstance(d, Mapping):
            raise TypeError("a session line is a JSON object")
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d and f.name != "proxy"}
        for key in ("seq", "method", "path", "t_start_s"):
            if key not in kw:
                raise KeyError(key)
        if not isinstance(kw["seq"], int) or not isinstance(kw["t_start_s"], int | float):
            raise TypeError("seq and t_start_s are numbers")
        return cls(**kw, proxy=ProxyDelays.from_json(d.get("proxy") or {}))

    @property
    def target(self) -> str:
        return self.path + (f"?{self.query}" if self.query else "")


# ---- tokens -------------------------------------------------------------------------------------


def token_counts(
    usage: Mapping[str, Any] | None, timings: Mapping[str, Any] | None, events: int | None
) -> tuple[int | None, int | None, str | None]:
    """(prompt tokens, completion tokens, where the completion count came from): the response's
    ``usage``, else llama-server's ``timings``, else the streamed events that carried text
    (``events``, None for an answer that was not streamed)."""

    def num(d: Mapping[str, Any] | None, k: str) -> int | None:
        v = (d or {}).get(k)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    prompt = num(usage, "prompt_tokens")
    if prompt is None and num(timings, "prompt_n") is not None:
        prompt = (num(timings, "prompt_n") or 0) + (num(timings, "cache_n") or 0)
    if (done := num(usage, "completion_tokens")) is not None:
        return prompt, done, "usage"
    if (done := num(timings, "predicted_n")) is not None:
        return prompt, done, "timings"
    if events is not None:
        return prompt, events, "events"
    return prompt, None, None


# ---- redaction ----------------------------------------------------------------------------------


def filler(text: str) -> str:
    """Text of the same length (in characters) with none of its words: its whitespace kept, every
    other character a letter of :data:`FILLER` by position, so a string and its extensions stay
    each other's prefixes (a replay still meets the prefix cache a growing conversation fills)."""
    return "".join(c if c.isspace() else FILLER[i % len(FILLER)] for i, c in enumerate(text))


def _fill_strings(x: Any) -> Any:
    if isinstance(x, str):
        return filler(x)
    if isinstance(x, list):
        return [_fill_strings(v) for v in x]
    if isinstance(x, dict):
        return {k: _fill_strings(v) for k, v in x.items()}
    return x


def _redact_arguments(text: str) -> str:
    """A tool call's ``arguments``: its JSON's string values filled (the JSON stays valid, its keys
    and numbers kept); anything that is not JSON filled whole."""
    import json

    try:
        doc = json.loads(text)
    except ValueError:
        return filler(text)
    return json.dumps(_fill_strings(doc), ensure_ascii=False)


def _redact_content(content: Any) -> Any:
    if isinstance(content, str):
        return filler(content)
    if isinstance(content, list):  # parts: {"type": "text", "text": ...}, images and the like kept
        return [
            {**p, "text": filler(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str) else p
            for p in content
        ]
    return content


def redact(body: Any) -> Any:
    """The body with its text replaced by same-length :func:`filler`: each message's ``content``
    (strings and text parts), ``reasoning_content``, and its tool calls' ``arguments`` (string
    values), and a completion's ``prompt`` (a string or a list of them). Roles, model, sampling
    settings, tool names and definitions are kept."""
    if not isinstance(body, dict):
        return body
    out = dict(body)
    if isinstance(out.get("messages"), list):
        msgs = []
        for m in out["messages"]:
            if not isinstance(m, dict):
                msgs.append(m)
                continue
            m = dict(m)
            for k in ("content", "reasoning_content"):
                if k in m:
                    m[k] = _redact_content(m[k])
            if isinstance(m.get("tool_calls"), list):
                m["tool_calls"] = [_redact_call(c) for c in m["tool_calls"]]
            msgs.append(m)
        out["messages"] = msgs
    if isinstance(out.get("prompt"), str | list):  # a completion's prompt: a string, or a batch of them
        out["prompt"] = _fill_strings(out["prompt"])
    return out


def _redact_call(call: Any) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
        return call
    return {**call, "function": {**fn, "arguments": _redact_arguments(fn["arguments"])}}


# ---- the session as a whole ---------------------------------------------------------------------


def concurrency(exchanges: Iterable[Exchange]) -> int:
    """The most requests that were in flight at once (from their start to their end)."""
    edges = []
    for e in exchanges:
        end = e.t_end_s if e.t_end_s is not None else e.t_start_s
        edges += [(e.t_start_s, 1), (max(end, e.t_start_s), -1)]
    most = now = 0
    for _, step in sorted(edges, key=lambda x: (x[0], x[1])):  # an end before a start at the same time
        now += step
        most = max(most, now)
    return most


def percentiles(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50, p99, largest and count, rounded to µs (values in ms)."""
    if not values:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    a = np.asarray(values, dtype=float)
    p50, p99 = np.percentile(a, [50, 99])
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3), "max": round(float(a.max()), 3), "n": len(values)}


def summarize(exchanges: Sequence[Exchange], piece_ms: Sequence[float] = ()) -> dict[str, object]:
    """The session in figures: requests by path and status, errors, tokens, the most in flight at
    once, and the proxy's added latency (forwarding a request, the first byte of an answer, and
    each relayed piece when ``piece_ms`` gives them all; else the per-request medians)."""
    ends = [e.t_end_s for e in exchanges if e.t_end_s is not None]
    starts = [e.t_start_s for e in exchanges]
    delays = [e.proxy for e in exchanges]
    pieces = list(piece_ms) or [d.piece_p50_ms for d in delays if d.piece_p50_ms is not None]
    return {
        "requests": len(exchanges),
        "paths": dict(Counter(f"{e.method} {e.path}" for e in exchanges).most_common()),
        "status": {str(k): v for k, v in sorted(Counter(e.status for e in exchanges if e.status).items())},
        "errors": dict(sorted(Counter(e.error for e in exchanges if e.error).items())),
        "prompt_tokens": sum(e.prompt_tokens or 0 for e in exchanges),
        "completion_tokens": sum(e.completion_tokens or 0 for e in exchanges),
        "duration_s": round(max(ends) - min(starts), 3) if ends and starts else None,
        "concurrency": concurrency(exchanges),
        "proxy_ms": {
            "forward": percentiles([d.forward_ms for d in delays if d.forward_ms is not None]),
            "first_byte": percentiles([d.first_byte_ms for d in delays if d.first_byte_ms is not None]),
            "piece": percentiles(pieces),
        },
    }


def summary_lines(s: Mapping[str, Any]) -> list[str]:
    """:func:`summarize`'s figures for a person."""

    def ms(p: Mapping[str, Any]) -> str:
        return "-" if not p["n"] else f"p50 {p['p50']:.3f} ms, p99 {p['p99']:.3f} ms (n={p['n']})"

    errs = ", ".join(f"{k} x{v}" for k, v in s["errors"].items())
    px = s["proxy_ms"]
    return [
        f"{s['requests']} requests ({', '.join(f'{k} x{v}' for k, v in s['paths'].items()) or 'none'})"
        + (f", errors: {errs}" if errs else "")
        + f"; {s['prompt_tokens']} prompt and "
        f"{s['completion_tokens']} completion tokens; at most {s['concurrency']} at once",
        f"added by the proxy: forwarding a request {ms(px['forward'])}; first byte of an answer "
        f"{ms(px['first_byte'])}; each relayed piece {ms(px['piece'])}",
    ]
