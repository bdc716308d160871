"""ik_llama.cpp's layer split, and the ``-ts`` that makes it give the plan's layers.

Mainline splits layers by count (``-ts`` are layer shares). ik_llama.cpp (0.1.5,
``src/llama.cpp``) splits by bytes: it sizes every layer (its weights, all of them, plus its KV
cache at the full context; the output layer also carries the logits' scratch beyond the largest
compute estimate), reserves the largest per-layer compute estimate on every device, and walks the
layers in order, giving each device layers while they fit under its cumulative ``-ts`` share of the
total (taking one more when that lands closer to the share). So moetune computes the same sizes and
sets each device's ``-ts`` value so that its share ends 40% of a layer past the plan's last layer
for it: a margin both ways against rounding. Pure functions; the tests check them against the
real server's ``Setting default device in layer`` lines.
"""

from __future__ import annotations

import itertools

from moetune.model.kv import kv_shape
from moetune.model.profile import EXPERT_KINDS, ModelProfile
from moetune.model.quants import by_name
from moetune.plan.compute import mla_heads
from moetune.plan.ledger import kv_cells
from moetune.plan.settings import Settings

F32 = 4
_EXPS = frozenset(EXPERT_KINDS)
_SHEXP = {"ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"}
_DENSE = {"ffn_gate", "ffn_up", "ffn_down"}
_NORMS = {
    "attn_norm",
    "attn_norm_2",
    "attn_output_norm",
    "post_attention_norm",
    "ffn_norm",
    "post_ffw_norm",
    "layer_output_norm",
}
MARGIN = 0.4  # of the next layer's size, on each side of a device's share boundary
# ik 0.1.5 finds a tensor's role by prefix, in the order of its tensor enum, where the dense FFN
# names come first: in the architectures whose name table has them (leading dense blocks), the
# routed and shared experts' tensors count as dense FFN in the compute estimate
_DENSE_SHADOWS = {"glm4moe", "deepseek2", "glm-dsa"}


def layer_sizes(p: ModelProfile, s: Settings, mla: int = 0) -> tuple[list[float], float]:
    """(bytes of each layer 0..n_layer plus the output layer at index n_layer, the largest
    per-layer compute estimate), as ik_llama.cpp's ``get_layer_sizes``. ``mla``: the -mla mode."""
    n = p.n_layer_all
    ub = s.ubatch
    result = [0.0] * (n + 1)
    exps, shexp, dense = [0] * n, [0] * n, [0] * n
    norm = [False] * n
    wk_b: dict[int, tuple[int, ...]] = {}
    wv_b: dict[int, tuple[str, tuple[int, ...]]] = {}
    has_wkv_b: set[int] = set()
    ow = embd = 0
    for t in p.tensors:
        if t.name == "token_embd.weight":
            embd = t.nbytes
            continue
        if t.name == "output.weight":
            ow = t.nbytes
            continue
        if t.layer is None or t.layer >= n or t.layer >= p.n_layer:  # NextN blocks are not loaded
            continue
        il = t.layer
        result[il] += t.nbytes
        if t.name.endswith(".bias"):
            continue
        ne1 = t.shape[1] if len(t.shape) > 1 else 1
        if t.kind == "attn_k_b":
            wk_b[il] = t.shape
        elif t.kind == "attn_v_b":
            wv_b[il] = (t.type_name, t.shape)
        elif t.kind == "attn_kv_b":
            has_wkv_b.add(il)
        elif t.kind in _EXPS | _SHEXP and p.arch in _DENSE_SHADOWS:
            dense[il] += ne1 * ub * F32
        elif t.kind in _EXPS:
            exps[il] += ne1 * ub * p.n_expert_used * F32
        elif t.kind in _SHEXP:
            shexp[il] += ne1 * ub * F32
        elif t.kind in _DENSE:
            dense[il] += ne1 * ub * F32
        elif t.kind in _NORMS:
            norm[il] = True
    compute = [0.0] * n
    for il in range(n):
        inp = p.n_embd * ub * F32 * (2 if norm[il] else 1)
        compute[il] = float(max(exps[il], shexp[il], dense[il]) + inp)
    cells = kv_cells(s)
    for il, (type_name, vb) in wv_b.items():
        if il in wk_b and il not in has_wkv_b:  # ik rebuilds wkv_b from wk_b and wv_b
            qt = by_name(type_name if type_name.upper() in ("F32", "F16", "BF16") else "q8_0")
            result[il] += qt.row_bytes(vb[0]) * (vb[1] + wk_b[il][1]) * vb[2] * 2
        if mla == 3:
            heads = mla_heads(vb[2], 2 * vb[1] * vb[2] * cells * F32 / (1 << 20), s.amb_mib)
            compute[il] = max(compute[il], float(2 * vb[1] * heads * cells * F32))
    max_compute = max(compute, default=0.0)
    shape = kv_shape(p, "ik_llama.cpp")
    kv = shape.by_layer(s.ctk, s.ctv)
    for il in range(n):  # ik counts a NextN block's cache as a trunk layer's here
        result[il] += kv.get(il, kv.get(0, 0) if il >= p.n_layer else 0) * cells
    for il in shape.recurrent_layers:  # a recurrent layer's state, per sequence
        result[il] += shape.rs_bytes_per_layer_seq * max(1, s.slots)
    out_scratch = max(float(p.n_vocab * ub * F32), max_compute) - max_compute
    result[n] = float(ow or embd) + out_scratch
    return result, max_compute


