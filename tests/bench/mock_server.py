"""A mock OpenAI-compatible streaming server with a known token schedule.

It speaks enough of llama-server's dialect for `moetune serve-bench` (``/health``, ``/props``,
``/slots``, ``/apply-template``, ``/tokenize``, streaming ``/v1/chat/completions`` with
``timings_per_token`` and ``include_usage``) and writes each token at a time fixed in advance:

- the i-th request it receives gets its first token ``ttft_ms[i % len(ttft_ms)]`` after its body
  arrived, and token k+1 follows token k by ``itl_ms[k % len(itl_ms)]``; deadlines are absolute,
  so a late write does not delay the ones after it;
- chunk j carries ``tokens_per_chunk[j % len]`` tokens and is written when its last token is due.

It records when it wrote each chunk (``time.monotonic()``, the clock every process on the host
shares), served at ``/mock/log``, so a client's timestamps can be checked event by event; a long
run takes the finished requests' times from ``/mock/log/drain`` instead, which forgets what it
hands over, so the mock's memory stays bounded. It can
also misbehave the way real servers do: close keep-alive connections idle for ``idle_close_s``,
drop every k-th request that arrives on a reused connection without answering (the race in which
a server closes an idle connection just as the client sends on it), and answer HTTP 400 for a
prompt longer than ``max_prompt_tokens``, as llama-server does when a prompt exceeds a slot's
context.

The event loop uses ``select()``, whose timeout has microsecond resolution, not epoll's
millisecond one: with epoll every write would be up to 1 ms late.

Run it as ``python -m tests.bench.mock_server --config JSON``; it prints its URL on the first
line of stdout. :func:`mock_server` starts it in a subprocess for tests and benches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

BOS = 1


@dataclass(frozen=True, slots=True)
class MockConfig:
    ttft_ms: tuple[float, ...] = (50.0,)
    itl_ms: tuple[float, ...] = (20.0,)
    tokens_per_chunk: tuple[int, ...] = (1,)
    reasoning_tokens: int = 0  # the first N tokens are reasoning_content, the rest content
    slots: int = 4096  # reported by /props
    n_ctx: int = 1 << 20  # per-slot context reported by /props
    max_prompt_tokens: int | None = None  # longer prompts get HTTP 400 (exceed_context_size_error)
    idle_close_s: float | None = None  # close a kept-alive connection idle this long
    drop_reused_every: int = 0  # close without answering every k-th request on a reused connection
    record: bool = True  # keep the write times for /mock/log

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MockConfig:
        d = json.loads(text)
        for k in ("ttft_ms", "itl_ms", "tokens_per_chunk"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)

    def token_times(self, request_no: int, n_tokens: int) -> list[float]:
        """Offsets (s) from the request's arrival at which each token is due."""
        t = self.ttft_ms[request_no % len(self.ttft_ms)] / 1000
        out = []
        for k in range(n_tokens):
            if k:
                t += self.itl_ms[(k - 1) % len(self.itl_ms)] / 1000
            out.append(t)
        return out


@dataclass(slots=True)
class MockState:
    requests: int = 0  # completions received
    completed: int = 0  # completions answered to the end ([DONE] written)
    dropped: int = 0
    idle_closed: int = 0
    rejected: int = 0
    reused_seen: int = 0
    log: dict[str, dict[str, Any]] = field(default_factory=dict)  # completion id -> times


def template(messages: list[dict[str, Any]]) -> str:
    return "".join(f"<|{m.get('role', 'user')}|>\n{m.get('content', '')}\n" for m in messages) + "<|assistant|>\n"


def tokenize(text: str, add_special: bool) -> list[int]:
    """One token per UTF-8 byte (ids 3..258), like moetune's byte-vocabulary test models."""
    return ([BOS] if add_special else []) + [3 + b for b in text.encode()]


