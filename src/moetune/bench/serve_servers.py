"""Where each load level's server comes from: a running server's URL, or a plan that moetune
launches (once, or once per level with ``--match-slots``: ``--parallel`` and ``-c`` set to the
level's concurrency, so every level runs on as many slots as it has streams)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from moetune.bench.serve_target import CTX, PARALLEL, flag_value, match_slots
from moetune.errors import InputError


class ServerSource(Protocol):
    target: str

    def url_for(self, concurrency: int) -> tuple[str, bool]:
        """The URL for a level, and whether the server behind it is new (just launched)."""
        ...

    def level_info(self, concurrency: int) -> dict[str, Any]:
        """What the level ran on beyond the server's own answers (the launched argv)."""
        ...

    def close(self) -> None: ...


class RunningServer:
    def __init__(self, url: str) -> None:
        self.target = url

    def url_for(self, concurrency: int) -> tuple[str, bool]:
        return self.target, False

    def level_info(self, concurrency: int) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class PlanServers:
    """Launches a plan's processes with moetune's launcher; stops them in order."""

    def __init__(self, path: Path, *, match: bool, need_per_slot: int, log: Callable[[str], None],
                 server: str | None = None) -> None:
        from moetune.run.prepare import read_plan

        self.path = path
        self.target = str(path)
        self.spec, self.doc = read_plan(path)
        self.match = match
        self.need = need_per_slot
        self.log = log
        self.server = server
        self.launched: Any = None
        self.url = ""
        self.argv: dict[int, list[str]] = {}
        servers = self.spec.servers()
        if server is not None and server not in {s.name for s in servers}:
            raise InputError(f"--server {server}: the plan has no such server ({', '.join(s.name for s in servers)})")
        if server is None and len(servers) > 1:
            raise InputError(f"the plan starts {len(servers)} servers: say which one to benchmark",
                             hint="--server NAME")

    def url_for(self, concurrency: int) -> tuple[str, bool]:
        if self.launched is not None and not self.match:
            return self.url, False
        self.close()
        from moetune.run.launch import Event, launch

        spec = match_slots(self.spec, concurrency, need_per_slot=self.need, server=self.server) if self.match \
            else self.spec
        name = self.server or spec.servers()[0].name
        argv = next(s.argv for s in spec.servers() if s.name == name)
        what = (f" with --parallel {flag_value(argv, PARALLEL)} -c {flag_value(argv, CTX)}" if self.match else "")
        self.log(f"launching {self.path.name}{what}")

        def on_event(e: Event) -> None:
            if e.kind in ("ready", "exited"):
                self.log(f"  {e.process}: {e.kind} after {e.elapsed_s:.1f} s {e.detail}".rstrip())

        self.launched = launch(spec, self.doc, plan_file=str(self.path.resolve()), on_event=on_event)
        self.url = self.launched.urls[name]
        self.argv[concurrency] = list(argv)
        return self.url, True

    def level_info(self, concurrency: int) -> dict[str, Any]:
        return {"argv": self.argv[concurrency]} if concurrency in self.argv else {}

    def close(self) -> None:
        if self.launched is not None:
            from moetune.run.stop import stop_run

            stop_run(self.launched.run)
            self.launched = None
