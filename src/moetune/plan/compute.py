"""Compute buffers: the scratch memory each device reserves for the worst-case graph.

Mainline llama.cpp: replayed from the engine's own rules (``reserve_bytes``): the reserve graph of
the model's family (``moetune.plan.graph``), split over the devices and laid out by ggml-alloc's
allocator (``moetune.plan.galloc``), holes included. Checked against ``llama-fit-params`` on
full-size replicas of the published models (``benchmarks/bench_fullscale.py``, results in
``benchmarks/results/fullscale.md``) and against llama-server on generated models
(``benchmarks/results/ledger.md``).

ik_llama.cpp: a model fitted on its real server (``_ik_compute_bytes``, 1,080 reserves of
``benchmarks/measure_buffers_ik.py``), by the role each device plays (``DeviceRole``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from moetune.model.kv import KV_PAD
from moetune.model.profile import ModelProfile
from moetune.plan.galloc import buffer_sizes
from moetune.plan.graph import Shape, Sites, build

MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeInputs:
    ubatch: int
    ctx: int  # total context (-c)
    slots: int  # --parallel
    flash_attn: bool = True
    kv_unified: bool = False
    amb_mib: int = 0  # ik_llama.cpp -amb (attention max batch), 0 = off
    ctk: str = "f16"
    ctv: str = "f16"
    n_outputs: int = 0  # tokens of the reserve graph that reach the output layer; 0: the whole ubatch
    n_kv_swa: int = 0  # cells per stream of the sliding-window layers' cache (mainline); 0: none

    @property
    def n_tok(self) -> int:
        return min(self.ubatch, self.ctx)

    @property
    def n_kv(self) -> int:
        cells = self.ctx if self.kv_unified or self.slots <= 1 else self.ctx // self.slots
        return max(KV_PAD, -(-cells // KV_PAD) * KV_PAD)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceRole:
    """What runs on a device, as far as ik_llama.cpp's compute buffer is concerned."""

    layers: bool  # holds repeating layers (attention + their FFN unless experts are elsewhere)
    experts: bool  # computes routed experts for some layer
    dense: bool  # holds a leading dense layer
    output: bool  # holds the output layer
    host: bool  # the CPU that builds inputs while layers are on accelerators
    cpu: bool = False  # the device is the CPU (layers there run on the CPU backend)


def _ffn_width(p: ModelProfile, role: DeviceRole) -> int:
    w = 0
    if role.experts:
        w = max(w, p.hp_int("expert_feed_forward_length") * p.n_expert_used)
    if role.layers:
        shexp = p.hp_int("expert_shared_feed_forward_length")
        if not shexp and p.hp("expert_shared_count"):
            shexp = p.hp_int("expert_feed_forward_length") * p.hp_int("expert_shared_count")
        w = max(w, shexp)
    if role.dense and p.n_dense_lead:
        w = max(w, p.hp_int("feed_forward_length"))
    return w


