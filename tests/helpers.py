"""Test helpers: run the CLI in-process, start a real llama-server on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from click.testing import CliRunner

from moetune.cli import cli
from moetune.cli.common import run
from moetune.engine.install import build_for


def engine_bin_dir() -> Path | None:
    b = build_for()
    return b.bin_dir if b.complete() else None


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(*args: str) -> CliResult:
    """Run `moetune ARGS` in-process, through the same error handling and exit codes as the real CLI."""
    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        sys.argv = ["moetune", *args]
        code = run(cli)
        sys.stdout.flush()
        sys.stderr.flush()
        return CliResult(code, out.getvalue().decode(), err.getvalue().decode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def llama_server(bin_dir: Path, model: Path, log: Path, *args: str, timeout: float = 120) -> Iterator[Server]:
    """Start llama-server on a free port and wait for /health. `-nr` is the caller's choice."""
    port = free_port()
    with open(log, "wb") as f:
        proc = subprocess.Popen([str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1",
                                 "--port", str(port), *args], stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not healthy after {timeout}s")
            time.sleep(0.2)
        yield Server(proc, url, log)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def rpc_workers(bin_dir: Path, n: int) -> Iterator[list[str]]:
    """Start n ggml-rpc-server workers on loopback; yield their host:port endpoints."""
    procs: list[subprocess.Popen[bytes]] = []
    ends: list[str] = []
    try:
        for _ in range(n):
            port = free_port()
            procs.append(subprocess.Popen([str(bin_dir / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
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


def loopback_hw(endpoints: list[str], mem_mib: float = 24000, cpu_ram_mib: float = 24000) -> dict[str, object]:
    """Hardware for this machine with loopback RPC workers as extra devices."""
    nodes: list[dict[str, object]] = [{"name": "local", "cpu": {"cores": 2, "ram_mib": cpu_ram_mib, "ram_bw_gbs": 20}}]
    for i, e in enumerate(endpoints):
        host, port = e.split(":")
        nodes.append({"name": f"w{i}", "link_addr": host, "rpc_port": int(port),
                      "cpu": {"cores": 2, "ram_mib": cpu_ram_mib, "ram_bw_gbs": 20},
                      "devices": [{"name": "CPU", "kind": "cpu", "mem_mib": mem_mib, "bw_gbs": 20}]})
    return {"nodes": nodes}
