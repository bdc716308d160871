"""Server-sent event streams as llama-server and OpenAI-compatible servers send them, and ways to cut
and damage them (Hypothesis strategies)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

_delta = st.fixed_dictionaries(
    {},
    optional={
        "content": st.one_of(st.none(), st.text(max_size=8)),
        "reasoning_content": st.one_of(st.none(), st.text(max_size=8)),
        "role": st.just("assistant"),
        "tool_calls": st.just([{"index": 0, "function": {"arguments": "{"}}]),
    },
)
_choice = st.fixed_dictionaries(
    {"index": st.just(0), "delta": _delta}, optional={"finish_reason": st.sampled_from([None, "stop", "length"])}
)
_timings = st.fixed_dictionaries(
    {"predicted_n": st.integers(0, 500), "predicted_ms": st.floats(0, 1e5), "prompt_n": st.integers(0, 500)}
)
_usage = st.fixed_dictionaries({"completion_tokens": st.integers(0, 500), "prompt_tokens": st.integers(0, 500)})
EVENTS = st.fixed_dictionaries(
    {"choices": st.lists(_choice, max_size=2)},
    optional={
        "id": st.text(max_size=6),
        "object": st.just("chat.completion.chunk"),
        "timings": _timings,
        "usage": _usage,
    },
)
# completion-style chunks (llama-server's /completion), read by the single-stream client
COMPLETION_EVENTS = st.fixed_dictionaries(
    {"content": st.text(max_size=8)},
    optional={
        "stop": st.booleans(),
        "timings": _timings,
        "tokens_cached": st.integers(0, 100),
        "stop_type": st.just("eos"),
    },
)


@st.composite
def streams(draw: st.DrawFn, events: st.SearchStrategy[dict[str, Any]] = EVENTS) -> bytes:
    """A valid event stream: JSON events (ASCII-escaped or not), CRLF or LF line ends, comments and
    ``event:`` lines between them, ``[DONE]`` at the end (or not)."""
    out = b""
    for obj in draw(st.lists(events, max_size=6)):
        eol = draw(st.sampled_from([b"\n", b"\r\n"]))
        if draw(st.integers(0, 4)) == 0:
            out += b": keep-alive" + eol + eol
        if draw(st.integers(0, 4)) == 0:
            out += b"event: message" + eol
        data = json.dumps(obj, ensure_ascii=draw(st.booleans())).encode()
        out += draw(st.sampled_from([b"data: ", b"data:"])) + data + eol + eol
    if draw(st.booleans()):
        out += b"data: [DONE]\n\n"
    return out


@st.composite
def damaged(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid stream, damaged: bytes flipped, cut, inserted (events after [DONE], bare CRs, JSON
    of the wrong shape)."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(("insert", "insert", "flip", "cut")))
        if op == "insert":
            data[i:i] = draw(
                st.one_of(
                    st.binary(max_size=8),
                    st.sampled_from(
                        [
                            b"\r",
                            b"\n\n",
                            b"\r\n\r\n",
                            b"data: [DONE]\n\n",
                            b"data: {}\n\n",
                            b"data: []\n\n",
                            b"data: 1\n\n",
                            b'data: {"choices": 5}\n\n',
                            b'data: {"choices": "ab"}\n\n',
                            b'data: {"choices": [null]}\n\n',
                            b'data: {"choices": [{"delta": "x"}]}\n\n',
                            b'data: {"choices": [{"delta": {"content": 7}}]}\n\n',
                            b'data: {"choices": [{"delta": {"reasoning_content": [1]}}]}\n\n',
                            b'data: {"error": "boom"}\n\n',
                            b'data: {"error": {"type": 5, "message": null}}\n\n',
                            b'data: {"timings": {"predicted_n": -3}}\n\n',
                            b'data: {"usage": {"completion_tokens": "9"}, "choices": [{}]}\n\n',
                            b'data: {"content": 5}\n\n',
                            b'data: {"timings": 1, "usage": 2}\n\n',
                            b"data: \xff\xfe\n\n",
                            b"data: NaN\n\n",
                            b'data: {"choices": [{"finish_reason": {"a": 1}}]}\n\n',
                        ]
                    ),
                )
            )
        elif op == "flip" and data:
            data[min(i, len(data) - 1)] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del data[i:]
    return bytes(data)


@dataclass(frozen=True)
class Cut:
    """A byte stream and where it is cut into the pieces a client reads."""

    data: bytes
    at: tuple[int, ...] = field(default=())

    @property
    def pieces(self) -> list[bytes]:
        edges = [0, *self.at, len(self.data)]
        return [self.data[a:b] for a, b in itertools.pairwise(edges)]


def cuts(data: st.SearchStrategy[bytes]) -> st.SearchStrategy[Cut]:
    return data.flatmap(
        lambda d: st.builds(
            Cut, st.just(d), st.lists(st.integers(0, len(d)), max_size=12).map(lambda xs: tuple(sorted(xs)))
        )
    )


@st.composite
def http_responses(draw: st.DrawFn) -> tuple[bytes, bytes, int]:
    """A complete HTTP/1.1 response (head and body framed by Content-Length, chunked encoding with
    random chunk sizes and extensions, or the end of the connection), its body and status."""
    status = draw(st.sampled_from([200, 200, 400, 404, 500, 503]))
    body = draw(st.one_of(streams(), st.binary(max_size=200)))
    framing = draw(st.sampled_from(("length", "chunked", "close")))
    head = f"HTTP/1.1 {status} OK\r\nContent-Type: text/event-stream\r\n".encode()
    if framing == "length":
        head += f"Content-Length: {len(body)}\r\n".encode()
        wire = body
    elif framing == "chunked":
        head += draw(st.sampled_from([b"Transfer-Encoding: chunked\r\n", b"transfer-encoding: Chunked\r\n"]))
        wire, i = b"", 0
        while i < len(body):
            n = draw(st.integers(1, max(1, len(body) - i)))
            ext = draw(st.sampled_from([b"", b";x=1", b" "]))
            wire += f"{n:x}".encode() + ext + b"\r\n" + body[i : i + n] + b"\r\n"
            i += n
        wire += b"0\r\n" + draw(st.sampled_from([b"", b"X-Trailer: 1\r\n"])) + b"\r\n"
    else:
        head += b"Connection: close\r\n"
        wire = body
    return head + b"\r\n" + wire, body, status
