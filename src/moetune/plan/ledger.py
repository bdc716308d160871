"""The memory ledger: what each device must hold for one service, item by item, in the order the
engine allocates it (weights, KV cache, compute buffer, output buffer), plus backend overhead and a
margin. Pure: a profile, a placement and settings in, numbers out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from moetune.hardware.inventory import Inventory
from moetune.jsonread import real
from moetune.kinds import DeviceKind, EngineKind
from moetune.model import kv
from moetune.model.kv import KVShape, checkpoint_bytes, full_cells, kv_shape
from moetune.model.profile import ModelProfile, Tensor
from moetune.plan import graph_split
from moetune.plan.compute import ComputeInputs, DeviceRole, compute_bytes, reserve_bytes
from moetune.plan.graph import Sites
from moetune.plan.placement import CPU, Placement, tensor_device
from moetune.plan.repack import Repacked, in_place, repacked
from moetune.plan.settings import Settings

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Item:
    what: str  # weights | weights (pinned) | weights (mapped) | weights (split) | repack | kv | rs | compute | output
    #            | checkpoints | prompt cache | overhead | margin
    mib: float
    service: str = ""
    note: str = ""  # how the figure arises, where the name alone does not say


@dataclass(frozen=True, slots=True)
class DeviceLedger:
    device: str
    kind: str
    capacity_mib: float
    items: tuple[Item, ...]

    @property
    def used_mib(self) -> float:
        return sum(i.mib for i in self.items)

    @property
    def free_mib(self) -> float:
        return self.capacity_mib - self.used_mib

    def shortfall(self) -> Shortfall | None:
        """What the device lacks, or None if everything fits (the margin included)."""
        if self.used_mib <= self.capacity_mib + 1e-6:
            return None
        acc = 0.0
        what = "margin"
        for it in self.items:
            acc += it.mib
            if acc > self.capacity_mib + 1e-6:
                what = it.what
                break
        margin = sum((i.mib for i in self.items if i.what == "margin"), 0.0)
        return Shortfall(
            device=self.device, what=what, needed_mib=self.used_mib, capacity_mib=self.capacity_mib, margin_mib=margin
        )


def whole_mib(mib: float) -> int:
    """MiB as printed: rounded to the tenth the plan's JSON keeps, then to a whole MiB, so that sums and
    differences of printed numbers agree whether they are made from the plan or from its JSON."""
    return round(round(mib, 1))


@dataclass(frozen=True, slots=True, kw_only=True)
class Shortfall:
    """A device that cannot hold what the plan puts on it."""

    device: str
    what: (
        str  # the first item, in allocation order, that crosses the capacity ("margin": only the head-room is missing)
    )
    needed_mib: float  # every item on the device, the margin included
    capacity_mib: float
    margin_mib: float = 0.0

    @property
    def mib(self) -> float:
        """MiB missing: needed minus capacity."""
        return self.needed_mib - self.capacity_mib

    def message(self) -> str:
        """One sentence whose numbers add up as printed (each rounded to whole MiB first)."""
        need, cap, margin = whole_mib(self.needed_mib), whole_mib(self.capacity_mib), whole_mib(self.margin_mib)
        text = f"{self.device} is short by {need - cap:,} MiB: needs {need:,} of {cap:,} MiB"
        if margin:
            text += f" ({margin:,} MiB of margin included)"
        if self.what == "margin":
            return text + f"; everything but the margin fits, with {cap - (need - margin):,} MiB to spare"
        return text + f"; it runs out when allocating its {self.what}"

    def to_json(self) -> dict[str, object]:
        return {
            "device": self.device,
            "mib": round(self.mib, 1),
            "what": self.what,
            "needed_mib": round(self.needed_mib, 1),
            "capacity_mib": round(self.capacity_mib, 1),
            "margin_mib": round(self.margin_mib, 1),
            "message": self.message(),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> Shortfall:
        """Read a plan document's entry (plans written before ``margin_mib`` have none)."""
        return cls(
            device=str(d["device"]),
            what=str(d["what"]),
            needed_mib=real(d["needed_mib"]),
            capacity_mib=real(d["capacity_mib"]),
            margin_mib=real(d.get("margin_mib") or 0.0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceMemory:
    """One service's items per device, before they are summed with other services'."""

    service: str
    items: dict[str, list[Item]] = field(default_factory=dict)
    mapped_span_mib: dict[str, float] = field(default_factory=dict)  # CPU_Mapped buffer per file (log check)
    kv_cells: int = 0
    tensors_on: dict[str, list[str]] = field(default_factory=dict)
    # mainline: the compute buffers as llama-fit-params projects them (every ubatch token an output)
    dry_run_compute_mib: dict[str, float] = field(default_factory=dict)
    swa_cells: int = 0  # cells of the sliding-window layers' cache (0: the model has none)


def kv_cells(s: Settings) -> int:
    """KV cells llama.cpp allocates for the full-attention layers (``model.kv.full_cells``)."""
    return full_cells(s.ctx, s.slots, s.kv_unified)


def swa_cells(s: Settings, n_swa: int) -> int:
    """Cells of the sliding-window layers' cache (``model.kv.swa_cells``)."""
    return kv.swa_cells(s.ctx, s.slots, s.ubatch, n_swa, unified=s.kv_unified, swa_full=s.swa_full)


def loaded(p: ModelProfile, s: Settings) -> list[Tensor]:
    """Tensors the engine loads: mainline skips NextN/MTP blocks unless MTP drafting is on;
    ik_llama.cpp also skips the DSA indexer tensors it does not implement."""
    ts = p.loaded_tensors(with_nextn=s.mtp)
    if p.arch == "glm-dsa" and s.engine != EngineKind.IK and not s.mtp and p.n_nextn:
        # mainline's glm-dsa loader creates the NextN blocks' expert-bias tensor without the MTP flag
        ts += [t for t in p.tensors if t.kind == "exp_probs_b" and t.layer is not None and t.layer >= p.n_layer]
    if s.engine == EngineKind.IK:
        ts = [t for t in ts if not t.kind.startswith("indexer.")]
    return ts


def service_memory(
    p: ModelProfile, hw: Inventory, pl: Placement, s: Settings, *, service: str = "main", dry_run: bool = False
) -> ServiceMemory:
    """``dry_run``: also the compute buffers as llama-fit-params projects them (mainline; for the
    plan's document and ``--verify``, not for the placement search)."""
    has_gpu = any(d.kind == DeviceKind.GPU for d in hw.accelerators())
    experts = pl.experts()
    weights: dict[str, int] = defaultdict(int)
    on: dict[str, list[str]] = defaultdict(list)
    spans: dict[int, list[int]] = {}
    placed = [(t, tensor_device(t, pl, experts)) for t in loaded(p, s)]
    rp = repack_buffers([t for t, d in placed if d == CPU], hw, s)
    share = graph_split.shares(hw) if s.split_mode == "graph" else {}
    split: dict[str, float] = defaultdict(float)  # graph split: each GPU's part of the CUDA_Split buffer
    for t, d in placed:
        on[d].append(t.name)
        if graph_split.is_split(t, d, pl.layer_device, p.n_layer, share=share):
            for g, b in graph_split.parts(t, share).items():
                split[g] += b
            continue
        if t.name in rp.names:  # moved into the repack buffer: neither mapped nor loaded as it is
            continue
        weights[d] += t.nbytes
        if d == CPU:
            lo, hi = spans.get(t.file_index, [t.offset, t.offset + t.nbytes])
            spans[t.file_index] = [min(lo, t.offset), max(hi, t.offset + t.nbytes)]
    items: dict[str, list[Item]] = defaultdict(list)
    for acc in hw.accelerators():
        if acc.kind == DeviceKind.GPU:
            items[acc.name].append(Item("overhead", s.gpu_overhead_mib, service))
    mmap = s.mmap and not in_place(s.engine, s.repacks)  # ik's -rtr reads the weights instead of mapping them
    for dev, nbytes in weights.items():
        label = "weights"
        if dev == CPU:
            label = "weights (pinned)" if has_gpu and (s.engine == EngineKind.IK or not mmap) else "weights"
        items[dev].append(Item(label, nbytes / MIB, service))
    for dev, nbytes_f in split.items():
        items[dev].append(
            Item(
                "weights (split)",
                nbytes_f / MIB,
                service,
                note=f"{share[dev]:.0%} of each offloaded layer (-sm graph), norms and routers whole",
            )
        )
    if rp.nbytes:
        items[CPU].append(Item("repack", rp.nbytes / MIB, service))
    # KV cache and recurrent state follow their layer
    kv: KVShape = kv_shape(p, s.engine)
    cells, cells_swa = kv_cells(s), swa_cells(s, kv.n_swa)
    kv_by_dev: dict[str, float] = defaultdict(float)

    def add_kv(layer: int, nbytes: float) -> None:
        dev = pl.layer_device[layer]
        for d, f in share.items() if dev in share else ((dev, 1.0),):  # graph split: divided with the heads
            kv_by_dev[d] += nbytes * f

    for lk in kv.layers:
        add_kv(lk.layer, KVShape.layer_bytes_per_token(lk, s.ctk, s.ctv) * (cells_swa if lk.swa else cells))
    for layer in kv.recurrent_layers:
        add_kv(layer, kv.rs_bytes_per_layer_seq * s.slots)
    for dev, kv_bytes in kv_by_dev.items():
        items[dev].append(Item("kv", kv_bytes / MIB, service))
    # compute buffers
    streams = 1 if s.kv_unified or s.slots <= 1 else s.slots
    inp = ComputeInputs(
        ubatch=s.ubatch,
        ctx=s.ctx,
        slots=s.slots,
        flash_attn=s.flash_attn,
        kv_unified=s.kv_unified,
        amb_mib=s.amb_mib,
        ctk=s.ctk,
        ctv=s.ctv,
        n_kv_swa=cells_swa // streams if kv.n_swa else 0,
    )
    projected: dict[str, float] = {}
    if s.engine == EngineKind.IK:
        for d, role in device_roles(p, pl, experts).items():
            items[d].append(Item("compute", compute_bytes(p, inp, role) / MIB, service))
    else:
        # llama-server reserves the logits of one token per slot (tools/server/server-context.cpp,
        # ``server_output_limits``: ``n_outputs_max = n_parallel``, no draft model in moetune's commands);
        # llama-fit-params keeps llama_context's default, every token of the ubatch (``n_outputs_max = n_batch``)
        for d, nbytes in mainline_compute(p, hw, pl, replace(inp, n_outputs=s.slots)).items():
            if nbytes:
                items[d].append(Item("compute", nbytes / MIB, service))
        if dry_run:
            projected = {d: b / MIB for d, b in mainline_compute(p, hw, pl, inp).items() if b}
    items[CPU].append(Item("output", p.n_vocab * 4 * s.slots / MIB, service))
    if ckpt := checkpoints_item(kv, s, service):
        items[CPU].append(ckpt)
    mapped = {} if not mmap else {str(p.files[i]): (hi - lo) / MIB for i, (lo, hi) in spans.items()}
    return ServiceMemory(
        service=service,
        items=dict(items),
        mapped_span_mib=mapped,
        kv_cells=cells,
        tensors_on=dict(on),
        dry_run_compute_mib=projected,
        swa_cells=cells_swa if kv.n_swa else 0,
    )


def checkpoints_item(kv: KVShape, s: Settings, service: str = "") -> Item | None:
    """The context checkpoints' host memory: each slot keeps up to ``--ctx-checkpoints`` copies of
    the state that cannot be rolled back (``model.kv.checkpoint_bytes``); None where the server
    makes none. The server allocates them as prompts are processed, not at load."""
    streams = 1 if s.kv_unified or s.slots <= 1 else s.slots
    each = checkpoint_bytes(
        kv, s.engine, s.ctk, s.ctv, tokens_per_slot=s.ctx // s.slots, swa_full=s.swa_full, streams=streams
    )
    n = s.checkpoints_per_slot
    if not each or not n:
        return None
    return Item(
        "checkpoints",
        s.slots * n * each / MIB,
        service,
        note=f"{s.slots} slot(s) x up to {n} x {each / MIB:.3f} MiB: host RAM the server takes as prompts "
        "are processed, not at load (--ctx-checkpoints)",
    )


@dataclass(frozen=True, slots=True)
class PromptCache:
    """Mainline's prompt cache in host RAM (``server_prompt_cache``): the ledger's item, and the
    ``--cache-ram`` the command says (None: the engine's default stands)."""

    item: Item | None
    cache_ram_mib: int | None


def prompt_cache(s: Settings, kv_mib: float, room_mib: float, service: str = "") -> PromptCache:
    """The prompt cache a service's server may fill as requests come (states of finished prompts,
    their checkpoints with them, oldest dropped first), bounded by ``--cache-ram`` MiB; with -1 by
    the context's tokens (``n_ctx``: about ``kv_mib``, one full cache). Left to the engine (None),
    it is mainline's 8 GiB where the host has that much left (``room_mib``, after every service's
    weights and caches), else what is left: the plan then says ``--cache-ram`` with it, so the cache
    never takes the RAM the weights need. ik_llama.cpp keeps none."""
    from moetune.plan.settings import ENGINE_CACHE_RAM_MIB

    v = s.cache_ram_mib
    if s.engine != EngineKind.MAINLINE or v == 0:
        return PromptCache(None, v)
    grows = "host RAM the server takes as prompts are cached, not at load"
    if v == -1:
        return PromptCache(
            Item(
                "prompt cache",
                kv_mib,
                service,
                f"--cache-ram -1 (no limit): up to the context's tokens of cached prompts; {grows}",
            ),
            v,
        )
    if v is not None:
        return PromptCache(Item("prompt cache", float(v), service, f"--cache-ram {v}: {grows}"), v)
    cap = int(max(0.0, min(float(ENGINE_CACHE_RAM_MIB), room_mib)))
    if cap >= ENGINE_CACHE_RAM_MIB:
        return PromptCache(
            Item(
                "prompt cache",
                float(ENGINE_CACHE_RAM_MIB),
                service,
                f"the engine's default --cache-ram {ENGINE_CACHE_RAM_MIB}: {grows}",
            ),
            None,
        )
    if cap == 0:
        return PromptCache(None, 0)  # no room left: --cache-ram 0, the server caches no prompts
    return PromptCache(
        Item(
            "prompt cache",
            float(cap),
            service,
            f"--cache-ram {cap}: the host RAM left of the engine's {ENGINE_CACHE_RAM_MIB}; {grows}",
        ),
        cap,
    )


def repack_buffers(cpu: list[Tensor], hw: Inventory, s: Settings) -> Repacked:
    """Of the CPU-resident weights, those mainline moves into its repack buffers (AMX, CPU_REPACK)
    where the plan repacks (:mod:`moetune.plan.repack`): the ledger's ``repack`` line, beside the
    mapped file."""
    return repacked(
        cpu,
        engine=s.engine,
        repack=s.repacks,
        isa=hw.local.cpu_isa,
        local_gpu=any(d.kind == DeviceKind.GPU for d in hw.local.devices),
    )


def mainline_compute(p: ModelProfile, hw: Inventory, pl: Placement, inp: ComputeInputs) -> dict[str, int]:
    """Mainline llama.cpp's compute buffer per device. A CUDA GPU runs the matmuls of host-resident
    weights itself at 32 tokens or more (op offload: the first GPU in the engine's order, RPC
    devices having no offload); several accelerators with every layer offloaded and no tensor
    override turn on pipeline parallelism (``llama_context``: ``pipeline_parallel``)."""
    experts = pl.experts()
    sites = Sites(tuple(pl.layer_device[: p.n_layer]), experts, pl.output_device)
    accs = hw.accelerators()
    offload = next((d.name for d in accs if d.kind == DeviceKind.GPU), "")
    pipeline = len(accs) > 1 and all(d == pl.layer_device[int(n.split(".")[1])] for n, d in experts.items())
    return reserve_bytes(
        p, inp, sites, [d.name for d in hw.devices()], offload_to=offload, n_copies=4 if pipeline else 1
    )


def device_roles(p: ModelProfile, pl: Placement, experts: dict[str, str]) -> dict[str, DeviceRole]:
    layer_devs = set(pl.layer_device[: p.n_layer])
    expert_devs = set(experts.values())
    dense_devs = {pl.layer_device[i] for i in range(min(p.n_dense_lead, p.n_layer))}
    roles: dict[str, DeviceRole] = {}
    for d in sorted(layer_devs | expert_devs | {pl.output_device, CPU}):
        host = d == CPU and bool(layer_devs - {CPU})
        roles[d] = DeviceRole(
            layers=d in layer_devs,
            experts=d in expert_devs,
            dense=d in dense_devs,
            output=d == pl.output_device,
            host=host,
            cpu=d == CPU,
        )
    return roles


def capacity(hw: Inventory, name: str) -> tuple[str, float]:
    if name == CPU:
        c = hw.cpu()
        return DeviceKind.CPU, c.mem_mib - c.reserved_mib
    d = hw.device(name)
    return d.kind, d.usable_mib


def combine(hw: Inventory, services: list[ServiceMemory], s_margin: dict[str, float]) -> list[DeviceLedger]:
    """Sum the services' items per device, add each device's margin, in llama.cpp device order."""
    out = []
    for d in hw.devices():
        items = [it for sm in services for it in sm.items.get(d.name, [])]
        kind, cap = capacity(hw, d.name)
        m = s_margin.get(d.name, 0.0)
        if m:
            items.append(Item("margin", m))
        out.append(DeviceLedger(d.name, kind, cap, tuple(items)))
    return out
