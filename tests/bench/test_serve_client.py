"""The streaming client's pieces: SSE parsing, token counting, error kinds, HTTP framing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from moetune.bench.http.client import Disconnected, RawClient, Truncated, _Conn
from moetune.bench.serve.request import RequestRecord, SseParser, http_error


def rec() -> RequestRecord:
    return RequestRecord(index=0, concurrency=1, rate=None, prompt_tokens=8, max_tokens=4, t_sched=0.0)


def ev(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def delta(content: str | None = None, reasoning: str | None = None, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if content is not None:
        d["content"] = content
    if reasoning is not None:
        d["reasoning_content"] = reasoning
    return {"id": "x1", "choices": [{"index": 0, "delta": d, "finish_reason": None}], **extra}


def test_llama_server_stream_with_timings_per_token() -> None:
    r = rec()
    p = SseParser(r)
    role = {"id": "x1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}
    # role chunk and first token arrive in one read; the second read holds a held-back token's text
    p.feed(1.0, ev(role) + ev(delta("a", timings={"predicted_n": 1, "predicted_ms": 0.0})))
    # two tokens, their text held back (a partial UTF-8 character), then the text with no new token
    p.feed(1.1, ev(delta("", timings={"predicted_n": 3, "predicted_ms": 99.5})))
    p.feed(1.2, ev(delta("é", timings={"predicted_n": 3, "predicted_ms": 99.5})))
    p.feed(
        1.3,
        ev({"id": "x1", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        + ev(
            {
                "id": "x1",
                "choices": [],
                "usage": {"completion_tokens": 4, "prompt_tokens": 8},
                "timings": {"predicted_n": 4, "prompt_ms": 3.0},
            }
        )
        + b"data: [DONE]\n\n",
    )
    assert r.count_source == "timings"
    assert r.chunks == [
        [1.0, 1, 1, 0, 0.0, 1.0],
        [1.1, 2, 0, 0, 99.5, 1.1],
        [1.2, 0, 1, 0, 99.5, 1.2],
        [1.3, 1, 0, 0, None, 1.3],
    ]
    assert p.done and r.finish_reason == "length" and r.response_id == "x1"
    assert r.usage == {"completion_tokens": 4, "prompt_tokens": 8}
    assert r.timings == {"predicted_n": 4, "prompt_ms": 3.0}


def test_openai_stream_without_counts_counts_text_events() -> None:
    r = rec()
    p = SseParser(r)
    p.feed(1.0, ev(delta(reasoning="hm")) + ev(delta("a")))
    p.feed(1.1, ev(delta("b")))
    p.feed(1.2, ev({"id": "x1", "choices": [], "usage": {"completion_tokens": 9}}) + b"data: [DONE]\n\n")
    assert r.count_source == "text"
    assert [c[:5] for c in r.chunks] == [[1.0, 1, 0, 2, None], [1.0, 1, 1, 0, None], [1.1, 1, 1, 0, None]]


def test_continuous_usage_counts() -> None:
    r = rec()
    p = SseParser(r)
    p.feed(1.0, ev(delta("ab", usage={"completion_tokens": 2})))
    p.feed(1.1, ev(delta("c", usage={"completion_tokens": 3})))
    assert r.count_source == "usage"
    assert [c[1] for c in r.chunks] == [2, 1]


def test_events_split_across_reads_and_crlf() -> None:
    r = rec()
    p = SseParser(r)
    raw = (ev(delta("a", timings={"predicted_n": 1})) + ev(delta("b", timings={"predicted_n": 2}))).replace(
        b"\n", b"\r\n"
    )
    p.feed(1.0, raw[:17])
    p.feed(1.1, raw[17:-3])
    p.feed(1.2, raw[-3:])
    assert [(c[0], c[1]) for c in r.chunks] == [(1.1, 1), (1.2, 1)]


def test_error_event_mid_stream() -> None:
    r = rec()
    SseParser(r).feed(1.0, ev({"error": {"code": 500, "message": "boom", "type": "server_error"}}))
    assert r.error == "stream_error:server_error" and r.detail == "boom"


def test_malformed_event() -> None:
    r = rec()
    SseParser(r).feed(1.0, b"data: {not json\n\n")
    assert r.error == "bad_event"


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (
            400,
            {"error": {"code": 400, "type": "exceed_context_size_error", "message": "too long"}},
            "http_400:exceed_context_size_error",
        ),
        (503, {"error": {"message": "loading"}}, "http_503"),
        (500, "plain text", "http_500"),
    ],
)
def test_http_error_kinds(status: int, body: Any, kind: str) -> None:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body.encode()
    assert http_error(status, raw)[0] == kind


def test_sample_is_json_without_nan() -> None:
    s = rec().to_sample()
    assert s["t_send"] is None and s["schema"] == 1
    json.dumps(s, allow_nan=False)


# -- HTTP framing of the raw client ----------------------------------------------------------


def feed_all(parts: list[bytes]) -> _Conn:
    c = _Conn()
    for part in parts:
        c.feed(part, 7.0)
    return c


def split_everywhere(raw: bytes) -> list[list[bytes]]:
    return [[raw[:i], raw[i:]] for i in range(1, len(raw))] + [[raw[i : i + 1] for i in range(len(raw))]]


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n"
)
SIZED = b'HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\n{"error":1}'


@pytest.mark.parametrize("parts", split_everywhere(CHUNKED))
def test_chunked_body_however_it_is_split(parts: list[bytes]) -> None:
    c = feed_all(parts)
    assert c.done and c.error is None and c.status == 200
    assert b"".join(p for _, _, p in c.pieces) == b"hello, world"
    assert all(t == t_min == 7.0 for t, t_min, _ in c.pieces)  # stamped by the arrival clock


@pytest.mark.parametrize("parts", split_everywhere(SIZED))
def test_content_length_body(parts: list[bytes]) -> None:
    c = feed_all(parts)
    assert c.done and c.status == 400
    assert b"".join(p for _, _, p in c.pieces) == b'{"error":1}'


def test_connection_closed_before_answer_or_mid_body() -> None:
    c = feed_all([])
    c.on_lost(None)
    assert isinstance(c.error, Disconnected)
    c = feed_all([CHUNKED[:90]])
    c.on_lost(ConnectionResetError())
    assert isinstance(c.error, Truncated)
    c = feed_all([b"HTTP/1.1 200 OK\r\n\r\nuntil close"])
    c.on_lost(None)
    assert c.done and c.error is None and b"".join(p for _, _, p in c.pieces) == b"until close"


def test_not_http() -> None:
    c = feed_all([b"SSH-2.0-OpenSSH\r\n\r\n"])
    assert c.done and isinstance(c.error, ValueError)


def test_raw_client_classifies() -> None:
    rc = RawClient("http://127.0.0.1:9", 10)
    assert rc.classify(Disconnected("x")) == "disconnected"
    assert rc.classify(Truncated("x")) == "truncated"
    assert rc.classify(ConnectionRefusedError()) == "connect_error"
    assert rc.classify(ConnectionResetError()) == "connection_reset"
    assert rc.classify(TimeoutError()) == "timeout"


def test_raw_client_refused() -> None:
    async def go() -> str:
        rc = RawClient("http://127.0.0.1:9", 10)
        try:
            await rc.get_json("/health")
        except Exception as e:
            return rc.classify(e)
        finally:
            await rc.aclose()
        return "no error"

    assert asyncio.run(go()) == "connect_error"
