"""Hardware: nodes, their devices (GPUs, the CPU, RPC workers), memory and bandwidths.

Read from YAML (validated with pydantic at the boundary) into frozen dataclasses the planner uses.
The minimal accepted form::

    nodes: [{name: local, cpu: {cores: 16, ram_mib: 786432, ram_bw_gbs: 460},
             devices: [{name: CUDA0, kind: gpu, mem_mib: 97247, bw_gbs: 1790}]}]

A remote node reached over llama.cpp RPC carries ``ssh`` (a target for the system ssh client),
``link_addr``/``rpc_port`` (where its ggml-rpc-server listens) and ``bin_dir`` (engine binaries
there); its devices become ``RPC<n>[addr:port]`` on the node that runs llama-server.

The RPC protocol has no authentication: whoever reaches a worker's port can read and write its
memory. A ``link_addr`` must therefore be a loopback, private or link-local address; ``0.0.0.0``
(every interface) or a public address is refused unless the node says ``allow_public_bind: true``,
and then warned about (:func:`public_binds`).

pydantic and yaml are imported only to read a file (:mod:`moetune.hardware.schema`), so the
planner's users of these dataclasses do not pay for them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.errors import InputError
from moetune.hardware import DEFAULT_RPC_PORT
from moetune.kinds import DeviceKind

if TYPE_CHECKING:
    from moetune.hardware.schema import NodeIn

DEFAULT_PCIE_GBS = 25.0  # PCIe 4.0 x16 effective, when a GPU's link is not given


# ---- core model ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    name: str  # the buffer type name the engine uses: CUDA0, CPU, RPC0[10.0.0.2:50052]
    kind: DeviceKind
    mem_mib: float
    bw_gbs: float
    node: str
    link_gbs: float = DEFAULT_PCIE_GBS
    reserved_mib: float = 0.0
    tflops: float | None = None

    @property
    def usable_mib(self) -> float:
        return self.mem_mib - self.reserved_mib

    @property
    def is_accelerator(self) -> bool:
        return self.kind != DeviceKind.CPU


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    name: str
    cores: int
    ram_mib: float
    ram_bw_gbs: float
    devices: tuple[Device, ...] = ()
    ssh: str | None = None
    link_addr: str | None = None
    rpc_port: int = DEFAULT_RPC_PORT
    link_gbs: float | None = None
    bin_dir: str | None = None
    ram_reserved_mib: float = 0.0
    allow_public_bind: bool = False
    rdma: bool = False  # the link to this node carries RDMA (RoCE) beside TCP
    # the CPU's vector extensions the engine's repacked kernels test (plan.repack.ISA_WORDS: avx2,
    # avx512, amx, dotprod, i8mm); None: not said (an x86 CPU with AVX2 is assumed)
    cpu_isa: tuple[str, ...] | None = None
    # the speed model's constants measured on this CPU (cpu.speed: `moetune hw attention`), sorted
    cpu_speed: tuple[tuple[str, float], ...] = ()

    @property
    def remote(self) -> bool:
        return self.ssh is not None or self.link_addr is not None


@dataclass(frozen=True, slots=True)
class Inventory:
    nodes: tuple[Node, ...]
    name: str | None = None
    source: str | None = field(default=None, compare=False)
    local_first: bool = False  # ik_llama.cpp's device order: local GPUs, then RPC devices

    @property
    def local(self) -> Node:
        return self.nodes[0]

    def accelerators(self) -> list[Device]:
        """Devices in the engine's order: llama.cpp puts RPC devices first (to minimise network
        transfers), then the local GPUs; ik_llama.cpp (``local_first``) the other way round."""
        out: list[Device] = []
        for n in self.nodes[1:]:
            for i, d in enumerate(n.devices):
                out.append(
                    Device(
                        name=rpc_name(i, n),
                        kind=DeviceKind.RPC,
                        mem_mib=d.mem_mib,
                        bw_gbs=d.bw_gbs,
                        node=n.name,
                        link_gbs=n.link_gbs or d.link_gbs,
                        reserved_mib=d.reserved_mib,
                        tflops=d.tflops,
                    )
                )
        return list(self.local.devices) + out if self.local_first else out + list(self.local.devices)

    def devices(self) -> list[Device]:
        """Every device the llama-server on the first node uses: accelerators, then the CPU."""
        return [*self.accelerators(), self.cpu()]

    def rpc_endpoints(self) -> list[str]:
        return [f"{n.link_addr or '127.0.0.1'}:{n.rpc_port}" for n in self.nodes[1:] if n.devices]

    def cpu(self) -> Device:
        n = self.local
        return Device(
            name="CPU",
            kind=DeviceKind.CPU,
            mem_mib=n.ram_mib,
            bw_gbs=n.ram_bw_gbs,
            node=n.name,
            link_gbs=n.ram_bw_gbs,
            reserved_mib=n.ram_reserved_mib,
        )

    def engine_names(self) -> dict[str, str]:
        """Buffer-type name -> the device name llama.cpp logs: RPC devices are numbered across all
        endpoints (RPC0, RPC1, ...) while their buffer types restart per endpoint (RPC0[a:p])."""
        out = {}
        k = 0
        for d in self.accelerators():
            if d.kind == DeviceKind.RPC:
                out[d.name] = f"RPC{k}"
                k += 1
            else:
                out[d.name] = d.name
        return out

    def device(self, name: str) -> Device:
        devs = self.devices()
        for d in devs:
            if d.name == name:
                return d
        by_engine = {v: k for k, v in self.engine_names().items()}
        if name in by_engine:
            return next(d for d in devs if d.name == by_engine[name])
        raise InputError(
            f"no device {name!r} in the hardware file (devices: {', '.join(d.name for d in self.devices())})"
        )


# private networks by name, not ipaddress's is_private (which also counts the documentation
# ranges, 240.0.0.0/4, 198.18.0.0/15 and other special-purpose blocks that are nobody's private link)
PRIVATE_NETS = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
DOCUMENTATION_NETS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)  # RFC 5737, RFC 3849


def bind_problem(addr: str) -> str | None:
    """Why an RPC worker should not listen on ``addr``, as "ADDR, which ..." (None when it is a
    loopback, private (RFC 1918, IPv6 unique local) or link-local address)."""
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_unspecified:
        return f"{addr}, which means every interface, public ones included"
    if ip.is_loopback or ip.is_link_local or any(ip in n for n in PRIVATE_NETS):
        return None
    doc = next((n for n in DOCUMENTATION_NETS if ip in n), None)
    if doc is not None:
        return f"{addr}, which is in {doc}, a range reserved for documentation, not a private network"
    return f"{addr}, which is not a loopback, private or link-local address"


RPC_NO_AUTH = (
    "the RPC protocol has no authentication: anyone who reaches the port can read and write the "
    "worker's memory and run computations on it"
)
RPC_PUBLIC_BIND_REMEDY = (
    "keep the port behind a firewall that admits only the server's node, or bind it to the private link"
)


def public_binds(inv: Inventory) -> list[tuple[Node, str]]:
    """Nodes whose worker listens on a public address or every interface, as allowed explicitly."""
    out = []
    for n in inv.nodes[1:]:
        why = bind_problem(n.link_addr) if n.link_addr else None
        if why:
            out.append((n, why))
    return out


def rpc_name(index: int, node: Node) -> str:
    """llama.cpp names a worker's devices RPC0, RPC1, ... per endpoint: ``RPC0[10.0.0.2:50052]``."""
    return f"RPC{index}[{node.link_addr or '127.0.0.1'}:{node.rpc_port}]"


