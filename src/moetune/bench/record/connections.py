"""The two ends of the recording proxy: requests read from a client (:func:`read_request`), and
connections to the upstream (:func:`open_upstream`) whose bytes carry their arrival time: the
kernel's receive time over plain TCP, read by the serving client's own
:class:`~moetune.bench.http.clock.SockReader`, or the event loop's over TLS."""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from moetune.bench.http.clock import ProtocolReader, SockReader, open_timestamped
from moetune.bench.record.framing import Head, content_length, parse_head, render_head, request_line
from moetune.errors import InputError

HEAD_LIMIT = 1 << 20  # a request or response head longer than this is refused


@dataclass(frozen=True, slots=True)
class Upstream:
    scheme: str
    host: str
    port: int
    prefix: str  # a path the upstream URL has, put before every request's

    @classmethod
    def parse(cls, url: str) -> Upstream:
        u = urlsplit(url)
        try:
            port = u.port
        except ValueError:
            port = -1
        if u.scheme not in ("http", "https") or not u.hostname or port == -1 or u.query or u.fragment:
            raise InputError(
                f"--upstream {url!r} is not an http(s) URL of a server",
                hint="give the server's base URL, e.g. --upstream http://127.0.0.1:8080",
            )
        return cls(u.scheme, u.hostname, port or (443 if u.scheme == "https" else 80), u.path.rstrip("/"))

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True, kw_only=True)
class Request:
    method: str
    target: str  # path and query, as the client sent them
    head: Head
    body: bytes
    t_head: float  # its head was in (time.monotonic())
    t_in: float  # all of it was in
    t_unix: float

    @property
    def keep_alive(self) -> bool:
        return self.head.keep_alive

    def upstream_bytes(self, up: Upstream) -> bytes:
        headers = self.head.forwarded(drop=frozenset({"host", "content-length", "expect"}))
        headers.insert(0, ("Host", up.host_header))
        if self.body or self.method in ("POST", "PUT", "PATCH"):
            headers.append(("Content-Length", str(len(self.body))))
        return render_head(f"{self.method} {up.prefix}{self.target} HTTP/1.1", headers) + self.body


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Request | None:
    """The next request on a client connection; None when the client closed it between requests."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial.strip():
            raise BadRequest(400, "the connection closed in the middle of a request head") from None
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest(431, "request head too large") from None
    t_head, t_unix = time.monotonic(), time.time()
    try:
        head = parse_head(raw.lstrip(b"\r\n")[:-4])
        method, target = request_line(head)
        length = content_length(head)
    except ValueError as e:
        raise BadRequest(400, str(e)) from None
    if "100-continue" in head.tokens("expect"):
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in head.tokens("transfer-encoding"):
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(length) if length else b""
    return Request(
        method=method, target=target, head=head, body=body, t_head=t_head, t_in=time.monotonic(), t_unix=t_unix
    )


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadRequest(400, f"bad chunk-size line {line[:40]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise BadRequest(400, "a chunk is not followed by CRLF")


class Receiver(Protocol):
    """What takes an upstream connection's bytes: the answer in flight on it."""

    def on_bytes(self, data: bytes, t: float) -> None: ...

    def on_lost(self) -> None: ...


class UpstreamConn:
    """A connection to the upstream; the bytes it reads go to the exchange in flight on it."""

    def __init__(self) -> None:
        self.io: SockReader | ProtocolReader | None = None
        self.relay: Receiver | None = None
        self.lost = False
        self.answered = 0  # answers completed on it

    def feed(self, data: bytes, t: float, t_min: float | None = None) -> None:
        if self.relay is not None:
            self.relay.on_bytes(data, t)

    def on_lost(self, exc: BaseException | None) -> None:
        self.lost = True
        if self.relay is not None:
            self.relay.on_lost()

    @property
    def usable(self) -> bool:
        return not self.lost and self.io is not None and not self.io.closing and not self.io.peer_closed()

    def close(self) -> None:
        if self.io is not None:
            self.io.close()
        self.lost = True


async def open_upstream(up: Upstream, addrs: dict[tuple[str, int], tuple[Any, ...]]) -> UpstreamConn:
    """A connection whose reads carry the kernel's receive time (plain TCP) or the loop's (TLS);
    ``addrs`` keeps the upstream's address once resolved (a resolver call runs on a thread)."""
    c = UpstreamConn()
    ctx = ssl.create_default_context() if up.scheme == "https" else None
    c.io = await open_timestamped(c, up.host, up.port, ssl_ctx=ctx, addrs=addrs)
    return c
