"""The recording proxy's pure parts: HTTP framing, the session line, redaction, token counts, the
summary, and what a replay sends when."""

from __future__ import annotations

import json
import random

import pytest

from moetune.bench.record.framing import BodyReader, parse_head, render_head
from moetune.bench.record.schedule import (
    choose_model,
    due_offsets,
    parse_speed,
    replay_body,
    replay_concurrency,
    replay_requests,
    token_differences,
)
from moetune.bench.record.session import (
    Exchange,
    ProxyDelays,
    concurrency,
    filler,
    redact,
    summarize,
    summary_lines,
    token_counts,
)
from moetune.errors import InputError


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\nX-Trailer: 1\r\n\r\n"


@pytest.mark.parametrize("seed", range(20))
def test_a_chunked_body_ends_where_it_ends_however_it_is_split(seed: int) -> None:
    parts = [b"data: {}\n\n", b"x" * 300, b"", b"data: [DONE]\n\n"]
    parts = [p for p in parts if p]
    raw = chunked(parts) + b"HTTP/1.1 200 OK\r\n"  # what follows is not this body's
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(raw)), rng.randint(0, 12)))
    r = BodyReader(chunked=True, length=None)
    used, payload = 0, b""
    for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        n, p = r.feed(raw[a:b])
        used, payload = used + n, payload + p
    assert r.done and payload == b"".join(parts) and used == len(raw) - len(b"HTTP/1.1 200 OK\r\n")


def test_body_lengths_and_bodiless_answers() -> None:
    r = BodyReader(chunked=False, length=5)
    assert r.feed(b"abc") == (3, b"abc") and not r.done
    assert r.feed(b"defgh") == (2, b"de") and r.done
    head = parse_head(b"HTTP/1.1 204 No Content\r\nContent-Length: 9")
    assert BodyReader.for_response(head, "GET").done
    ok = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 9")
    assert BodyReader.for_response(ok, "HEAD").done and not BodyReader.for_response(ok, "GET").done
    assert BodyReader.for_response(parse_head(b"HTTP/1.1 200 OK"), "GET").until_close
    with pytest.raises(ValueError):
        BodyReader(chunked=True, length=None).feed(b"zz\r\n")
    with pytest.raises(ValueError):
        BodyReader(chunked=True, length=None).feed(b"2\r\nabXY")


