"""GGUF headers over HTTP: a model is planned before it is downloaded.

Only the header is fetched, with Range requests of growing size (1 MiB, then at least double what
is held) until the parser (:func:`moetune.model.gguf_read.parse`, the same one local files go
through) has every tensor info; the other shards of a split model are found by name beside the
given URL, as local shards are. Standard library only (urllib), so no dependency and no proxy for
a loopback address.

What a server may do, and what we do:
- answer 206 with ``Content-Range``: the normal case;
- ignore Range and answer 200 with the whole file: the header is read from the start of that body,
  then the connection is closed (the file is not downloaded) and the caller says so;
- redirect (Hugging Face sends ``resolve/`` URLs to a CDN): followed up to ``MAX_REDIRECTS``, a
  loop named; the token is sent only to its own origin, never to the CDN;
- 404, 401/403, other errors, no answer within the timeout, a body cut short: one error naming it.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urljoin, urlsplit, urlunsplit

from moetune.errors import InputError, RuntimeFailure
from moetune.model.gguf_read import Buffer, GGUFFile, check_split, parse, shard_names

FIRST_CHUNK = 1 << 20  # the first request's size; most headers (all but a big vocabulary's) fit
MAX_REDIRECTS = 10
DEFAULT_TIMEOUT_S = 30.0
MAX_PARALLEL = 8  # shards read at once
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
USER_AGENT = "moetune (header reader)"
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)\s*$", re.I)
_REDIRECTS = (301, 302, 303, 307, 308)


def hf_endpoint(environ: Mapping[str, str] = os.environ) -> str:
    """The Hugging Face-style endpoint: ``HF_ENDPOINT``, else huggingface.co (no trailing slash)."""
    return (environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def shown(url: str) -> str:
    """A URL as messages show it: without its query (a CDN's signature) or fragment."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects come back as HTTPError, so that :meth:`Client.get` follows them by its own rules."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _opener(host: str | None) -> urllib.request.OpenerDirector:
    """A loopback address never goes through a proxy; any other follows the environment as it is
    now (http_proxy, https_proxy, no_proxy)."""
    proxies = urllib.request.ProxyHandler({}) if _is_loopback(host) else urllib.request.ProxyHandler()
    return urllib.request.build_opener(proxies, _NoRedirect())


@dataclass
class Stats:
    """What reading cost, counted across the threads that read shards."""

    bytes_fetched: int = 0
    requests: int = 0
    range_ignored: list[str] = field(default_factory=list)  # URLs whose server answered 200 to a Range request
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, *, nbytes: int = 0, requests: int = 0) -> None:
        with self._lock:
            self.bytes_fetched += nbytes
            self.requests += requests

    def ignored_range(self, url: str) -> None:
        with self._lock:
            self.range_ignored.append(url)


