"""Ask the real engine what it would allocate: start llama-server, wait until it has reserved its
compute buffers (the ``sched_reserve: graph`` line), stop it, return the log. With mmap this reads
no weights, so it takes well under a second even for a large model."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

RESERVED = "sched_reserve: graph"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reserve_log(server: Path, argv: Sequence[str], timeout: float = 60.0) -> tuple[bool, str]:
    """(reached the reserve, log text). `argv` should not carry --host/--port (a free port is used)."""
    cmd = [str(server), *argv, "--host", "127.0.0.1", "--port", str(free_port()), "--no-warmup"]
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
        ok = False
        try:
            while time.monotonic() - t0 < timeout:
                if p.poll() is not None:
                    break
                f.seek(0)
                if RESERVED in f.read():
                    ok = True
                    break
                time.sleep(0.05)
        finally:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        f.seek(0)
        return ok, f.read()


def strip_endpoint(argv: Sequence[str]) -> list[str]:
    """Drop --host/--port pairs from a rendered argv."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("--host", "--port") and i + 1 < len(argv):
            skip = True
            continue
        out.append(a)
    return out