def test_hop_by_hop_headers_stay_behind() -> None:
    head = parse_head(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nConnection: keep-alive, X-Hop\r\n"
        b"X-Hop: 1\r\nKeep-Alive: timeout=5\r\nAuthorization: Bearer k\r\nTE: trailers\r\n"
        b"Content-Type: application/json"
    )
    assert head.forwarded(drop=frozenset({"host"})) == [
        ("Authorization", "Bearer k"),
        ("Content-Type", "application/json"),
    ]
    assert head.keep_alive and head.version == "HTTP/1.1"
    assert not parse_head(b"GET / HTTP/1.0").keep_alive
    answer = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100")
    assert (
        render_head(answer.start, answer.forwarded(keep=frozenset({"transfer-encoding"})))
        == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for bad in (b"", b"garbage", b"GET / HTTP/1.1\r\nno colon here", b"GET / HTTP/1.1\r\n bad: folded"):
        with pytest.raises(ValueError):
            parse_head(bad)


CHAT = {
    "model": "m",
    "max_tokens": 8,
    "temperature": 0,
    "ignore_eos": True,
    "messages": [
        {"role": "system", "content": "You are a careful coding agent.\nUse tools."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Fix the bug in parser.py"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "secret plan",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "src/parser.py", "line": 12}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "def parse(): return 42"},
    ],
}


def _strings(x: object) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return []


def test_redaction_keeps_lengths_and_structure_and_drops_the_text() -> None:
    r = redact(CHAT)
    assert {k: v for k, v in r.items() if k != "messages"} == {k: v for k, v in CHAT.items() if k != "messages"}
    m = r["messages"]
    assert [x["role"] for x in m] == ["system", "user", "assistant", "tool"]
    assert len(m[0]["content"]) == len(CHAT["messages"][0]["content"]) and m[0]["content"].count("\n") == 1
    assert len(m[1]["content"][0]["text"]) == len("Fix the bug in parser.py")
    assert m[1]["content"][1] == CHAT["messages"][1]["content"][1]  # not text: kept
    assert len(m[2]["reasoning_content"]) == len("secret plan") and m[2]["content"] is None
    call = m[2]["tool_calls"][0]
    assert call["function"]["name"] == "read_file" and call["id"] == "c1"
    args = json.loads(call["function"]["arguments"])
    assert set(args) == {"path", "line"} and args["line"] == 12 and len(args["path"]) == len("src/parser.py")
    text = json.dumps(r)
    for word in ("careful", "coding", "bug", "parser", "secret", "plan", "return", "42", "tools"):
        assert word not in text.replace('"line": 12', ""), word
    # a completion's prompt, alone or batched; token ids kept
    assert redact({"prompt": "hello world"})["prompt"] == filler("hello world")
    assert redact({"prompt": ["ab", [1, 2]]})["prompt"] == [filler("ab"), [1, 2]]
    assert redact(None) is None and redact([1]) == [1]


def test_filler_keeps_prefixes_so_a_growing_conversation_stays_one() -> None:
    a, b = "first turn", "first turn, then the second"
    assert filler(b).startswith(filler(a)) and len(filler(b)) == len(b)
    assert filler("x y\tz\n") == filler("a b\tc\n") and " " in filler("x y")


def test_a_line_survives_json() -> None:
    e = Exchange(
        seq=3,
        method="POST",
        path="/v1/chat/completions",
        query="a=1",
        t_start_s=1.25,
        body=CHAT,
        body_bytes=500,
        t_end_s=2.5,
        status=200,
        stream=True,
        events=8,
        prompt_tokens=40,
        completion_tokens=8,
        tokens_from="usage",
        usage={"completion_tokens": 8},
        proxy=ProxyDelays(
            forward_ms=0.3, connect_ms=None, first_byte_ms=0.05, piece_p50_ms=0.02, piece_max_ms=0.2, pieces=9
        ),
    )
    back = Exchange.from_json(json.loads(json.dumps(e.to_json())))
    assert back == e and back.target == "/v1/chat/completions?a=1"
    for bad in ({"seq": 1}, {"seq": "x", "method": "GET", "path": "/", "t_start_s": 0}, [1]):
        with pytest.raises((KeyError, TypeError)):
            Exchange.from_json(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("usage", "timings", "events", "want"),
    [
        ({"prompt_tokens": 40, "completion_tokens": 8}, {"predicted_n": 7}, 5, (40, 8, "usage")),
        (None, {"prompt_n": 30, "cache_n": 10, "predicted_n": 7}, 5, (40, 7, "timings")),
        (None, None, 5, (None, 5, "events")),
        (None, None, None, (None, None, None)),  # not streamed, nothing said
        ({"completion_tokens": True}, None, 2, (None, 2, "events")),  # not a count
    ],
)
def test_token_counts(usage: dict | None, timings: dict | None, events: int | None, want: tuple) -> None:  # type: ignore[type-arg]
    assert token_counts(usage, timings, events) == want


def ex(
    seq: int,
    t: float,
    end: float | None,
    path: str = "/v1/chat/completions",
    method: str = "POST",
    body: object = None,
    tokens: int | None = 8,
) -> Exchange:
    return Exchange(
        seq=seq,
        method=method,
        path=path,
        t_start_s=t,
        t_end_s=end,
        completion_tokens=tokens,
        tokens_from="usage" if seq != 2 else "events",
        body={"messages": [], "max_tokens": 8, "model": "m"} if body is None else body,
        proxy=ProxyDelays(forward_ms=0.2, first_byte_ms=0.1, piece_p50_ms=0.05),
    )


@pytest.mark.parametrize(
    ("spans", "most"),
    [
        ([], 0),
        ([(0, 1)], 1),
        ([(0, 1), (1, 2)], 1),
        ([(0, 2), (1, 3), (1.5, 1.6)], 3),
        ([(0, None), (0, 1)], 1),
    ],
)
def test_concurrency_counts_what_was_in_flight(spans: list[tuple[float, float | None]], most: int) -> None:
    assert concurrency(ex(i, a, b) for i, (a, b) in enumerate(spans)) == most


def test_summary() -> None:
    s = summarize(
        [ex(0, 0, 1), ex(1, 0.5, 2), ex(2, 3, 3.1, path="/v1/models", method="GET", tokens=None)],
        piece_ms=[0.1, 0.2, 0.3],
    )
    assert s["requests"] == 3 and s["concurrency"] == 2 and s["completion_tokens"] == 16 and s["duration_s"] == 3.1
    assert s["paths"] == {"POST /v1/chat/completions": 2, "GET /v1/models": 1}
    assert s["proxy_ms"]["piece"]["n"] == 3 and s["proxy_ms"]["forward"]["p50"] == 0.2
    assert "added by the proxy" in summary_lines(s)[1]
    empty = summarize([])
    assert empty["requests"] == 0 and empty["proxy_ms"]["first_byte"]["p50"] is None
    assert summary_lines(empty)


@pytest.mark.parametrize(("text", "want"), [("1x", 1.0), ("2x", 2.0), ("0.5x", 0.5), (" MAX ", None), ("10.x", 10.0)])
def test_speed(text: str, want: float | None) -> None:
    assert parse_speed(text) == want


@pytest.mark.parametrize("text", ["0x", "x", "1", "fast", "-1x", "1xx", ""])
def test_bad_speed(text: str) -> None:
    with pytest.raises(InputError, match="--speed"):
        parse_speed(text)


def test_what_a_replay_sends_and_when() -> None:
    session = [
        ex(2, 5.0, 6.0, path="/v1/completions", body={"prompt": "p", "n_predict": 4}),
        ex(0, 2.0, 4.0),
        ex(1, 2.5, 3.0, path="/v1/models", method="GET"),
        ex(3, 5.5, 7.0, path="/v1/chat/completions", body="not json"),
        ex(4, 6.0, 6.5, path="/health", method="POST"),
    ]
    reqs, skipped = replay_requests(session)
    assert [r.seq for r in reqs] == [0, 2] and skipped == 3
    assert [r.offset_s for r in reqs] == [0.0, 3.0] and [r.max_tokens for r in reqs] == [8, 4]
    assert [r.target for r in reqs] == ["/v1/chat/completions", "/v1/completions"]
    assert due_offsets(reqs, 1.0) == (0.0, 3.0) and due_offsets(reqs, 2.0) == (0.0, 1.5)
    assert due_offsets(reqs, None) is None
    assert replay_concurrency(session) == 1 and replay_concurrency([]) == 1
    body = json.loads(replay_body(reqs[0], None))
    assert body == {
        "messages": [],
        "max_tokens": 8,
        "model": "m",
        "stream": True,
        "timings_per_token": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    assert json.loads(replay_body(reqs[0], "other"))["model"] == "other"
    assert [r.recorded_completion_tokens for r in reqs] == [8, None]  # events are not a server's count
    assert token_differences(reqs, [8, 5]) == [] and token_differences(reqs, [7, None]) == [0]


@pytest.mark.parametrize(
    ("recorded", "served", "override", "want"),
    [
        ("m", ["m", "n"], None, None),  # served: kept
        ("m", ["x"], None, "x"),  # not served: the target's own
        ("m", [], None, None),  # the target says nothing: kept
        (None, ["x"], None, None),  # none recorded: the server's default
        ("m", ["m"], "y", "y"),  # --model wins
    ],
)
def test_which_model_a_replay_names(
    recorded: str | None, served: list[str], override: str | None, want: str | None
) -> None:
    assert choose_model(recorded, served, override) == want
