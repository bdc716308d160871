"""The worst-case graph mainline llama.cpp reserves, coarsely: the tensors that decide the compute
buffers, in the order the engine builds them, each on the device of its weight.

``sched_reserve`` (``src/llama-context.cpp``) builds the graph of one full ubatch, ``n_tokens =
min(ubatch, ctx)``, of which ``n_outputs = min(n_tokens, n_outputs_max)`` reach the output layer
(``Shape.n_out``): llama-fit-params keeps llama_context's default ``n_outputs_max = n_batch``, every
token, while llama-server sets it to its slots (``server_output_limits`` in
tools/server/server-context.cpp: ``n_parallel`` times one plus the draft length, no draft in
moetune's commands). What each family builds is read from its builder
(``src/models/*.cpp``, ``src/llama-graph.cpp``) and checked against the allocator's own trace
(ggml-alloc.c built with ``GGML_ALLOCATOR_DEBUG``) on full-size replicas: names below follow the
engine's (``ffn_moe_down``, ``kq``, ``result_output``). Sizes are bytes; small tensors (biases,
norms of a few KiB, indices) are left out where they cannot change a layout.

Pure: a profile, the placement of every layer and expert tensor, and the batch shape in; nodes out
for ``moetune.plan.galloc``.
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.model.kv import swa_layers
from moetune.model.profile import ModelProfile
from moetune.plan.galloc import CPU, Node

F32 = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """The reserved batch: tokens, KV cells per stream, flash attention, cache types, outputs."""

    n_tok: int
    n_kv: int
    flash_attn: bool
    k_quant: bool = False  # a quantized K cache (q8_0, q4_0): attention rotation on
    v_quant: bool = False
    n_out: int = 0  # tokens whose logits the graph computes; 0: all of them
    n_kv_swa: int = 0  # cells per stream of the sliding-window layers' cache; 0: the model has none

    @property
    def outputs(self) -> int:
        return min(self.n_out or self.n_tok, self.n_tok)


@dataclass(frozen=True, slots=True)
class Sites:
    """Where the weights are: each trunk layer's device, each expert tensor's, the output layer's."""

    layers: tuple[str, ...]
    experts: dict[str, str]  # tensor name -> device
    output: str


class _Graph:
    def __init__(self, p: ModelProfile, sh: Shape, sites: Sites) -> None:
        self.p, self.sh, self.sites = p, sh, sites
        self.nodes: list[Node] = []
        self.skipped_leafs: list[str] = []  # top-k leafs of layers left out (``_kept_layers``), freed by the next one
        self.sizes = {t.name: t.nbytes for t in p.tensors}
        self.e = F32 * p.n_embd * sh.n_tok  # one row of the residual stream per token
        self.swa = swa_layers(p)[1] if sh.n_kv_swa else frozenset()

    def add(
        self,
        name: str,
        nbytes: int,
        srcs: tuple[str, ...] = (),
        *,
        weight: str = "",
        weight_bytes: int = 0,
        batch: int = 0,
        inplace: bool = False,
        leaf: bool = False,
        is_input: bool = False,
        pinned: bool = False,
        view_of: str = "",
    ) -> str:
        self.nodes.append(
            Node(
                name=name,
                nbytes=int(nbytes),
                srcs=srcs,
                weight=weight,
                weight_bytes=weight_bytes,
                batch=batch,
                inplace=inplace,
                leaf=leaf,
                is_input=is_input,
                pinned=pinned,
                view_of=view_of,
            )
        )
        return name

    def hp(self, key: str, default: int = 0) -> int:
        return self.p.hp_int(key, default) or default