def _device_kind_checks(n: NodeIn, first: bool) -> None:
    # a remote worker may expose its CPU backend as its device (loopback test rigs do)
    for d in n.devices:
        if d.kind == str(DeviceKind.CPU) and first:
            raise InputError(f"node {n.name}: describe the local CPU under `cpu:`, not as device {d.name}")


def from_dict(doc: Any, source: str | None = None) -> Inventory:
    from pydantic import ValidationError

    from moetune.hardware.schema import HardwareIn
    from moetune.yamlfile import schema_error

    try:
        hw = HardwareIn.model_validate(doc)
    except ValidationError as e:
        raise schema_error(source or "hardware", e, hint="see `moetune hw example` for the accepted form") from None
    nodes = []
    names: set[str] = set()
    for i, n in enumerate(hw.nodes):
        _device_kind_checks(n, i == 0)
        if n.name in names:
            raise InputError(f"{source or 'hardware'}: two nodes are named {n.name!r}")
        why = bind_problem(n.link_addr) if n.link_addr and i > 0 else None
        if why and not n.allow_public_bind:
            raise InputError(
                f"{source or 'hardware'}: node {n.name}: refusing to bind its RPC worker to {why}; {RPC_NO_AUTH}",
                hint="use the node's address on the private link between the nodes (10.x, 172.16-31.x, "
                "192.168.x, 169.254.x), or set `allow_public_bind: true` on the node if a firewall "
                "keeps everyone else out",
            )
        names.add(n.name)
        devs = tuple(
            Device(
                name=d.name,
                kind=DeviceKind(d.kind),
                mem_mib=d.mem_mib,
                bw_gbs=d.bw_gbs,
                node=n.name,
                link_gbs=d.link_gbs or DEFAULT_PCIE_GBS,
                reserved_mib=d.reserved_mib,
                tflops=d.tflops,
            )
            for d in n.devices
        )
        nodes.append(
            Node(
                name=n.name,
                cores=n.cpu.cores,
                ram_mib=n.cpu.ram_mib,
                ram_bw_gbs=n.cpu.ram_bw_gbs,
                devices=devs,
                ssh=n.ssh,
                link_addr=n.link_addr,
                rpc_port=n.rpc_port,
                link_gbs=n.link_gbs,
                bin_dir=n.bin_dir,
                ram_reserved_mib=n.cpu.reserved_mib,
                allow_public_bind=n.allow_public_bind,
                rdma=n.rdma,
                cpu_isa=None if n.cpu.isa is None else tuple(n.cpu.isa),
                cpu_speed=tuple(sorted((n.cpu.speed or {}).items())),
            )
        )
    return Inventory(tuple(nodes), hw.name, source)


