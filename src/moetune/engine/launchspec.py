"""What to start, in what order: the part of a plan that `moetune launch` executes.

A plan (``moetune plan --json``) carries a ``launch`` object of this shape. It is pure data: the
command layer (``engine.command``) renders it from a plan, `run/` starts it. Servers list the RPC workers they need in ``after``; workers
start first and stop last.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from moetune.errors import InputError
from moetune.kinds import ProcessRole

LAUNCH_SCHEMA_VERSION = 1
RUN_FILES = ("run", "plan")  # the run directory's own files (run.json, plan.json): no process may take them


def check_process_name(name: str) -> None:
    """A process's name names its files in the run directory (NAME.json, NAME.log): InputError for
    one that would leave it, replace the run's own files, or hold a line break or a control character."""
    bad = next((ch for ch in name if unicodedata.category(ch) in ("Cc", "Zl", "Zp")), None)
    why = (
        "it is empty"
        if not name
        else "it holds '/'"
        if "/" in name
        else "it names a directory"
        if name in (".", "..")
        else f"it holds the character {bad!r}"
        if bad is not None
        else f"{name}.json is the run's own file"
        if name in RUN_FILES
        else None
    )
    if why:
        raise InputError(
            f"process name {name!r} cannot name its files in the run directory: {why}",
            hint="rename the service (a layout's `name:`) and plan again",
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessSpec:
    name: str  # unique within the launch: "main", "coder1", "rpc0"
    role: ProcessRole
    engine: str  # engine name (moetune engine list)
    argv: tuple[str, ...]  # arguments after the binary; the binary comes from the engine and role
    host: str  # address it listens on
    port: int
    node: str = "local"  # node name in the hardware file
    ssh: str | None = None  # ssh target (user@host, or a Host from ~/.ssh/config) for remote nodes
    bin_dir: str | None = None  # engine binaries on that node, when it is not the local engine's
    env: dict[str, str] = field(default_factory=dict)
    after: tuple[str, ...] = ()  # processes that must be up first (a server's RPC workers)
    allow_public_bind: bool = False  # an RPC worker may listen on 0.0.0.0 or a public address (the node says so)
    gpus: tuple[str, ...] = ()  # this node's GPUs it uses (CUDA1, ...): all a container engine passes it

    @property
    def url(self) -> str:
        """Where moetune's own clients reach it: a server on every interface through loopback."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "[::1]" if self.host in ("::", "[::]") else self.host
        return f"http://{host}:{self.port}"


def _items(x: object) -> list[object]:
    """A JSON list's entries; TypeError (a malformed section) for anything else."""
    if not isinstance(x, list | tuple):
        raise TypeError(f"expected a list, got {x!r}")
    return list(x)


def _object(x: object) -> Mapping[str, object]:
    if not isinstance(x, Mapping):
        raise TypeError(f"expected an object, got {x!r}")
    return x


def _int(x: object) -> int:
    if not isinstance(x, int | float | str):
        raise TypeError(f"expected a number, got {x!r}")
    return int(x)


def _role(p: Mapping[str, object]) -> ProcessRole:
    role = str(p["role"])
    if role not in tuple(ProcessRole):
        raise InputError(f"plan: process {p['name']} has unknown role {role!r}")
    return ProcessRole(role)


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    processes: tuple[ProcessSpec, ...]

    def servers(self) -> list[ProcessSpec]:
        return [p for p in self.processes if p.role == ProcessRole.SERVER]

    def workers(self) -> list[ProcessSpec]:
        return [p for p in self.processes if p.role == ProcessRole.RPC]

    def to_json(self) -> dict[str, object]:
        return {"schema_version": LAUNCH_SCHEMA_VERSION, "processes": [asdict(p) for p in self.processes]}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> LaunchSpec:
        try:
            procs = []
            for p in map(_object, _items(doc["processes"])):
                ssh, bin_dir = p.get("ssh"), p.get("bin_dir")
                procs.append(
                    ProcessSpec(
                        name=str(p["name"]),
                        role=_role(p),
                        engine=str(p["engine"]),
                        argv=tuple(str(a) for a in _items(p["argv"])),
                        host=str(p["host"]),
                        port=_int(p["port"]),
                        node=str(p.get("node", "local")),
                        ssh=None if ssh is None else str(ssh),
                        bin_dir=None if bin_dir is None else str(bin_dir),
                        env={str(k): str(v) for k, v in _object(p.get("env") or {}).items()},
                        after=tuple(str(a) for a in _items(p.get("after", ()))),
                        allow_public_bind=bool(p.get("allow_public_bind", False)),
                        gpus=tuple(str(g) for g in _items(p.get("gpus", ()))),
                    )
                )
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(
                f"plan: the launch section is malformed ({e!r})", hint="regenerate it with `moetune plan ... --json`"
            ) from None
        spec = cls(tuple(procs))
        spec.validate()
        return spec

    def validate(self) -> None:
        names = [p.name for p in self.processes]
        for n in names:
            check_process_name(n)
        if len(set(names)) != len(names):
            raise InputError(f"plan: duplicate process names in {names}")
        for p in self.processes:
            if p.role not in tuple(ProcessRole):
                raise InputError(f"plan: process {p.name} has unknown role {p.role!r}")
            for a in p.after:
                if a not in names:
                    raise InputError(f"plan: process {p.name} waits for {a!r}, which the plan does not start")
        endpoints = [(p.node, p.host, p.port) for p in self.processes]
        if len(set(endpoints)) != len(endpoints):
            raise InputError("plan: two processes listen on the same node, address and port")