def _inputs(g: _Graph) -> str:
    """``build_inp_embd`` and the attention inputs. Every input is a CPU leaf. The token rows are
    picked by ``ggml_build_forward_select`` among the token path, the vector-embedding path (the
    ``inp_embd`` input, read by nobody, so never freed) and the mixed path, whose ``ggml_dup`` of
    ``inp_mixed_embd`` is written by a ``ggml_set_rows`` view nobody reads: the copy stays allocated
    all graph long on the device that runs it (the first layer's: the scheduler spreads the layers'
    device up the graph), above the inputs copied there before it."""
    t, n_kv = g.sh.n_tok, g.sh.n_kv
    mask = t * n_kv * (2 if g.sh.flash_attn else F32)  # F16 with flash attention (llama-graph.cpp, build_attn_inp_*)
    g.add("inp_tokens", F32 * t, leaf=True, is_input=True)
    g.add("inp_embd", g.e, leaf=True, is_input=True)
    g.add("inp_mixed_tokens", F32 * t, leaf=True, is_input=True)
    g.add("inp_mixed_slots", 8 * t, leaf=True, is_input=True)
    g.add("inp_mixed_embd", g.e, leaf=True, is_input=True)
    g.add("inp_pos", F32 * t, leaf=True, is_input=True)
    g.add("k_idxs", 8 * t, leaf=True, is_input=True)
    if g.p.arch == "glm-dsa":  # the lightning indexer's own mask, F16 (glm-dsa.cpp, fused)
        g.add("kq_mask_lid", t * n_kv * 2, leaf=True, is_input=True)
    g.add("kq_mask", mask, leaf=True, is_input=True)
    if g.sh.n_kv_swa:  # the sliding-window layers' own indices and mask (build_attn_inp_kv_iswa)
        g.add("k_idxs_swa", 8 * t, leaf=True, is_input=True)
        g.add("kq_mask_swa", t * g.sh.n_kv_swa * (2 if g.sh.flash_attn else F32), leaf=True, is_input=True)
    g.add("out_ids", F32 * g.sh.outputs, leaf=True, is_input=True)
    embd = g.add("embd", g.e, ("inp_tokens",), weight=CPU)  # token_embd stays on the CPU; GET_ROWS is never offloaded
    g.add("mixed_rows", g.e, ("inp_mixed_tokens",), weight=CPU)
    g.add("mixed_copy", g.e, ("inp_mixed_embd",), pinned=True)
    g.add("mixed_set_rows", 0, ("mixed_copy", "mixed_rows", "inp_mixed_slots"), view_of="mixed_copy")
    return embd


def _matmul(
    g: _Graph,
    name: str,
    *,
    nbytes: int,
    src: str,
    dev: str,
    tensor: str = "",
    srcs: tuple[str, ...] = (),
    batch: int = 0,
) -> str:
    """An op that multiplies by a weight on ``dev`` (``tensor``: its name, when an offload may copy it),
    over ``batch`` tokens (the whole ubatch by default)."""
    return g.add(name, nbytes, (src, *srcs), weight=dev, weight_bytes=g.sizes.get(tensor, 0), batch=batch or g.sh.n_tok)


