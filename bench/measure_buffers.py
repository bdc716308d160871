"""Measure llama-server's own buffer accounting over a grid of models and settings.

Used to fit the compute-buffer model in src/moetune/plan/compute.py (see its docstring) and, by
`make bench`, to write the predicted-vs-measured table. Each point starts llama-server with
`-lv 4`, waits for the reserve to finish (the `sched_reserve: graph` line), stops it and parses
the log. A loopback ggml-rpc-server is the second device (RPC0), standing in for a GPU.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from moetune.engine import registry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def rpc_worker() -> Iterator[str]:
    port = free_port()
    bin_ = registry.get().binary("rpc")
    p = subprocess.Popen([str(bin_), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        p.terminate()
        p.wait(10)


@dataclass
class Point:
    model: str
    args: list[str]
    log: str = field(default="", repr=False)
    ok: bool = False
    seconds: float = 0.0


def run_point(model: Path, args: Sequence[str], timeout: float = 60) -> Point:
    """Start llama-server until its compute buffers are reserved; return the log."""
    server = registry.get().binary("server")
    # -nr: CPU weight repacking crashes on this CPU (see DESIGN.md section 5)
    cmd = [str(server), "-m", str(model), "-nr", "-lv", "4", "--host", "127.0.0.1", "--port", str(free_port()),
           "--no-warmup", *args]
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)
        ok = False
        try:
            while time.monotonic() - t0 < timeout:
                if p.poll() is not None:
                    break
                f.seek(0)
                text = f.read()
                if "sched_reserve: graph" in text and ("RS buffer" in text or "KV buffer" in text or "-c 0" in cmd):
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
        text = f.read()
    return Point(str(model), list(args), text, ok, time.monotonic() - t0)


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else Path("measure.json")
    pts: list[dict[str, object]] = []
    models = sorted(Path(argv[1]).glob("*.gguf")) if len(argv) > 1 else []
    with rpc_worker() as rpc:
        for m in models:
            for ub in (64, 256, 512):
                for ctx in (512, 4096):
                    for extra in ([], ["-ot", "exps=CPU"]):
                        pt = run_point(m, ["--rpc", rpc, "-c", str(ctx), "-ub", str(ub), "-b", str(max(ub, 512)),
                                           "--parallel", "1", "-fit", "off", *extra])
                        pts.append(asdict(pt))
                        print(m.name, ub, ctx, extra, pt.ok, f"{pt.seconds:.1f}s", flush=True)
    out.write_text(json.dumps(pts))


if __name__ == "__main__":
    main(sys.argv[1:])