def _http(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        "Connection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class StampingSelectSelector(selectors.SelectSelector):
    """select() (microsecond timeouts), remembering when it last returned: the arrival time of
    whatever the loop reads in that iteration."""

    last_return = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        self.last_return = time.monotonic()
        return ready


class MockConn(asyncio.Protocol):
    """One client connection: requests are read as they arrive, answered one at a time."""

    def __init__(self, server: MockServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False
        self.closed = False
        self.served = 0
        self.idle_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next(self.server.clock())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _next(self, t_recv: float) -> None:
        if self.busy or self.closed:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = self.buf[:end].decode("latin-1").split("\r\n")
        length = 0
        for h in lines[1:]:
            name, _, value = h.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        method, path = [*lines[0].split(" "), "", ""][:2]
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        st, cfg = self.server.state, self.server.cfg
        if self.served and cfg.drop_reused_every:
            st.reused_seen += 1
            if st.reused_seen % cfg.drop_reused_every == 0:  # close without answering, with a RST
                st.dropped += 1
                assert self.transport is not None
                sock = self.transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.transport.close()
                return
        self.busy = True
        asyncio.get_running_loop().create_task(self._serve(method, path.split("?", 1)[0], body, t_recv))

    async def _serve(self, method: str, path: str, body: bytes, t_recv: float) -> None:
        try:
            await self.server.route(method, path, body, t_recv, self)
        except (ValueError, KeyError) as e:
            self.write(_http(400, json.dumps({"error": {"code": 400, "message": str(e)}}).encode()))
        self.busy = False
        self.served += 1
        idle = self.server.cfg.idle_close_s
        if idle is not None and not self.closed:
            self.idle_timer = asyncio.get_running_loop().call_later(idle, self._idle_close)
        if self.buf:
            self._next(self.server.clock())

    def _idle_close(self) -> None:
        if not self.busy and not self.closed and self.transport is not None:
            self.server.state.idle_closed += 1
            self.transport.close()


class MockServer:
    def __init__(self, cfg: MockConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.state = MockState()

    async def route(self, method: str, path: str, body: bytes, t_recv: float, w: MockConn) -> None:
        cfg = self.cfg
        doc: Any = None
        if method == "GET" and path == "/health":
            doc = {"status": "ok"}
        elif method == "GET" and path == "/props":
            doc = {
                "total_slots": cfg.slots,
                "default_generation_settings": {"n_ctx": cfg.n_ctx, "params": {}},
                "build_info": "mock",
                "model_path": "",
                "model_alias": "mock",
            }
        elif method == "GET" and path == "/slots":
            doc = [{"id": i, "n_ctx": cfg.n_ctx, "is_processing": False} for i in range(min(cfg.slots, 64))]
        elif method == "GET" and path == "/mock/stats":
            s = self.state
            doc = {
                "requests": s.requests,
                "completed": s.completed,
                "dropped": s.dropped,
                "idle_closed": s.idle_closed,
                "rejected": s.rejected,
                "pid": os.getpid(),
            }
        elif method == "GET" and path == "/mock/log":
            doc = self.state.log
        elif method == "GET" and path == "/mock/log/drain":  # finished requests: receipt and writes, then forgotten
            log = self.state.log
            done = [cid for cid, e in log.items() if e.get("done")]
            doc = {cid: {"recv": log[cid]["recv"], "writes": log.pop(cid)["writes"]} for cid in done}
        elif method == "POST" and path == "/apply-template":
            doc = {"prompt": template(json.loads(body)["messages"])}
        elif method == "POST" and path == "/tokenize":
            req = json.loads(body)
            doc = {"tokens": tokenize(req["content"], bool(req.get("add_special", False)))}
        elif method == "POST" and path == "/v1/chat/completions":
            await self.complete(json.loads(body), t_recv, w)
            return
        if doc is None:
            w.write(_http(404, b'{"error":{"code":404,"message":"not found","type":"not_found_error"}}'))
        else:
            w.write(_http(200, json.dumps(doc).encode()))

    async def complete(self, req: dict[str, Any], t_recv: float, w: MockConn) -> None:
        cfg, st = self.cfg, self.state
        request_no = st.requests
        st.requests += 1
        n_prompt = len(tokenize(template(req.get("messages", [])), True))
        if cfg.max_prompt_tokens is not None and n_prompt > cfg.max_prompt_tokens:
            st.rejected += 1
            err = {
                "error": {
                    "code": 400,
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": n_prompt,
                    "n_ctx": cfg.max_prompt_tokens,
                    "message": f"request ({n_prompt} tokens) exceeds the available context size "
                    f"({cfg.max_prompt_tokens} tokens), try increasing it",
                }
            }
            w.write(_http(400, json.dumps(err).encode()))
            return
        n_out = int(req.get("max_tokens") or 16)
        cid = f"mock-{request_no}"
        due = [t_recv + d for d in cfg.token_times(request_no, n_out)]
        writes: list[float] = []
        if cfg.record:
            st.log[cid] = {"recv": t_recv, "due": due, "writes": writes}
        loop = asyncio.get_running_loop()
        sent = 0
        j = 0
        t_first: float | None = None
        timings = bool(req.get("timings_per_token"))
        while sent < n_out and not w.closed:
            n = min(cfg.tokens_per_chunk[j % len(cfg.tokens_per_chunk)], n_out - sent)
            j += 1
            delay = due[sent + n - 1] - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            n_reason = max(0, min(n, cfg.reasoning_tokens - sent))
            delta: dict[str, Any] = {}
            if n_reason:
                delta["reasoning_content"] = "r" * n_reason
            if n - n_reason:
                delta["content"] = "a" * (n - n_reason)
            sent += n
            ev: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
            now = time.monotonic()
            if t_first is None:
                t_first = now
            if timings:  # like llama-server: the time since the first token, by the server's clock
                ev["timings"] = {
                    "prompt_n": n_prompt,
                    "cache_n": 0,
                    "predicted_n": sent,
                    "predicted_ms": round((now - t_first) * 1000, 3),
                }
            data = _sse(ev)
            if sent == n:  # first write: headers, the role chunk and the first token together
                role = {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}],
                }
                data = (
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                    b"Connection: keep-alive\r\n\r\n"
                ) + _chunked(_sse(role) + data)
            else:
                data = _chunked(data)
            writes.append(time.monotonic())
            w.write(data)
        tail = _sse(
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
            }
        )
        if (req.get("stream_options") or {}).get("include_usage"):
            tail += _sse(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "choices": [],
                    "usage": {
                        "prompt_tokens": n_prompt,
                        "completion_tokens": n_out,
                        "total_tokens": n_prompt + n_out,
                        "prompt_tokens_details": {"cached_tokens": 0},
                    },
                    "timings": {"prompt_n": n_prompt, "cache_n": 0, "predicted_n": n_out},
                }
            )
        tail += b"data: [DONE]\n\n"
        w.write(_chunked(tail) + b"0\r\n\r\n")
        st.completed += 0 if w.closed else 1
        if cfg.record:
            st.log[cid]["done"] = True