class Client:
    """GET with optional Range, redirects followed by our rules, errors as moetune errors.

    ``token`` goes (as ``Authorization: Bearer``) only to URLs of ``token_origin``; it is never
    stored elsewhere, logged or put in a message.
    """

    def __init__(
        self, timeout_s: float = DEFAULT_TIMEOUT_S, token: str | None = None, token_origin: str | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self._token = token
        self._token_origin = token_origin
        self.stats = Stats()

    @classmethod
    def from_env(cls, timeout_s: float = DEFAULT_TIMEOUT_S, environ: Mapping[str, str] = os.environ) -> Client:
        """A client with ``HF_TOKEN`` for the Hugging Face endpoint (``HF_ENDPOINT``), if set."""
        return cls(timeout_s, environ.get("HF_TOKEN") or None, origin(hf_endpoint(environ)))

    def _headers(self, url: str, start: int | None, end: int | None) -> dict[str, str]:
        h = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        if start is not None:
            h["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        if self._token and origin(url) == self._token_origin:
            h["Authorization"] = f"Bearer {self._token}"
        return h

    def get(self, url: str, start: int | None = None, end: int | None = None) -> tuple[str, http.client.HTTPResponse]:
        """The open response to GET url (bytes [start, end) when start is given) and the URL that
        answered, after redirects. Answers 200, 206 and 416 come back; others raise."""
        seen = [url]
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme.lower() not in ("http", "https"):
                raise InputError(
                    f"{shown(seen[0])}: redirected to {parts.scheme or 'a relative'} URL {shown(url)}, "
                    "which is not http(s)"
                )
            req = urllib.request.Request(url, headers=self._headers(url, start, end))
            self.stats.add(requests=1)
            try:
                resp = _opener(parts.hostname).open(req, timeout=self.timeout_s)
                return url, resp
            except urllib.error.HTTPError as e:
                if e.code == 416:
                    return url, e  # type: ignore[return-value]  # an answer: the file is shorter than the range
                location = e.headers.get("Location") if e.code in _REDIRECTS else None
                e.close()
                if location is None:
                    raise http_error(seen[0], url, e.code, e.reason) from None
            except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException) as e:
                raise network_error(seen[0], e, self.timeout_s) from None
            nxt = urljoin(url, location)
            if nxt in seen:
                loop = " → ".join(shown(u) for u in [*seen[seen.index(nxt) :], nxt])
                raise RuntimeFailure(
                    f"{shown(seen[0])}: redirect loop ({loop})",
                    hint="the server is misconfigured; try the URL the loop should end at",
                )
            seen.append(nxt)
            url = nxt
        raise RuntimeFailure(
            f"{shown(seen[0])}: more than {MAX_REDIRECTS} redirects (last: {shown(url)})",
            hint="the server is misconfigured; try the URL the redirects should end at",
        )

    def read(self, resp: http.client.HTTPResponse, n: int, url: str) -> bytes:
        """Up to n bytes of a response's body (fewer only at its end), counted in the stats."""
        chunks, got = [], 0
        try:
            while got < n:
                b = resp.read(min(n - got, 1 << 20))
                if not b:
                    break
                chunks.append(b)
                got += len(b)
        except (TimeoutError, OSError, http.client.HTTPException) as e:
            raise network_error(url, e, self.timeout_s) from None
        finally:
            self.stats.add(nbytes=got)
        return b"".join(chunks)

    def json(self, url: str) -> Any:
        """GET a JSON document (an API answer, read whole)."""
        import json

        _, resp = self.get(url)
        with resp:
            body = self.read(resp, 64 << 20, url)
        try:
            return json.loads(body)
        except ValueError:
            raise RuntimeFailure(
                f"{shown(url)}: the answer is not JSON ({len(body)} bytes)",
                hint="is this an API endpoint? check HF_ENDPOINT",
            ) from None


class NotFound(InputError):
    """HTTP 404 (and 410)."""


def http_error(url: str, final: str, code: int, reason: str) -> InputError | RuntimeFailure:
    where = shown(url) + ("" if final == url else f" (redirected to {urlsplit(final).netloc})")
    if code in (404, 410):
        return NotFound(
            f"{where}: not found (HTTP {code})", hint="check the URL (and for a split model, that every shard is there)"
        )
    if code in (401, 403):
        return InputError(
            f"{where}: access denied (HTTP {code})",
            hint="a private or gated repository needs a token: set HF_TOKEN (moetune sends it only to "
            "the Hugging Face endpoint, HF_ENDPOINT)",
        )
    if 400 <= code < 500:
        return InputError(f"{where}: the server refused the request (HTTP {code} {reason})")
    return RuntimeFailure(f"{where}: server error (HTTP {code} {reason})", hint="try again later")


def network_error(url: str, e: BaseException, timeout_s: float) -> RuntimeFailure:
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, TimeoutError):
        return RuntimeFailure(
            f"{shown(url)}: no answer within {timeout_s:g} s",
            hint="check the network, or wait longer with --http-timeout",
        )
    if isinstance(
        reason,
        http.client.IncompleteRead
        | http.client.RemoteDisconnected
        | ConnectionResetError
        | ConnectionAbortedError
        | BrokenPipeError,
    ):
        return RuntimeFailure(
            f"{shown(url)}: the server closed the connection early ({type(reason).__name__})",
            hint="try again; a proxy or the server may cut long answers",
        )
    return RuntimeFailure(
        f"{shown(url)}: cannot reach the server ({reason})",
        hint="check the URL's host and the network (and http_proxy/https_proxy if you use one)",
    )


def _content_range(value: str | None, url: str) -> tuple[int | None, int]:
    """(first byte, file size) of a Content-Range header."""
    m = _CONTENT_RANGE.match(value or "")
    if not m or m[3] == "*":
        raise RuntimeFailure(
            f"{shown(url)}: the server answered a range without the file's size (Content-Range: {value!r})"
        )
    return (int(m[1]) if m[1] is not None else None), int(m[3])


