"""Test helpers: run the CLI in-process, start a real llama-server on a free loopback port.

`free_port`, `rpc_workers` and `loopback_hw` live in tests/engine_harness.py (the benches and the
demo use them too).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner

from moetune.cli import cli
from moetune.cli.common import run
from moetune.engine.install import MAINLINE, Recipe, build_for
from moetune.run.process import end
from tests.engine_harness import free_port, loopback_hw, rpc_workers

__all__ = ["CliResult", "Server", "free_port", "json_shape", "llama_server", "loopback_hw", "rpc_workers", "run_cli"]


def json_shape(x: Any, at: str = "") -> set[str]:
    """The key paths of a JSON document (lists are leaves; a server's own ``props`` are its own)."""
    if not isinstance(x, dict):
        return {at}
    return {p for k, v in x.items() if k != "props" for p in json_shape(v, f"{at}.{k}")}


def engine_bin_dir(recipe: Recipe = MAINLINE) -> Path | None:
    b = build_for(recipe=recipe)
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
        proc = subprocess.Popen(
            [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
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
        end(proc, 20)
