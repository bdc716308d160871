"""From a plan to the exact commands to run, and the checks that need no process: the binary and
the model file exist, the ports are free, the RPC workers the plan does not start are reachable,
no worker listens on a public address unless its node allows it. A worker on another node is
checked over ssh (its engine directory, its binary, whether the build has RDMA).

A check that fails raises :class:`LaunchFailed` with the diagnosis, before anything starts.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import moetune.run.diagnose as diagnose
from moetune.engine import registry
from moetune.engine.formats import MODEL_FLAGS, mount_labels
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.engine.registry import BINARIES, Engine
from moetune.errors import InputError, RuntimeFailure
from moetune.hardware.inventory import RPC_NO_AUTH, RPC_PUBLIC_BIND_REMEDY, bind_problem
from moetune.kinds import EngineKind, ProcessRole
from moetune.plan.ledger import Shortfall
from moetune.plan.settings import is_loopback
from moetune.run.container import ContainerRun
from moetune.run.diagnose import Diagnosis
from moetune.run.health import TCP_LISTEN, listener_of, port_free, port_open, tcp_states
from moetune.run.remote import NodeProbe, RemoteError, probe_node, ssh_base
from moetune.run.transport import engine_files, rdma_capable

VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose")
# mainline prints buffers, the device list, slot and cache details only at verbosity 4
MAINLINE_VERBOSITY = ("-lv", "4")
METRICS_FLAG = "--metrics"  # llama-server's /metrics (both engines)


class LaunchFailed(RuntimeFailure):
    """A launch that could not start or come up; carries the diagnosis."""

    def __init__(self, diagnosis: Diagnosis, run_id: str | None = None) -> None:
        super().__init__(
            diagnosis.message,
            hint=diagnosis.hint,
            details=tuple(f"{e.line:>5} | {e.text[:200]}" for e in diagnosis.evidence[:6]),
        )
        self.diagnosis = diagnosis
        self.run_id = run_id


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    spec: ProcessSpec
    engine: Engine
    argv: tuple[str, ...]  # binary first: exactly what runs (on its node); in a container, what the image runs
    rdma: bool = False  # its build has the RDMA transport
    node: NodeProbe | None = None  # what ssh found on its node, for a process started there
    container: ContainerRun | None = None  # its engine is an image: how it runs in a container

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def remote(self) -> bool:
        return self.spec.ssh is not None

    @property
    def endpoint(self) -> str:
        return f"{self.spec.host}:{self.spec.port}"


def read_plan(path: Path) -> tuple[LaunchSpec, dict[str, object]]:
    """A plan file (with a ``launch`` key) or a plain launch spec; returns the spec and the document."""
    from moetune.paths import readable_file

    try:
        doc = json.loads(readable_file(path, "plan file").read_text())
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not JSON ({e})", hint="pass the output of `moetune plan --json`") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: a plan is a JSON object", hint="pass the output of `moetune plan --json`")
    launch = doc.get("launch", doc)
    if not isinstance(launch, dict) or "processes" not in launch:
        raise InputError(
            f"{path}: no launch section (a 'launch' object with 'processes')",
            hint="pass the output of `moetune plan --json`",
        )
    spec = LaunchSpec.from_json(launch)
    if not spec.servers():
        raise InputError(f"{path}: the plan starts no server")
    return spec, doc


def _entries(x: object) -> list[Mapping[str, object]]:
    """A list of objects (none for a missing or empty one); TypeError for anything else."""
    if not x:
        return []
    if not isinstance(x, list) or not all(isinstance(e, Mapping) for e in x):
        raise TypeError(f"expected a list of objects, got {x!r}")
    return x


def check_fits(doc: Mapping[str, object], path: Path, force: bool) -> list[str]:
    """The plan's own verdict, before anything starts: a plan that says it does not fit is refused
    (InputError naming each device and its shortfall) unless ``force``; then the shortfalls come
    back, to be said as warnings. A bare launch spec has no verdict and passes."""
    if doc.get("fits", True) is not False:
        return []
    try:
        said = [Shortfall.from_json(sf).message() for sf in _entries(doc.get("shortfalls"))]
    except (KeyError, TypeError, ValueError, AttributeError):
        said = []
    said = said or ["the plan says it does not fit (no shortfall recorded)"]
    if force:
        return said
    raise InputError(
        f"{path}: the plan does not fit: {said[0]}",
        details=tuple(said[1:]),
        hint="plan again with less on that device (another --strategy, a smaller context or -ub, "
        "a quantized KV cache), or start it anyway with `moetune launch --force`",
    )


def _flag_values(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    out = []
    for i, a in enumerate(argv):
        if a in flags and i + 1 < len(argv):
            out.append(argv[i + 1])
        else:
            out += [a.split("=", 1)[1] for f in flags if f.startswith("--") and a.startswith(f + "=")]
    return out


def rpc_endpoints(argv: Sequence[str]) -> list[str]:
    return [ep.strip() for v in _flag_values(argv, ("--rpc",)) for ep in v.split(",") if ep.strip()]


def outside_workers(argv: Sequence[str], own: Collection[str]) -> list[str]:
    """The RPC workers (host:port) a server's ``argv`` uses that its run does not start (``own``)."""
    return split_workers(argv, {ep: ep for ep in own})[1]