class HttpSource:
    """A remote file as a :class:`moetune.model.gguf_read.ByteSource`: its first bytes, fetched as
    the parser asks for them (each request at least doubles what is held)."""

    def __init__(self, client: Client, url: str, first_chunk: int = FIRST_CHUNK) -> None:
        self.client = client
        self.path = url  # as given: messages and the profile name it
        self._url = url  # where it answered, after redirects: later ranges go there directly
        self.buf = bytearray()
        self._stream: http.client.HTTPResponse | None = None  # a 200 answer, read from its start
        self.size = self._open(first_chunk)

    def _open(self, n: int) -> int:
        final, resp = self.client.get(self.path, 0, n)
        self._url = final
        if resp.status == 416:  # nothing at byte 0: an empty file
            with resp:
                return _content_range(resp.headers.get("Content-Range"), self.path)[1]
        if resp.status == 206:
            with resp:
                start, size = _content_range(resp.headers.get("Content-Range"), self.path)
                self._take(resp, start, min(n, size))
            return size
        length = resp.headers.get("Content-Length")
        if length is None or not length.isdigit():
            resp.close()
            raise RuntimeFailure(
                f"{shown(self.path)}: the server ignores Range requests and does not say the file's length",
                hint="download the file, or serve it from a server with range support (any static file server or CDN)",
            )
        self._stream = resp  # the server ignores Range: read the header off the start of the whole file
        self.client.stats.ignored_range(self.path)
        size = int(length)
        self._grow(min(n, size))
        return size

    def _take(self, resp: http.client.HTTPResponse, start: int | None, want: int) -> None:
        if start != len(self.buf):
            raise RuntimeFailure(
                f"{shown(self.path)}: asked for bytes from {len(self.buf)}, the server sent bytes from {start}"
            )
        data = self.client.read(resp, want - len(self.buf), self.path)
        self.buf += data
        if len(self.buf) < want:
            raise RuntimeFailure(
                f"{shown(self.path)}: the server sent {len(self.buf)} of {want} bytes and ended the answer",
                hint="try again; the file may be changing on the server",
            )

    def _grow(self, want: int) -> None:
        if self._stream is not None:
            self.buf += self.client.read(self._stream, want - len(self.buf), self.path)
            if len(self.buf) < want:
                raise RuntimeFailure(
                    f"{shown(self.path)}: the answer ended at byte {len(self.buf)} of the {self.size} its length said"
                )
            return
        _, resp = self.client.get(self._url, len(self.buf), want)
        with resp:
            if resp.status != 206:
                raise RuntimeFailure(
                    f"{shown(self.path)}: the server stopped answering Range requests (HTTP {resp.status})",
                    hint="try again",
                )
            start, _ = _content_range(resp.headers.get("Content-Range"), self.path)
            self._take(resp, start, want)

    def prefix(self, end: int) -> Buffer:
        if end > len(self.buf):
            self._grow(min(self.size, max(end, 2 * len(self.buf))))
        return self.buf

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()  # the rest of the file is never read
            self._stream = None


def shard_urls(url: str) -> list[str]:
    """Every shard's URL of a split model, given one shard's (the others sit beside it, by name)."""
    parts = urlsplit(url)
    head, _, last = parts.path.rpartition("/")
    names = shard_names(unquote(last))
    if len(names) == 1:
        return [url]
    return [url if n == unquote(last) else urlunsplit(parts._replace(path=f"{head}/{quote(n)}")) for n in names]


def read_file(client: Client, url: str, index: int) -> GGUFFile:
    src = HttpSource(client, url)
    try:
        return parse(src, index)
    finally:
        src.close()


def read_remote_files(url: str, client: Client) -> list[GGUFFile]:
    """Every shard's header, the given shard first (its errors are the clearest), the others in parallel."""
    urls = shard_urls(url)
    given = urls.index(url)
    first = read_file(client, url, given)

    def read(i: int) -> GGUFFile:
        try:
            return read_file(client, urls[i], i)
        except NotFound:
            name = unquote(urlsplit(urls[i]).path.rpartition("/")[2])
            raise InputError(
                f"{shown(url).rpartition('/')[0]}/: missing shard {name} of {len(urls)} (HTTP 404)",
                hint="all shards must sit beside each other on the server",
            ) from None

    rest = [i for i in range(len(urls)) if i != given]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(rest) or 1)) as pool:
        others = dict(zip(rest, pool.map(read, rest), strict=True))
    others[given] = first
    return check_split([others[i] for i in range(len(urls))])


def file_name(url: str) -> str:
    return unquote(urlsplit(url).path.rpartition("/")[2])


def curl_command(urls: list[str]) -> str:
    """A command that downloads every file into the current directory (curl's URL globbing)."""
    if len(urls) == 1:
        return f"curl -L -O '{shown(urls[0])}'"
    first = shown(urls[0])
    head, _, name = first.rpartition("/")
    m = re.match(r"^(.*)-00001-of-(\d{5})\.gguf$", unquote(name))
    assert m, name
    return f"curl -L --remote-name-all '{head}/{quote(m[1])}-[00001-{m[2]}]-of-{m[2]}.gguf'"
