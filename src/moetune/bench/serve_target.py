"""What serve-bench points at: a server URL, or a plan whose server moetune starts.

For a plan, ``--match-slots`` gives the server as many slots as the level's concurrency, and a
context that keeps each slot's share: :func:`match_slots` rewrites the server's ``--parallel`` and
``-c`` (pure: a LaunchSpec in, a LaunchSpec out).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError

PARALLEL = ("--parallel", "-np")
CTX = ("--ctx-size", "-c")


def is_url(target: str) -> bool:
    u = urlsplit(target)
    return u.scheme in ("http", "https") and bool(u.hostname)


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
    servers = spec.servers()
    if server is not None:
        servers = [p for p in servers if p.name == server]
    if len(servers) != 1:
        names = ", ".join(p.name for p in spec.servers()) or "none"
        raise InputError(f"--match-slots needs one server to resize; the plan has: {names}",
                         hint="name it with --server NAME")
    target = servers[0]
    per_slot = max(need_per_slot, slot_context(target) or 0)
    total = per_slot * concurrency  # with --kv-unified too: room for every slot's share at once
    argv = set_flag(set_flag(target.argv, PARALLEL, str(concurrency)), CTX, str(total))
    return LaunchSpec(tuple(replace(p, argv=argv) if p is target else p for p in spec.processes))


def load_plan_launch(path: Path) -> LaunchSpec:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable plan ({e})",
                         hint="give a server URL (http://host:port) or a plan file from `moetune plan --json`") from None
    launch = doc.get("launch") if isinstance(doc, dict) else None
    if not isinstance(launch, dict):
        raise InputError(f"{path}: the plan has no launch section", hint="regenerate it with `moetune plan ... --json`")
    return LaunchSpec.from_json(launch)