def _attn_gqa(g: _Graph, il: int, x: str, dev: str, *, gated: bool) -> str:
    """``build_qkv`` + q/k norms + rope (in place) + ``build_attn`` (qwen3moe.cpp, glm4-moe.cpp;
    qwen35moe's full-attention layers add an output gate computed with Q). A quantized K cache
    rotates Q and K by a Hadamard matrix, a quantized V cache rotates V and un-rotates the output
    (``llama_mul_mat_hadamard``; ``llama_kv_cache``: ``n_rot_k``/``n_rot_v`` for head sizes that are
    multiples of 64): one more tensor of each size."""
    t = g.sh.n_tok
    n_head, hk = (
        g.hp("attention.head_count"),
        g.hp("attention.key_length", g.p.n_embd // max(g.hp("attention.head_count"), 1)),
    )
    hv = g.hp("attention.value_length", hk)
    n_kv_head = g.hp("attention.head_count_kv", n_head)
    q, kv, qv = F32 * n_head * hk * t, F32 * n_kv_head * hk * t, F32 * n_head * hv * t
    rot_k, rot_v = g.sh.k_quant and hk % 64 == 0, g.sh.v_quant and hv % 64 == 0
    windowed = il in g.swa  # a sliding-window layer attends over its own, smaller cache
    mask, n_kv = ("kq_mask_swa", g.sh.n_kv_swa) if windowed else ("kq_mask", g.sh.n_kv)
    idxs = "k_idxs_swa" if windowed else "k_idxs"
    # a Q/K norm is a new tensor; without one, a bias (gpt-oss) is added in place
    normed = f"blk.{il}.attn_q_norm.weight" in g.sizes or f"blk.{il}.attn_q.bias" not in g.sizes
    qfull = _matmul(g, f"Qcur-{il}", nbytes=2 * q if gated else q, src=x, dev=dev)
    qr = g.add(f"Qnorm-{il}", q, (qfull,), weight=dev, inplace=not normed)
    qr = g.add(f"Qrope-{il}", q, (qr, "inp_pos"), inplace=True)
    if rot_k:
        qr = g.add(f"Q_rot-{il}", q, (qr,))
    v = _matmul(g, f"Vcur-{il}", nbytes=kv, src=x, dev=dev)
    if rot_v:
        v = g.add(f"V_rot-{il}", kv, (v,))
    g.add(f"v_set-{il}", 0, (v, idxs), view_of=v)
    k = _matmul(g, f"Kcur-{il}", nbytes=kv, src=x, dev=dev)
    k = g.add(f"Knorm-{il}", kv, (k,), weight=dev, inplace=not normed)
    k = g.add(f"Krope-{il}", kv, (k, "inp_pos"), inplace=True)
    if rot_k:
        k = g.add(f"K_rot-{il}", kv, (k,))
    g.add(f"k_set-{il}", 0, (k, idxs), view_of=k)
    if g.sh.flash_attn:
        o = g.add(f"fattn-{il}", qv, (qr, mask))
    else:
        kq = g.add(f"kq-{il}", F32 * n_kv * n_head * t, (qr, mask))
        o = g.add(f"kqv-{il}", qv, (kq,))
        o = g.add(f"kqv_out-{il}", qv, (o,))  # the heads merged (``ggml_cont``)
    if rot_v:
        o = g.add(f"out_rot-{il}", qv, (o,))
    if gated:  # the attention times the sigmoid of Q's gate half, in place: in the attention's
        # buffer, unless flash attention's output reaches it as a reshaped view (then the gate's)
        gate = g.add(f"gate_reshaped-{il}", qv, (qfull,))
        o = g.add(f"attn_gated-{il}", qv, (gate, o) if g.sh.flash_attn else (o, gate), inplace=True)
    return _matmul(g, f"attn_out-{il}", nbytes=g.e, src=o, dev=dev)


def _attn_mla(g: _Graph, il: int, x: str, dev: str) -> str:
    """deepseek2.cpp (and glm-dsa.cpp without its indexer): absorbed MLA. Q goes through the LoRA,
    splits into nope and rope parts, the nope part is absorbed into the latent (``q_nope_absorbed``)
    and both are concatenated (``Qcur``, ``n_head * (kv_lora + rope)`` per token, the largest)."""
    t = g.sh.n_tok
    n_head = g.hp("attention.head_count")
    lora, rope = g.hp("attention.kv_lora_rank"), g.hp("rope.dimension_count")
    k_mla, v_mla = g.hp("attention.key_length_mla"), g.hp("attention.value_length_mla")
    qa = _matmul(g, f"q_a-{il}", nbytes=F32 * g.hp("attention.q_lora_rank", g.p.n_embd) * t, src=x, dev=dev)
    q = _matmul(g, f"q-{il}", nbytes=F32 * n_head * k_mla * t, src=qa, dev=dev)
    qna = _matmul(g, f"q_nope_absorbed-{il}", nbytes=F32 * n_head * lora * t, src=q, dev=dev)
    qpe = g.add(f"q_pe-{il}", F32 * n_head * rope * t, (q, "inp_pos"))
    qcur = g.add(f"Qcur-{il}", F32 * n_head * (lora + rope) * t, (qna, qpe))
    kv = _matmul(g, f"kv_cmpr_pe-{il}", nbytes=F32 * (lora + rope) * t, src=x, dev=dev)
    g.add(f"k_set-{il}", 0, (kv, "k_idxs"), view_of=kv)
    sel = (_indexer(g, il, x, qa, dev=dev),) if g.p.arch == "glm-dsa" else ()
    if g.sh.flash_attn:
        qp = g.add(f"Q_fa-{il}", F32 * n_head * lora * t, (qcur, *sel))
        lat = g.add(f"fattn_mla-{il}", F32 * n_head * v_mla * t, (qp, "kq_mask"), weight=dev)
    else:
        kq = g.add(f"kq-{il}", F32 * g.sh.n_kv * n_head * t, (qcur, "kq_mask", *sel))
        kqv = g.add(f"kqv-{il}", F32 * n_head * lora * t, (kq,))
        lat = g.add(f"kqv_mla-{il}", F32 * n_head * v_mla * t, (kqv,), weight=dev)
    o = g.add(f"attn_cont-{il}", F32 * n_head * v_mla * t, (lat,))
    return _matmul(g, f"attn_out-{il}", nbytes=g.e, src=o, dev=dev)


def _indexer(g: _Graph, il: int, x: str, qa: str, *, dev: str) -> str:
    """glm-dsa.cpp's lightning indexer (fused, ``cparams.fused_lid``): its queries, one F32 score per
    key and token (heads summed), the top-k, and the two F16 masks built from it; the layer's
    zero-filled top-k tensor is a graph leaf (``ggml_new_tensor_4d`` + ``ggml_fill``), allocated with
    every other leaf before the first node, so the first layer runs with all of them held."""
    t, n_kv = g.sh.n_tok, g.sh.n_kv
    top_k = min(n_kv, g.hp("attention.indexer.top_k", n_kv))
    iq = _matmul(
        g,
        f"indexer_q-{il}",
        nbytes=F32 * g.hp("attention.indexer.head_count") * g.hp("attention.indexer.key_length") * t,
        src=qa,
        dev=dev,
    )
    fill = g.add(f"topk_fill-{il}", F32 * top_k * t, leaf=True)
    score = g.add(f"indexer_score-{il}", F32 * n_kv * t, (iq, x, "kq_mask_lid"))
    sel = g.add(f"top_k-{il}", F32 * top_k * t, (score,))
    m1 = g.add(f"lid_mask-{il}", 2 * n_kv * t, (fill, sel, *g.skipped_leafs))
    g.skipped_leafs = []
    return g.add(f"lid_mask2-{il}", 2 * n_kv * t, (m1,))


def _attn_deltanet(g: _Graph, il: int, x: str, dev: str) -> str:
    """qwen35moe's linear-attention layers (``build_layer_attn_linear``, delta-net-base.cpp): the
    mixed QKV through the short convolution (with the conv state), the gated delta rule (its output
    and the new state), the norm gated by ``silu(z)`` and the output projection."""
    t = g.sh.n_tok
    d_inner, d_state, n_group = g.hp("ssm.inner_size"), g.hp("ssm.state_size"), g.hp("ssm.group_count")
    n_v = g.hp("ssm.time_step_rank")
    conv = F32 * (d_inner + 2 * n_group * d_state)
    qkv = _matmul(g, f"qkv_mixed-{il}", nbytes=conv * t, src=x, dev=dev)
    ci = g.add(f"conv_input-{il}", conv * (t + max(g.hp("ssm.conv_kernel") - 1, 0)), (qkv,))
    co = g.add(f"conv_output-{il}", conv * t, (ci,))
    q = g.add(f"q_conv-{il}", F32 * n_group * d_state * t, (co,))
    k = g.add(f"k_conv-{il}", F32 * n_group * d_state * t, (co,))
    dn = g.add(f"delta_out-{il}", F32 * (d_inner * t + n_v * d_state * d_state), (q, k, co))
    nrm = g.add(f"gated_norm-{il}", F32 * d_inner * t, (dn,), weight=dev)
    z = _matmul(g, f"z-{il}", nbytes=F32 * d_inner * t, src=x, dev=dev)
    zs = g.add(f"z_silu-{il}", F32 * d_inner * t, (z,))
    gated = g.add(f"attn_gated-{il}", F32 * d_inner * t, (nrm, zs), inplace=True)
    return _matmul(g, f"linear_attn_out-{il}", nbytes=g.e, src=gated, dev=dev)


def _ffn_dense(g: _Graph, il: int, x: str, dev: str, *, t: int) -> str:
    n_ff = g.hp("feed_forward_length")
    gate = _matmul(g, f"ffn_gate-{il}", nbytes=F32 * n_ff * t, src=x, dev=dev, batch=t)
    up = _matmul(g, f"ffn_up-{il}", nbytes=F32 * n_ff * t, src=x, dev=dev, batch=t)
    act = g.add(f"ffn_swiglu-{il}", F32 * n_ff * t, (gate, up))
    return _matmul(g, f"ffn_out-{il}", nbytes=F32 * g.p.n_embd * t, src=act, dev=dev, batch=t)


def _ffn_moe(g: _Graph, il: int, x: str, dev: str, *, t: int) -> str:
    """``build_moe_ffn``: the router on the layer's device, the experts' matmuls on their weights'
    devices (the up-projection input and the top-k copied there), their down projections' outputs
    (``[n_embd, n_expert_used, n_tokens]``) weighted and summed where the next op with a weight runs,
    then the shared expert (qwen35moe, glm4moe, deepseek2, glm-dsa), on the layer's device."""
    used, n_exp, e = g.p.n_expert_used, g.p.n_expert, F32 * g.p.n_embd * t
    n_ff = g.hp("expert_feed_forward_length")
    logits = _matmul(g, f"ffn_moe_logits-{il}", nbytes=F32 * n_exp * t, src=x, dev=dev, batch=t)
    if f"blk.{il}.ffn_gate_inp.bias" in g.sizes:  # gpt-oss: the router's bias (ggml_add, a new tensor)
        logits = g.add(f"ffn_moe_logits_biased-{il}", F32 * n_exp * t, (logits,), weight=dev, inplace=True)
    probs = g.add(f"ffn_moe_probs-{il}", F32 * n_exp * t, (logits,), inplace=True)
    sel = probs
    if f"blk.{il}.exp_probs_b.bias" in g.sizes:  # the selection bias (deepseek2, glm4moe, glm-dsa)
        sel = g.add(f"ffn_moe_probs_biased-{il}", F32 * n_exp * t, (probs,), weight=dev)
    arg = g.add(f"ffn_moe_argsort-{il}", F32 * n_exp * t, (sel,))
    w = g.add(f"ffn_moe_weights-{il}", F32 * used * t, (probs, arg))
    if g.p.hp("expert_weights_norm", g.p.arch in ("qwen3moe", "qwen35moe", "qwen3next")):
        wsum = g.add(f"ffn_moe_weights_sum-{il}", F32 * t, (w,))
        w = g.add(f"ffn_moe_weights_norm-{il}", F32 * used * t, (w, wsum))
    site = {k: g.sites.experts.get(f"blk.{il}.ffn_{k}_exps.weight", dev) for k in ("gate", "up", "down")}
    gate = _matmul(
        g,
        f"ffn_moe_gate-{il}",
        nbytes=F32 * n_ff * used * t,
        src=x,
        dev=site["gate"],
        tensor=f"blk.{il}.ffn_gate_exps.weight",
        srcs=(arg,),
        batch=t,
    )
    gate = _expert_bias(g, il, "gate", cur=gate, nbytes=F32 * n_ff * used * t, dev=site["gate"], arg=arg)
    up = _matmul(
        g,
        f"ffn_moe_up-{il}",
        nbytes=F32 * n_ff * used * t,
        src=x,
        dev=site["up"],
        tensor=f"blk.{il}.ffn_up_exps.weight",
        srcs=(arg,),
        batch=t,
    )
    up = _expert_bias(g, il, "up", cur=up, nbytes=F32 * n_ff * used * t, dev=site["up"], arg=arg)
    act = g.add(f"ffn_moe_swiglu-{il}", F32 * n_ff * used * t, (gate, up))
    down = _matmul(
        g,
        f"ffn_moe_down-{il}",
        nbytes=e * used,
        src=act,
        dev=site["down"],
        tensor=f"blk.{il}.ffn_down_exps.weight",
        srcs=(arg,),
        batch=t,
    )
    down = _expert_bias(g, il, "down", cur=down, nbytes=e * used, dev=site["down"], arg=arg)
    wd = g.add(f"ffn_moe_weighted-{il}", e * used, (down, w), inplace=True)
    out = g.add(f"ffn_moe_out-{il}", e, (wd,))
    shexp = g.hp("expert_shared_feed_forward_length") or (n_ff * g.hp("expert_shared_count"))
    if shexp:
        sg = _matmul(g, f"ffn_shexp_gate-{il}", nbytes=F32 * shexp * t, src=x, dev=dev, batch=t)
        su = _matmul(g, f"ffn_shexp_up-{il}", nbytes=F32 * shexp * t, src=x, dev=dev, batch=t)
        sa = g.add(f"ffn_shexp_swiglu-{il}", F32 * shexp * t, (sg, su))
        sd = _matmul(g, f"ffn_shexp-{il}", nbytes=e, src=sa, dev=dev, batch=t)
        out = g.add(f"ffn_out-{il}", e, (out, sd), inplace=True)
    return out


def _expert_bias(g: _Graph, il: int, kind: str, *, cur: str, nbytes: int, dev: str, arg: str) -> str:
    """gpt-oss's expert biases: ``ggml_add_id`` of the selected experts' rows on the experts' device
    (where the bias lives with its weight), which the allocator runs in place."""
    if f"blk.{il}.ffn_{kind}_exps.bias" not in g.sizes:
        return cur
    return g.add(f"ffn_moe_{kind}_biased-{il}", nbytes, (cur, arg), weight=dev, inplace=True)


def _recurrent(p: ModelProfile, il: int) -> bool:
    """qwen35moe: every ``full_attention_interval``-th layer has attention, the others a delta net."""
    n = p.hp_int("full_attention_interval", 0)
    return p.is_hybrid_recurrent and n > 0 and (il + 1) % n != 0


def _kept_layers(p: ModelProfile, sites: Sites, keep: int = 2) -> list[int]:
    """The layers the replay builds: of every run of identical blocks (same device, kind and expert
    sites; a block is one layer, or qwen35moe's period of delta nets and one attention layer), the
    first ``keep`` and the last. The allocator's layout repeats from one such block to the next, so
    the ones left out change no buffer; the replay stays fast on 90-layer models."""
    period = p.hp_int("full_attention_interval", 0) if p.is_hybrid_recurrent else 1
    period = max(period, 1)

    def sig(il: int) -> tuple[object, ...]:
        ex = tuple(sites.experts.get(f"blk.{il}.ffn_{k}_exps.weight", "") for k in ("gate", "up", "down"))
        return sites.layers[il], _recurrent(p, il), ex, il < p.n_dense_lead

    blocks = [list(range(b, min(b + period, p.n_layer))) for b in range(0, p.n_layer, period)]
    sigs = [tuple(sig(il) for il in blk) for blk in blocks]
    out: list[int] = []
    run = 0
    for i, blk in enumerate(blocks):
        run = run + 1 if i and sigs[i] == sigs[i - 1] else 1
        last_of_run = i + 1 == len(blocks) or sigs[i + 1] != sigs[i]
        if run <= keep or last_of_run:
            out.extend(blk)
    return out


def build(p: ModelProfile, sh: Shape, sites: Sites, every_layer: bool = False) -> list[Node]:
    """The coarse reserve graph of a mainline model. Only the output rows (``inp_out_ids``) go on
    after the last layer's attention (qwen35moe: after the final norm): the last FFN, the final norm
    and the logits see ``sh.outputs`` tokens. ``every_layer``: no layer left out (``_kept_layers``)."""
    g = _Graph(p, sh, sites)
    cur = _inputs(g)
    last, rows, e_out = p.n_layer - 1, sh.outputs, F32 * p.n_embd * sh.outputs
    kept = set(range(p.n_layer)) if every_layer else set(_kept_layers(p, sites))
    # qwen35moe selects the output rows after the final norm, gpt-oss after the last layer
    late_rows = p.is_hybrid_recurrent or p.arch == "gpt-oss"
    for il in range(p.n_layer):
        if il not in kept:
            if p.arch == "glm-dsa":  # its top-k leaf is still allocated with the others
                top_k = min(sh.n_kv, g.hp("attention.indexer.top_k", sh.n_kv))
                g.skipped_leafs.append(g.add(f"topk_fill-{il}", F32 * top_k * sh.n_tok, leaf=True))
            continue
        dev = sites.layers[il]
        x = g.add(f"attn_norm-{il}", g.e, (cur,), weight=dev)
        if _recurrent(p, il):
            a = _attn_deltanet(g, il, x, dev)
        elif p.is_mla:
            a = _attn_mla(g, il, x, dev)
        else:
            a = _attn_gqa(g, il, x, dev, gated=p.is_hybrid_recurrent)
        selects = il == last and not late_rows  # the last layer keeps only the output rows
        t = rows if selects else sh.n_tok
        e = F32 * p.n_embd * t
        if selects:
            a = g.add(f"attn_rows-{il}", e, (a, "out_ids"))
            cur = g.add(f"inp_rows-{il}", e, (cur, "out_ids"))
        # the residual add takes over the attention output's buffer, except a delta net's, which reaches
        # it as a reshaped view: the allocator then takes the residual stream's (qwen35moe.cpp)
        res = g.add(f"ffn_inp-{il}", e, (cur, a) if _recurrent(p, il) else (a, cur), inplace=True)
        n = g.add(f"ffn_norm-{il}", e, (res,), weight=dev)
        moe = any(f"blk.{il}.ffn_{k}_exps.weight" in g.sizes for k in ("gate", "up", "down"))
        f = _ffn_moe(g, il, n, dev, t=t) if moe else _ffn_dense(g, il, n, dev, t=t)
        cur = g.add(f"l_out-{il}", e, (f, res), inplace=True)
    # the graph's outputs are never freed (``llm_graph_result::set_outputs`` flags the logits, the
    # final hidden state ``t_embd`` and the MTP seed ``t_h_nextn``, the normed hidden state)
    if p.arch == "gpt-oss":
        cur = g.add("out_rows", e_out, (cur, "out_ids"))
    norm = g.add(
        "result_norm",
        F32 * p.n_embd * (sh.n_tok if p.is_hybrid_recurrent else rows),
        (cur,),
        weight=sites.output,
        inplace=True,
        pinned=True,
    )
    if p.is_hybrid_recurrent:  # qwen35moe selects the output rows after the final norm
        norm = g.add("result_rows", e_out, (norm, "out_ids"), pinned=True)
    g.add(
        "result_output",
        F32 * p.n_vocab * rows,
        (norm,),
        weight=sites.output,
        weight_bytes=g.sizes.get("output.weight", 0),
        batch=rows,
    )
    return g.nodes
