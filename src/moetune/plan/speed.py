"""First-order speed model: decode (TG) and prefill (PP) throughput of a placement.

Decode, per token: each device reads its non-expert weights, ``k/E`` of its expert tensors and, at
depth ``d``, ``d`` tokens of its layers' KV cache, at its memory bandwidth times an efficiency;
plus a fixed cost per graph split (a backend switch) and per RPC hop. Prefill, per ubatch: matmul
FLOPs on each device at its throughput; on a GPU build, expert weights left on the CPU are streamed
over the host link once per ubatch (llama.cpp offloads batches of 32+ tokens to the GPU).

Every constant is in :class:`SpeedConstants`, printed with each prediction and overridable
(``--speed K=V``); calibration from measured runs fits them.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from moetune.errors import InputError
from moetune.hardware.inventory import Inventory
from moetune.kinds import DeviceKind
from moetune.model.kv import KVShape, kv_shape
from moetune.model.profile import ModelProfile
from moetune.plan.ledger import loaded
from moetune.plan.placement import CPU, Placement, tensor_device
from moetune.plan.settings import Settings

GB = 1e9


@dataclass(frozen=True, slots=True)
class SpeedConstants:
    gpu_bw_eff: float = 0.75  # share of a GPU's memory bandwidth a decode step reaches
    cpu_bw_eff: float = 0.55  # share of RAM bandwidth the CPU expert matmuls reach
    split_us: float = 25.0  # cost of one backend switch (sync, copy of the activations)
    rpc_hop_us: float = 150.0  # extra cost of a switch to or from an RPC device (network round trip)
    token_overhead_us: float = 300.0  # sampling, graph launch, bookkeeping per token
    gpu_tflops: float = 80.0  # effective matmul throughput of a GPU without a declared figure
    cpu_gflops_per_core: float = 40.0  # effective matmul throughput per CPU core
    offload_min_batch: int = 32  # llama.cpp moves CPU-resident matmuls to the GPU for batches this big
    # attention over the context while decoding, beyond reading the cache: small, latency-bound
    # kernels, far below matmul throughput (2.4-2.8 GFLOP/s on 2 cores of the test machine)
    cpu_ctx_gflops_per_core: float = 1.5
    gpu_ctx_tflops: float = 20.0

    def with_overrides(self, pairs: dict[str, str]) -> SpeedConstants:
        names = {f.name: f.type for f in fields(self)}
        kw: dict[str, Any] = {}
        for k, v in pairs.items():
            if k not in names:
                raise InputError(f"--speed {k}: unknown constant (known: {', '.join(names)})")
            try:
                kw[k] = int(v) if k == "offload_min_batch" else float(v)
            except ValueError:
                raise InputError(f"--speed {k}={v}: not a number") from None
        return replace(self, **kw)


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    device: str
    read_mib_per_token: float
    decode_ms: float
    bw_gbs: float = 0.0  # the device's memory bandwidth in the hardware file (the physical limit)
    kv_mib_per_1k_depth: float = 0.0  # more read per token for each 1000 tokens of context
    ctx_gflop_per_1k_depth: float = 0.0  # attention work per token for each 1000 tokens of context
    cores: int = 0  # the CPU's cores (its attention runs on them); 0 for an accelerator


@dataclass(frozen=True, slots=True)
class Prediction:
    tg_tok_s: float
    pp_tok_s: float
    graph_splits: int
    rpc_hops: int
    per_device: tuple[DeviceLoad, ...]
    constants: SpeedConstants
    depth: int = 0
    ms_per_1k_depth: float = 0.0  # decode time per token added by each 1000 tokens of context (linear)

    def to_json(self) -> dict[str, Any]:
        return {
            "tg_tok_s": round(self.tg_tok_s, 3),
            "pp_tok_s": round(self.pp_tok_s, 3),
            "ms_per_token": round(1000.0 / self.tg_tok_s, 5),
            "ms_per_1k_depth": round(self.ms_per_1k_depth, 6),
            "graph_splits": self.graph_splits,
            "rpc_hops": self.rpc_hops,
            "depth": self.depth,
            "per_device": [asdict(d) for d in self.per_device],
            "constants": asdict(self.constants),
        }


def graph_splits(p: ModelProfile, pl: Placement, experts: dict[str, str]) -> tuple[int, list[tuple[str, str]]]:
    """Backend switches per token: walk the ops of each layer in order (attention on the layer's
    device, then its expert tensors, then back) and count device changes."""
    seq: list[str] = [CPU]  # input embeddings
    by_layer: dict[int, list[str]] = {}
    for name, dev in experts.items():
        layer = int(name.split(".", 2)[1])
        by_layer.setdefault(layer, []).append(dev)
    for il in range(p.n_layer):
        seq.append(pl.layer_device[il])
        devs = sorted(set(by_layer.get(il, [])))
        seq.extend(d for d in devs if d != pl.layer_device[il])
        seq.append(pl.layer_device[il])  # shared expert, residual
    seq.append(pl.output_device)
    hops = [(a, b) for a, b in itertools.pairwise(seq) if a != b]
    return len(hops) + 1, hops


def predict(p: ModelProfile, hw: Inventory, pl: Placement, s: Settings,
            k: SpeedConstants | None = None, depth: int = 0) -> Prediction:
    k = k or SpeedConstants()
    experts = pl.experts()
    frac = p.n_expert_used / p.n_expert if p.n_expert else 1.0
    read: dict[str, float] = {}
    held: dict[str, float] = {}
    active_params: dict[str, float] = {}
    for t in loaded(p, s):
        d = tensor_device(t, pl, experts)
        if t.kind == "token_embd":
            continue  # one row per token
        f = frac if t.is_expert else 1.0
        read[d] = read.get(d, 0.0) + t.nbytes * f
        held[d] = held.get(d, 0.0) + (t.nbytes if t.is_expert else 0.0)
        n = 1
        for x in t.shape:
            n *= x
        active_params[d] = active_params.get(d, 0.0) + n * f
    kv_per_tok: dict[str, float] = {}  # KV bytes read per token per token of context
    ctx_flops: dict[str, float] = {}  # attention FLOPs per token per token of context
    kv: KVShape = kv_shape(p, s.engine)
    heads = int(p.hp("attention.head_count", 1) or 1)
    heads_kv = p.hp("attention.head_count_kv", heads) or heads
    q_per_kv = heads / max(1, int(heads_kv if not isinstance(heads_kv, list) else max(heads_kv)))
    for lk in kv.layers:
        d = pl.layer_device[lk.layer]
        kv_per_tok[d] = kv_per_tok.get(d, 0.0) + KVShape.layer_bytes_per_token(lk, s.ctk, s.ctv)
        # q.k and p.v over every cached row, for every query head sharing it
        ctx_flops[d] = ctx_flops.get(d, 0.0) + 2 * q_per_kv * (sum(lk.k_rows) + (sum(lk.v_rows) or sum(lk.k_rows)))
    for d, b in kv_per_tok.items():
        read[d] = read.get(d, 0.0) + depth * b
    devs = {d.name: d for d in hw.devices()}
    loads = []
    t_tok = k.token_overhead_us * 1e-6
    ms_per_1k = 0.0
    for name in sorted(set(read) | set(ctx_flops)):
        b = read.get(name, 0.0)
        dev = devs.get(name) or hw.cpu()
        on_cpu = dev.kind == DeviceKind.CPU
        eff = k.cpu_bw_eff if on_cpu else k.gpu_bw_eff
        cores = hw.local.cores if on_cpu else 0
        rate = k.cpu_ctx_gflops_per_core * cores * 1e9 if on_cpu else k.gpu_ctx_tflops * 1e12
        ctx_s_per_1k = ctx_flops.get(name, 0.0) * 1000 / rate if rate else 0.0
        ms = b / (dev.bw_gbs * GB * eff) * 1e3 + ctx_s_per_1k * depth / 1000 * 1e3
        t_tok += ms / 1e3
        ms_per_1k += kv_per_tok.get(name, 0.0) * 1000 / (dev.bw_gbs * GB * eff) * 1e3 + ctx_s_per_1k * 1e3
        loads.append(DeviceLoad(name, round(b / (1 << 20), 3), round(ms, 4), dev.bw_gbs,
                                round(kv_per_tok.get(name, 0.0) * 1000 / (1 << 20), 4),
                                round(ctx_flops.get(name, 0.0) * 1000 / 1e9, 6), cores))
    n_splits, hops = graph_splits(p, pl, experts)
    kinds = {name: d.kind for name, d in devs.items()}
    rpc_hops = sum(1 for src, dst in hops if kinds.get(src) == DeviceKind.RPC or kinds.get(dst) == DeviceKind.RPC)
    t_tok += n_splits * k.split_us * 1e-6 + rpc_hops * k.rpc_hop_us * 1e-6
    # activations crossing RPC links
    for src, dst in hops:
        for name in (src, dst):
            if kinds.get(name) == DeviceKind.RPC:
                t_tok += p.n_embd * 4 / (devs[name].link_gbs * GB)
    tg = 1.0 / t_tok
    pp = _prefill(p, hw, s, k, active_params, held, n_splits, rpc_hops)
    return Prediction(tg, pp, n_splits, rpc_hops, tuple(loads), k, depth, ms_per_1k)


def at_depth(predicted: dict[str, Any], depth: int) -> dict[str, Any]:
    """A stored prediction (``Prediction.to_json()``) moved to another context depth: decode time
    is linear in the context read per token; prefill is per ubatch and stays. Returns
    ``{tg_tok_s, pp_tok_s, depth, per_device: [{device, read_mib_per_token, bw_gbs}], graph_splits,
    rpc_hops, constants}`` (what a calibration needs to refit the constants)."""
    base = int(predicted.get("depth") or 0)
    dk = (depth - base) / 1000.0
    ms = float(predicted["ms_per_token"]) + float(predicted.get("ms_per_1k_depth") or 0.0) * dk
    per = [{"device": d["device"], "bw_gbs": d.get("bw_gbs", 0.0), "cores": d.get("cores", 0),
            "read_mib_per_token": d["read_mib_per_token"] + (d.get("kv_mib_per_1k_depth") or 0.0) * dk,
            "ctx_gflop_per_token": (d.get("ctx_gflop_per_1k_depth") or 0.0) * depth / 1000.0}
           for d in predicted.get("per_device", [])]
    return {"tg_tok_s": 1000.0 / ms if ms > 0 else 0.0, "pp_tok_s": float(predicted["pp_tok_s"]), "depth": depth,
            "per_device": per, "graph_splits": predicted.get("graph_splits", 0), "rpc_hops": predicted.get("rpc_hops", 0),
            "constants": predicted.get("constants", {})}


def _flops(dev_kind: str, tflops: float | None, cores: int, k: SpeedConstants) -> float:
    if dev_kind == DeviceKind.CPU:
        return cores * k.cpu_gflops_per_core * 1e9
    return (tflops or k.gpu_tflops) * 1e12


def _prefill(p: ModelProfile, hw: Inventory, s: Settings, k: SpeedConstants, active: dict[str, float],
             held_expert_bytes: dict[str, float], n_splits: int, rpc_hops: int) -> float:
    ub = min(s.ubatch, s.batch)
    devs = {d.name: d for d in hw.devices()}
    gpus = [d for d in hw.accelerators() if d.kind == DeviceKind.GPU]
    t = 0.0
    for name, n_params in active.items():
        dev = devs.get(name) or hw.cpu()
        if name == CPU and gpus and ub >= k.offload_min_batch:
            # CPU-resident expert matmuls run on the GPU: the weights cross the host link per ubatch
            g = gpus[0]
            t += held_expert_bytes.get(CPU, 0.0) / (g.link_gbs * GB)
            t += 2 * n_params * ub / _flops(DeviceKind.GPU, g.tflops, 0, k)
            continue
        t += 2 * n_params * ub / _flops(dev.kind, dev.tflops, hw.local.cores, k)
    t += (n_splits * k.split_us + rpc_hops * k.rpc_hop_us) * 1e-6
    return ub / t if t > 0 else 0.0
