"""What a benchmark points at, the same for `bench`, `sweep` and `serve-bench`: a server's URL, or
a plan file whose server moetune starts. A plan that starts several servers (a layout) needs
``--server NAME``; a plan with one server needs nothing (:func:`choose_server`, the one rule).

A plan is launched with an RPC transport (``transport``, ``rdma_dev``: `launch --transport`'s,
tcp unless asked; :func:`with_transport` sets them), which every run records with what the
workers' logs confirmed.

For a plan, serve-bench's ``--match-slots`` gives the server as many slots as the level's
concurrency, and a context that keeps each slot's share: :func:`match_slots` rewrites the
server's ``--parallel`` and ``-c`` (pure: a LaunchSpec in, a LaunchSpec out).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError
from moetune.kinds import Transport

PARALLEL = ("--parallel", "-np")
CTX = ("--ctx-size", "-c")
_HOSTPORT = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d+/?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A running server (``url``) or a plan moetune launches (``plan_path``, its launch spec and
    document, and the name of the server to measure)."""

    url: str | None = None
    plan_path: Path | None = None
    spec: LaunchSpec | None = None
    doc: dict[str, object] | None = None
    server: str | None = None
    transport: str = Transport.TCP  # how a plan's server talks to its RPC workers (launch --transport)
    rdma_dev: str | None = None  # GGML_RDMA_DEV for --transport rdma

    @property
    def name(self) -> str:
        """What the history records as the run's target."""
        return self.url if self.url is not None else str(self.plan_path.resolve() if self.plan_path else "")

    @property
    def label(self) -> str | None:
        """A plan's own label (or its file's name); None for a URL (the server names itself)."""
        if self.plan_path is None:
            return None
        doc = self.doc or {}
        return str(doc.get("label") or doc.get("name") or self.plan_path.stem)


def choose_server(spec: LaunchSpec, server: str | None, source: str) -> ProcessSpec:
    """The plan's server to measure: the named one, else the only one."""
    servers = spec.servers()
    names = ", ".join(p.name for p in servers) or "none"
    if server is not None:
        chosen = next((p for p in servers if p.name == server), None)
        if chosen is None:
            raise InputError(f"--server {server}: {source} has no such server (servers: {names})")
        return chosen
    if len(servers) != 1:
        raise InputError(
            f"{source} starts {len(servers)} servers ({names}): say which one to benchmark", hint="--server NAME"
        )
    return servers[0]


def plan_target(path: Path, server: str | None = None) -> Target:
    """A plan file as a target: read by the launcher's own reader, its server chosen by the rule."""
    from moetune.run.prepare import read_plan

    spec, doc = read_plan(path)
    return Target(plan_path=path, spec=spec, doc=doc, server=choose_server(spec, server, str(path)).name)


def layout_target(target: str) -> Target:
    """A plan file as a layout: every server of it, none chosen (`serve-bench PLAN --load ...`)."""
    path = Path(target)
    if not path.is_file():
        if target.startswith(("http://", "https://")) or _HOSTPORT.match(target):
            raise InputError(
                "--load drives the services of a layout plan; TARGET is a server URL",
                hint="give the plan `moetune plan --layout` wrote, or drop --load",
            )
        resolve(target)  # says what it is instead
    from moetune.run.prepare import read_plan

    spec, doc = read_plan(path)
    return Target(plan_path=path, spec=spec, doc=doc)


def resolve(target: str, server: str | None = None) -> Target:
    """TARGET as the user typed it: an existing plan file, or a server URL (``host:port`` and an
    OpenAI base URL ending in ``/v1`` name the same server)."""
    path = Path(target)
    if path.is_file():
        return plan_target(path, server)
    if target.startswith(("http://", "https://")) or _HOSTPORT.match(target):
        if server is not None:
            raise InputError(
                "--server names a server of a plan; TARGET is a URL",
                hint="drop --server, or give the plan file as TARGET",
            )
        url = target if target.startswith("http") else "http://" + target
        return Target(url=url.rstrip("/").removesuffix("/v1"))
    if path.exists() or path.is_symlink():
        from moetune.paths import readable_file

        readable_file(path, "plan file")  # says what it is instead (a directory, a FIFO, a loop)
    raise InputError(
        f"TARGET {target!r} is neither a server URL nor a plan file",
        hint="give http://HOST:PORT of a running server, or a plan JSON file",
    )


def with_transport(t: Target, transport: str | None, rdma_dev: str | None = None) -> Target:
    """The target launched with this RPC transport (None: as it is, tcp unless set). A URL has no
    launch to choose it for."""
    if transport is None and rdma_dev is None:
        return t
    if t.url is not None:
        raise InputError(
            "--transport chooses how moetune launches a plan's RPC workers; TARGET is a running server's URL",
            hint="drop --transport and --rdma-dev, or give the plan file as TARGET",
        )
    if transport is not None and transport not in tuple(Transport):
        raise InputError(f"--transport {transport!r}: choose {', '.join(Transport)}")
    return replace(t, transport=transport or t.transport, rdma_dev=rdma_dev or t.rdma_dev)


def flag_value(argv: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    """The value of the last occurrence of a flag (``-c 4096`` or ``--ctx-size=4096``)."""
    value = None
    for i, a in enumerate(argv):
        if a in names and i + 1 < len(argv):
            value = argv[i + 1]
        for n in names:
            if n.startswith("--") and a.startswith(n + "="):
                value = a.split("=", 1)[1]
    return value


def set_flag(argv: tuple[str, ...], names: tuple[str, ...], value: str) -> tuple[str, ...]:
    """``argv`` with every occurrence of the flag removed and ``names[0] value`` in place of the
    first (or appended)."""
    out: list[str] = []
    placed = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in names or any(n.startswith("--") and a.startswith(n + "=") for n in names):
            if not placed:
                out += [names[0], value]
                placed = True
            i += 1 if "=" in a else 2
            continue
        out.append(a)
        i += 1
    if not placed:
        out += [names[0], value]
    return tuple(out)


def slot_context(p: ProcessSpec) -> int | None:
    """Tokens of context per slot as the server's argv sets it (None when -c is absent or 0)."""
    ctx = flag_value(p.argv, CTX)
    par = flag_value(p.argv, PARALLEL)
    try:
        total = int(ctx) if ctx is not None else 0
        n = max(1, int(par)) if par is not None else 1
    except ValueError:
        return None
    if total <= 0:
        return None
    return total // n  # with --kv-unified a slot may use more, but this is its share when all are busy


def match_slots(spec: LaunchSpec, concurrency: int, *, need_per_slot: int, server: str | None = None) -> LaunchSpec:
    """The launch with its server set to ``concurrency`` slots of at least ``need_per_slot`` tokens
    each (the plan's own per-slot context when it is larger): ``--parallel C -c C*ctx``."""
    if concurrency < 1:
        raise InputError(f"concurrency {concurrency}: must be at least 1")
    target = choose_server(spec, server, "the plan")
    per_slot = max(need_per_slot, slot_context(target) or 0)
    total = per_slot * concurrency  # with --kv-unified too: room for every slot's share at once
    argv = set_flag(set_flag(target.argv, PARALLEL, str(concurrency)), CTX, str(total))
    return LaunchSpec(tuple(replace(p, argv=argv) if p is target else p for p in spec.processes))
