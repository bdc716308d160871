"""Make a plan: one or several services on shared hardware, each with its placement, its ledger and
its predicted speed; and the combined verdict per device. (Its commands and JSON document are
rendered from it by ``moetune.engine.command``.)

Services with a fixed strategy are planned first; `auto` services then get what is left, so an
orchestrator's experts take the memory the workers do not need (the reference's final layout).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import moetune.plan.attention as attention
from moetune.errors import InputError
from moetune.hardware.inventory import Inventory, Node, rpc_name
from moetune.kinds import DeviceKind, EngineKind, StrategyKind
from moetune.model.profile import ModelProfile
from moetune.model.routing import Routing
from moetune.plan import graph_split
from moetune.plan import placement as plc
from moetune.plan.ledger import DeviceLedger, ServiceMemory, Shortfall, combine, prompt_cache, service_memory
from moetune.plan.optimize import auto
from moetune.plan.settings import Settings
from moetune.plan.speed import Prediction, SpeedConstants, predict

NEAR_LIMIT = 0.97  # warn when a device is this full


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceSpec:
    name: str
    model: ModelProfile
    settings: Settings = field(default_factory=Settings)
    strategy: str = "auto"
    port: int = 8080
    devices: tuple[str, ...] | None = None  # accelerators this service may use (None: all)
    engine: str = ""  # engine name for launching (moetune engine list)
    routing: Routing | None = None  # measured expert routing (an imatrix), for prefill's touched experts
    choose: attention.Choose = field(
        default_factory=attention.Choose
    )  # flash attention / cache type left to the speed model


@dataclass(frozen=True, slots=True, kw_only=True)
class ServicePlan:
    spec: ServiceSpec
    hw: Inventory
    placement: plc.Placement
    memory: ServiceMemory
    prediction: Prediction
    attention_note: str | None = None  # why the plan chose its flash attention and cache type


@dataclass(frozen=True, slots=True)
class Plan:
    hw: Inventory
    services: list[ServicePlan]
    ledgers: list[DeviceLedger]
    constants: SpeedConstants

    @property
    def shortfalls(self) -> list[Shortfall]:
        return [sf for led in self.ledgers if (sf := led.shortfall()) is not None]

    @property
    def fits(self) -> bool:
        return not self.shortfalls

    @property
    def main(self) -> ServicePlan:
        return self.services[0]

    def warnings(self) -> list[dict[str, str | None]]:
        """What to tell beside the verdict: a device close to its limit; a model still to download."""
        out: list[dict[str, str | None]] = []
        for led in self.ledgers:
            if any(i.what == "margin" for i in led.items):
                continue  # the margin is the head-room; a plan that eats it is a shortfall, not a warning
            if led.shortfall() is None and led.used_mib > NEAR_LIMIT * led.capacity_mib:
                out.append(
                    {
                        "device": led.device,
                        "message": f"{led.device} is {led.used_mib / led.capacity_mib:.0%} "
                        "full: a driver update or another process can tip it over",
                        "remedy": "lower -ub or the context, or move one more layer's experts to the CPU",
                    }
                )
        for sp in self.services:
            s, trained = sp.spec.settings, sp.spec.model.hp_int("context_length")
            per_slot = s.ctx // s.slots
            if trained and per_slot > trained and s.server.rope_scaling is None:
                who = f"{sp.spec.name}: " if len(self.services) > 1 else ""
                out.append(
                    {
                        "device": None,
                        "message": f"{who}--ctx {s.ctx} over {s.slots} slot(s) gives each "
                        f"{per_slot:,} tokens, past the {trained:,} the model was trained for "
                        f"({sp.spec.model.arch}.context_length): positions beyond it degrade the answers",
                        "remedy": f"plan with --rope-scaling yarn (renders --rope-scaling yarn --rope-scale "
                        f"{per_slot / trained:.2f} --yarn-orig-ctx {trained}; both engines take it), or "
                        f"--ctx {trained * s.slots} or less",
                    }
                )
            r = sp.spec.model.remote
            if r is not None:
                who = f"{sp.spec.name}: " if len(self.services) > 1 else ""
                out.append(
                    {
                        "device": None,
                        "message": f"{who}the model is remote ({sp.spec.model.files[0]}): "
                        f"llama-server cannot open a URL, so the commands say -m {r.local_path}, where its "
                        "download puts it",
                        "remedy": f"download it first ({r.download}) and run the commands from that directory, "
                        "or plan the downloaded file",
                    }
                )
        out += _shared_rpc_workers(self.services)
        return out


def _shared_rpc_workers(services: list[ServicePlan]) -> list[dict[str, str | None]]:
    """Services that would use the same RPC worker: the rpc-server builds moetune installs (llama.cpp
    11434, ik_llama.cpp 0.1.5) serve one client at a time (``ggml_backend_rpc_start_server`` accepts
    the next connection when the last closes), so the second server waits at load until the first stops."""
    users: dict[tuple[str, str], list[str]] = {}
    for sp in services:
        for node in sp.hw.nodes[1:]:
            if node.devices:
                users.setdefault((f"{node.link_addr or '127.0.0.1'}:{node.rpc_port}", node.name), []).append(
                    sp.spec.name
                )
    return [
        {
            "device": None,
            "message": f"services {', '.join(names)} all use the RPC worker {ep} (node {node}): "
            "an rpc-server serves one client at a time, so only the first of them will start (the others wait for "
            "the device until the launch times out)",
            "remedy": "give each service its own RPC worker (`devices:` in the layout, one RPC node each), or keep "
            "one on this machine's CPU with `devices: []`",
        }
        for (ep, node), names in users.items()
        if len(names) > 1
    ]


def _restrict(hw: Inventory, devices: tuple[str, ...] | None) -> Inventory:
    if devices is None:
        return hw
    keep = set(devices)
    known = {d.name for d in hw.accelerators()} | {f"RPC{i}" for i, n in enumerate(hw.nodes[1:]) if n.devices}
    missing = keep - known
    if missing:
        raise InputError(f"devices {sorted(missing)} are not in the hardware file")
    local = hw.local
    nodes = [
        Node(
            name=local.name,
            cores=local.cores,
            ram_mib=local.ram_mib,
            ram_bw_gbs=local.ram_bw_gbs,
            devices=tuple(d for d in local.devices if d.name in keep),
            ssh=local.ssh,
            link_addr=local.link_addr,
            rpc_port=local.rpc_port,
            link_gbs=local.link_gbs,
            bin_dir=local.bin_dir,
            ram_reserved_mib=local.ram_reserved_mib,
        )
    ]
    for i, n in enumerate(hw.nodes[1:]):
        # a worker by its node's number (RPC1: the second worker) or by a device's full name
        # (RPC0[10.0.0.2:50052]: each worker numbers its devices from 0); its devices all stay
        full = {rpc_name(j, n) for j in range(len(n.devices))}
        nodes.append(n if f"RPC{i}" in keep or full & keep else replace(n, devices=()))
    return Inventory(tuple(nodes), hw.name, hw.source)


def place(
    strategy: str, p: ModelProfile, hw: Inventory, s: Settings, *, reserved: dict[str, float], margins: dict[str, float]
) -> plc.Placement:
    st = plc.parse_strategy(strategy)
    if st.kind == StrategyKind.AUTO:
        return auto(p, hw, s, reserved, margins=margins)
    if st.kind == StrategyKind.CPU_MOE:
        return plc.cpu_moe(p, hw)
    if st.kind == StrategyKind.ALL_GPU:
        return plc.gpu_layers(p, hw)
    if st.kind == StrategyKind.N_CPU_MOE:
        return plc.n_cpu_moe(p, hw, st.n)
    if st.kind == StrategyKind.HEAD_TAIL:
        return plc.head_tail(p, hw, st.head, st.tail, middle=st.middle)
    return plc.layer_sets(p, hw, st.spec)


def _is_auto(spec: ServiceSpec) -> bool:
    return plc.parse_strategy(spec.strategy).kind == StrategyKind.AUTO


def _check_cache_types(p: ModelProfile, s: Settings) -> None:
    """Mainline llama.cpp refuses an MLA model whose K and V caches differ in type: its V is a view
    of K (``llama_init_from_model``: "model does not support different K and V cache types")."""
    if p.is_mla and s.engine == EngineKind.MAINLINE and s.ctk != s.ctv:
        raise InputError(
            f"{p.arch} keeps V inside the K cache (MLA): --ctk {s.ctk} and --ctv {s.ctv} must match",
            hint=f"use --ctv {s.ctk} (a quantized cache needs flash attention) or --ctk {s.ctv}",
        )


def _margins(hw: Inventory, s: Settings) -> dict[str, float]:
    m = {d.name: s.margin_mib for d in hw.accelerators() if d.kind == DeviceKind.GPU}
    m["CPU"] = s.host_margin_mib
    return m


def _choose_attention(
    spec: ServiceSpec,
    shw: Inventory,
    hw: Inventory,
    k: SpeedConstants,
    *,
    reserved: dict[str, float],
    margins: dict[str, float],
    mems: list[ServiceMemory],
) -> attention.Choice:
    """Each variant placed, its memory checked beside the services planned before it, its TG
    predicted at the plan's decision depth (:mod:`moetune.plan.attention`)."""
    depth = attention.decision_depth(spec.settings)
    scored = []
    for s in attention.variants(spec.settings, spec.choose):
        pl = place(spec.strategy, spec.model, shw, s, reserved=reserved, margins=margins)
        mem = service_memory(spec.model, shw, pl, s, service=spec.name, dry_run=True)
        fits = all(led.shortfall() is None for led in combine(hw, [*mems, mem], margins))
        scored.append((s, predict(spec.model, shw, pl, s, k=k, depth=depth, routing=spec.routing).tg_tok_s, fits))
    return attention.pick(scored, depth)


