"""One answer on its way from the upstream to the client through the recording proxy.

Each piece of bytes the upstream sends is written to the client from the callback that read it
(the answer's head once whole, less its hop-by-hop headers; the body as it came, its chunked
framing included), and only then read for the log: its server-sent events by serve-bench's own
parser (:class:`~moetune.bench.serve.request.SseParser`), a JSON answer for its usage. The delay
of each piece, from its arrival (kernel time) to its write, is what the proxy adds to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import zlib
from typing import Any

from moetune.bench.record.connections import HEAD_LIMIT, Request
from moetune.bench.record.framing import BodyReader, Head, parse_head, render_head, status_of
from moetune.bench.record.session import token_counts
from moetune.bench.serve.request import RequestRecord, SseParser

JSON_LIMIT = 64 << 20  # a JSON answer longer than this is relayed but not read for its usage


class Relay:
    """One answer on its way from the upstream to the client: written through as it arrives, read
    on the side for the log."""

    def __init__(self, req: Request, client: asyncio.WriteTransport, rec: RequestRecord, pieces: list[float]) -> None:
        self.req, self.client, self.rec, self.pieces = req, client, rec, pieces
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.head_buf = b""
        self.head: Head | None = None
        self.body: BodyReader | None = None
        self.sse: SseParser | None = None
        self.inflate: Any = None  # a zlib decompressor for a gzip or deflate answer
        self.payload = bytearray()  # a JSON answer, to read its usage
        self.readable = True  # an answer in a content coding this proxy cannot read is relayed, not read
        self.t_first_byte: float | None = None
        self.t_headers: float | None = None
        self.t_first_chunk: float | None = None
        self.first_byte_ms: float | None = None
        self.delays: list[float] = []
        self.written = False  # some of the answer reached the client
        self.error: str | None = None
        self.close_client = False

    def reset(self) -> None:
        """Before sending again on a new connection (the old one closed before answering)."""
        self.done = asyncio.get_running_loop().create_future()
        self.head_buf, self.t_first_byte = b"", None

    def on_bytes(self, data: bytes, t: float) -> None:
        if self.done.done():
            return
        if self.t_first_byte is None:
            self.t_first_byte = t
        try:
            out, payload = self._take(data, t)
        except ValueError as e:
            self._end(f"bad_response: {e}"[:200])
            return
        if out:  # written first, read for the log after
            if self.client.is_closing():
                self._end("client_closed")
                return
            self.client.write(out)
            now = time.monotonic()
            delay = (now - t) * 1000
            if self.first_byte_ms is None:
                self.first_byte_ms = (now - self.t_first_byte) * 1000
            self.delays.append(delay)
            self.pieces.append(delay)
            self.written = True
        if payload:
            self._read(payload, t)
        if self.body is not None and self.body.done:
            self._end(None)

    def _take(self, data: bytes, t: float) -> tuple[bytes, bytes]:
        """What of ``data`` to write to the client now, and the body's payload in it (for the log)."""
        out = b""
        while self.head is None:
            self.head_buf += data
            end = self.head_buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head_buf) > HEAD_LIMIT:
                    raise ValueError("response head too large")
                return b"", b""
            head = parse_head(self.head_buf[:end])
            data, self.head_buf = self.head_buf[end + 4 :], b""
            status = status_of(head)
            if 100 <= status < 200 and status != 101:  # an interim answer: the final one follows
                continue
            self._start(head, t)
            out = render_head(head.start, self._answer_headers(head))
        assert self.body is not None
        used, payload = self.body.feed(data)
        return out + data[:used], payload

    def _start(self, head: Head, t: float) -> None:
        self.head, self.t_headers = head, t
        self.body = BodyReader.for_response(head, self.req.method)
        self.close_client = not self.req.keep_alive or self.body.until_close
        self.rec.status = status_of(head)
        if "text/event-stream" in (head.get("content-type") or ""):
            self.sse = SseParser(self.rec)
        encoding = head.tokens("content-encoding")
        if encoding & {"gzip", "deflate"}:
            self.inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # either, by its header
        elif encoding - {"identity"}:
            self.sse, self.readable = None, False  # br, zstd: relayed, not read

    def _answer_headers(self, head: Head) -> list[tuple[str, str]]:
        headers = head.forwarded(keep=frozenset({"transfer-encoding"}))  # the framing is relayed as it is
        if self.close_client:
            headers.append(("Connection", "close"))
        return headers

    def _read(self, payload: bytes, t: float) -> None:
        if self.t_first_chunk is None:
            self.t_first_chunk = t
        if self.inflate is not None:
            try:
                payload = self.inflate.decompress(payload)
            except zlib.error:
                self.inflate, self.sse, self.readable = None, None, False
                return
        if self.sse is not None:
            self.sse.feed(t, payload)
        elif self.readable and len(self.payload) <= JSON_LIMIT:
            self.payload += payload

    def on_client_gone(self) -> None:
        self._end("client_closed")

    def on_lost(self) -> None:
        if self.done.done():
            return
        if self.body is not None and self.body.until_close:
            self._end(None)  # an answer framed by the connection's end
            return
        self.close_client = True
        self._end("upstream_closed" if self.head is None else "upstream_truncated")

    def _end(self, error: str | None) -> None:
        if error is not None:
            self.error = error
            self.close_client = True
        if not self.done.done():
            self.done.set_result(None)

    def tokens(self) -> tuple[int | None, int | None, str | None, bool, int, str | None]:
        """(prompt tokens, completion tokens, their source, streamed, events, finish reason)."""
        rec = self.rec
        if self.sse is not None:
            events = len(rec.chunks)
            counted = sum(int(e.tokens or 0) for e in rec.events())
            p, c, src = token_counts(rec.usage, rec.timings, counted)
            return p, c, src, True, events, rec.finish_reason
        doc: Any = None
        if self.readable and self.payload and len(self.payload) <= JSON_LIMIT:
            with contextlib.suppress(ValueError):
                doc = json.loads(self.payload)
        if not isinstance(doc, dict):
            return None, None, None, False, 0, None
        choices: list[Any] = doc["choices"] if isinstance(doc.get("choices"), list) else []
        finish = next(
            (str(c["finish_reason"]) for c in choices if isinstance(c, dict) and c.get("finish_reason")), None
        )
        usage, timings = doc.get("usage"), doc.get("timings")
        rec.usage = usage if isinstance(usage, dict) else None
        p, c, src = token_counts(rec.usage, timings if isinstance(timings, dict) else None, None)
        return p, c, src, False, 0, finish
