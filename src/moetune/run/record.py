"""The run directory: what a launch started, how, and when each process came and went.

    <runs_dir>/<run id>/
        run.json        the launch spec, plan, engine versions, machine fingerprint, state
        plan.json       the plan as given to `moetune launch`
        <name>.json     one process: exact argv, environment, pid, start/ready/stop/exit times
        <name>.log      its stdout and stderr

A process on another node (an RPC worker started over ssh) is recorded with the local ssh client
as ``pid`` and the worker's own pid on its node as ``remote_pid``; ``argv`` is what ran there. A
process in a container is recorded with the `podman run` client as ``pid``, the container's name,
and its main process as ``container_pid``; ``argv`` is the ``podman run`` command.

Times are wall-clock seconds (``time.time()``). Files are replaced atomically under a lock, so a
launcher and a `moetune stop` in another process can both write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from moetune.engine import auth
from moetune.engine.launchspec import check_process_name
from moetune.errors import InputError
from moetune.kinds import LaunchState, ProcessRole
from moetune.paths import runs_dir
from moetune.run.process import LocalProcess, Process, pid_alive
from moetune.run.remote import RemoteProcess

RUN_SCHEMA_VERSION = 1
# environment variables worth recording besides the plan's own (others may hold secrets)
RECORDED_ENV = re.compile(r"^(LLAMA_|GGML_|CUDA_|HIP_|ROCR_|HSA_|OMP_|MOETUNE_|PATH$|LD_LIBRARY_PATH$)")
_ID = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcRecord:
    name: str
    role: ProcessRole
    node: str
    host: str
    port: int
    argv: list[str]  # exactly what was executed, binary first
    env: dict[str, str]  # the plan's variables plus those moetune sets
    env_inherited: dict[str, str]  # engine-related variables the process inherited
    log: str  # file name in the run directory
    cwd: str = ""  # where it ran (relative paths in argv are relative to it)
    pid: int | None = None
    pgid: int | None = None
    start_ticks: int | None = None
    started_at: float | None = None
    ready_at: float | None = None  # listening (worker) or /health 200 (server)
    stop_sent_at: float | None = None  # SIGTERM sent
    kill_sent_at: float | None = None  # SIGKILL sent after the grace period
    exited_at: float | None = None  # first seen gone (pid and its process group)
    exit_code: int | None = None  # where known (this process's children only)
    ssh_target: str | None = None  # the node's ssh destination, for a process started over ssh
    ssh: list[str] | None = None  # the ssh client and options used (stop uses the same)
    remote_pid: int | None = None  # its pid on that node
    remote_start_ticks: int | None = None
    transport: str | None = None  # an RPC worker's transport, as its log showed it: TCP | RDMA
    container: str | None = None  # in a container of this name (``pid``: the `podman run` client)
    runtime: str | None = None  # the container's runtime: podman | docker
    container_pid: int | None = None  # the container's main process (the engine) on this machine
    container_start_ticks: int | None = None

    @property
    def engine_pid(self) -> tuple[int | None, int | None]:
        """The engine's own process on its node (pid, start ticks): where the sampler and the doctor
        look (a worker on another node: its pid there; in a container: its main process)."""
        if self.remote:
            return self.remote_pid, self.remote_start_ticks
        if self.container_pid is not None:
            return self.container_pid, self.container_start_ticks
        return self.pid, self.start_ticks

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def remote(self) -> bool:
        return self.ssh_target is not None

    def process(self, run_path: Path | None = None) -> Process | None:
        """The process to watch or stop; ``run_path`` (the run directory) lets a remote one read
        its log for the exit status."""
        local = (
            None
            if self.pid is None
            else LocalProcess.attach(self.name, self.pid, self.pgid or self.pid, self.start_ticks)
        )
        if self.ssh_target is not None:
            log = run_path / self.log if run_path is not None else None
            return RemoteProcess.attach(
                self.name,
                self.ssh or [],
                self.ssh_target,
                self.remote_pid,
                remote_start_ticks=self.remote_start_ticks,
                local=local,
                log=log,
            )
        return local

    def alive(self) -> bool:
        return self.pid is not None and pid_alive(self.pid, self.start_ticks)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    run: str
    created_at: float
    state: LaunchState
    launch: dict[str, object]  # Launched.to_json()
    engines: dict[str, str]  # engine name -> its version line
    fingerprint: str
    machine: dict[str, str]
    launcher_pid: int
    detached: bool
    plan_file: str | None = None
    diagnosis: dict[str, object] | None = None  # Diagnosis.to_json()
    schema_version: int = RUN_SCHEMA_VERSION
    order: list[str] = field(default_factory=list)  # process names in start order
    transport: str | None = None  # the RPC transport asked for: tcp | rdma | auto
    launcher_start_ticks: int | None = None  # with launcher_pid: that process, not a later one with its pid


def new_run_id(now: float, suffix: str) -> str:
    """``20260721-093015-3fa2``: sortable by start time; ``suffix`` makes it unique."""
    return time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + "-" + suffix


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def run_id(self) -> str:
        return self.path.name

    # -- creation and lookup ------------------------------------------------------------------
    @classmethod
    def create(cls, info: RunInfo, plan_doc: Mapping[str, object]) -> RunDir:
        path = runs_dir() / info.run
        path.mkdir(parents=True, exist_ok=False)
        rd = cls(path)
        rd._write("plan.json", plan_doc)
        rd._write("run.json", asdict(info))
        return rd

    @classmethod
    def open(cls, run_id: str) -> RunDir:
        if not _ID.match(run_id) or run_id in (".", ".."):
            raise InputError(f"{run_id!r} is not a run id", hint="see `moetune ps --all` for the runs")
        path = runs_dir() / run_id
        if not (path / "run.json").exists():
            raise InputError(f"no run {run_id!r} in {runs_dir()}", hint="see `moetune ps --all` for the runs")
        return cls(path)

    @staticmethod
    def all() -> list[RunDir]:
        root = runs_dir()
        if not root.is_dir():
            return []
        return [RunDir(p) for p in sorted(root.iterdir()) if (p / "run.json").exists()]

    # -- reading and writing ------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.path / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _write(self, name: str, doc: Any) -> None:
        tmp = self.path / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(doc, indent=2, default=str))
        tmp.replace(self.path / name)

    def _read(self, name: str) -> dict[str, Any]:
        try:
            doc: dict[str, Any] = json.loads((self.path / name).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"{self.path / name}: unreadable ({e})") from None
        return doc

    def info(self) -> RunInfo:
        doc = self._read("run.json")
        known = {f.name for f in fields(RunInfo)}
        info = RunInfo(**{k: v for k, v in doc.items() if k in known})
        return replace(info, state=LaunchState(info.state))

    def update(self, **changes: Any) -> RunInfo:
        with self.locked():
            info = replace(self.info(), **changes)
            self._write("run.json", asdict(info))
            return info

    def plan(self) -> dict[str, object]:
        return self._read("plan.json")

    def _proc_file(self, name: str, ext: str) -> str:
        """A process's file name in the run directory; InputError for a name that cannot be one."""
        check_process_name(name)
        return f"{name}.{ext}"

    def log_path(self, name: str) -> Path:
        return self.path / self._proc_file(name, "log")

    def proc(self, name: str) -> ProcRecord:
        doc = self._read(self._proc_file(name, "json"))
        known = {f.name for f in fields(ProcRecord)}
        rec = ProcRecord(**{k: v for k, v in doc.items() if k in known})
        return replace(rec, role=ProcessRole(rec.role))

    def add_proc(self, rec: ProcRecord) -> None:
        """Record a process about to start, last in the start order."""
        file = self._proc_file(rec.name, "json")
        with self.locked():
            self._write(file, asdict(rec))
            info = self.info()
            self._write("run.json", asdict(replace(info, order=[*info.order, rec.name])))

    def update_proc(self, name: str, **changes: Any) -> ProcRecord:
        with self.locked():
            rec = replace(self.proc(name), **changes)
            self._write(self._proc_file(name, "json"), asdict(rec))
            return rec

    def procs(self) -> list[ProcRecord]:
        """The processes in start order (those written so far)."""
        order = self.info().order
        return [self.proc(n) for n in order if (self.path / self._proc_file(n, "json")).exists()]

    def alive(self) -> list[ProcRecord]:
        return [r for r in self.procs() if r.alive()]

    def workers(self) -> dict[str, str]:
        """The RPC workers this run started: host:port -> process name."""
        return {f"{r.host}:{r.port}": r.name for r in self.procs() if r.role == ProcessRole.RPC}


def recorded_env(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if RECORDED_ENV.match(k) and k != auth.KEY_ENV}
