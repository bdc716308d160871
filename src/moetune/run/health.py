"""Probes a launch waits on: a port that listens, a /health that answers 200, a log that grows.

These touch sockets, HTTP and files; the decisions about what a failure means live in
``diagnose.py``.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import socket
import urllib.error
import urllib.request
from pathlib import Path

from moetune.engine import auth
from moetune.engine.logs import detect_era, phases_in, split_lines
from moetune.kinds import LogPhase


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def port_free(host: str, port: int) -> bool:
    """This machine could listen on host:port now (as llama-server and ggml-rpc-server bind: with
    SO_REUSEADDR, so connections of a stopped server lingering in TIME_WAIT do not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno not in (errno.EADDRINUSE, errno.EACCES)
    return True


TCP_LISTEN = "0A"  # /proc/net/tcp's state of a listening socket


def tcp_states(port: int) -> set[str]:
    """The states (/proc/net/tcp's hex codes) of this machine's TCP sockets on a local port."""
    out: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if len(parts) > 3 and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    out.add(parts[3])
    return out


def listener_of(port: int) -> tuple[int, str] | None:
    """(pid, command line) of the local process listening on a TCP port, where /proc tells."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if len(parts) > 9 and parts[3] == TCP_LISTEN and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(parts[9])
    if not inodes:
        return None
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (d / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    return int(d.name), cmd
    return None


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a server's own address, never a proxy


def health(url: str, timeout_s: float = 2.0) -> int | None:
    """HTTP status of GET url/health (503 while loading), or None when nothing answers."""
    try:
        with _DIRECT.open(urllib.request.Request(url + "/health", headers=auth.headers(url)), timeout=timeout_s) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:  # 503 while loading: an answer, not a failure
        return int(e.code)
    except (OSError, ValueError, http.client.HTTPException):
        return None


class LogFollower:
    """Reads what a log gained since the last look and tells the load phases it went through."""

    def __init__(self, path: Path, era: str | None = None) -> None:
        self.path = path
        self.era = era
        self._pos = 0
        self._partial = ""
        self._head: list[str] = []

    def poll(self) -> list[LogPhase]:
        """The phases the new complete lines go through, in order (often none)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except OSError:
            return []
        self._pos += len(chunk)
        text = self._partial + chunk.decode(errors="replace")
        lines = split_lines(text)
        self._partial = lines.pop() if lines and not text.endswith("\n") else ""
        if not lines:
            return []
        if self.era is None:  # the era shows after a few lines; until then each chunk judges itself
            self._head += lines
            if len(self._head) >= 20:
                self.era = detect_era(self._head)
        return phases_in(lines, self.era)
