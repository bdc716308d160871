"""Plans of real processes for the launch tests: tiny models, loopback ports, and a look at /proc
for anything a launch left behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from moetune.engine import registry
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from moetune.paths import runs_dir
from moetune.run.process import end
from tests.helpers import free_port

# -nr: CPU weight repacking crashes on this CPU (DESIGN.md section 5); every server binds 127.0.0.1
SERVER_ARGS = ("-nr", "-c", "512", "--parallel", "1")


@pytest.fixture(scope="session")
def tiny_model(models: Path) -> Path:
    path = models / "launch-tiny.gguf"
    if not path.exists():
        generate(path, "qwen3moe", Dims(n_layer=2), "f16")
    return path


@pytest.fixture(scope="session")
def slow_model(models: Path) -> Path:
    """400 MB of experts in a sparse file: sending it to an RPC worker takes a few seconds."""
    path = models / "launch-slow.gguf"
    if not path.exists():
        generate(
            path, "qwen3moe", Dims(n_layer=2, n_embd=512, n_ff_exp=512, n_expert=128, head_dim=128), "f16", sparse=True
        )
    return path


def worker(name: str = "rpc0", port: int | None = None) -> ProcessSpec:
    return ProcessSpec(
        name=name, role="rpc", engine=registry.get().name, argv=(), host="127.0.0.1", port=port or free_port()
    )


def server(
    model: Path, *extra: str, name: str = "main", workers: Sequence[ProcessSpec] = (), port: int | None = None
) -> ProcessSpec:
    argv = ["-m", str(model), *SERVER_ARGS]
    if workers:  # before -ot: an RPC device's buffer type exists only once --rpc is parsed
        argv += ["--rpc", ",".join(f"{w.host}:{w.port}" for w in workers)]
    argv += extra
    return ProcessSpec(
        name=name,
        role="server",
        engine=registry.get().name,
        argv=tuple(argv),
        host="127.0.0.1",
        port=port or free_port(),
        after=tuple(w.name for w in workers),
    )


@pytest.fixture
def plan_file(tmp_path: Path) -> Callable[..., Path]:
    """Write a full plan (a 'launch' key, as `moetune plan --json` does) for these processes."""

    def write(*procs: ProcessSpec, extra: dict[str, object] | None = None) -> Path:
        path = tmp_path / f"plan-{len(list(tmp_path.glob('plan-*')))}.json"
        path.write_text(json.dumps({"schema_version": 1, **(extra or {}), "launch": LaunchSpec(procs).to_json()}))
        return path

    return write


_started: list[subprocess.Popen[str]] = []


def moetune(*args: str, **kw: object) -> subprocess.Popen[str]:
    """`moetune ARGS` as its own process (the environment carries the test's MOETUNE_DATA_DIR);
    stopped after the test if it still runs (a failed assertion left it)."""
    p = subprocess.Popen(
        [sys.executable, "-m", "moetune", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )  # type: ignore[call-overload]
    _started.append(p)
    return p


@pytest.fixture(autouse=True)
def stop_launchers() -> Iterator[None]:
    """SIGTERM to any `moetune` this test started and left running (a launcher stops its
    processes on SIGTERM), before the home's guard looks for what the launches left."""
    yield
    while _started:
        p = _started.pop()
        if p.poll() is None:
            end(p, 30)
        p.communicate()


def survivors(run_id: str) -> list[int]:
    """Every live process whose environment carries this run's id (each process moetune starts does)."""
    needle = f"MOETUNE_RUN={run_id}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            out.append(int(d.name))
    return out


def record(run_id: str, name: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads((runs_dir() / run_id / f"{name}.json").read_text())
    return doc


def run_state(run_id: str) -> str | None:
    try:
        return str(json.loads((runs_dir() / run_id / "run.json").read_text())["state"])
    except (OSError, ValueError, KeyError):
        return None


def only_run() -> str:
    runs = sorted(p.name for p in runs_dir().iterdir()) if runs_dir().exists() else []
    assert len(runs) == 1, runs
    return runs[0]


def wait_for(cond: Callable[[], object], timeout_s: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def assert_stopped_in_order(run_id: str, servers: Sequence[str], workers: Sequence[str]) -> None:
    """Each worker was told to stop only after every server's pid was seen gone."""
    gone = [float(record(run_id, s)["exited_at"]) for s in servers]  # type: ignore[arg-type]
    for w in workers:
        sent = record(run_id, w)["stop_sent_at"]
        assert sent is not None, f"{w} was never stopped"
        assert float(sent) >= max(gone), f"{w} stopped {max(gone) - float(sent):.3f} s before the servers were gone"  # type: ignore[arg-type]
        assert record(run_id, w)["exited_at"] is not None


def assert_nothing_left(run_id: str) -> None:
    """No process of the run's environment is alive, nor any recorded pid (same pid, same start time)."""
    assert survivors(run_id) == []
    for f in (runs_dir() / run_id).glob("*.json"):
        doc = json.loads(f.read_text())
        if f.name == "run.json" or not doc.get("pid"):
            continue
        try:
            fields = Path(f"/proc/{doc['pid']}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        assert fields[0] == "Z" or int(fields[19]) != doc["start_ticks"], f"{doc['name']} (pid {doc['pid']}) is alive"