def split_workers(argv: Sequence[str], own: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """A server's RPC workers in two parts: those its run starts (endpoint to the worker's process
    name in ``own``), and the endpoints it does not start."""
    eps = rpc_endpoints(argv)
    return {ep: own[ep] for ep in eps if ep in own}, [ep for ep in eps if ep not in own]


def model_paths(argv: Sequence[str]) -> list[str]:
    return _flag_values(argv, MODEL_FLAGS)


def api_key_files(argv: Sequence[str]) -> list[str]:
    """The key files a server reads (``--api-key-file``); moetune's clients send their first key."""
    return _flag_values(argv, ("--api-key-file",))


def ubatch(argv: Sequence[str]) -> int | None:
    vals = _flag_values(argv, ("-ub", "--ubatch-size"))
    return int(vals[-1]) if vals and vals[-1].isdigit() else None


def bind_host(p: ProcessSpec) -> str:
    """The address a worker will listen on: its -H, else the plan's host (final_argv adds it)."""
    given = _flag_values(p.argv, ("-H", "--host"))
    return given[-1] if given else p.host


def check_bind(p: ProcessSpec) -> None:
    """Refuse a worker on every interface or a public address unless its node allows it."""
    host = bind_host(p)
    try:
        why = bind_problem(host)
    except ValueError:
        raise InputError(
            f"plan: RPC worker {p.name} binds to {host!r}, which is not an IP address",
            hint="give the worker's address on the link between the nodes",
        ) from None
    if why and not p.allow_public_bind:
        raise InputError(
            f"refusing to start RPC worker {p.name} on port {p.port} of {why}; {RPC_NO_AUTH}",
            hint="bind it to the node's address on the private link (hardware file: link_addr), or "
            "set `allow_public_bind: true` on the node if a firewall keeps everyone else out",
        )


def public_bind_warnings(spec: LaunchSpec) -> list[tuple[str, str]]:
    """(message, remedy) for each worker allowed on a public address or every interface: said once
    more at each launch."""
    out = []
    for p in spec.servers():
        if not is_loopback(host := bind_host(p)):
            auth = (
                "clients must send a key from " + ", ".join(keys)
                if (keys := api_key_files(p.argv))
                else "llama-server has no authentication without --api-key-file: anyone who reaches it can use it"
            )
            out.append(
                (
                    f"server {p.name} will listen on {host}:{p.port}, reachable from the network; {auth}",
                    "plan with --listen 127.0.0.1 to keep it on this machine"
                    if keys
                    else "plan with --api-key-file FILE, or --listen 127.0.0.1",
                )
            )
    for p in spec.workers():
        with contextlib.suppress(ValueError):
            why = bind_problem(bind_host(p))
            if why and p.allow_public_bind:
                out.append(
                    (
                        f"RPC worker {p.name} on node {p.node} will listen on {why} (allow_public_bind); {RPC_NO_AUTH}",
                        RPC_PUBLIC_BIND_REMEDY,
                    )
                )
    return out


def final_argv(p: ProcessSpec, binary: Path | PurePosixPath, kind: str) -> tuple[str, ...]:
    """The binary and the plan's arguments, plus the address when the plan left it out, plus
    ``-lv 4`` for mainline servers (the log moetune reads needs it) unless a verbosity is set, plus
    ``--metrics`` for every server (its Prometheus counters, which moetune's sampler records)."""
    args = list(p.argv)
    port_flags = ("--port",) if p.role == ProcessRole.SERVER else ("-p", "--port")
    given = _flag_values(args, port_flags)
    if given and given[-1] != str(p.port):
        raise InputError(
            f"plan: process {p.name} says port {p.port} but its arguments say {given[-1]}", hint="regenerate the plan"
        )
    if not given:
        args += (
            ["--host", p.host, "--port", str(p.port)]
            if p.role == ProcessRole.SERVER
            else ["-H", p.host, "-p", str(p.port)]
        )
    if (
        p.role == ProcessRole.SERVER
        and kind != EngineKind.IK
        and not any(a in VERBOSITY_FLAGS or a.startswith("--verbosity=") for a in args)
    ):
        args += MAINLINE_VERBOSITY
    if p.role == ProcessRole.SERVER and METRICS_FLAG not in args:
        args.append(METRICS_FLAG)
    return (str(binary), *args)


def _engine(p: ProcessSpec) -> Engine:
    e = registry.get(p.engine)
    return replace(e, bin_dir=p.bin_dir) if p.bin_dir else e


def _binary(p: ProcessSpec, e: Engine) -> Path:
    try:
        return e.binary(p.role)
    except InputError:
        names = " or ".join(BINARIES[p.role])
        raise LaunchFailed(diagnose.binary_missing(p.name, f"no {names} in {e.bin_dir}")) from None


def start_order(spec: LaunchSpec) -> list[ProcessSpec]:
    """Workers first, in plan order; then servers, each after the servers it names in ``after``."""
    done: list[ProcessSpec] = list(spec.workers())
    todo = spec.servers()
    while todo:
        names = {d.name for d in done}
        ready = [s for s in todo if all(a in names for a in s.after)]
        if not ready:
            raise InputError(f"plan: servers {', '.join(s.name for s in todo)} wait for each other")
        done.append(ready[0])
        todo.remove(ready[0])
    return done


def _remote(p: ProcessSpec, e: Engine) -> Prepared:
    """A worker on another node: its engine directory and binary, looked at over ssh."""
    assert p.ssh is not None
    if p.role != ProcessRole.RPC:
        raise InputError(
            f"plan: process {p.name} is a {p.role} on node {p.node}; only RPC workers run on other nodes",
            hint="run llama-server on the first node of the hardware file",
        )
    bin_dir = p.bin_dir or e.bin_dir
    if bin_dir is None:
        raise InputError(
            f"plan: node {p.node} has no bin_dir and engine {e.name} is a container image",
            hint="give the node's engine directory as bin_dir in the hardware file",
        )
    try:
        node = probe_node(ssh_base(), p.ssh, bin_dir, BINARIES[ProcessRole.RPC])
    except RemoteError as err:
        raise LaunchFailed(diagnose.ssh_failed(p.name, p.node, p.ssh, str(err))) from None
    if node.binary_path is None:
        where = f"{bin_dir} on node {p.node} ({node.hostname})"
        raise LaunchFailed(diagnose.binary_missing(p.name, f"no {' or '.join(BINARIES[ProcessRole.RPC])} in {where}"))
    return Prepared(
        spec=p, engine=e, argv=final_argv(p, PurePosixPath(node.binary_path), e.kind), rdma=node.rdma, node=node
    )


def _in_container(p: ProcessSpec, e: Engine, label: str) -> Prepared:
    """A process of an image engine: the engine's argv as the image's binary takes it (host paths,
    checked here; the container's are rendered at the start), and how the container runs."""
    assert e.image is not None and e.runtime is not None
    if e.missing:
        raise LaunchFailed(diagnose.binary_missing(p.name, f"engine {e.name}: {e.missing}"))
    entry = e.entrypoint(p.role)
    name = PurePosixPath(entry or BINARIES[p.role][0]).name
    run = ContainerRun(
        runtime=e.runtime,
        image=e.image,
        entrypoint=entry,
        gpus=p.gpus,
        host_network=p.role == ProcessRole.RPC,
        label=label,
    )
    return Prepared(spec=p, engine=e, argv=final_argv(p, PurePosixPath(name), e.kind), container=run)


def prepare(spec: LaunchSpec) -> list[Prepared]:
    """The processes in start order with their exact argv; raises LaunchFailed when a check fails."""
    out = []
    labels = dict(zip((p.name for p in spec.processes), mount_labels([p.argv for p in spec.processes]), strict=True))
    for p in start_order(spec):
        if p.role == ProcessRole.RPC:
            check_bind(p)
        e = _engine(p)
        if p.ssh:
            out.append(_remote(p, e))
            continue
        if e.image:
            out.append(_in_container(p, e, labels[p.name]))
            continue
        binary = _binary(p, e)
        out.append(
            Prepared(spec=p, engine=e, argv=final_argv(p, binary, e.kind), rdma=rdma_capable(engine_files(binary)))
        )
    preflight(out)
    return out


LINGER_WAIT_S = 75.0  # a stopped server's connections hold its port at most this long (tcp_fin_timeout 60 s)


def _lingering_frees(host: str, port: int, wait_s: float = LINGER_WAIT_S) -> bool:
    """Whether a port comes free within ``wait_s`` where only a stopped server's connections hold it
    (one launch of a tune after another on the same port): they linger in FIN_WAIT/TIME_WAIT, and
    ik_llama.cpp's server binds without SO_REUSEADDR, so they block the next one for up to a minute.
    A port something listens on is not waited for."""
    deadline = time.monotonic() + wait_s
    while (states := tcp_states(port)) and TCP_LISTEN not in states:
        if port_free(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return port_free(host, port)


def preflight(prepared: Sequence[Prepared]) -> None:
    own = {x.endpoint for x in prepared if x.spec.role == ProcessRole.RPC}
    for x in prepared:
        for m in model_paths(x.argv) if not x.remote else ():
            if not Path(m).exists():
                raise LaunchFailed(diagnose.model_missing(x.name, m))
        if x.remote:  # seen from here, as the server will see it
            if port_open(x.spec.host, x.spec.port, timeout_s=2):
                raise LaunchFailed(diagnose.port_in_use(x.name, f"{x.endpoint} (node {x.spec.node})", None))
        elif not port_free(x.spec.host, x.spec.port) and not _lingering_frees(x.spec.host, x.spec.port):
            raise LaunchFailed(diagnose.port_in_use(x.name, x.endpoint, listener_of(x.spec.port)))
        for ep in outside_workers(x.argv, own):
            host, _, port = ep.rpartition(":")
            if not port.isdigit() or not port_open(host, int(port), timeout_s=2):
                raise LaunchFailed(diagnose.rpc_unreachable(x.name, ep, "nothing accepts connections there"))
