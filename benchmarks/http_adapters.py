"""aiohttp and httpx behind the serving benchmark's client interface, beside moetune's own
(:mod:`moetune.bench.http.client`, "asyncio").

They exist only so `make bench` (benchmarks/bench_serve_client.py) can measure their timing error
against the mock server with the same harness as moetune's own client, which serve-bench uses: it
measured best by far (benchmarks/results/serve_client.md), since it takes the kernel's receive time
of each event where the libraries can only read the clock when their coroutine resumes. They need
the optional ``clients`` extra (``pip install 'moetune[clients]'``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import aiohttp
import httpx

from moetune.bench.http.client import Arrival, RawClient, StreamingHttp, StreamReply, retry_stale

DEFAULT_LIBRARY = "asyncio"
LIBRARIES = ("asyncio", "aiohttp", "httpx")
_JSON = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}


async def _stamped(pieces: AsyncIterator[bytes]) -> AsyncIterator[Arrival]:
    """The library hands bytes to the coroutine; the time is taken when the coroutine resumes."""
    async for p in pieces:
        t = time.monotonic()
        yield t, t, p


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode(errors="replace")


class AiohttpClient:
    library = "aiohttp"

    def __init__(self, base_url: str, timeout_s: float) -> None:
        # no connection limit: the load generator bounds concurrency itself
        self._s = aiohttp.ClientSession(
            base_url.rstrip("/"),
            connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True),
            timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 30)),
            auto_decompress=False,
        )

    async def _json(self, method: str, path: str, data: bytes | None) -> tuple[int, Any]:
        async with self._s.request(method, path, data=data, headers=_JSON) as r:
            return r.status, _decode(await r.read())

    async def get_json(self, path: str) -> tuple[int, Any]:
        return await retry_stale(self, lambda: self._json("GET", path, None))

    async def post_json(self, path: str, doc: Any) -> tuple[int, Any]:
        return await retry_stale(self, lambda: self._json("POST", path, json.dumps(doc).encode()))

    @asynccontextmanager
    async def _stream(self, path: str, body: bytes) -> AsyncIterator[StreamReply]:
        async with self._s.post(path, data=body, headers=_JSON) as r:
            yield StreamReply(r.status, None, _stamped(r.content.iter_any()))

    def post_stream(self, path: str, body: bytes) -> AbstractAsyncContextManager[StreamReply]:
        return self._stream(path, body)

    def classify(self, exc: BaseException) -> str:
        if isinstance(exc, aiohttp.ServerDisconnectedError):
            return "disconnected"
        if isinstance(exc, aiohttp.ClientConnectorError):
            return "connect_error"
        if isinstance(exc, aiohttp.ClientPayloadError):
            return "truncated"
        if isinstance(exc, asyncio.TimeoutError | TimeoutError):
            return "timeout"
        if isinstance(exc, ConnectionResetError | BrokenPipeError | aiohttp.ClientOSError):
            return "connection_reset"
        if isinstance(exc, aiohttp.ClientError):
            return "client_error"
        return "client_exception"

    async def aclose(self) -> None:
        await self._s.close()


class HttpxClient:
    library = "httpx"

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self._c = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 30)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def _json(self, method: str, path: str, data: bytes | None) -> tuple[int, Any]:
        r = await self._c.request(method, path, content=data, headers=_JSON)
        return r.status_code, _decode(r.content)

    async def get_json(self, path: str) -> tuple[int, Any]:
        return await retry_stale(self, lambda: self._json("GET", path, None))

    async def post_json(self, path: str, doc: Any) -> tuple[int, Any]:
        return await retry_stale(self, lambda: self._json("POST", path, json.dumps(doc).encode()))

    @asynccontextmanager
    async def _stream(self, path: str, body: bytes) -> AsyncIterator[StreamReply]:
        async with self._c.stream("POST", path, content=body, headers=_JSON) as r:
            yield StreamReply(r.status_code, None, _stamped(r.aiter_raw()))

    def post_stream(self, path: str, body: bytes) -> AbstractAsyncContextManager[StreamReply]:
        return self._stream(path, body)

    def classify(self, exc: BaseException) -> str:
        if isinstance(exc, httpx.RemoteProtocolError):
            return "disconnected"
        if isinstance(exc, httpx.ConnectError):
            return "connect_error"
        if isinstance(exc, httpx.TimeoutException | asyncio.TimeoutError | TimeoutError):
            return "timeout"
        if isinstance(exc, httpx.ReadError | httpx.WriteError | ConnectionResetError | BrokenPipeError):
            return "connection_reset"
        if isinstance(exc, httpx.HTTPError):
            return "client_error"
        return "client_exception"

    async def aclose(self) -> None:
        await self._c.aclose()


def make_client(base_url: str, *, timeout_s: float = 600, library: str = DEFAULT_LIBRARY) -> StreamingHttp:
    """A client for ``base_url``; create it inside the running event loop."""
    if library == "aiohttp":
        return AiohttpClient(base_url, timeout_s)
    if library == "httpx":
        return HttpxClient(base_url, timeout_s)
    if library == "asyncio":
        return RawClient(base_url, timeout_s)
    raise ValueError(f"unknown HTTP library {library!r} (known: {', '.join(LIBRARIES)})")