def make_plan(
    services: list[ServiceSpec],
    hw: Inventory,
    constants: SpeedConstants | None = None,
    *,
    pinned: Mapping[str, plc.Placement] | None = None,
) -> Plan:
    """Place the services, each beside the memory of those placed before it: services with a fixed
    placement (any strategy but ``auto``) first, in their order, then the ``auto`` ones, which fill
    what is left. ``pinned``: services placed exactly so, before all others (another plan's
    placements, kept while one service of a layout is tuned: ``tune --layout``); their settings are
    taken as given (nothing chosen for them again)."""
    if not services:
        raise InputError("a plan needs at least one service")
    names = [s.name for s in services]
    if len(set(names)) != len(names):
        raise InputError(f"service names must be unique: {names}")
    pinned = pinned or {}
    if unknown := sorted(set(pinned) - set(names)):
        raise InputError(f"pinned placements of services the plan does not have: {', '.join(unknown)}")
    k = constants or SpeedConstants()
    order = sorted(range(len(services)), key=lambda i: (services[i].name not in pinned, _is_auto(services[i])))
    planned: dict[int, ServicePlan] = {}
    mems: list[ServiceMemory] = []
    for i in order:
        spec = services[i]
        spec.settings.validate()
        _check_cache_types(spec.model, spec.settings)
        shw = replace(_restrict(hw, spec.devices), local_first=spec.settings.engine == EngineKind.IK)
        graph_split.check(spec.model, shw, spec.settings)
        reserved: dict[str, float] = {}
        for m in mems:
            for dev, items in m.items.items():
                reserved[dev] = reserved.get(dev, 0.0) + sum(it.mib for it in items)
        margins = _margins(hw, spec.settings)
        note = None
        if spec.choose and spec.name not in pinned:
            choice = _choose_attention(spec, shw, hw, k, reserved=reserved, margins=margins, mems=mems)
            spec, note = replace(spec, settings=choice.settings), choice.note()
        pl = pinned.get(spec.name) or place(
            spec.strategy, spec.model, shw, spec.settings, reserved=reserved, margins=margins
        )
        if spec.settings.split_mode == "graph":  # -ts: the GPUs' shares of every split layer
            pl = replace(pl, tensor_split=graph_split.percents(shw))
        mem = service_memory(spec.model, shw, pl, spec.settings, service=spec.name, dry_run=True)
        pred = predict(spec.model, shw, pl, spec.settings, k=k, routing=spec.routing)
        planned[i] = ServicePlan(spec=spec, hw=shw, placement=pl, memory=mem, prediction=pred, attention_note=note)
        mems.append(mem)
    margins = _margins(hw, services[0].settings)
    room = next((led.free_mib for led in combine(hw, mems, margins) if led.device == plc.CPU), 0.0)
    for i in order:  # prompt caches last: they grow as requests come, into what the load left
        sp = planned[i]
        kv_mib = sum(it.mib for items in sp.memory.items.values() for it in items if it.what in ("kv", "rs"))
        pc = prompt_cache(sp.spec.settings, kv_mib, room, sp.spec.name)
        if pc.item is not None:
            room -= pc.item.mib
            by_dev = {**sp.memory.items, plc.CPU: [*sp.memory.items.get(plc.CPU, []), pc.item]}
            sp = replace(sp, memory=replace(sp.memory, items=by_dev))
        if pc.cache_ram_mib != sp.spec.settings.cache_ram_mib:
            sp = replace(sp, spec=replace(sp.spec, settings=replace(sp.spec.settings, cache_ram_mib=pc.cache_ram_mib)))
        planned[i] = sp
    ordered = [planned[i] for i in range(len(services))]
    ledgers = combine(hw, [planned[i].memory for i in order], margins)
    return Plan(hw, ordered, ledgers, k)
