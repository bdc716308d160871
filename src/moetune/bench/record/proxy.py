"""`moetune record`: a transparent proxy in front of an OpenAI-compatible server that logs every
request it forwards, one JSON line each (:class:`~moetune.bench.record.session.Exchange`).

Requests (any method and path) go to the upstream as they came: method, path and query, the
body, the headers but the hop-by-hop ones (and ``Host``, which names the upstream; an
``Expect: 100-continue`` is answered here). Answers come back unbuffered: each piece of bytes the
upstream sends is written to the client from the callback that read it, its chunked framing
included, so a stream reaches the client event by event as the server wrote it; only the
answer's head loses its hop-by-hop headers. A copy of the body is read on the side for the log
(its server-sent events through serve-bench's own parser, :class:`~moetune.bench.serve.request.SseParser`).

Upstream bytes are read with the serving client's reader (:mod:`moetune.bench.record.connections`),
which stamps them with the kernel's receive time: the delay the proxy adds to each piece is from
that time to the moment it was written to the client (:mod:`moetune.bench.record.relay`). Each line is appended and flushed when its
request ends, so a crash loses no finished request. SIGINT and SIGTERM stop it: no new
connections, requests in flight get a few seconds to end (logged as ``interrupted`` if cut).
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from moetune.bench.http.clock import run as run_loop
from moetune.bench.record.connections import (
    HEAD_LIMIT,
    BadRequest,
    Request,
    Upstream,
    UpstreamConn,
    open_upstream,
    read_request,
)
from moetune.bench.record.framing import render_head
from moetune.bench.record.relay import Relay
from moetune.bench.record.session import Exchange, ProxyDelays, redact, summarize
from moetune.bench.serve.request import RequestRecord
from moetune.errors import InputError

CONNECT_TIMEOUT_S = 30.0
GRACE_S = 5.0  # requests in flight at a stop get this long to end
CLIENT_CHECK_S = 0.1  # how often a request in flight checks that its client is still there


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordConfig:
    host: str
    port: int
    upstream: Upstream
    output: Path
    redact: bool = False
    grace_s: float = GRACE_S


@dataclass(kw_only=True)
class Recorder:
    """The proxy's state: its configuration, the session so far, the log file, what is in flight."""

    cfg: RecordConfig
    log: Callable[[str], None]
    out: IO[str]
    exchanges: list[Exchange] = field(default_factory=list)
    pieces: list[float] = field(default_factory=list)  # every relayed piece's delay, ms
    t0: float | None = None
    seq: int = 0
    active: set[Relay] = field(default_factory=set)
    handlers: set[asyncio.Task[None]] = field(default_factory=set)
    listening: bool = False
    addrs: dict[tuple[str, int], tuple[Any, ...]] = field(default_factory=dict)  # the upstream's, resolved

    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        up: UpstreamConn | None = None
        try:
            while True:
                try:
                    req = await read_request(reader, writer)
                except BadRequest as e:
                    writer.write(_error_answer(e.status, str(e), "bad_request", close=True))
                    return
                if req is None:
                    return
                up, keep = await self.exchange(req, up, reader, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.handlers.discard(task)
            if up is not None:
                up.close()
            writer.close()

    async def exchange(
        self, req: Request, up: UpstreamConn | None, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[UpstreamConn | None, bool]:
        """Forward one request and relay its answer; log it. Returns the upstream connection to
        keep for the next request, and whether the client connection stays open."""
        if self.t0 is None:
            self.t0 = req.t_head
        seq, self.seq = self.seq, self.seq + 1
        rec = RequestRecord(index=seq, concurrency=0, rate=None, prompt_tokens=None, max_tokens=0, t_sched=req.t_head)
        transport = writer.transport
        assert isinstance(transport, asyncio.WriteTransport)
        relay = Relay(req, transport, rec, self.pieces)
        self.active.add(relay)
        connect_ms: float | None = None
        t_sent: float | None = None
        try:
            for attempt in range(2):
                if up is None or not up.usable:
                    if up is not None:
                        up.close()
                    t = time.monotonic()
                    try:
                        up = await asyncio.wait_for(open_upstream(self.cfg.upstream, self.addrs), CONNECT_TIMEOUT_S)
                    except (OSError, TimeoutError) as e:
                        up = None
                        relay.error = "upstream_unreachable"
                        writer.write(
                            _error_answer(
                                502,
                                f"moetune record: the upstream {self.cfg.upstream.url} is unreachable ({e})",
                                "upstream_unreachable",
                                close=not req.keep_alive,
                            )
                        )
                        return None, req.keep_alive
                    connect_ms = (time.monotonic() - t) * 1000
                reused = up.answered > 0
                up.relay = relay
                assert up.io is not None
                data = req.upstream_bytes(self.cfg.upstream)
                # handed to the kernel: on loopback the upstream may run before this process does again
                t_sent = time.monotonic()
                try:
                    await up.io.send(data)
                except OSError:
                    relay.on_lost()
                await _answered(relay, reader)
                if relay.error == "upstream_closed" and reused and attempt == 0 and relay.t_first_byte is None:
                    up.close()  # a kept-alive connection the upstream had closed: send it again on a new one
                    up, relay.error, relay.close_client = None, None, False
                    relay.reset()
                    continue
                break
            assert up is not None
            if relay.error is not None and not relay.written and relay.error != "client_closed":
                kind = relay.error.split(":", 1)[0]
                writer.write(_error_answer(502, f"moetune record: {relay.error}", kind, close=True))
            if (
                relay.error is None
                and relay.head is not None
                and relay.head.keep_alive
                and relay.body is not None
                and not relay.body.until_close
            ):
                up.answered += 1
                up.relay = None
            else:
                up.close()
                up = None
            return up, not relay.close_client
        except asyncio.CancelledError:
            relay.error = relay.error or "interrupted"
            raise
        finally:
            if up is not None and relay.error is not None:
                up.close()
            self.active.discard(relay)
            self._log(req, relay, connect_ms, t_sent)

    def _log(self, req: Request, relay: Relay, connect_ms: float | None, t_sent: float | None) -> None:
        assert self.t0 is not None
        t_end = time.monotonic()

        def rel(t: float | None) -> float | None:
            return None if t is None else t - self.t0  # type: ignore[operator]

        path, _, query = req.target.partition("?")
        body: Any = None
        if req.body:
            try:
                body = json.loads(req.body)
            except ValueError:
                body = None
        if self.cfg.redact:
            body = redact(body)
        prompt, completion, source, stream, events, finish = relay.tokens()
        d = sorted(relay.delays)
        rec = relay.rec
        e = Exchange(
            seq=rec.index,
            method=req.method,
            path=path,
            query=query,
            body=body,
            body_bytes=len(req.body),
            t_unix=req.t_unix,
            t_start_s=req.t_head - self.t0,
            t_sent_s=rel(t_sent),
            t_headers_s=rel(relay.t_headers),
            t_first_chunk_s=rel(relay.t_first_chunk),
            t_first_token_s=rel(rec.events()[0].t if rec.chunks else None),
            t_end_s=t_end - self.t0,
            status=rec.status if relay.head is not None else (502 if relay.error else None),
            stream=stream,
            events=events,
            prompt_tokens=prompt,
            completion_tokens=completion,
            tokens_from=source,
            usage=rec.usage,
            finish_reason=finish,
            error=relay.error or rec.error,
            redacted=self.cfg.redact,
            proxy=ProxyDelays(
                forward_ms=None if t_sent is None else (t_sent - req.t_in) * 1000,
                connect_ms=connect_ms,
                first_byte_ms=relay.first_byte_ms,
                piece_p50_ms=d[len(d) // 2] if d else None,
                piece_max_ms=d[-1] if d else None,
                pieces=len(d),
            ),
        )
        self.out.write(json.dumps(e.to_json(), ensure_ascii=False) + "\n")
        self.out.flush()
        self.exchanges.append(e)
        tokens = "" if e.completion_tokens is None else f", {e.prompt_tokens or '?'}+{e.completion_tokens} tokens"
        took = (e.t_end_s or 0) - e.t_start_s
        self.log(
            f"#{e.seq} {e.method} {e.target} {e.status or '-'}{tokens}, {took:.2f} s"
            + (f" ({e.error})" if e.error else "")
        )


async def _answered(relay: Relay, reader: asyncio.StreamReader) -> None:
    """Until the answer has been relayed, or the client has closed its connection (then the
    upstream's is closed too, which stops a server generating for nobody)."""
    while not relay.done.done():
        await asyncio.wait([relay.done], timeout=CLIENT_CHECK_S)
        if reader.at_eof() and not relay.done.done():
            relay.on_client_gone()


def _error_answer(status: int, message: str, kind: str, *, close: bool) -> bytes:
    reason = {400: "Bad Request", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}.get(status, "Error")
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    head = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    if close:
        head.append(("Connection", "close"))
    return render_head(f"HTTP/1.1 {status} {reason}", head) + body


class Signals:
    """SIGINT and SIGTERM as requests to stop, counted for as long as the proxy runs (from before its
    event loop starts to after it ends, so that a second signal right after the first, as
    `timeout` and a hurried Ctrl-C send, never finds a default handler): the first stops it, the
    second cuts the requests in flight."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.count = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.changed: asyncio.Event | None = None
        self.previous: dict[int, Any] = {}

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.loop is not None and self.changed is not None:
            self.loop.call_soon_threadsafe(self.changed.set)

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self) for sig in self.SIGNALS}

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    async def wait(self, n: int) -> None:
        """Until ``n`` signals have come."""
        self.loop, self.changed = asyncio.get_running_loop(), asyncio.Event()
        while self.count < n:
            await self.changed.wait()
            self.changed.clear()


async def _serve(cfg: RecordConfig, rec: Recorder, ready: Callable[[str], None], signals: Signals) -> None:
    from moetune.monitor.serve import listen_error

    try:
        server = await asyncio.start_server(rec.client, cfg.host, cfg.port, limit=HEAD_LIMIT)
    except OSError as e:
        raise listen_error(cfg.host, cfg.port, e) from None
    rec.listening = True
    sock = server.sockets[0].getsockname()
    host = f"[{sock[0]}]" if ":" in sock[0] else sock[0]
    try:
        ready(f"http://{host}:{sock[1]}")
        await signals.wait(1)
    finally:
        server.close()
        if rec.active and signals.count < 2:
            rec.log(
                f"stopping: {len(rec.active)} request(s) in flight get {cfg.grace_s:g} s to end "
                "(signal again to cut them)"
            )
            waiting = asyncio.ensure_future(signals.wait(2))
            deadline = time.monotonic() + cfg.grace_s
            while rec.active and time.monotonic() < deadline and not waiting.done():
                await asyncio.sleep(0.02)
            waiting.cancel()
        for task in list(rec.handlers):
            task.cancel()
        await asyncio.gather(*rec.handlers, return_exceptions=True)


def record(
    cfg: RecordConfig, log: Callable[[str], None] = lambda s: None, ready: Callable[[str], None] = lambda url: None
) -> dict[str, object]:
    """Run the proxy until SIGINT or SIGTERM; return the session's :func:`summarize`. ``ready`` gets
    the proxy's URL once it listens; ``log`` a line per request. The output file is started empty."""
    try:
        out = open(cfg.output, "w", encoding="utf-8")  # noqa: SIM115 (closed below, kept open while serving)
    except OSError as e:
        raise InputError(
            f"-o {cfg.output}: cannot write it ({e.strerror or e})", hint="choose a writable path"
        ) from None
    rec = Recorder(cfg=cfg, log=log, out=out)
    signals = Signals()
    signals.install()
    try:
        run_loop(_serve(cfg, rec, ready, signals))
    finally:
        signals.restore()
        out.close()
        if not rec.listening:
            cfg.output.unlink(missing_ok=True)  # it never listened: leave nothing behind
    return summarize(rec.exchanges, rec.pieces)


def default_output() -> Path:
    return Path(time.strftime("session-%Y%m%d-%H%M%S.jsonl"))


def check_output(path: Path, *, force: bool) -> None:
    """An output that would mix two sessions is refused unless ``force`` (it is then replaced)."""
    if path.is_dir():
        raise InputError(f"-o {path}: is a directory", hint="give a file name, e.g. -o session.jsonl")
    if path.exists() and path.stat().st_size and not force:
        raise InputError(
            f"-o {path}: the file exists and holds another session",
            hint="choose another file, or add --force to replace it",
        )
