"""A stopped server's connections lingering on its port (FIN_WAIT2 until the client closes): the
next launch on that port waits for them instead of failing 'already in use'."""

from __future__ import annotations

import socket
import struct
import threading
import time

from moetune.run.health import port_free, tcp_states
from moetune.run.prepare import _lingering_frees


def _server_closed_first() -> tuple[int, socket.socket]:
    """A listener bound without SO_REUSEADDR (as ik_llama.cpp's server binds), one accepted
    connection, and the server side closed first: its socket lingers while the client's stays open."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()
    srv.close()
    return port, client


def test_the_port_comes_free_when_the_lingering_connection_ends() -> None:
    port, client = _server_closed_first()
    assert not port_free("127.0.0.1", port)  # what failed every ik launch after a tune's first
    assert tcp_states(port) and "0A" not in tcp_states(port)
    # the client resets its end (no TIME_WAIT after it, which on Linux holds a port bound without
    # SO_REUSEADDR for 60 s: what a real stopped server leaves, and what the wait covers)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    threading.Timer(1.0, client.close).start()
    t0 = time.monotonic()
    assert _lingering_frees("127.0.0.1", port, wait_s=20)
    assert 0.5 < time.monotonic() - t0 < 15


def test_a_listener_is_not_waited_for() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    try:
        t0 = time.monotonic()
        assert not _lingering_frees("127.0.0.1", srv.getsockname()[1], wait_s=20)
        assert time.monotonic() - t0 < 1
    finally:
        srv.close()


def test_a_connection_that_never_ends_gives_up_at_the_deadline() -> None:
    port, client = _server_closed_first()
    try:
        t0 = time.monotonic()
        assert not _lingering_frees("127.0.0.1", port, wait_s=1.0)
        assert time.monotonic() - t0 < 3
    finally:
        client.close()
