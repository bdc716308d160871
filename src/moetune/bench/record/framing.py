"""HTTP/1.1 framing for the recording proxy (pure: bytes in, facts out).

The proxy relays a response's bytes as they arrive, its chunked framing included, so what the
client reads is what the server wrote. It only needs to know where a message's head ends, which
headers belong to one hop (RFC 9110 7.6.1: never forwarded), and where a body ends
(:class:`BodyReader`, RFC 9112 6.3: no body for HEAD, 1xx, 204 and 304; chunked; a
``Content-Length``; else until the connection closes), and the body's payload without its
framing, to read the server-sent events in it.
"""

from __future__ import annotations

from dataclasses import dataclass

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


@dataclass(frozen=True, slots=True)
class Head:
    """A message's start line and its headers, as sent (names in their own case, in order)."""

    start: str
    headers: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    def tokens(self, name: str) -> set[str]:
        """The comma-separated, lower-cased tokens of every ``name`` header (``Connection: close``)."""
        name = name.lower()
        return {t.strip().lower() for k, v in self.headers if k.lower() == name for t in v.split(",") if t.strip()}

    @property
    def version(self) -> str:
        """HTTP/1.1 or HTTP/1.0: a request line's last word, a status line's first."""
        parts = self.start.split(" ")
        return parts[-1] if not self.start.startswith("HTTP/") else parts[0]

    @property
    def keep_alive(self) -> bool:
        """Whether the sender keeps the connection open after this message."""
        conn = self.tokens("connection")
        return "keep-alive" in conn if self.version == "HTTP/1.0" else "close" not in conn

    def forwarded(
        self, *, keep: frozenset[str] = frozenset(), drop: frozenset[str] = frozenset()
    ) -> list[tuple[str, str]]:
        """The end-to-end headers: without the hop-by-hop ones (but those in ``keep``), those the
        ``Connection`` header names, and those in ``drop`` (lower-case names)."""
        named = self.tokens("connection")
        out = []
        for k, v in self.headers:
            lk = k.lower()
            if lk in drop or ((lk in HOP_BY_HOP or lk in named) and lk not in keep):
                continue
            out.append((k, v))
        return out


def parse_head(raw: bytes) -> Head:
    """A head without its final empty line; ValueError when it is not one."""
    text = raw.decode("latin-1")
    lines = text.split("\r\n")
    if not lines[0] or len(lines[0].split(" ")) < 2:
        raise ValueError(f"not an HTTP start line: {lines[0][:80]!r}")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if not sep or not k or k != k.strip():
            raise ValueError(f"not an HTTP header: {line[:80]!r}")
        headers.append((k, v.strip()))
    return Head(lines[0], tuple(headers))


def render_head(start: str, headers: list[tuple[str, str]]) -> bytes:
    return (start + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1")


def request_line(head: Head) -> tuple[str, str]:
    """(method, target) of a request head; ValueError for anything else."""
    parts = head.start.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        raise ValueError(f"not an HTTP/1.x request line for this server: {head.start[:80]!r}")
    return parts[0], parts[1]


def status_of(head: Head) -> int:
    parts = head.start.split(" ", 2)
    if not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP status line: {head.start[:80]!r}")
    return int(parts[1])


def content_length(head: Head) -> int | None:
    """The ``Content-Length`` (None without); ValueError for a malformed or conflicting one."""
    values = {v.strip() for k, v in head.headers if k.lower() == "content-length"}
    if not values:
        return None
    if len(values) > 1 or not next(iter(values)).isdigit():
        raise ValueError(f"bad Content-Length: {sorted(values)}")
    return int(next(iter(values)))


_SIZE, _DATA, _CRLF, _TRAILER = range(4)  # where a chunked body's reader is
MAX_LINE = 8192  # a chunk-size or trailer line longer than this is not HTTP


class BodyReader:
    """Where a body ends, fed its bytes as they arrive: :meth:`feed` says how many of them belong
    to the body (the rest would be the next message) and gives their payload (framing removed)."""

    def __init__(self, *, chunked: bool, length: int | None) -> None:
        self.chunked = chunked
        self.left = length  # Content-Length left; None and not chunked: until the connection closes
        self.buf = b""  # chunked: the start of a size or trailer line
        self.state = _SIZE
        self.n = 0  # chunked: payload (or CRLF) bytes left in this chunk
        self.done = not chunked and length == 0

    @classmethod
    def for_response(cls, head: Head, method: str) -> BodyReader:
        status = status_of(head)
        if method == "HEAD" or 100 <= status < 200 or status in (204, 304):
            return cls(chunked=False, length=0)
        if "chunked" in head.tokens("transfer-encoding"):
            return cls(chunked=True, length=None)
        return cls(chunked=False, length=content_length(head))

    @property
    def until_close(self) -> bool:
        return not self.chunked and self.left is None

    def feed(self, data: bytes) -> tuple[int, bytes]:
        """(bytes of ``data`` that are body, their payload); ValueError on broken chunk framing."""
        if self.done:
            return 0, b""
        if not self.chunked:
            if self.left is None:
                return len(data), data
            take = data[: self.left]
            self.left -= len(take)
            self.done = self.left == 0
            return len(take), take
        return self._chunks(data)

    def _chunks(self, data: bytes) -> tuple[int, bytes]:
        start = len(self.buf)
        buf = self.buf + data
        pos, out = 0, []
        while pos < len(buf) and not self.done:
            if self.state in (_DATA, _CRLF):
                take = min(self.n, len(buf) - pos)
                piece = buf[pos : pos + take]
                if self.state == _DATA:
                    out.append(piece)
                elif piece != b"\r\n"[2 - self.n : 2 - self.n + take]:
                    raise ValueError("a chunk is not followed by CRLF")
                pos += take
                self.n -= take
                if self.n == 0:
                    self.state, self.n = (_CRLF, 2) if self.state == _DATA else (_SIZE, 0)
                continue
            end = buf.find(b"\r\n", pos)
            if end < 0:
                if len(buf) - pos > MAX_LINE:
                    raise ValueError("a chunk-size line without its end")
                break
            line, pos = buf[pos:end], end + 2
            if self.state == _TRAILER:
                self.done = not line
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ValueError(f"bad chunk-size line {line[:40]!r}") from None
            self.state, self.n = (_DATA, size) if size else (_TRAILER, 0)
        if self.done:
            self.buf = b""
            return pos - start, b"".join(out)
        self.buf = buf[pos:]
        return len(data), b"".join(out)
