"""What a replay sends, and when (pure: the recorded session in, requests and due times out).

The replayed requests are the session's completions (``POST .../chat/completions`` and
``.../completions`` with a JSON body), in the order they arrived, each to its own path with its
recorded body, but streamed with usage asked for as serve-bench asks (``stream``,
``stream_options.include_usage`` and ``continuous_usage_stats``, ``timings_per_token``), and with
the model the target serves when it does not serve the recorded one. Anything else in the session
(``GET /v1/models``, ``/health``...) is skipped and counted.

Timing: ``1x`` sends each request at its recorded arrival offset, ``Nx`` at the offset divided by
N, ``max`` as fast as the client slots allow; both keep the recorded order and at most the
recorded concurrency (or the one given) in flight.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moetune.bench.record.session import Exchange, concurrency
from moetune.errors import InputError

REPLAYED_PATHS = ("/chat/completions", "/completions")
_SPEED = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)x$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRequest:
    seq: int  # the recorded request's
    target: str  # its path and query
    body: Mapping[str, Any]  # as recorded
    offset_s: float  # its arrival, from the session's first request
    max_tokens: int  # 0: not set
    recorded_completion_tokens: int | None  # as the upstream counted them (usage, timings); None: not counted
    recorded_prompt_tokens: int | None
    recorded_ok: bool = True  # the recording got a 2xx answer to it, whole (a replay may fail it again)


def replayable(e: Exchange) -> bool:
    return e.method == "POST" and isinstance(e.body, dict) and e.path.rstrip("/").endswith(REPLAYED_PATHS)


def parse_speed(text: str) -> float | None:
    """``max`` → None; ``1x``, ``2x``, ``0.5x`` → the factor."""
    t = text.strip().lower()
    if t == "max":
        return None
    m = _SPEED.match(t)
    factor = float(m[1]) if m else 0.0
    if factor <= 0:
        raise InputError(
            f"--speed {text!r}: give max, or a factor such as 1x, 2x or 0.5x",
            hint="1x keeps the recorded timing, max sends as fast as the client slots allow",
        )
    return factor


def _max_tokens(body: Mapping[str, Any]) -> int:
    for k in ("max_tokens", "max_completion_tokens", "n_predict"):
        v = body.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def replay_requests(exchanges: Sequence[Exchange]) -> tuple[list[ReplayRequest], int]:
    """The requests to replay in their recorded order, and how many recorded ones are not replayed."""
    keep = sorted((e for e in exchanges if replayable(e)), key=lambda e: (e.t_start_s, e.seq))
    t0 = keep[0].t_start_s if keep else 0.0
    reqs = [
        ReplayRequest(
            seq=e.seq,
            target=e.target,
            body=e.body,
            offset_s=e.t_start_s - t0,
            max_tokens=_max_tokens(e.body),
            recorded_completion_tokens=e.completion_tokens if e.tokens_from in ("usage", "timings") else None,
            recorded_prompt_tokens=e.prompt_tokens,
            recorded_ok=e.status is not None and 200 <= e.status < 300 and e.error is None,
        )
        for e in keep
    ]
    return reqs, len(exchanges) - len(keep)


def replay_concurrency(exchanges: Sequence[Exchange]) -> int:
    """How many replayed requests the recording had in flight at once (at least 1)."""
    return max(1, concurrency(e for e in exchanges if replayable(e)))


def due_offsets(reqs: Sequence[ReplayRequest], speed: float | None) -> tuple[float, ...] | None:
    """When each request is due, from the replay's start (None for ``max``: as slots free up)."""
    return None if speed is None else tuple(r.offset_s / speed for r in reqs)


def choose_model(recorded: Any, served: Sequence[str], override: str | None) -> str | None:
    """The model field to send: ``override``; else the recorded one where the target serves it (or
    says nothing of what it serves), or none where none was recorded (the server's default); else
    the target's first. None: leave the body's as it is."""
    if override is not None:
        return override
    if recorded is None or not served or recorded in served:
        return None
    return served[0]


def salted(body: Mapping[str, Any], salt: str) -> dict[str, object]:
    """The body with ``salt`` and a space before its first text: the first message's content (a
    string, or its first text part) or a completion's prompt. Every request of one pass of a replay
    gets the same salt, so the prefixes they share stay shared, while a pass shares none with
    another: each pass meets the prefix cache as the session filled it, not as the last pass left it."""
    doc = dict(body)
    msgs = doc.get("messages")
    if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict):
        first = dict(msgs[0])
        content = first.get("content")
        if isinstance(content, str):
            first["content"] = f"{salt} {content}"
        elif isinstance(content, list):
            at = next(
                (i for i, p in enumerate(content) if isinstance(p, dict) and isinstance(p.get("text"), str)), None
            )
            if at is not None:
                content = list(content)
                content[at] = {**content[at], "text": f"{salt} {content[at]['text']}"}
                first["content"] = content
        doc["messages"] = [first, *msgs[1:]]
    elif isinstance(doc.get("prompt"), str):
        doc["prompt"] = f"{salt} {doc['prompt']}"
    return doc


def pinned(body: Mapping[str, Any], tokens: int) -> dict[str, object]:
    """The body asking for exactly ``tokens`` tokens (``max_tokens`` and ``ignore_eos``), so that a
    replay does the recorded work whatever the model now says."""
    doc = {k: v for k, v in body.items() if k not in ("max_completion_tokens", "n_predict")}
    doc["max_tokens"] = tokens
    doc["ignore_eos"] = True
    return doc


def replay_body(r: ReplayRequest, model: str | None, *, salt: str | None = None, pin: bool = False) -> bytes:
    """The recorded body, streamed with usage asked for, with ``model`` when given; ``salt`` before
    its first text (:func:`salted`); with ``pin``, exactly the recorded completion tokens asked for
    where the recording counted them (:func:`pinned`)."""
    doc = dict(r.body)
    if salt is not None:
        doc = salted(doc, salt)
    if pin and r.recorded_completion_tokens:
        doc = pinned(doc, r.recorded_completion_tokens)
    doc["stream"] = True
    options = doc.get("stream_options")
    doc["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    doc["timings_per_token"] = True
    if model is not None:
        doc["model"] = model
    return json.dumps(doc).encode()


def token_differences(reqs: Sequence[ReplayRequest], completion_tokens: Sequence[int | None]) -> list[int]:
    """The replayed requests (by position) whose completion tokens differ from the recording's,
    of those where both are known."""
    return [
        i
        for i, (r, n) in enumerate(zip(reqs, completion_tokens, strict=True))
        if r.recorded_completion_tokens is not None and n is not None and n != r.recorded_completion_tokens
    ]
