"""A model hub on the loopback for the tests and the benches: files served with HTTP Range (206,
Content-Range), Hugging Face-style paths, and switches to misbehave. It listens on 127.0.0.1 only.

Routes:
- ``/files/PATH``: a file under ``root``;
- ``/OWNER/REPO/resolve/main/PATH``: a file of a repository (``repos``), or a redirect to a second
  hub standing in for the CDN (``cdn``), as huggingface.co redirects;
- ``/api/models/OWNER/REPO``: ``{"id": ..., "siblings": [{"rfilename": ...}]}``;
- ``/loop/PATH``: redirects to ``/loop2/PATH``, which redirects back;
- ``/hops/N/PATH``: N redirects, then ``/files/PATH``.

Switches (attributes, changed while it runs): ``ranges`` (False: ignore Range, answer 200 with the
whole file), ``delay_s`` (wait before answering), ``truncate_to`` (every file ends at that byte).
Every request is logged with its Range and Authorization headers; ``bytes_sent`` counts body bytes.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass(frozen=True)
class Logged:
    path: str
    range: str | None
    authorization: str | None


@dataclass
class Hub:
    root: Path
    repos: dict[str, Path] = field(default_factory=dict)  # OWNER/REPO -> its directory
    cdn: Hub | None = None  # resolve/ URLs redirect there (its /files/ must hold OWNER/REPO/PATH)
    ranges: bool = True
    delay_s: float = 0.0
    truncate_to: int | None = None
    url: str = ""
    log: list[Logged] = field(default_factory=list)
    bytes_sent: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def file_url(self, rel: str | Path) -> str:
        return f"{self.url}/files/{quote(str(rel))}"

    def sent(self, n: int) -> None:
        with self._lock:
            self.bytes_sent += n


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        hub = self.server.hub
        path = unquote(urlsplit(self.path).path)
        hub.log.append(Logged(path, self.headers.get("Range"), self.headers.get("Authorization")))
        if hub.delay_s:
            time.sleep(hub.delay_s)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client stopped reading (once it
            self._route(hub, path)  # has the header, as it should)

    def _route(self, hub: Hub, path: str) -> None:
        parts = path.lstrip("/").split("/")
        if parts[0] == "files":
            return self._file(hub, hub.root / "/".join(parts[1:]))
        if parts[0] in ("loop", "loop2"):
            return self._redirect(f"/{'loop2' if parts[0] == 'loop' else 'loop'}/{quote('/'.join(parts[1:]))}")
        if parts[0] == "hops" and len(parts) > 2 and parts[1].isdigit():
            n, rest = int(parts[1]), quote("/".join(parts[2:]))
            return self._redirect(f"/hops/{n - 1}/{rest}" if n else f"/files/{rest}")
        if parts[:2] == ["api", "models"] and len(parts) == 4:
            return self._listing(hub, "/".join(parts[2:]))
        if len(parts) > 4 and parts[2:4] == ["resolve", "main"]:
            repo, rel = "/".join(parts[:2]), "/".join(parts[4:])
            if hub.cdn is not None:
                return self._redirect(f"{hub.cdn.url}/files/{quote(repo + '/' + rel)}?sig=signed-by-the-hub")
            if repo in hub.repos:
                return self._file(hub, hub.repos[repo] / rel)
        return self._status(404)

    def _status(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self._status(302, headers={"Location": location})

    def _listing(self, hub: Hub, repo: str) -> None:
        d = hub.repos.get(repo)
        if d is None:
            return self._status(404, b'{"error": "Repository not found"}')
        files = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())
        body = json.dumps({"id": repo, "siblings": [{"rfilename": f} for f in files]}).encode()
        self._status(200, body, {"Content-Type": "application/json"})

    def _file(self, hub: Hub, p: Path) -> None:
        if not p.is_file():
            return self._status(404)
        size = p.stat().st_size if hub.truncate_to is None else min(p.stat().st_size, hub.truncate_to)
        m = _RANGE.match(self.headers.get("Range") or "") if hub.ranges else None
        if m:
            start = int(m[1])
            end = min(int(m[2]) if m[2] else size - 1, size - 1)
            if start >= size:
                return self._status(416, headers={"Content-Range": f"bytes */{size}"})
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            start, end = 0, size - 1
            self.send_response(200)
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes" if hub.ranges else "none")
        self.end_headers()
        with p.open("rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0:
                chunk = f.read(min(left, 1 << 16)) or b"\0" * min(left, 1 << 16)
                self.wfile.write(chunk)
                hub.sent(len(chunk))
                left -= len(chunk)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        super().__init__(("127.0.0.1", 0), _Handler)


@contextlib.contextmanager
def serve(hub: Hub) -> Iterator[Hub]:
    """Run the hub on a free loopback port (``hub.url`` is set) until the block ends."""
    server = _Server(hub)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    t = threading.Thread(target=server.serve_forever, args=(0.05,), name="gguf-hub", daemon=True)
    t.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        t.join()
