"""A small HTTP/1.1 client that stamps each piece of a response body with the time its bytes
reached the machine.

Why it exists: a server that decodes a batch emits one token for every slot at the same moment,
so a benchmark client receives bursts of events, and a client on the same host as a CPU-bound
server is often not running when they arrive. aiohttp and httpx hand bytes to the waiting
coroutine a loop iteration later, so a timestamp taken there is late by whatever the client did
meanwhile (about 1 ms for 64 streams on the 2-core test machine, tens of ms when it is
descheduled; see benchmarks/results/serve_client.md). Here the time comes from, in order of
preference:

1. the kernel's receive timestamp of the bytes (``SO_TIMESTAMPNS``, Linux, plain HTTP): it does
   not depend on when this process runs. When several writes queue up before a read, the kernel
   gives the latest one's time, so the earlier ones can only be stamped late, never early;
2. the moment the event loop's ``select()`` returned in the iteration that read the bytes
   (:mod:`moetune.bench.http.clock`): bytes read then were in the kernel by then. Each piece
   also carries the earliest time it may have arrived, for pieces that queued up;
3. ``time.monotonic()`` in the read callback.

It speaks what llama-server and OpenAI-compatible servers send: a status line, headers, and a body
framed by ``Content-Length``, chunked encoding or the end of the connection; it keeps connections
alive and reuses them; it reports a connection that closes before the answer as
:class:`Disconnected`, and one that closes in the middle of a body as :class:`Truncated`.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from moetune.bench.http.clock import ProtocolReader, SockReader, open_timestamped
from moetune.engine import auth

T = TypeVar("T")
RETRYABLE = frozenset({"disconnected", "connection_reset"})
_DIGITS = re.compile(r"[0-9]{1,18}")
_HEX = re.compile(rb"[0-9a-fA-F]{1,15}")

# a piece of a body: (arrival time, earliest time it may have arrived, bytes); the two times
# differ when the client read late and several writes came out of one read
Arrival = tuple[float, float, bytes]


@dataclass(frozen=True, slots=True)
class StreamReply:
    """A response as it streams in: its status, when the request was handed to the kernel (None
    when the library does not say), and the body's pieces as :data:`Arrival` tuples."""

    status: int
    t_sent: float | None
    pieces: AsyncIterator[Arrival]


class Disconnected(ConnectionError):
    """The server closed the connection before answering."""


class Truncated(ConnectionError):
    """The server closed the connection in the middle of a response body."""


class StreamingHttp(Protocol):
    library: str

    async def get_json(self, path: str) -> tuple[int, Any]: ...

    async def post_json(self, path: str, doc: Any) -> tuple[int, Any]: ...

    def post_stream(self, path: str, body: bytes) -> AbstractAsyncContextManager[StreamReply]:
        """POST ``body``; yield the reply: status, send time, and the body's pieces as they
        arrive, each with its arrival time (``time.monotonic()``)."""
        ...

    def classify(self, exc: BaseException) -> str:
        """A short kind for a transport failure."""
        ...

    async def aclose(self) -> None: ...


async def retry_stale(http: StreamingHttp, call: Callable[[], Awaitable[T]], attempts: int = 3) -> T:
    """``call()``, again on a new connection when the server closed a kept-alive one under it
    (for the small requests around a benchmark: /props, /tokenize, /apply-template)."""
    for i in range(attempts):
        try:
            return await call()
        except Exception as e:
            if i == attempts - 1 or http.classify(e) not in RETRYABLE:
                raise
    raise AssertionError("unreachable")


