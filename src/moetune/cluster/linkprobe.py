"""moetune's built-in TCP link test: a self-contained script (standard library only, Python 3.8+).

It is sent to each node on stdin (``ssh NODE python3 - serve ...``) so that nothing needs to be
installed there. One end serves, the other measures and prints one JSON document of raw numbers:

    python3 - serve   --bind ADDR --port PORT [--idle S]
    python3 - measure --host ADDR --port PORT [--duration S] [--streams 1,8] [--pings N]

Each connection starts with a line naming its job: ``SINK`` (read until the sender closes, then
answer with the byte count received), ``ECHO`` (send every message back: round trips),
``STOP`` (the server exits). Throughput counts what the receiver got, from a common start until
the last receiver's answer arrived.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import struct
import sys
import threading
import time

CHUNK = 1 << 20
IDLE_S = 60.0


def _readline(conn: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n") and len(buf) < 64:
        b = conn.recv(1)
        if not b:
            break
        buf += b
    return buf.strip()


def _handle(conn: socket.socket, stop: threading.Event) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        job = _readline(conn)
        if job == b"SINK":
            n = 0
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    break
                n += len(data)
            conn.sendall(struct.pack("!Q", n))
        elif job == b"ECHO":
            while True:
                data = conn.recv(65536)
                if not data:
                    break
                conn.sendall(data)
        elif job == b"STOP":
            stop.set()


def serve(bind: str, port: int, idle_s: float) -> int:
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((bind, port))
    srv.listen(64)
    srv.settimeout(0.2)
    print(json.dumps({"listening": f"{bind}:{port}"}), flush=True)
    stop = threading.Event()
    last = time.monotonic()
    while not stop.is_set() and time.monotonic() - last < idle_s:
        try:
            conn, _ = srv.accept()
        except socket.timeout:  # noqa: UP041 (an alias of TimeoutError only from Python 3.10)
            continue
        conn.settimeout(None)
        last = time.monotonic()
        threading.Thread(target=_handle, args=(conn, stop), daemon=True).start()
    srv.close()
    return 0


def _connect(host: str, port: int, job: bytes) -> socket.socket:
    s = socket.create_connection((host, port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(job + b"\n")
    return s


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            raise ConnectionError("the other end closed the connection")
        buf += b
    return buf


def round_trips(host: str, port: int, pings: int, size: int) -> list[float]:
    """Seconds per round trip of a ``size``-byte message, after a few warm-up ones."""
    msg = b"x" * size
    out = []
    with _connect(host, port, b"ECHO") as s:
        for i in range(pings + 5):
            t0 = time.perf_counter()
            s.sendall(msg)
            _recv_exact(s, size)
            if i >= 5:
                out.append(time.perf_counter() - t0)
    return out


def throughput(host: str, port: int, streams: int, duration_s: float) -> dict[str, object]:
    """``streams`` connections sending for ``duration_s``; bytes the receiver counted, and seconds
    from the common start to the last receiver's answer."""
    socks = [_connect(host, port, b"SINK") for _ in range(streams)]
    start = threading.Barrier(streams + 1)
    got = [0] * streams
    errors: list[str] = []
    buf = b"\0" * CHUNK
    t0 = [0.0]

    def send(i: int) -> None:
        s = socks[i]
        try:
            start.wait()
            while time.perf_counter() - t0[0] < duration_s:
                s.sendall(buf)
            s.shutdown(socket.SHUT_WR)
            got[i] = struct.unpack("!Q", _recv_exact(s, 8))[0]
        except OSError as e:
            errors.append(str(e))
        finally:
            s.close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    t0[0] = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0[0]
    if errors:
        raise ConnectionError("; ".join(errors))
    return {"streams": streams, "bytes": sum(got), "seconds": seconds, "per_stream_bytes": got}


def measure(host: str, port: int, *, duration_s: float, streams: list[int], pings: int, size: int, stop: bool) -> int:
    doc: dict[str, object] = {"host": host, "port": port, "python": sys.version.split()[0]}
    try:
        doc["rtt_s"] = round_trips(host, port, pings, size)
        doc["msg_bytes"] = size
        doc["throughput"] = [throughput(host, port, n, duration_s) for n in streams]
    except OSError as e:
        doc["error"] = f"{type(e).__name__}: {e}"
    finally:
        if stop:
            with contextlib.suppress(OSError):
                _connect(host, port, b"STOP").close()
    print(json.dumps(doc), flush=True)
    return 1 if "error" in doc else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="linkprobe")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--idle", type=float, default=IDLE_S)
    m = sub.add_parser("measure")
    m.add_argument("--host", required=True)
    m.add_argument("--port", type=int, required=True)
    m.add_argument("--duration", type=float, default=3.0)
    m.add_argument("--streams", default="1,8")
    m.add_argument("--pings", type=int, default=200)
    m.add_argument("--size", type=int, default=1)
    m.add_argument("--no-stop", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "serve":
        return serve(a.bind, a.port, a.idle)
    return measure(
        a.host,
        a.port,
        duration_s=a.duration,
        streams=[int(x) for x in a.streams.split(",") if x],
        pings=a.pings,
        size=a.size,
        stop=not a.no_stop,
    )


if __name__ == "__main__":
    sys.exit(main())
