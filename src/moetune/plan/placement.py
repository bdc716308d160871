"""Placement: which device holds each layer (its attention, norms, router and KV cache) and each
expert tensor. Pure functions over the model profile and the hardware.

Layers follow llama.cpp's own split rule (``-ngl`` and ``-ts``: contiguous runs of layers, RPC
devices first, the output layer with the last); expert tensors are then moved with ``-ot``.
A layer's KV cache follows the layer, so weights are spilled to the CPU with ``-ot``, never by
lowering ``-ngl``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

from moetune.errors import InputError
from moetune.hardware.inventory import Inventory
from moetune.kinds import StrategyKind
from moetune.model.profile import ModelProfile, Tensor

CPU = "CPU"
STRATEGY_SYNTAX = "auto, cpu-moe, all-gpu, n-cpu-moe:N, layers:CUDA0=3-14,CUDA1=68-77 or head-tail:H+T[+M]"


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """A strategy string, parsed (:func:`parse_strategy`): the one reading of it that planning and
    rendering share; ``str()`` writes it back in its canonical form."""

    kind: StrategyKind
    n: int = 0  # n-cpu-moe:N
    spec: str = ""  # layers:SPEC
    head: int = 0  # head-tail:H+T+M: the first H, the last T and M middle MoE layers' experts on the accelerators
    tail: int = 0
    middle: int = 0

    def __str__(self) -> str:
        if self.kind == StrategyKind.N_CPU_MOE:
            return f"{self.kind}:{self.n}"
        if self.kind == StrategyKind.LAYERS:
            return f"{self.kind}:{self.spec}"
        if self.kind == StrategyKind.HEAD_TAIL:
            return f"{self.kind}:{self.head}+{self.tail}" + (f"+{self.middle}" if self.middle else "")
        return str(self.kind)


_HEAD_TAIL = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*(?:\+\s*(\d+)\s*)?$")


def parse_strategy(text: str, what: str = "--strategy") -> Strategy:
    """``auto``, ``cpu-moe``, ``all-gpu``, ``n-cpu-moe:N``, ``layers:CUDA0=3-14,CUDA1=68-77`` or
    ``head-tail:H+T[+M]`` (syntax only: a layer set's devices and layers are checked against the
    model and the hardware when placed). ``what``: the option the text came from, for the errors."""
    s = text.strip()
    bare = {str(k): k for k in StrategyKind if not k.takes_argument}
    if s in bare:
        return Strategy(kind=bare[s])
    head, sep, arg = s.partition(":")
    if sep and head == StrategyKind.N_CPU_MOE:
        try:
            return Strategy(kind=StrategyKind.N_CPU_MOE, n=int(arg))
        except ValueError:
            raise InputError(f"{what} {s!r}: N must be an integer", hint="n-cpu-moe:64") from None
    if sep and head == StrategyKind.LAYERS and arg.strip():
        return Strategy(kind=StrategyKind.LAYERS, spec=arg.strip())
    if sep and head == StrategyKind.HEAD_TAIL:
        m = _HEAD_TAIL.match(arg)
        if not m:
            raise InputError(
                f"{what} {s!r}: expected head-tail:H+T or head-tail:H+T+M (layer counts)",
                hint="head-tail:12+10 (first 12, last 10 MoE layers), head-tail:8+8+4 (and 4 middle)",
            )
        return Strategy(kind=StrategyKind.HEAD_TAIL, head=int(m[1]), tail=int(m[2]), middle=int(m[3] or 0))
    raise InputError(f"{what} {s!r}: choose {STRATEGY_SYNTAX}")


def head_tail_name(head: int, tail: int, middle: int = 0) -> str:
    return str(Strategy(kind=StrategyKind.HEAD_TAIL, head=head, tail=tail, middle=middle))


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    strategy: str
    layer_device: tuple[str, ...]  # device per block (trunk and NextN), index = layer
    output_device: str
    expert_device: tuple[tuple[str, str], ...]  # (tensor name, device) for every routed-expert tensor
    tensor_split: tuple[int, ...] = ()  # -ts values, one per accelerator, when more than one

    def experts(self) -> dict[str, str]:
        return dict(self.expert_device)


def tensor_device(t: Tensor, pl: Placement, experts: dict[str, str] | None = None) -> str:
    """Where a tensor lives under a placement."""
    if t.layer is None:
        if t.kind == "token_embd":
            return CPU  # llama.cpp keeps the input layer on the CPU
        return pl.output_device if t.kind in ("output", "output_norm") else CPU
    if t.is_expert:
        ex = experts if experts is not None else pl.experts()
        return ex.get(t.name, pl.layer_device[t.layer])
    return pl.layer_device[t.layer]


def layer_split(n_blocks: int, counts: list[int], names: list[str]) -> tuple[list[str], str]:
    """llama.cpp's rule: with -ngl all and -ts counts, block ``il`` goes to the device whose
    cumulative share first exceeds ``il / (n_blocks + 1)``; the output layer is index n_blocks."""
    if not names:
        return [CPU] * n_blocks, CPU
    total = sum(counts)
    cum: list[float] = []
    acc = 0.0
    for c in counts:
        acc += c
        cum.append(acc / total)
    act = n_blocks + 1

    def dev(il: int) -> str:
        i = bisect.bisect_right(cum, il / act)
        return names[min(i, len(names) - 1)]

    return [dev(i) for i in range(n_blocks)], dev(n_blocks)


def split_counts(n_blocks: int, weights: list[float]) -> list[int]:
    """Integer -ts counts (summing to n_blocks + 1) proportional to the weights, each at least 1."""
    n = n_blocks + 1
    if len(weights) == 1:
        return [n]
    total = sum(weights)
    raw = [w / total * n for w in weights]
    counts = [max(1, int(r)) for r in raw]
    while sum(counts) < n:
        i = max(range(len(raw)), key=lambda j: raw[j] - counts[j])
        counts[i] += 1
    while sum(counts) > n:
        i = max(range(len(raw)), key=lambda j: counts[j] - raw[j])
        counts[i] -= 1
    return counts


def base_layers(
    p: ModelProfile, hw: Inventory, counts: list[int] | None = None
) -> tuple[list[str], str, tuple[int, ...]]:
    """Layer devices when every layer is offloaded (-ngl all), split over the accelerators."""
    accs = hw.accelerators()
    if not accs:
        return [CPU] * p.n_layer_all, CPU, ()
    if counts is None:
        counts = split_counts(p.n_layer_all, [d.usable_mib for d in accs])
    layers, out = layer_split(p.n_layer_all, counts, [d.name for d in accs])
    return layers, out, tuple(counts) if len(accs) > 1 else ()


def expert_tensors(p: ModelProfile) -> list[Tensor]:
    return [t for t in p.tensors if t.is_expert and t.layer is not None and t.layer < p.n_layer]


def _make(
    strategy: str,
    p: ModelProfile,
    hw: Inventory,
    on_cpu: set[int] | None,
    *,
    explicit: dict[int, str] | None = None,
    counts: list[int] | None = None,
) -> Placement:
    layers, out, ts = base_layers(p, hw, counts)
    ex = []
    for t in expert_tensors(p):
        assert t.layer is not None
        if explicit is not None:
            ex.append((t.name, explicit.get(t.layer, CPU)))
        elif on_cpu is not None and t.layer in on_cpu:
            ex.append((t.name, CPU))
        else:
            ex.append((t.name, layers[t.layer]))
    return Placement(
        strategy=strategy, layer_device=tuple(layers), output_device=out, expert_device=tuple(ex), tensor_split=ts
    )


def cpu_moe(p: ModelProfile, hw: Inventory) -> Placement:
    return _make(str(StrategyKind.CPU_MOE), p, hw, set(range(p.n_layer_all)))


def n_cpu_moe(p: ModelProfile, hw: Inventory, n: int) -> Placement:
    """Experts of the first N layers on the CPU (mainline's --n-cpu-moe N)."""
    if n < 0:
        raise InputError(f"n-cpu-moe:{n}: N must be >= 0")
    return _make(str(Strategy(kind=StrategyKind.N_CPU_MOE, n=n)), p, hw, set(range(n)))


def gpu_layers(p: ModelProfile, hw: Inventory) -> Placement:
    """Everything on the accelerators (no expert override)."""
    return _make(str(StrategyKind.ALL_GPU), p, hw, set())


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_layer_sets(spec: str, p: ModelProfile, hw: Inventory) -> dict[int, str]:
    """``CUDA0=3-14,CUDA1=68-77`` (ranges inclusive; ``+`` joins ranges: ``CUDA0=3-8+70-77``)."""
    names = {d.name: d for d in hw.accelerators()}
    aliases = {alias: names[full] for full, alias in hw.engine_names().items()}  # RPC0, RPC1, CUDA0
    out: dict[int, str] = {}
    for part in spec.split(","):
        dev_s, sep, ranges = part.partition("=")
        dev = names.get(dev_s.strip()) or aliases.get(dev_s.strip())
        if not sep or dev is None:
            raise InputError(
                f"layers:{spec}: {part!r} is not DEVICE=RANGE with a device of the hardware file "
                f"(devices: {', '.join(names) or 'none'})"
            )
        for r in ranges.split("+"):
            m = _RANGE.match(r)
            if not m:
                raise InputError(f"layers:{spec}: {r!r} is not a layer or a range like 3-14")
            a, b = int(m[1]), int(m[2] or m[1])
            for i in range(min(a, b), max(a, b) + 1):
                if i >= p.n_layer:
                    raise InputError(f"layers:{spec}: layer {i} does not exist (trunk layers 0-{p.n_layer - 1})")
                out[i] = dev.name
    return out


def layer_sets(p: ModelProfile, hw: Inventory, spec: str) -> Placement:
    return _make(
        str(Strategy(kind=StrategyKind.LAYERS, spec=spec)), p, hw, None, explicit=parse_layer_sets(spec, p, hw)
    )


def moe_layers(p: ModelProfile) -> list[int]:
    """The trunk layers with routed experts, in order."""
    return sorted({t.layer for t in expert_tensors(p) if t.layer is not None})


def spread(layers: Sequence[int], n: int) -> list[int]:
    """``n`` of ``layers`` evenly spaced (the middle of each of n equal stretches)."""
    return [layers[(2 * k + 1) * len(layers) // (2 * n)] for k in range(n)] if n else []


def head_tail_layers(p: ModelProfile, head: int, tail: int, middle: int = 0) -> set[int]:
    """The MoE layers of ``head-tail:H+T+M``: the first H, the last T, and M spread evenly over the
    ones between (reference 000's 20-layer set: head 8, tail 8, middle 4)."""
    moe = moe_layers(p)
    name = head_tail_name(head, tail, middle)
    if head + tail + middle > len(moe):
        raise InputError(
            f"{name}: {head + tail + middle} layers, the model has {len(moe)} MoE layers ({moe[0]}-{moe[-1]})"
            if moe
            else f"{name}: the model has no MoE layers"
        )
    between = moe[head : len(moe) - tail]
    return {*moe[:head], *moe[len(moe) - tail :], *spread(between, middle)}


def head_tail(p: ModelProfile, hw: Inventory, head: int, tail: int, *, middle: int = 0) -> Placement:
    """The experts of the first H and last T MoE layers (and M middle ones) on the accelerators,
    each with its layer (the layer split spreads the layers over the accelerators by their memory:
    with two, the head's experts land on the first, the tail's on the last), the rest on the CPU."""
    keep = head_tail_layers(p, head, tail, middle)
    return _make(head_tail_name(head, tail, middle), p, hw, set(moe_layers(p)) - keep)


def accelerator_expert_layers(p: ModelProfile, pl: Placement) -> int:
    """How many MoE layers' worth of expert bytes a placement keeps off the CPU (whole layers, at
    the model's mean expert bytes per MoE layer): the expert budget a head/tail split can share."""
    ts = expert_tensors(p)
    n = len(moe_layers(p))
    total = sum(t.nbytes for t in ts)
    if not total or not n:
        return 0
    ex = pl.experts()
    off = sum(t.nbytes for t in ts if ex.get(t.name, CPU) != CPU)
    return int(off * n / total + 1e-9)


def with_experts(pl: Placement, experts: dict[str, str], strategy: str) -> Placement:
    return Placement(
        strategy=strategy,
        layer_device=pl.layer_device,
        output_device=pl.output_device,
        expert_device=tuple(experts.items()),
        tensor_split=pl.tensor_split,
    )
