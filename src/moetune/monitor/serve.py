"""`moetune metrics serve`: the snapshots of the machine as a Prometheus endpoint (``GET /metrics``).

What it exports comes from a *source*, a callable that returns the labelled snapshots to show
each time Prometheus scrapes (:data:`Source`). :class:`DbSource` reads the results history: the
newest snapshot of every run still ``running``, as the benchmark's sampler stores them. Sources
compose: ``combine(DbSource(path), live)`` exports both, and a series both would write is written
once, the first source's (:func:`moetune.monitor.exposition.render`).

The endpoint has no authentication: it binds loopback unless told otherwise.
"""

from __future__ import annotations

import errno
import ipaddress
import signal
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

from moetune.errors import InputError, MoetuneError, RuntimeFailure
from moetune.monitor.exposition import CONTENT_TYPE, LabelledSnapshot, render
from moetune.monitor.snapshot import Snapshot

DEFAULT_LISTEN = "127.0.0.1:9101"
MAX_AGE_S = 10.0  # a newer snapshot of a running run shows its writer is alive

# The labelled snapshots to export, asked for at each scrape (from the scrape's own thread).
Source = Callable[[], Iterable[LabelledSnapshot]]


def combine(*sources: Source) -> Source:
    """One source from several, in order (the first wins a series two of them write)."""

    def source() -> list[LabelledSnapshot]:
        return [item for s in sources for item in s()]

    return source


class DbSource:
    """The newest snapshot of every run with status ``running`` in a results database, labelled
    with the run's id, kind, label and launch; a snapshot older than ``max_age_s`` (its writer was
    killed, so its run stays ``running``) is left out. Close it when done."""

    def __init__(
        self, db_path: Path | None = None, *, max_age_s: float = MAX_AGE_S, clock: Callable[[], float] = time.time
    ) -> None:
        from moetune.store.db import ResultsDB

        self.db = ResultsDB.open(db_path)
        self.max_age_s = max_age_s
        self.clock = clock
        self._lock = threading.Lock()  # one connection, scrapes on several threads

    def __call__(self) -> list[LabelledSnapshot]:
        from moetune.kinds import RunStatus

        out = []
        with self._lock:
            now = self.clock()
            for run in self.db.runs(status=RunStatus.RUNNING):
                doc = self.db.latest_metrics(run.id)
                if doc is None:
                    continue
                try:
                    snap = Snapshot.from_json(doc)
                except (KeyError, TypeError, ValueError):  # a row this version cannot read
                    continue
                if now - snap.t > self.max_age_s:
                    continue
                out.append(
                    LabelledSnapshot(
                        snapshot=snap, run=run.id, kind=str(run.kind), label=run.label, launch=run.meta.launch_run
                    )
                )
        return out

    def close(self) -> None:
        with self._lock:
            self.db.close()


class LaunchSource:
    """The live launches, sampled at each scrape (no thread, nothing spent between scrapes): the
    host and its GPUs once, then each launch's processes and servers labelled with its id; rates
    are over the time since the previous scrape. ``only`` keeps one launch (``launch
    --metrics-port``). Close it when done (it may hold ssh sessions to other nodes)."""

    def __init__(self, only: str | None = None) -> None:
        from moetune.monitor.sampler import Sampler

        self.only = only
        self._host = Sampler()
        self._host.tick()  # a first reading, so that the first scrape has the host's rates
        self._launches: dict[str, Sampler] = {}
        self._lock = threading.Lock()

    def live(self) -> list[str]:
        from moetune.run.status import runs

        return [s.run for s in runs() if s.live and (self.only is None or s.run == self.only)]

    def __call__(self) -> list[LabelledSnapshot]:
        from moetune.monitor.sampler import Sampler, watches_of_launch

        with self._lock:
            live = self.live()
            for gone in set(self._launches) - set(live):
                self._launches.pop(gone).close()
            out = [LabelledSnapshot(snapshot=self._host.tick())]
            for run in live:
                sampler = self._launches.get(run)
                if sampler is None:  # a new launch: its processes' rates come from the next scrape on
                    sampler = self._launches[run] = Sampler(
                        watches=lambda r=run: watches_of_launch(r),  # type: ignore[misc]
                        gpus=False,
                        host=False,
                    )
                out.append(LabelledSnapshot(snapshot=sampler.tick(), launch=run))
            return out

    def close(self) -> None:
        with self._lock:
            for sampler in self._launches.values():
                sampler.close()
            self._launches.clear()