def tensor_split(sizes: list[float], max_compute: float, layer_index: list[int], n_devices: int) -> tuple[float, ...]:
    """``-ts`` values that make ik's split give layer ``il`` (output layer last) to device
    ``layer_index[il]`` (ik's device numbering). The indices must not decrease; a device may get
    no layer (a CPU-only build's local device, before the RPC servers)."""
    if any(b < a for a, b in itertools.pairwise(layer_index)):
        raise ValueError(
            "ik_llama.cpp gives each device one run of layers: the plan's layer map must follow its device order"
        )
    total = max_compute * n_devices + sum(sizes)
    bounds: list[float] = []
    loaded = 0.0
    for d in range(n_devices):
        loaded += max_compute
        mine = [il for il, dev in enumerate(layer_index) if dev == d]
        loaded += sum(sizes[il] for il in mine)
        nxt = (mine[-1] + 1) if mine else next((il for il, dev in enumerate(layer_index) if dev > d), len(sizes))
        bounds.append(total if d == n_devices - 1 else loaded + MARGIN * (sizes[nxt] if nxt < len(sizes) else 0.0))
    bounds[-1] = total
    shares = [bounds[0], *(b - a for a, b in itertools.pairwise(bounds))]
    return tuple(round(x / (1 << 20), 3) for x in shares)


def split(sizes: list[float], max_compute: float, ts: tuple[float, ...]) -> list[int]:
    """ik's walk: the device of each layer (output layer last) under ``-ts ts`` (every layer
    offloaded). The inverse of tensor_split; kept to test it."""
    n_dev = len(ts)
    cum, acc = [], 0.0
    for x in ts:
        acc += x
        cum.append(acc)
    fracs = [c / acc for c in cum]
    total = max_compute * n_dev + sum(sizes)
    out = [n_dev - 1] * len(sizes)
    last = 0
    loaded = 0.0
    for d in range(n_dev):
        loaded += max_compute
        cap = fracs[d] * total
        il = last
        while il < len(sizes):
            if loaded + sizes[il] <= cap:
                out[il] = d
                loaded += sizes[il]
                il += 1
                continue
            if loaded + sizes[il] - cap < cap - loaded:
                out[il] = d
                loaded += sizes[il]
                il += 1
            break
        last = il
    return out
