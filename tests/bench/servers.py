"""Fixtures' helpers for bench tests against a real llama-server: generated models, plans."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from moetune.engine import registry
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from tests.helpers import free_port

SERVER_ARGS = ("-nr", "-c", "1024", "-t", "1")  # -t 1 leaves the second core to the client


def model(models: Path, name: str, **dims: int) -> Path:
    path = models / f"{name}.gguf"
    if not path.exists():
        generate(path, "qwen3moe", Dims(**dims), "f16")
    return path


def plan_doc(model_path: Path, *extra: str, label: str | None = None, rpc: bool = False) -> dict[str, Any]:
    """A plan as the planner writes it: a launch section (one server, optionally an RPC worker)."""
    engine = registry.get().name
    procs = []
    argv = ["-m", str(model_path), *SERVER_ARGS, *extra]
    after: tuple[str, ...] = ()
    if rpc:
        rport = free_port()
        procs.append(ProcessSpec(name="rpc0", role="rpc", engine=engine, argv=(), host="127.0.0.1", port=rport))
        argv += ["--rpc", f"127.0.0.1:{rport}"]
        after = ("rpc0",)
    procs.append(
        ProcessSpec(
            name="main", role="server", engine=engine, argv=tuple(argv), host="127.0.0.1", port=free_port(), after=after
        )
    )
    doc: dict[str, Any] = {"launch": LaunchSpec(tuple(procs)).to_json()}
    if label:
        doc["label"] = label
    return doc


def write_plan(path: Path, model_path: Path, *extra: str, label: str | None = None, rpc: bool = False) -> Path:
    path.write_text(json.dumps(plan_doc(model_path, *extra, label=label, rpc=rpc), indent=2))
    return path


def _cpu_busy_s() -> float:
    """CPU seconds all processes (and the hypervisor's steal) used since boot, from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    utime, stime = stat.rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


class ForeignLoad:
    """How much CPU other programs took while a block ran (cores, averaged): the test's own
    processes (``pids``, and this one) are subtracted from the machine's total."""

    def __init__(self, *pids: int) -> None:
        self.pids = (os.getpid(), *pids)
        self.cores = 0.0

    def __enter__(self) -> ForeignLoad:
        self._t = time.monotonic()
        self._busy = _cpu_busy_s()
        self._ours = sum(_proc_cpu_s(p) for p in self.pids)
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self._t
        others = (_cpu_busy_s() - self._busy) - (sum(_proc_cpu_s(p) for p in self.pids) - self._ours)
        self.cores = max(0.0, others / wall) if wall > 0 else 0.0