# ---- the HTTP server ---------------------------------------------------------------------------

INDEX = """<!doctype html>
<html><head><title>moetune metrics</title></head>
<body><h1>moetune metrics</h1><p><a href="/metrics">/metrics</a>: the machine while moetune measures,
in the Prometheus text format.</p></body></html>
"""


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    server_version = "moetune"
    timeout = 30  # a client that stalls mid-request loses its connection, not a thread forever

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            try:
                status, ctype, text = 200, CONTENT_TYPE, render(self.server.source())
            except Exception as e:  # the scrape fails (Prometheus marks the target down), the server lives on
                self.log_error("scrape failed: %s", f"{type(e).__name__}: {e}")
                status, ctype, text = 500, "text/plain; charset=utf-8", f"scrape failed: {type(e).__name__}: {e}\n"
        elif path == "/":
            status, ctype, text = 200, "text/html; charset=utf-8", INDEX
        else:
            status, ctype, text = 404, "text/plain; charset=utf-8", "not found: try /metrics\n"
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # one scrape a second: say nothing
        pass

    def log_error(self, format: str, *args: object) -> None:
        sys.stderr.write(f"moetune metrics: {format % args}\n")


class MetricsServer(ThreadingHTTPServer):
    """``GET /metrics`` from ``source``; ``/`` a page that links to it; anything else 404."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], source: Source) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.source = source
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer's own looks the host's name up (getfqdn), which can hang on a machine without DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = str(host)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9101`` for IPv6) → (host, port); port 0 picks a free one."""
    hint = f"give a host and a port, e.g. --listen {DEFAULT_LISTEN}"
    host, sep, port = listen.rpartition(":")
    if not sep or not host:
        raise InputError(f"--listen {listen!r}: no port" if not sep else f"--listen {listen!r}: no host", hint=hint)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise InputError(f"--listen {listen!r}: write an IPv6 address in brackets", hint="--listen [::1]:9101")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InputError(f"--listen {listen!r}: the port must be a number from 0 to 65535", hint=hint)
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int, source: Source) -> MetricsServer:
    """The server, bound and listening (not yet serving); a clear error when it cannot be."""
    try:
        return MetricsServer((host, port), source)
    except OSError as e:
        raise listen_error(host, port, e) from None


def listen_error(host: str, port: int, e: OSError) -> MoetuneError:
    """What to tell a user whose ``--listen HOST:PORT`` could not be bound: a name that does not
    resolve or an address not of this machine (input, exit 2), a port in use (exit 1)."""
    if isinstance(e, socket.gaierror):
        return InputError(
            f"--listen {host}:{port}: cannot resolve {host!r} ({e.strerror})",
            hint="give an address of this machine, e.g. 127.0.0.1",
        )
    if e.errno == errno.EADDRINUSE:
        return RuntimeFailure(
            f"--listen {host}:{port}: the address is in use",
            hint="stop what listens there, or choose another port (--listen HOST:PORT)",
        )
    if e.errno == errno.EADDRNOTAVAIL:
        return InputError(
            f"--listen {host}:{port}: {host} is not an address of this machine",
            hint="use 127.0.0.1, or one of this machine's addresses",
        )
    return RuntimeFailure(
        f"--listen {host}:{port}: {e.strerror or e}", hint="choose another address or port (--listen HOST:PORT)"
    )


def wait_listening(host: str, port: int, timeout_s: float) -> bool:
    """Whether something accepts connections on ``host:port`` within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def serve_until_stopped(server: MetricsServer, stop: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set or SIGTERM arrives (returns) or Ctrl-C (KeyboardInterrupt
    propagates); the listening socket is closed and in-flight scrapes end either way."""
    stop = stop or threading.Event()
    in_main = threading.current_thread() is threading.main_thread()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_term) if in_main else None
    worker = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True, name="moetune-metrics"
    )
    worker.start()
    try:
        while not stop.wait(0.5):  # a timed wait, so Ctrl-C reaches this thread promptly
            pass
    finally:
        server.shutdown()
        server.server_close()
        worker.join(5)
        if in_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