def _attn_phase_per_tok(p: ModelProfile, inp: ComputeInputs) -> int:
    n_head = p.hp_int("attention.head_count")
    if p.is_mla:
        lora = p.hp_int("attention.kv_lora_rank")
        rope = p.hp_int("rope.dimension_count")
        kmla = p.hp_int("attention.key_length_mla")
        vmla = p.hp_int("attention.value_length_mla")
        b = 4 * (2 * n_head * lora + lora + rope + n_head * (kmla + vmla))
    elif p.is_hybrid_recurrent:
        d_inner = p.hp_int("ssm.inner_size")
        n_group = p.hp_int("ssm.group_count")
        d_state = p.hp_int("ssm.state_size")
        b = 4 * (2 * (d_inner + 2 * n_group * d_state) + 2 * d_inner)
    else:
        hk = p.hp_int("attention.key_length", p.n_embd // max(n_head, 1))
        b = 4 * n_head * hk * 3
    if not inp.flash_attn:
        b += inp.n_kv * 4 * n_head
    return b


def mla_heads(n_head: int, kv_f32_mib: float, amb_mib: int) -> int:
    """Heads ik_llama.cpp dequantizes the latent cache for at once: all of them, or with ``-amb``
    the most whose F32 copy fits in it (a divisor of n_head, 1 at worst)."""
    if amb_mib <= 0 or kv_f32_mib <= amb_mib:
        return n_head
    return next((n_head // k for k in range(2, n_head) if n_head % k == 0 and kv_f32_mib / k <= amb_mib), 1)


def _ik_compute_bytes(p: ModelProfile, inp: ComputeInputs, role: DeviceRole) -> int:
    """ik_llama.cpp (0.1.5), fitted on 1,080 reserves of the real server (``benchmarks/
    measure_buffers_ik.py``): the attention mask (``n_tok * n_kv``, F16 with flash attention, F32
    without) plus the largest phase of one layer on the device, each ``n_tok *`` bytes per token:

    - FFN: ``16 *`` the widest FFN there (as mainline);
    - attention: with flash attention ``4 * (2 n_head + 2 n_head_kv) * head_dim + 8 n_embd``
      (MLA below 128 tokens: mainline's MLA phase ``+ 8 n_embd``; from 128 tokens ik dequantizes
      the whole latent cache to F32, ``n_kv * 4 * (2 v_head n_head + kv_lora + rope)``, a few
      heads at a time with ``-amb``, plus ``24 n_embd`` per token on an accelerator, ``10 n_embd``
      on the CPU); without, the ``n_kv * 4 * n_head`` scores plus ``8 n_embd``;
    - delta-net layers: ``4 n_embd + 32 d_inner``;
    - a device whose layers' experts run elsewhere gathers their outputs: ``(6 n_expert_used + 4) n_embd``;
    - the output layer's logits for every ubatch token: ``4 n_vocab`` (4.7 GiB of the GLM-5.1
      reference's 5.3 GiB at ``-ub 8192``).

    The host that builds the inputs keeps the mask and ``4 n_embd`` per token, or the experts'
    FFN phase when they run there and it is larger. ``-amb`` changes nothing outside MLA without
    flash attention, which is not modelled (see benchmarks/results/ledger-ik.md for the misses)."""
    n_tok, n_kv, e = inp.n_tok, inp.n_kv, p.n_embd
    mask = n_tok * n_kv * (2 if inp.flash_attn else 4)
    if role.host and not role.layers:
        base = mask + n_tok * 4 * e
        if role.experts:
            base = max(
                base,
                n_tok
                * 16
                * _ffn_width(p, DeviceRole(layers=False, experts=True, dense=False, output=False, host=False)),
            )
        return base
    phases = [n_tok * 16 * _ffn_width(p, role)]
    if role.layers:
        n_head = p.hp_int("attention.head_count")
        if p.is_mla and inp.flash_attn and n_tok >= 128:
            v_head = p.hp_int("attention.value_length_mla")
            lora = p.hp_int("attention.kv_lora_rank")
            rope = p.hp_int("rope.dimension_count")
            heads = mla_heads(n_head, 2 * v_head * n_head * n_kv * 4 / MIB, inp.amb_mib)
            phases.append(n_kv * 4 * (2 * v_head * heads + lora + rope) + n_tok * (10 if role.cpu else 24) * e)
        elif p.is_mla:
            phases.append(n_tok * (_attn_phase_per_tok(p, inp) + 8 * e))
        elif inp.flash_attn:
            heads_kv = p.hp_int("attention.head_count_kv", n_head) or n_head
            hd = p.hp_int("attention.key_length", e // max(n_head, 1))
            phases.append(n_tok * (4 * (2 * n_head + 2 * heads_kv) * hd + 8 * e))
        else:
            phases.append(n_tok * n_kv * 4 * n_head + n_tok * 8 * e)
        if p.is_hybrid_recurrent:
            phases.append(n_tok * (4 * e + 32 * p.hp_int("ssm.inner_size")))
        if not role.experts and p.n_expert:
            phases.append(n_tok * (6 * p.n_expert_used + 4) * e)
    if role.output:
        phases.append(n_tok * 4 * p.n_vocab)
    return mask + max(phases)


def reserve_bytes(
    p: ModelProfile,
    inp: ComputeInputs,
    sites: Sites,
    devices: Sequence[str],
    *,
    offload_to: str = "",
    n_copies: int = 1,
) -> dict[str, int]:
    """Mainline llama.cpp's compute buffer on every device (``devices`` in the engine's order, the
    CPU last): the reserve graph replayed (see the module docstring)."""
    plain = ("f16", "bf16", "f32")  # the other cache types are quantized (attention rotation)
    nodes = build(
        p,
        Shape(
            n_tok=inp.n_tok,
            n_kv=inp.n_kv,
            flash_attn=inp.flash_attn,
            k_quant=inp.ctk not in plain,
            v_quant=inp.ctv not in plain,
            n_out=inp.n_outputs,
            n_kv_swa=inp.n_kv_swa,
        ),
        sites,
    )
    return buffer_sizes(nodes, devices, offload_to, n_copies)


def compute_bytes(p: ModelProfile, inp: ComputeInputs, role: DeviceRole) -> int:
    """ik_llama.cpp's compute buffer for a device playing ``role``."""
    return _ik_compute_bytes(p, inp, role)
