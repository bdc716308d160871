"""Arrival clocks for the serving client: when did these bytes reach the machine?

- :func:`kernel_time`: the kernel's receive timestamp (``SO_TIMESTAMPNS``) of bytes read with
  ``recvmsg``, moved from the wall clock to the monotonic one;
- :class:`StampingSelector`: the interval in which bytes read in this loop iteration arrived:
  before this iteration's ``select()`` returned, after the previous one did (or, when the select
  waited for them, just before it returned). :func:`run` runs a coroutine on a loop with such a
  selector, and :func:`arrival_window` gives the running loop's interval.

Several writes that queue up in a socket before the client reads them come out of one read with
one kernel time, the latest; the interval says how far back the earlier ones may go, and
:mod:`moetune.bench.analysis.serve` spreads them over it.

:class:`SockReader` reads a plain TCP socket with ``recvmsg`` and hands each piece on with both
times; :class:`ProtocolReader` does the same for an asyncio transport (TLS), without kernel times.
"""

from __future__ import annotations

import asyncio
import gc
import selectors
import socket
import struct
import sys
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
WAITED_S = 0.0002  # a select() that took longer waited for its bytes
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None)


class StampingSelector(selectors.DefaultSelector):
    """The platform's selector, remembering when ``select()`` was called and returned.

    Bytes read in a loop iteration were in the kernel when that iteration's select returned.
    They came after the previous iteration's select returned (the loop then read everything
    waiting), or, when this select waited for them, just before it returned: :meth:`window`.
    """

    last_return = 0.0
    prev_return = 0.0
    t_call = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        t_call = time.monotonic()
        ready = super().select(timeout)
        self.t_call = t_call
        self.prev_return, self.last_return = self.last_return, time.monotonic()
        return ready

    def window(self, kernel_t: float | None = None) -> tuple[float, float]:
        """(earliest, latest) arrival time of bytes read in the current iteration; ``kernel_t``,
        the kernel's time of the last of them, tells whether they arrived while select waited
        (then they woke it, just before it returned) or were already there when it was called."""
        waited = self.last_return - self.t_call > WAITED_S and (kernel_t is None or kernel_t > self.t_call)
        return (self.last_return if waited else self.prev_return), self.last_return


_STAMPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StampingSelector] = weakref.WeakKeyDictionary()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An event loop whose clients stamp arrivals with the select() return time."""
    sel = StampingSelector()
    loop = asyncio.SelectorEventLoop(sel)
    _STAMPS[loop] = sel
    return loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on :func:`new_event_loop`, with the objects that exist before it frozen out
    of the garbage collector's reach, so a full collection does not pause the loop for long."""
    gc.collect()
    gc.freeze()
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            return runner.run(main)
    finally:
        gc.unfreeze()


Window = Callable[[float | None], tuple[float, float]]


def arrival_window() -> Window:
    """For the running loop: (earliest, latest) arrival of what is being read now, given the
    kernel's time of it if known; on a loop without a :class:`StampingSelector`,
    ``time.monotonic()`` for both."""
    sel = _STAMPS.get(asyncio.get_running_loop())
    if sel is None:

        def now(kernel_t: float | None = None) -> tuple[float, float]:
            t = time.monotonic()
            return t, t

        return now
    return sel.window


def kernel_time(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The kernel's receive time (``SO_TIMESTAMPNS``, wall clock) on the monotonic clock."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, ns = struct.unpack("qq", data[:16])
            return float(sec) + float(ns) * 1e-9 - (time.time() - time.monotonic())
    return None


class Sink(Protocol):
    """Where a reader delivers bytes: with their arrival time and the earliest they may have come."""

    def feed(self, data: bytes, t: float, t_min: float | None = None) -> None: ...

    def on_lost(self, exc: BaseException | None) -> None: ...


class SockReader:
    """Plain TCP through ``add_reader`` and ``recvmsg``, for the kernel's receive timestamps."""

    def __init__(self, sock: socket.socket, conn: Sink, window: Window) -> None:
        self.sock, self.conn, self.window = sock, conn, window
        self.loop = asyncio.get_running_loop()
        self.closing = False
        self.last_t = 0.0
        self.loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        while not self.closing:
            try:
                data, anc, _, _ = self.sock.recvmsg(1 << 18, 64)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self.close()
                self.conn.on_lost(e)
                return
            if not data:
                self.close()
                self.conn.on_lost(None)
                return
            k = kernel_time(anc)
            earliest, seen = self.window(k)
            # the kernel's time (else when the loop's select returned), not after now, not before
            # this connection's last piece
            t = max(min(k, time.monotonic()) if k is not None else seen, self.last_t)
            t_min = max(min(earliest, t), self.last_t)
            self.last_t = t
            self.conn.feed(data, t, t_min)

    async def send(self, data: bytes) -> None:
        await self.loop.sock_sendall(self.sock, data)

    def peer_closed(self) -> bool:
        """Whether the server has already closed its side (its FIN is waiting to be read)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()


class ProtocolReader(asyncio.Protocol):
    """An asyncio transport (used for TLS), stamped by the arrival clock."""

    def __init__(self, conn: Sink, window: Window) -> None:
        self.conn, self.window = conn, window
        self.transport: asyncio.Transport | None = None

    @property
    def closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        earliest, latest = self.window(None)
        self.conn.feed(data, latest, earliest)

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.on_lost(exc)

    async def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def peer_closed(self) -> bool:
        return self.closing

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_timestamped(
    sink: Sink, host: str, port: int, *, ssl_ctx: Any, addrs: dict[tuple[str, int], tuple[Any, ...]]
) -> SockReader | ProtocolReader:
    """A connection to ``host:port`` whose reads go to ``sink`` with their arrival times: the
    kernel's receive timestamps on plain TCP (``SO_TIMESTAMPNS``, read by :class:`SockReader`), the
    loop's with TLS (``ssl_ctx``) or where the kernel has none. ``addrs`` keeps each address once
    resolved: a resolver call runs on a thread, and a sweep opens hundreds of connections at once."""
    loop = asyncio.get_running_loop()
    window = arrival_window()
    if ssl_ctx is not None or SO_TIMESTAMPNS is None:
        _, reader = await loop.create_connection(lambda: ProtocolReader(sink, window), host, port, ssl=ssl_ctx)
        return reader
    if (host, port) not in addrs:
        addrs[host, port] = (await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))[0]
    family, kind, proto, _, addr = addrs[host, port]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        await loop.sock_connect(sock, addr)
    except BaseException:
        sock.close()
        raise
    return SockReader(sock, sink, window)
