"""Fuzzing the streaming clients: the serve-bench SSE parser, the single-stream request and the HTTP
response parser under them.

The strong property: however a stream is cut into the pieces a socket delivers, the record is the
one the whole stream gives (valid streams, damaged ones and random bytes alike). And garbage ends
only in the documented ways: a serve-bench sample's ``error`` (``bad_event``, ``stream_error:...``),
a single-stream ``RuntimeFailure``, the HTTP parser's ``ValueError`` kept as the response's error.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from moetune.bench.http.client import StreamReply, _Conn
from moetune.bench.serve.request import RequestRecord, SseParser
from moetune.bench.single.request import stream
from moetune.errors import RuntimeFailure
from tests.fuzz.budget import fuzz
from tests.fuzz.guard import bounded
from tests.fuzz.sse_cases import COMPLETION_EVENTS, Cut, cuts, damaged, http_responses, streams

ANY_STREAM = st.one_of(
    streams(), streams(), damaged(streams()), damaged(streams(COMPLETION_EVENTS)), st.binary(max_size=300)
)

pytestmark = pytest.mark.fuzz


# ---- serve-bench: SseParser -------------------------------------------------------------------


def serve_record(pieces: list[bytes]) -> str:
    rec = RequestRecord(index=0, concurrency=1, rate=None, prompt_tokens=None, max_tokens=64, t_sched=0.0)
    parser = SseParser(rec)
    with bounded():
        for piece in pieces:
            parser.feed(1.0, piece)
    return repr((rec.to_sample(), parser.done))  # repr: a NaN in the server's numbers compares equal


@example(cut=Cut(b'data: {"choices": [null]}\n\n'))
@example(cut=Cut(b'data: {"choices": [{"delta": {"content": 7}}]}\n\n'))
@given(cut=cuts(ANY_STREAM))
@fuzz(1000)
def test_any_cut_of_a_stream_gives_the_serve_record_of_the_whole(cut: Cut) -> None:
    whole = serve_record([cut.data])
    assert serve_record(cut.pieces) == whole
    rec = RequestRecord(index=0, concurrency=1, rate=None, prompt_tokens=None, max_tokens=64, t_sched=0.0)
    SseParser(rec).feed(1.0, cut.data)
    assert rec.error is None or rec.error == "bad_event" or rec.error.startswith("stream_error"), rec.error
    assert all(isinstance(c[1], int) and c[1] >= 0 for c in rec.chunks), rec.chunks


# ---- single-stream: bench/single/request.stream ---------------------------------------------------


class OneReply:
    """A StreamingHttp whose server answers every POST with ``status`` and these body pieces."""

    library = "fake"

    def __init__(self, status: int, pieces: list[bytes]) -> None:
        self.status, self.pieces = status, pieces

    @asynccontextmanager
    async def _post(self) -> AsyncIterator[StreamReply]:
        async def body() -> AsyncIterator[tuple[float, float, bytes]]:
            for p in self.pieces:
                yield 0.0, 0.0, p

        yield StreamReply(self.status, None, body())

    def post_stream(self, path: str, body: bytes) -> Any:
        return self._post()

    def classify(self, exc: BaseException) -> str:
        return "client_exception"


def single_outcome(pieces: list[bytes], status: int = 200) -> str:
    try:
        with bounded():
            raw = asyncio.run(
                stream(
                    OneReply(status, pieces), "http://127.0.0.1:1", "/v1/chat/completions", {}, timeout_s=30, attempts=1
                )
            )
    except RuntimeFailure as e:
        assert "\n" not in str(e).split(": ", 2)[-1][:0]
        return f"RuntimeFailure: {e}"
    for k in ("t_unix_s", "headers_s", "end_s"):  # the client's clock
        raw.pop(k)
    return repr(raw)


@example(cut=Cut(b'data: [DONE]\n\ndata: {"choices": [{"delta": {"content": "x"}}]}\n\n', (14,)))
@given(cut=cuts(ANY_STREAM))
@fuzz(600)
def test_any_cut_of_a_stream_gives_the_single_stream_sample_of_the_whole(cut: Cut) -> None:
    assert single_outcome(cut.pieces) == single_outcome([cut.data])


@given(body=st.binary(max_size=100), status=st.sampled_from([400, 404, 500, 503]))
@fuzz(50)
def test_an_error_status_is_a_runtime_failure(body: bytes, status: int) -> None:
    assert single_outcome([body], status).startswith("RuntimeFailure: ")


# ---- the HTTP response parser under both ---------------------------------------------------------


def conn_outcome(pieces: list[bytes], closed: bool) -> tuple[Any, ...]:
    c = _Conn()
    with bounded():
        for p in pieces:
            c.feed(p, 1.0)
        if closed:
            c.on_lost(None)
    body = b"".join(p for _, _, p in c.pieces)
    assert c.error is None or isinstance(c.error, ValueError | ConnectionError), repr(c.error)
    return c.status, c.head_done, c.done, body, repr(c.error)


@given(resp=http_responses(), at=st.lists(st.integers(0, 1 << 12), max_size=12))
@fuzz(600)
def test_any_cut_of_a_response_gives_its_body(resp: tuple[bytes, bytes, int], at: list[int]) -> None:
    wire, body, status = resp
    cut = Cut(wire, tuple(sorted(min(a, len(wire)) for a in at)))
    closed = b"Connection: close" in wire
    got = conn_outcome(cut.pieces, closed)
    assert got == (status, True, True, body, "None")
    assert conn_outcome([wire], closed) == got


BAD_LENGTHS = [b"-1", b"abc", b"", b"1e3", b" 5", b"99999999999999999999", b"+3", b"0x10", b"1_0", b"\xff"]
BAD_SIZES = [b"-5", b"zz", b"", b"0x10", b"1_0", b"+3", b"ffffffffffffffffffff", b"-0", b" 3 ", b"\xff"]


@st.composite
def bad_responses(draw: st.DrawFn) -> bytes:
    body = draw(st.binary(max_size=40))
    kind = draw(st.sampled_from(("length", "chunked", "status", "random")))
    if kind == "length":
        return b"HTTP/1.1 200 OK\r\nContent-Length: " + draw(st.sampled_from(BAD_LENGTHS)) + b"\r\n\r\n" + body
    if kind == "chunked":
        return (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + draw(st.sampled_from(BAD_SIZES))
            + b"\r\n"
            + body
            + b"\r\n0\r\n\r\n"
        )
    if kind == "status":
        return (
            draw(
                st.sampled_from([b"HTTP/1.1 abc OK", b"HTTP/1.1", b"HTP/1.1 200", b"HTTP/1.1 -200 X", b"HTTP/1.1 \xff"])
            )
            + b"\r\n\r\n"
            + body
        )
    return draw(st.binary(max_size=120))


@given(wire=bad_responses(), at=st.lists(st.integers(0, 200), max_size=8), closed=st.booleans())
@fuzz(600)
def test_a_bad_response_is_read_the_same_however_it_is_cut(wire: bytes, at: list[int], closed: bool) -> None:
    cut = Cut(wire, tuple(sorted(min(a, len(wire)) for a in at)))
    assert conn_outcome(cut.pieces, closed) == conn_outcome([wire], closed)
