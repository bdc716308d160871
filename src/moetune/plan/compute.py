"""Compute-buffer model: how much scratch memory llama.cpp reserves per device for the worst-case graph.

How it was derived (mainline llama.cpp build 11434, flash attention on, its default): llama-server
was started with ``-lv 4`` on generated models of all five families at two widths, over
ubatch 32–1024, context 512–16384, 1 and 4 slots, with layers on a loopback RPC device or on the
CPU and experts on either (``benchmarks/measure_buffers.py``, 1,400 points). The reserved sizes
(``sched_reserve: <dev> compute buffer size``) decompose as

- the attention mask, an input that lives through the whole graph: ``n_tok * n_kv * 2`` bytes
  (F16 with flash attention; F32, 4 bytes, without), on the layers' device and again on the host
  that builds it (``n_tok = min(ubatch, ctx)``; ``n_kv`` = cells per stream, ``ctx / slots``
  padded to 256);
- per token of the ubatch, the largest phase of one layer: ``8 * n_embd`` for the residual stream
  plus the larger of the FFN phase (``16 *`` the widest FFN on that device: routed experts
  ``n_ff_exp * n_expert_used``, shared expert, or dense FFN) and the attention phase (MLA:
  ``4 * (2 * n_head * kv_lora + kv_lora + rope + n_head * (k_mla + v_mla))``; without flash
  attention the ``n_kv * 4 * n_head`` score matrix joins the attention phase);
- the DSA lightning indexer (GLM-5.x, mainline only; ``_dsa_phases``): every layer's top-k
  scratch is a graph leaf, allocated before the first node, and the indexer adds a second mask and
  an F32 score matrix per layer (see there);
- a layer whose experts run elsewhere still gathers their outputs: ``6 * n_embd * n_expert_used``
  per token (fitted);
- recurrent (delta-net) layers add their convolution and state rows per token.
- the output layer's logits for every ubatch token, ``4 * n_vocab + 16 * n_embd`` per token, with
  the mask still held (not in the hybrid graphs): several GiB at a 150k vocabulary and ``-ub 8192``,
  where it decides the device's buffer (found on full-size sparse replicas with llama-fit-params,
  ``benchmarks/bench_fullscale.py``; the generated test models' 259-token vocabulary hides it);
- on the host, when the layers are on an accelerator: the mask plus ``16 * n_embd`` per token, or
  the experts' FFN phase ``16 * n_ff_exp * n_expert_used + 4 * n_embd * n_expert_used`` per token
  (their down projections' outputs) when experts run on the host and it is larger; the mask is
  still held there in the hybrid graphs, and in every graph whose layers span two or more devices
  (the host's copy of the mask feeds the next device's split, after the first device's layers and
  their expert splits on the host: full-size replicas with two RPC devices);

ik_llama.cpp has its own model (``_ik_compute_bytes``), fitted on its real server the same way.
Accuracy against llama-server is checked by the test suite and
written by ``make bench`` (``benchmarks/results/ledger.md``). Known gap: with two or more accelerators the
per-token term moves between devices in ways this model does not follow (errors up to about 35%
per device there; the sum over devices stays within about 30%); llama.cpp's pipeline
parallelism (several accelerators, no tensor overrides) keeps 4 copies of the graph inputs, the
mask included, on every device.
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.kinds import EngineKind
from moetune.model.profile import ModelProfile

MIB = 1 << 20
KV_PAD = 256


@dataclass(frozen=True, slots=True)
class ComputeInputs:
    ubatch: int
    ctx: int  # total context (-c)
    slots: int  # --parallel
    flash_attn: bool = True
    kv_unified: bool = False
    engine: str = "llama.cpp"
    amb_mib: int = 0  # ik_llama.cpp -amb (attention max batch), 0 = off
    copies: int = 1  # graph input copies: 4 under pipeline parallelism (2+ accelerators, no overrides)
    layer_devices: int = 1  # devices holding repeating layers

    @property
    def n_tok(self) -> int:
        return min(self.ubatch, self.ctx)

    @property
    def n_kv(self) -> int:
        cells = self.ctx if self.kv_unified or self.slots <= 1 else self.ctx // self.slots
        return max(KV_PAD, -(-cells // KV_PAD) * KV_PAD)


@dataclass(frozen=True, slots=True)
class DeviceRole:
    """What runs on a device, as far as its compute buffer is concerned."""

    layers: bool  # holds repeating layers (attention + their FFN unless experts are elsewhere)
    experts: bool  # computes routed experts for some layer
    dense: bool  # holds a leading dense layer
    output: bool  # holds the output layer
    host: bool  # the CPU that builds inputs while layers are on accelerators
    cpu: bool = False  # the device is the CPU (layers there run on the CPU backend)
    n_layers: int = 0  # repeating layers held (the DSA indexer's per-layer scratch is allocated up front)


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


def _recurrent_scratch(p: ModelProfile, inp: ComputeInputs) -> int:
    """Delta-net layers copy their per-sequence states through the graph (fitted: slots + 4 copies)."""
    d_conv = p.hp_int("ssm.conv_kernel")
    d_inner = p.hp_int("ssm.inner_size")
    d_state = p.hp_int("ssm.state_size")
    n_group = p.hp_int("ssm.group_count")
    per_seq = 4 * (max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state) + d_state * d_inner)
    return per_seq * (inp.slots + 4)


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
            base = max(base, n_tok * 16 * _ffn_width(p, DeviceRole(False, True, False, False, False)))
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


def _dsa_phases(p: ModelProfile, inp: ComputeInputs, role: DeviceRole) -> int:
    """The largest phase of a device holding glm-dsa (GLM-5.x) layers in mainline llama.cpp.

    Follows ``src/models/glm-dsa.cpp`` (the lightning indexer, fused by default: ``cparams.fused_lid``)
    and ``llm_graph_context::build_attn`` for ``llm_graph_input_attn_k_dsa`` in
    ``src/llama-graph.cpp``, as ``ggml-alloc.c`` places them:

    - each layer's attention makes a zero-filled ``[1, top_k, n_tok]`` F32 tensor
      (``ggml_new_tensor_4d`` then ``ggml_fill``) to unmask the selected keys; the new tensor is a
      graph leaf and ``ggml_gallocr_alloc_graph_impl`` allocates all leafs before the first node, so
      the first layer runs with every layer's copy held: ``n_layers * 4 * min(n_kv, top_k) * n_tok``
      (this is what grows with the layer count, not the context);
    - the indexer has its own mask input (``kq_mask_lid``, F16 when fused) next to the attention's
      (F16 with flash attention, F32 without), both live through the graph;
    - the indexer phase adds its F32 scores, ``n_kv * n_tok * 4`` (one row per token: the fused
      op sums the heads), or without flash attention the attention's ``n_kv * n_tok * n_head`` F32
      scores, whichever is larger; the rest of the phase, ``76 * n_embd`` bytes per token, was
      fitted on full-size GLM-5.1 replicas against ``llama-fit-params`` (Q, the indexer's queries,
      the residual and what ``ggml_dyn_tallocr`` loses to fragmentation between them);
    - where the experts run on the device, their FFN phase (as on the host, below) plus ``8 * n_embd``;
    - on the output device, the logits of every ubatch token and the final norm, ``4 * n_vocab +
      16 * n_embd`` per token, on top of the leafs: unless the leafs' region, freed by then, holds
      the logits (plus the gathered expert outputs, ``4 * n_embd * n_expert_used`` per token, when
      the experts run elsewhere), where ``ggml_dyn_tallocr`` then places them (fitted threshold:
      on the CPU with every layer the logits go there, on a device without the experts they do not).

    GLM-5.2's shared indexer layers reuse a top-k from an earlier layer; the buffers do not change
    (measured)."""
    n_tok, n_kv = inp.n_tok, inp.n_kv
    top_k = p.hp_int("attention.indexer.top_k", n_kv) or n_kv
    leafs = role.n_layers * 4 * min(n_kv, top_k) * n_tok
    masks = inp.copies * n_kv * n_tok * ((2 if inp.flash_attn else 4) + 2)
    scores = n_kv * n_tok * 4
    if not inp.flash_attn:
        scores = max(scores, n_kv * n_tok * 4 * p.hp_int("attention.head_count"))
    e, used = p.n_embd, p.n_expert_used
    phases = [scores + 76 * e * n_tok]
    if role.experts:
        n_ff_exp = p.hp_int("expert_feed_forward_length")
        phases.append(n_tok * (8 * e + 16 * n_ff_exp * used + 4 * e * used))
    logits = 4 * p.n_vocab * n_tok
    if role.output and leafs < logits + (0 if role.experts else 4 * e * used * n_tok):
        phases.append(logits + 16 * e * n_tok)
    return leafs + masks + max(phases)


def compute_bytes(p: ModelProfile, inp: ComputeInputs, role: DeviceRole) -> int:
    if inp.engine == EngineKind.IK:
        return _ik_compute_bytes(p, inp, role)
    n_tok, n_kv = inp.n_tok, inp.n_kv
    mask = n_tok * n_kv * (2 if inp.flash_attn else 4)
    total = 0
    if role.host:
        if p.arch == "glm-dsa" and inp.engine != EngineKind.IK:
            mask = n_tok * n_kv * 4  # the indexer takes an F32 copy of the mask
        total = inp.copies * mask + n_tok * p.n_embd * (16 + 8 * (inp.copies - 1))
        if role.experts:  # the experts' FFN phase, with each used expert's down projection output (full-size
            # replicas: the mask is no longer held there, except in the hybrid graphs)
            ffn = n_tok * (16 * _ffn_width(p, DeviceRole(False, True, False, False, False)) + 4 * p.n_embd * p.n_expert_used)
            keeps_mask = p.is_hybrid_recurrent or inp.layer_devices > 1
            total = max(total, ffn + (inp.copies * mask if keeps_mask else 0))
    if role.layers or (role.experts and not role.host):
        ffn = 16 * _ffn_width(p, role)
        if role.layers and not role.experts and p.n_expert:
            ffn = max(ffn, 6 * p.n_embd * p.n_expert_used)  # gathering expert outputs computed elsewhere
        attn = _attn_phase_per_tok(p, inp) if role.layers else 0
        dev = inp.copies * mask + n_tok * (8 * p.n_embd + max(ffn, attn))
        if role.layers and p.arch == "glm-dsa":
            dev = max(dev, _dsa_phases(p, inp, role))
        if role.layers and p.is_hybrid_recurrent:
            dev += _recurrent_scratch(p, inp)
        total = max(total, dev) if role.host else dev
    if role.output:  # the logits of every ubatch token (the reserve asks for all of them) and the final norm;
        # the mask is still held there, except in the hybrid graphs (measured on full-size replicas)
        held = 0 if p.is_hybrid_recurrent else inp.copies * mask
        total = max(total, held + n_tok * (4 * p.n_vocab + 16 * p.n_embd))
    return total
