"""Make a plan: one or several services on shared hardware, each with its placement, its ledger, its
predicted speed and its exact command; and the combined verdict per device.

Services with a fixed strategy are planned first; `auto` services then get what is left, so an
orchestrator's experts take the memory the workers do not need (the reference's final layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from moetune.engine.dialect import dialect, n_cpu_moe_note
from moetune.engine.render import override_rules, server_argv, shell_script
from moetune.errors import InputError
from moetune.hardware.inventory import GPU, Inventory, Node
from moetune.model.profile import ModelProfile
from moetune.plan import placement as plc
from moetune.plan.launchspec import RPC as RPC_ROLE
from moetune.plan.launchspec import SERVER, LaunchSpec, ProcessSpec
from moetune.plan.ledger import DeviceLedger, ServiceMemory, combine, service_memory
from moetune.plan.optimize import auto
from moetune.plan.settings import Settings
from moetune.plan.speed import Prediction, SpeedConstants, predict

PLAN_SCHEMA_VERSION = 1
NEAR_LIMIT = 0.97  # warn when a device is this full


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    model: ModelProfile
    settings: Settings = field(default_factory=Settings)
    strategy: str = "auto"
    port: int = 8080
    devices: tuple[str, ...] | None = None  # accelerators this service may use (None: all)
    engine: str = ""  # engine name for launching (moetune engine list)


@dataclass(frozen=True, slots=True)
class ServicePlan:
    spec: ServiceSpec
    hw: Inventory
    placement: plc.Placement
    memory: ServiceMemory
    prediction: Prediction
    argv: list[str]
    notes: list[str]


@dataclass(frozen=True, slots=True)
class Plan:
    hw: Inventory
    services: list[ServicePlan]
    ledgers: list[DeviceLedger]
    constants: SpeedConstants

    @property
    def shortfalls(self) -> list[dict[str, Any]]:
        out = []
        for led in self.ledgers:
            sf = led.first_shortfall()
            if sf:
                out.append({"device": led.device, "mib": round(sf[1], 1), "what": sf[0],
                            "capacity_mib": round(led.capacity_mib, 1), "needed_mib": round(led.used_mib, 1)})
        return out

    @property
    def fits(self) -> bool:
        return not self.shortfalls

    @property
    def main(self) -> ServicePlan:
        return self.services[0]

    def warnings(self) -> list[dict[str, str]]:
        out = []
        for led in self.ledgers:
            if any(i.what == "margin" for i in led.items):
                continue  # the margin is the head-room; a plan that eats it is a shortfall, not a warning
            if led.first_shortfall() is None and led.used_mib > NEAR_LIMIT * led.capacity_mib:
                out.append({"device": led.device, "message": f"{led.device} is {led.used_mib / led.capacity_mib:.0%} "
                            "full: a driver update or another process can tip it over",
                            "remedy": "lower -ub or the context, or move one more layer's experts to the CPU"})
        return out


def _restrict(hw: Inventory, devices: tuple[str, ...] | None) -> Inventory:
    if devices is None:
        return hw
    keep = set(devices)
    known = {d.name for d in hw.accelerators()} | {d.name.split("[", 1)[0] for d in hw.accelerators()}
    missing = keep - known
    if missing:
        raise InputError(f"devices {sorted(missing)} are not in the hardware file")
    local = hw.local
    nodes = [Node(local.name, local.cores, local.ram_mib, local.ram_bw_gbs,
                  tuple(d for d in local.devices if d.name in keep), local.ssh, local.link_addr, local.rpc_port,
                  local.link_gbs, local.bin_dir, local.ram_reserved_mib)]
    for i, n in enumerate(hw.nodes[1:]):
        name = f"RPC{i}"
        nodes.append(n if name in keep or any(k.startswith(name + "[") for k in keep) else replace(n, devices=()))
    return Inventory(tuple(nodes), hw.name, hw.source)


def place(strategy: str, p: ModelProfile, hw: Inventory, s: Settings, reserved: dict[str, float],
          margins: dict[str, float]) -> plc.Placement:
    if strategy == "auto":
        return auto(p, hw, s, reserved, margins)
    if strategy == "cpu-moe":
        return plc.cpu_moe(p, hw)
    if strategy == "all-gpu":
        return plc.gpu_layers(p, hw)
    if strategy.startswith("n-cpu-moe:"):
        try:
            n = int(strategy.split(":", 1)[1])
        except ValueError:
            raise InputError(f"--strategy {strategy}: N must be an integer") from None
        return plc.n_cpu_moe(p, hw, n)
    if strategy.startswith("layers:"):
        return plc.layer_sets(p, hw, strategy.split(":", 1)[1])
    raise InputError(f"--strategy {strategy!r}: choose auto, cpu-moe, all-gpu, n-cpu-moe:N or "
                     "layers:CUDA0=3-14,CUDA1=68-77")


def _margins(hw: Inventory, s: Settings) -> dict[str, float]:
    m = {d.name: s.margin_mib for d in hw.accelerators() if d.kind == GPU}
    m["CPU"] = s.host_margin_mib
    return m


def make_plan(services: list[ServiceSpec], hw: Inventory, constants: SpeedConstants | None = None) -> Plan:
    if not services:
        raise InputError("a plan needs at least one service")
    names = [s.name for s in services]
    if len(set(names)) != len(names):
        raise InputError(f"service names must be unique: {names}")
    k = constants or SpeedConstants()
    order = sorted(range(len(services)), key=lambda i: services[i].strategy == "auto")
    planned: dict[int, ServicePlan] = {}
    mems: list[ServiceMemory] = []
    for i in order:
        spec = services[i]
        spec.settings.validate()
        shw = _restrict(hw, spec.devices)
        reserved: dict[str, float] = {}
        for m in mems:
            for dev, items in m.items.items():
                reserved[dev] = reserved.get(dev, 0.0) + sum(it.mib for it in items)
        margins = _margins(hw, spec.settings)
        pl = place(spec.strategy, spec.model, shw, spec.settings, reserved, margins)
        mem = service_memory(spec.model, shw, pl, spec.settings, spec.name)
        pred = predict(spec.model, shw, pl, spec.settings, k)
        d = dialect(spec.settings.engine)
        extra = ["--device", ",".join(spec.devices)] if spec.devices else []
        argv = server_argv(spec.model, pl, spec.settings, d, port=spec.port, rpc=shw.rpc_endpoints(), extra=extra)
        notes = _notes(spec, pl)
        planned[i] = ServicePlan(spec, shw, pl, mem, pred, argv, notes)
        mems.append(mem)
    ordered = [planned[i] for i in range(len(services))]
    margins = _margins(hw, services[0].settings)
    ledgers = combine(hw, [planned[i].memory for i in order], margins)
    return Plan(hw, ordered, ledgers, k)


def _notes(spec: ServiceSpec, pl: plc.Placement) -> list[str]:
    notes = []
    if spec.strategy.startswith("n-cpu-moe:"):
        n = int(spec.strategy.split(":", 1)[1])
        for kind in ("llama.cpp", "ik_llama.cpp"):
            notes.append(n_cpu_moe_note(dialect(kind), n, spec.model.n_layer))
        notes.append("rendered as explicit -ot overrides, which mean the same in every engine")
    return notes


# ---- JSON -----------------------------------------------------------------------------------
def _layer_map(sp: ServicePlan) -> list[dict[str, Any]]:
    ex = sp.placement.experts()
    by_layer: dict[int, dict[str, str]] = {}
    for t in sp.spec.model.tensors:
        if t.is_expert and t.layer is not None and t.name in ex:
            by_layer.setdefault(t.layer, {})[t.kind] = ex[t.name]
    out = []
    for layer in sp.spec.model.layers:
        if layer.index >= sp.spec.model.n_layer:
            continue
        out.append({"index": layer.index, "kind": layer.kind, "device": sp.placement.layer_device[layer.index],
                    "experts": by_layer.get(layer.index, {}), "expert_mib": round(layer.expert_bytes / (1 << 20), 2)})
    return out


def service_json(sp: ServicePlan) -> dict[str, Any]:
    return {
        "name": sp.spec.name,
        "model": str(sp.spec.model.files[0]),
        "arch": sp.spec.model.arch,
        "strategy": sp.placement.strategy,
        "settings": {k: getattr(sp.spec.settings, k) for k in sp.spec.settings.__slots__},
        "port": sp.spec.port,
        "devices": {dev: [{"what": i.what, "mib": round(i.mib, 2)} for i in items]
                    for dev, items in sp.memory.items.items()},
        "kv_cells": sp.memory.kv_cells,
        "cpu_mapped_span_mib": {f: round(v, 2) for f, v in sp.memory.mapped_span_mib.items()},
        "layers": _layer_map(sp),
        "tensor_split": list(sp.placement.tensor_split),
        "override_rules": [str(r) for r in override_rules(sp.spec.model, sp.placement)],
        "predicted": sp.prediction.to_json(),
        "argv": sp.argv,
        "notes": sp.notes,
    }


def launch_spec(plan: Plan, engine: str) -> LaunchSpec:
    procs: list[ProcessSpec] = []
    workers: list[str] = []
    for i, n in enumerate(plan.hw.nodes[1:]):
        if not n.devices:
            continue
        name = f"rpc{i}"
        host = n.link_addr or "127.0.0.1"
        procs.append(ProcessSpec(name, RPC_ROLE, engine, ("-H", host, "-p", str(n.rpc_port)), host, n.rpc_port,
                                 node=n.name, ssh=n.ssh, bin_dir=n.bin_dir, allow_public_bind=n.allow_public_bind))
        workers.append(name)
    for sp in plan.services:
        procs.append(ProcessSpec(sp.spec.name, SERVER, sp.spec.engine or engine, tuple(sp.argv), "127.0.0.1",
                                 sp.spec.port, after=tuple(workers)))
    return LaunchSpec(tuple(procs))


def plan_json(plan: Plan, engine: str, binary: str = "llama-server") -> dict[str, Any]:
    main = plan.main
    return {
        "schema_version": PLAN_SCHEMA_VERSION,
        "fits": plan.fits,
        "devices": [
            {"name": led.device, "kind": led.kind, "capacity_mib": round(led.capacity_mib, 1),
             "used_mib": round(led.used_mib, 1), "free_mib": round(led.free_mib, 1),
             "items": [{"what": it.what, "mib": round(it.mib, 2), "service": it.service} for it in led.items]}
            for led in plan.ledgers
        ],
        "shortfalls": plan.shortfalls,
        "warnings": plan.warnings(),
        "predicted": {"tg_tok_s": round(main.prediction.tg_tok_s, 3), "pp_tok_s": round(main.prediction.pp_tok_s, 3)},
        "argv": [binary, *main.argv],
        "shell": shell_script(binary, main.argv),
        "services": [service_json(sp) for sp in plan.services],
        "hardware": plan.hw.name or plan.hw.source,
        "speed_constants": main.prediction.to_json()["constants"],
        "launch": launch_spec(plan, engine).to_json(),
    }