def load(path: str | Path) -> Inventory:
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        builtin = Path(__file__).parent / "examples" / f"{p.name}.yaml"
        if builtin.exists():
            p = builtin
        else:
            raise InputError(
                f"{path}: no such hardware file",
                hint="write one with `moetune hw probe`, or use a built-in example: " + ", ".join(examples()),
            )
    from moetune.paths import readable_file

    p = readable_file(p, "hardware file")
    source = os.path.abspath(p)  # recorded in plans and results: it must hold from any directory
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"{p}: cannot read the hardware file ({e.strerror})") from None
    key = hashlib.sha256(raw + _CACHE_SALT).hexdigest()[:32]
    cached = _read_cache(key)
    if cached is not None:
        return replace(cached, source=source)
    from moetune import yamlfile

    inv = from_dict(yamlfile.parse(raw, str(p)), source)
    _write_cache(key, inv)
    return inv


# A file that validated once is kept, as the inventory it became, under the hash of its bytes: the
# next plan reads it without YAML or pydantic (about 0.15 s of a 0.4 s plan on a 2-core machine).
_CACHE_SALT = b"moetune-hardware-v4"  # v2: infinite amounts refused; v3: cpu isa; v4: cpu speed


def _read_cache(key: str) -> Inventory | None:
    from moetune import filecache

    data = filecache.get("hardware", key)
    if data is None:
        return None
    try:
        doc = json.loads(data)
        nodes = tuple(
            Node(
                **{
                    **n,
                    "devices": tuple(Device(**{**d, "kind": DeviceKind(d["kind"])}) for d in n["devices"]),
                    "cpu_isa": None if n.get("cpu_isa") is None else tuple(n["cpu_isa"]),
                    "cpu_speed": tuple((str(k), float(v)) for k, v in n.get("cpu_speed") or ()),
                }
            )
            for n in doc["nodes"]
        )
        return Inventory(nodes, doc.get("name"))
    except (ValueError, KeyError, TypeError):  # written by another version
        return None


def _write_cache(key: str, inv: Inventory) -> None:
    from moetune import filecache

    filecache.put("hardware", key, json.dumps({"name": inv.name, "nodes": [asdict(n) for n in inv.nodes]}).encode())


def examples() -> list[str]:
    return sorted(q.stem for q in (Path(__file__).parent / "examples").glob("*.yaml"))


def to_dict(inv: Inventory) -> dict[str, object]:
    """The hardware file's document (YAML, ``hw probe --json``) of ``inv``."""
    nodes = []
    for n in inv.nodes:
        cpu: dict[str, object] = {"cores": n.cores, "ram_mib": n.ram_mib, "ram_bw_gbs": n.ram_bw_gbs}
        if n.ram_reserved_mib:
            cpu["reserved_mib"] = n.ram_reserved_mib
        if n.cpu_isa is not None:
            cpu["isa"] = list(n.cpu_isa)
        if n.cpu_speed:
            cpu["speed"] = dict(n.cpu_speed)
        node: dict[str, object] = {"name": n.name, "cpu": cpu}
        node["devices"] = [
            {
                k: v
                for k, v in (
                    ("name", d.name),
                    ("kind", str(d.kind)),
                    ("mem_mib", d.mem_mib),
                    ("bw_gbs", d.bw_gbs),
                    ("link_gbs", d.link_gbs),
                    ("reserved_mib", d.reserved_mib),
                    ("tflops", d.tflops),
                )
                if v
            }
            for d in n.devices
        ]
        for k in ("ssh", "link_addr", "bin_dir", "link_gbs"):
            if getattr(n, k) is not None:
                node[k] = getattr(n, k)
        if n.remote:
            node["rpc_port"] = n.rpc_port
        if n.allow_public_bind:
            node["allow_public_bind"] = True
        if n.rdma:
            node["rdma"] = True
        nodes.append(node)
    out: dict[str, object] = {"nodes": nodes}
    if inv.name:
        out["name"] = inv.name
    return out
