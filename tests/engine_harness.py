"""Engine harness for the tests, the benchmarks and the demo (not part of the package).

- ``free_port``: a free loopback port.
- ``reserve_log``: ask the real engine what it would allocate: start llama-server, wait until it has
  reserved its compute buffers (the ``sched_reserve: graph`` line), stop it, return the log. With
  mmap this reads no weights, so it takes well under a second even for a large model.
- ``rpc_workers``, ``loopback_hw``: loopback RPC workers as extra devices, and a hardware
  description of this machine with them.

Scripts outside tests/ (benchmarks/, scripts/demo.py) put the repository root on ``sys.path`` to
import it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from moetune.engine.argv import strip_flags
from moetune.run.verify import run_until

RESERVED = "sched_reserve: graph"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_POOL_HIGH = _ephemeral_low()
_POOL_LOW = max(1024, _POOL_HIGH - 12000)
_next = [_POOL_LOW + (os.getpid() * 7919) % (_POOL_HIGH - _POOL_LOW)]


def free_port() -> int:
    """A loopback port free now, below the kernel's ephemeral range and never handed out twice by
    this process: a port the kernel gave out (bind to port 0) could be taken as the local end of
    an outgoing connection before the server that was meant to bind it starts ("already in use")."""
    span = _POOL_HIGH - _POOL_LOW
    for _ in range(span):
        port = _next[0]
        _next[0] = _POOL_LOW + (port - _POOL_LOW + 1) % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {_POOL_LOW}-{_POOL_HIGH - 1}")


def reserve_log(server: Path, argv: Sequence[str], timeout: float = 60.0, marker: str = RESERVED) -> tuple[bool, str]:
    """(reached the reserve, log text). `argv` should not carry --host/--port (a free port is used).
    ``marker``: the line that says the compute buffers are reserved (ik_llama.cpp: IK_RESERVED)."""
    cmd = [str(server), *argv, "--host", "127.0.0.1", "--port", str(free_port()), "--no-warmup"]
    rc, text = run_until(cmd, marker, timeout)
    return rc is None and marker in text, text


def strip_endpoint(argv: Sequence[str]) -> list[str]:
    """Drop --host/--port pairs from a rendered argv."""
    return strip_flags(argv, {"--host", "--port"}, ())


@contextmanager
def rpc_workers(bin_dir: Path, n: int, binary: str = "ggml-rpc-server") -> Iterator[list[str]]:
    """Start n RPC workers on loopback (ik_llama.cpp's is ``rpc-server``); yield their host:port endpoints."""
    procs: list[subprocess.Popen[bytes]] = []
    ends: list[str] = []
    try:
        for _ in range(n):
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [str(bin_dir / binary), "-H", "127.0.0.1", "-p", str(port)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            ends.append(f"127.0.0.1:{port}")
        for e in ends:
            host, port_s = e.split(":")
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection((host, int(port_s)), timeout=0.2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"rpc worker {e} did not listen") from None
                    time.sleep(0.05)
        yield ends
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def loopback_hw(endpoints: list[str], mem_mib: float = 24000, cpu_ram_mib: float = 24000) -> dict[str, Any]:
    """A hardware description of this machine with loopback RPC workers as extra devices."""
    nodes: list[dict[str, Any]] = [{"name": "local", "cpu": {"cores": 2, "ram_mib": cpu_ram_mib, "ram_bw_gbs": 20}}]
    for i, e in enumerate(endpoints):
        host, port = e.split(":")
        nodes.append(
            {
                "name": f"w{i}",
                "link_addr": host,
                "rpc_port": int(port),
                "cpu": {"cores": 2, "ram_mib": cpu_ram_mib, "ram_bw_gbs": 20},
                "devices": [{"name": "CPU", "kind": "cpu", "mem_mib": mem_mib, "bw_gbs": 20}],
            }
        )
    return {"nodes": nodes}
