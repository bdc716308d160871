"""The bugs the fuzzers found in the streaming clients (SSE and HTTP), one regression test each, named
after what broke. Each failed on the code before its fix and checks what the user sees now."""

from __future__ import annotations

import asyncio

import pytest

from moetune.bench.http.client import _Conn
from moetune.bench.serve.request import RequestRecord, SseParser
from moetune.errors import RuntimeFailure
from tests.fuzz.test_sse import OneReply, single_outcome


@pytest.mark.parametrize(
    "event",
    [
        b'{"choices": [null]}',
        b'{"choices": "ab"}',
        b'{"choices": [{"delta": "x"}]}',
        b'{"choices": [{"delta": {"content": 7}}]}',
    ],
)
def test_a_misshapen_chat_chunk_is_a_bad_event(event: bytes) -> None:
    # AttributeError / TypeError out of the parser: the request became `client_exception` and its
    # stream was dropped
    rec = RequestRecord(index=0, concurrency=1, rate=None, prompt_tokens=None, max_tokens=8, t_sched=0.0)
    p = SseParser(rec)
    p.feed(1.0, b"data: " + event + b"\n\ndata: " + b'{"choices": [{"delta": {"content": "x"}}]}\n\n')
    assert rec.error == "bad_event" and len(rec.chunks) == 1


def test_what_follows_done_does_not_count_however_it_arrives() -> None:
    # the single-stream client read events after [DONE] when they came in the same read, not later
    data = (
        b'data: {"choices": [{"delta": {"content": "a"}}]}\n\ndata: [DONE]\n\ndata: {"choices": [{"delta": '
        b'{"content": "bc"}}]}\n\n'
    )
    cut = data.index(b"data: [DONE]") + 14
    assert single_outcome([data]) == single_outcome([data[:cut], data[cut:]])
    assert "'content_chars': 1" in single_outcome([data])


def test_an_event_that_is_not_json_is_not_called_unreachable() -> None:
    # the single-stream client said "is the server running there?" for a server that sent garbage
    with pytest.raises(RuntimeFailure, match="cannot read") as e:
        asyncio.run(
            __import__("moetune.bench.single.request", fromlist=["stream"]).stream(
                OneReply(200, [b"data: {oops\n\n"]),
                "http://127.0.0.1:1",
                "/v1/chat/completions",
                {},
                timeout_s=5,
                attempts=1,
            )
        )
    assert "server running" not in (e.value.hint or "")


@pytest.mark.parametrize("head", [b"Content-Length: -1", b"Content-Length: +3", b"Content-Length: 1_0"])
def test_a_content_length_with_a_sign_is_a_bad_response(head: bytes) -> None:
    # int() took "-1" (never done: the stream hung on), "+3" and "1_0"
    c = _Conn()
    c.feed(b"HTTP/1.1 200 OK\r\n" + head + b"\r\n\r\nabcdefghijk", 1.0)
    assert c.done and isinstance(c.error, ValueError)


def test_bytes_after_a_failed_response_are_not_its_body() -> None:
    # after a bad Content-Length, the next read's bytes were delivered as body (only when they came later)
    c = _Conn()
    c.feed(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", 1.0)
    c.feed(b"junk", 2.0)
    assert not c.pieces and isinstance(c.error, ValueError)


def test_a_broken_chunk_keeps_the_body_before_it_however_it_was_read() -> None:
    # body bytes read together with a broken chunk header were dropped; read apart, they were kept
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n"
    whole, apart = _Conn(), _Conn()
    whole.feed(wire, 1.0)
    apart.feed(wire[:-6], 1.0)
    apart.feed(wire[-6:], 1.0)
    assert [p for _, _, p in whole.pieces] == [b"abc"] == [p for _, _, p in apart.pieces]