def sse_payloads(buf: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """The ``data:`` payloads of the complete events in ``buf + data``, and what is left over.
    Split at LF only: JSON leaves U+2028 and the like unescaped inside strings."""
    buf += data
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n")
    out = []
    while (i := buf.find(b"\n\n")) >= 0:
        event, buf = buf[:i], buf[i + 2 :]
        out += [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return out, buf


class _Conn:
    """One connection's response parser and state; its bytes come from an I/O driver."""

    def __init__(self) -> None:
        self.io: SockReader | ProtocolReader | None = None
        self.lost = False
        self.served = 0  # responses completed on this connection
        self.last_streamed = False  # the last one was chunked (a stream)
        self._reset()

    def _reset(self) -> None:
        self.buf = b""
        self.head_done = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunked = False
        self.remaining: int | None = None  # Content-Length left, None: until close
        self.chunk_left = -1  # bytes left in the current chunk; -1: read a size line; -2: trailers
        self.done = False
        self.error: BaseException | None = None
        self.pieces: collections.deque[Arrival] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None

    @property
    def usable(self) -> bool:
        return not self.lost and self.io is not None and not self.io.closing

    def feed(self, data: bytes, t: float, t_min: float | None = None) -> None:
        if self.done:  # the response is complete, or failed: what comes after is not part of it
            return
        self.buf += data
        try:
            self._parse(t, t if t_min is None else t_min)
        except ValueError as e:
            self.error = e
            self.done = True
        self._wake()

    def on_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        if not self.done:
            if not self.head_done:
                self.error = Disconnected(f"server closed the connection before answering ({exc or 'EOF'})")
            elif self.remaining is None and not self.chunked:
                if self.buf:
                    now = time.monotonic()
                    self.pieces.append((now, now, self.buf))
                    self.buf = b""
            else:
                self.error = Truncated(f"server closed the connection mid-body ({exc or 'EOF'})")
            self.done = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _parse(self, t: float, t_min: float) -> None:
        if not self.head_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            self.buf = self.buf[end + 4 :]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not _DIGITS.fullmatch(parts[1]):
                raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
            self.status = int(parts[1])
            for line in lines[1:]:
                k, _, v = line.partition(":")
                self.headers[k.strip().lower()] = v.strip()
            self.head_done = True
            self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
            if not self.chunked and "content-length" in self.headers:
                length = self.headers["content-length"]
                if not _DIGITS.fullmatch(length):  # RFC 9112: 1*DIGIT; a sign or a space is a broken peer
                    raise ValueError(f"bad Content-Length {length[:40]!r}")
                self.remaining = int(length)
        out: list[bytes] = []  # what this read adds to the body, kept when a later frame is broken
        try:
            if self.chunked:
                while True:
                    if self.chunk_left == -1:
                        i = self.buf.find(b"\r\n")
                        if i < 0:
                            break
                        field = self.buf[:i].split(b";", 1)[0].strip()
                        if not _HEX.fullmatch(field):  # RFC 9112: chunk-size = 1*HEXDIG
                            raise ValueError(f"bad chunk size {field[:40]!r}")
                        size = int(field, 16)
                        self.buf = self.buf[i + 2 :]
                        self.chunk_left = size if size else -2
                    elif self.chunk_left == -2:  # trailers end with an empty line
                        i = self.buf.find(b"\r\n")
                        if i < 0:
                            break
                        trailer, self.buf = self.buf[:i], self.buf[i + 2 :]
                        if not trailer:
                            self.done = True
                            break
                    else:
                        if len(self.buf) < self.chunk_left + 2:
                            if len(self.buf) > self.chunk_left:
                                break
                            out.append(self.buf)
                            self.chunk_left -= len(self.buf)
                            self.buf = b""
                            break
                        out.append(self.buf[: self.chunk_left])
                        self.buf = self.buf[self.chunk_left + 2 :]
                        self.chunk_left = -1
            elif self.remaining is not None:
                take = self.buf[: self.remaining]
                self.buf = self.buf[len(take) :]
                self.remaining -= len(take)
                out.append(take)
                self.done = self.remaining == 0
            else:
                out.append(self.buf)
                self.buf = b""
        finally:
            data = b"".join(out)
            if data:
                self.pieces.append((t, t_min, data))

    async def pieces_until_done(self) -> AsyncIterator[Arrival]:
        while True:
            while self.pieces:
                yield self.pieces.popleft()
            if self.done:
                if self.error is not None:
                    raise self.error
                return
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None


class RawClient:
    library = "asyncio"

    def __init__(self, base_url: str, timeout_s: float) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.prefix = u.path.rstrip("/")
        self.auth = auth.headers(base_url)  # a server launched with --api-key-file
        self.connect_timeout_s = min(timeout_s, 30)
        # llama-server advertises keep-alive but closes a connection after each streamed response;
        # once a connection that carried a stream dies on reuse, streams get fresh connections
        self.fresh_after_stream = False
        self.addrs: dict[tuple[str, int], tuple[Any, ...]] = {}  # resolved once
        self.idle: list[_Conn] = []
        self.all: set[_Conn] = set()

    async def _acquire(self) -> _Conn:
        while self.idle:
            c = self.idle.pop()
            if c.usable:
                return c
            if c.last_streamed:  # the server closes connections after a stream
                self.fresh_after_stream = True
            self.all.discard(c)
        c = await asyncio.wait_for(self._connect(), self.connect_timeout_s)
        self.all.add(c)
        return c

    async def _connect(self) -> _Conn:
        c = _Conn()
        c.io = await open_timestamped(c, self.host, self.port, ssl_ctx=self.ssl, addrs=self.addrs)
        return c

    def _release(self, c: _Conn, ok: bool) -> None:
        keep = ok and c.done and not c.lost and c.headers.get("connection", "").lower() != "close"
        if keep:
            c.served += 1
            c.last_streamed = c.chunked
            if c.chunked and c.io is not None and c.io.peer_closed():
                self.fresh_after_stream = True  # the server closes connections after a stream
            keep = not (c.chunked and self.fresh_after_stream)
        if keep:
            self.idle.append(c)
        else:
            if c.io is not None:
                c.io.close()
            self.all.discard(c)

    @asynccontextmanager
    async def _request(self, method: str, path: str, body: bytes | None) -> AsyncIterator[StreamReply]:
        c = await self._acquire()
        c._reset()
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Accept: text/event-stream, application/json\r\nConnection: keep-alive\r\n"
        )
        head += "".join(f"{k}: {v}\r\n" for k, v in self.auth.items())
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        assert c.io is not None
        ok = False
        try:
            try:
                await c.io.send(head.encode("latin-1") + b"\r\n" + (body or b""))
            except (BrokenPipeError, ConnectionResetError) as e:  # the server had closed it
                c.on_lost(e)
            t_sent = time.monotonic()
            while not c.head_done and not c.done:
                c.waiter = asyncio.get_running_loop().create_future()
                await c.waiter
                c.waiter = None
            if not c.head_done and c.error is not None:
                if isinstance(c.error, Disconnected) and c.served and c.last_streamed:
                    self.fresh_after_stream = True
                raise c.error
            yield StreamReply(c.status, t_sent, c.pieces_until_done())
            ok = True
        finally:
            self._release(c, ok)

    def post_stream(self, path: str, body: bytes) -> AbstractAsyncContextManager[StreamReply]:
        return self._request("POST", path, body)

    async def _json(self, method: str, path: str, doc: Any) -> tuple[int, Any]:
        body = None if doc is None else json.dumps(doc).encode()
        async with self._request(method, path, body) as reply:
            status = reply.status
            raw = b"".join([p async for _, _, p in reply.pieces])
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    async def get_json(self, path: str) -> tuple[int, Any]:
        return await self._retry(lambda: self._json("GET", path, None))

    async def post_json(self, path: str, doc: Any) -> tuple[int, Any]:
        return await self._retry(lambda: self._json("POST", path, doc))

    async def _retry(self, call: Callable[[], Awaitable[tuple[int, Any]]]) -> tuple[int, Any]:
        """Small requests are sent again when a kept-alive connection turns out closed."""
        for _ in range(2):
            try:
                return await call()
            except Disconnected:
                pass
        return await call()

    def classify(self, exc: BaseException) -> str:
        if isinstance(exc, Disconnected):
            return "disconnected"
        if isinstance(exc, Truncated):
            return "truncated"
        if isinstance(exc, asyncio.TimeoutError | TimeoutError):
            return "timeout"
        if isinstance(exc, ConnectionRefusedError):
            return "connect_error"
        if isinstance(exc, ConnectionResetError | BrokenPipeError):
            return "connection_reset"
        if isinstance(exc, OSError):
            return "os_error"
        if isinstance(exc, ValueError):
            return "bad_response"
        return "client_exception"

    async def aclose(self) -> None:
        for c in list(self.all):
            if c.io is not None:
                c.io.close()
        self.all.clear()
        self.idle.clear()


def connect(base_url: str, *, timeout_s: float = 600) -> RawClient:
    """A client for ``base_url``; create it inside the running event loop."""
    return RawClient(base_url, timeout_s)