async def serve(cfg: MockConfig, host: str, port: int, clock: Callable[[], float] = time.monotonic) -> None:
    server = MockServer(cfg, clock)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: MockConn(server), host, port, backlog=1024)
    bound = srv.sockets[0].getsockname()
    print(f"http://{bound[0]}:{bound[1]}", flush=True)
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--config", default="{}", help="MockConfig as JSON")
    a = ap.parse_args(argv)
    sel = StampingSelectSelector()
    loop = asyncio.SelectorEventLoop(sel)
    try:
        loop.run_until_complete(serve(MockConfig.from_json(a.config), a.host, a.port, lambda: sel.last_return))
    except KeyboardInterrupt:
        pass
    finally:
        loop.close()


@contextlib.contextmanager
def mock_server(cfg: MockConfig | None = None, *, timeout_s: float = 20) -> Iterator[str]:
    """Start the mock in a subprocess (its own interpreter, so it does not share the client's
    GIL); yield its URL; stop it on exit."""
    from tests.bench.mock_process import mock_process  # not at the top: this file also runs as a script

    with mock_process(
        __file__, (cfg or MockConfig()).to_json(), url_prefix="http://", what="mock server", timeout_s=timeout_s
    ) as url:
        yield url


if __name__ == "__main__":
    main()
