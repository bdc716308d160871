"""The `auto` strategy: fill each accelerator's budget with expert tensors to minimise decode time.

Decode reads ``k/E`` of every expert tensor per token, so per MiB every expert tensor saves the
same time when it moves from RAM to a faster device, whatever its layer. The optimizer therefore
(1) keeps the non-expert weights, KV cache and compute buffers on the accelerators (they are worth
``E/k`` times more per MiB), (2) moves whole layers' experts onto the device that holds the layer
(a layer with no expert left on the CPU saves two graph splits), lowest layers first so the ``-ot``
regex stays compact, then onto other accelerators with room, and (3) fills what is left with
single tensors (gate, up, down), largest that fits first. The ledger is rebuilt after each device
is filled, and tensors are taken back until every device fits, since compute buffers grow when a
device gains expert work.
"""

from __future__ import annotations

from collections import defaultdict

from moetune.hardware.inventory import Inventory
from moetune.kinds import StrategyKind
from moetune.model.profile import ModelProfile, Tensor
from moetune.plan.ledger import combine, service_memory
from moetune.plan.placement import CPU, Placement, cpu_moe, expert_tensors, with_experts
from moetune.plan.settings import Settings

MIB = 1 << 20


def _free(
    p: ModelProfile, hw: Inventory, pl: Placement, s: Settings, *, reserved: dict[str, float], margins: dict[str, float]
) -> dict[str, float]:
    """Free MiB per accelerator under a placement, after other services' reservations."""
    sm = service_memory(p, hw, pl, s)
    out = {}
    for led in combine(hw, [sm], margins):
        if led.device == CPU:
            continue
        out[led.device] = led.free_mib - reserved.get(led.device, 0.0)
    return out


def auto(
    p: ModelProfile,
    hw: Inventory,
    s: Settings,
    reserved: dict[str, float] | None = None,
    *,
    margins: dict[str, float] | None = None,
) -> Placement:
    reserved = reserved or {}
    margins = margins or {}
    base = cpu_moe(p, hw)
    accs = [d.name for d in hw.accelerators()]
    if not accs:
        return Placement(
            strategy=str(StrategyKind.AUTO),
            layer_device=base.layer_device,
            output_device=base.output_device,
            expert_device=base.expert_device,
            tensor_split=base.tensor_split,
        )
    experts = dict(base.expert_device)
    by_layer: dict[int, list[Tensor]] = defaultdict(list)
    for t in expert_tensors(p):
        assert t.layer is not None
        by_layer[t.layer].append(t)
    free = _free(p, hw, base, s, reserved=reserved, margins=margins)
    # headroom for the compute buffer growing once a device computes experts
    grow = {d: _compute_growth(p, hw, base, s, dev=d) for d in accs}
    budget = {d: free[d] - grow[d] for d in accs}

    def place_layers(target: str, layers: list[int]) -> None:
        for il in layers:
            ts = [t for t in by_layer[il] if experts[t.name] == CPU]
            need = sum(t.nbytes for t in ts) / MIB
            if ts and need <= budget[target]:
                for t in ts:
                    experts[t.name] = target
                budget[target] -= need

    moe_layers = sorted(by_layer)
    # (2a) whole layers on their own device
    for d in accs:
        place_layers(d, [il for il in moe_layers if base.layer_device[il] == d])
    # (2b) whole layers on other accelerators with room, nearest layers first
    for d in sorted(accs, key=lambda n: -budget[n]):
        place_layers(d, [il for il in moe_layers if base.layer_device[il] != d])
    # (3) single tensors, largest that fits
    singles = sorted(
        (t for il in moe_layers for t in by_layer[il] if experts[t.name] == CPU), key=lambda t: (-t.nbytes, t.layer)
    )
    for d in sorted(accs, key=lambda n: -budget[n]):
        for t in singles:
            mib = t.nbytes / MIB
            if experts[t.name] == CPU and mib <= budget[d]:
                experts[t.name] = d
                budget[d] -= mib
    # verify with the real ledger; give back the last tensors placed on a device that overflows
    order = [name for name, dev in experts.items() if dev != CPU]
    for _ in range(len(order) + 1):
        pl = with_experts(base, experts, str(StrategyKind.AUTO))
        free = _free(p, hw, pl, s, reserved=reserved, margins=margins)
        over = [d for d in accs if free[d] < 0]
        if not over:
            return pl
        for d in over:
            mine = [n for n in order if experts[n] == d]
            if mine:
                experts[mine[-1]] = CPU
    return with_experts(base, experts, str(StrategyKind.AUTO))


def _compute_growth(p: ModelProfile, hw: Inventory, base: Placement, s: Settings, *, dev: str) -> float:
    """MiB the compute buffer of `dev` grows by when it gains expert work."""
    trial = {name: (dev if i == 0 else d) for i, (name, d) in enumerate(base.expert_device)}
    with_one = with_experts(base, trial, "probe")
    before = _compute_mib(p, hw, base, s, dev=dev)
    after = _compute_mib(p, hw, with_one, s, dev=dev)
    return max(0.0, after - before)


def _compute_mib(p: ModelProfile, hw: Inventory, pl: Placement, s: Settings, *, dev: str) -> float:
    sm = service_memory(p, hw, pl, s)
    return sum(i.mib for i in sm.items.get(dev, []) if i.what == "compute")
