"""Launch a plan for a benchmark and stop it afterwards, through `moetune launch`'s Python API
(:func:`moetune.run.launch.launched`): RPC workers first, servers when healthy; on leaving, the
servers are stopped before their workers, Ctrl-C included. This module only picks the server to
measure and gathers what the results history records about it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.engine import registry
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError
from moetune.run.launch import Event
from moetune.run.launch import launched as run_launched

Status = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Launched:
    url: str
    server: ProcessSpec
    launch_run: str  # the launcher's run id (its directory holds the logs)
    logs: dict[str, Path]
    engine_build: str
    model_path: str | None


def launch_spec(plan: dict[str, Any], source: str) -> LaunchSpec:
    if not isinstance(plan, dict) or not isinstance(plan.get("launch"), dict):
        raise InputError(f"{source}: not a plan (no \"launch\" section)",
                         hint="write one with `moetune plan ... --json > plan.json`")
    return LaunchSpec.from_json(plan["launch"])


def model_arg(argv: tuple[str, ...] | list[str]) -> str | None:
    for i, a in enumerate(argv[:-1]):
        if a in ("-m", "--model"):
            return argv[i + 1]
    return None


def _status_of(status: Status | None) -> Callable[[Event], None]:
    def on_event(e: Event) -> None:
        if status and e.kind in ("start", "ready", "exited"):
            status(f"{e.process}: {'starting' if e.kind == 'start' else e.kind} {e.detail if e.kind != 'start' else ''}"
                   .rstrip())

    return on_event


@contextmanager
def launched(plan: dict[str, Any], *, source: str, server: str | None = None, timeout_s: float = 600.0,
             status: Status | None = None) -> Iterator[Launched]:
    """Start the plan, yield the server to measure (the named one, else the first), stop it all."""
    spec = launch_spec(plan, source)
    servers = spec.servers()
    if not servers:
        raise InputError(f"{source}: the plan starts no server")
    chosen = next((s for s in servers if s.name == server), None) if server else servers[0]
    if chosen is None:
        raise InputError(f"{source}: no server named {server!r} (servers: {', '.join(s.name for s in servers)})")
    with run_launched(spec, plan, plan_file=source, timeout_s=timeout_s, on_event=_status_of(status)) as ln:
        yield Launched(ln.urls[chosen.name], chosen, ln.run.run_id, {p.name: ln.log(p.name) for p in spec.processes},
                       registry.get(chosen.engine).version(), model_arg(chosen.argv))
    if status:
        status(f"stopped {', '.join(p.name for p in [*spec.servers(), *spec.workers()])}")
