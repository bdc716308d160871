"""Architectures moetune can generate: their hyperparameter keys and tensor layouts.

Each family is a function from :class:`Dims` to the GGUF metadata and the list of tensors that
llama.cpp's loader expects for it (names, ggml shapes), as read from llama.cpp's
``src/models/<arch>.cpp``. The generator writes them; the real llama-server loading the result is
the test that they are right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True, kw_only=True)
class Dims:
    """Shape of a generated model. ``n_layer`` counts trunk blocks; NextN blocks come after them."""

    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 512  # dense FFN width (leading dense layers)
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 128
    n_expert_shared: int = 1
    n_dense_lead: int = 0
    n_nextn: int = 0
    n_vocab: int = 259
    n_ctx_train: int = 4096
    # MLA (deepseek2, glm-dsa)
    q_lora_rank: int = 256
    kv_lora_rank: int = 512
    rope_dim: int = 64
    k_head_mla: int = 192  # qk_nope + rope
    v_head_mla: int = 128
    # DSA lightning indexer (glm-dsa)
    indexer_n_head: int = 4
    indexer_head_size: int = 128
    indexer_top_k: int = 2048
    # gated delta-net (qwen35moe)
    ssm_d_conv: int = 4
    ssm_d_state: int = 128
    ssm_n_group: int = 2
    ssm_dt_rank: int = 2
    full_attention_interval: int = 2
    # sliding-window attention (gpt-oss: every other layer)
    n_swa: int = 128

    @property
    def n_blocks(self) -> int:
        return self.n_layer + self.n_nextn


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # ggml order
    kind: str  # name without block prefix and suffix: "ffn_gate_exps", "attn_q", "token_embd"
    force_f32: bool = False  # norms, biases, convolutions: llama.cpp keeps them in F32


@dataclass(frozen=True, slots=True)
class Layout:
    metadata: dict[str, object]
    tensors: list[TensorSpec]


class _T:
    """Collects tensors in file order."""

    def __init__(self) -> None:
        self.out: list[TensorSpec] = []

    def add(self, name: str, *shape: int, f32: bool = False) -> None:
        base = name.split(".", 2)[2] if name.startswith("blk.") else name
        kind = base.rsplit(".", 1)[0] if base.endswith((".weight", ".bias")) else base
        self.out.append(TensorSpec(name, tuple(shape), kind, f32 or len(shape) == 1))


def _common_meta(arch: str, d: Dims) -> dict[str, object]:
    return {
        "general.architecture": arch,
        "general.name": f"moetune-{arch}",
        f"{arch}.context_length": d.n_ctx_train,
        f"{arch}.embedding_length": d.n_embd,
        f"{arch}.block_count": d.n_blocks,
        f"{arch}.feed_forward_length": d.n_ff,
        f"{arch}.attention.head_count": d.n_head,
        f"{arch}.attention.head_count_kv": d.n_head_kv,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.expert_count": d.n_expert,
        f"{arch}.expert_used_count": d.n_expert_used,
        f"{arch}.expert_feed_forward_length": d.n_ff_exp,
        f"{arch}.vocab_size": d.n_vocab,
    }


def _head(t: _T, d: Dims) -> None:
    t.add("token_embd.weight", d.n_embd, d.n_vocab)
    t.add("output_norm.weight", d.n_embd)
    t.add("output.weight", d.n_embd, d.n_vocab)


def _gqa_attn(t: _T, d: Dims, i: int, *, q_gate: bool = False, qk_norm: bool = True, qkv_bias: bool = False) -> None:
    q = d.n_head * d.head_dim
    kv = d.n_head_kv * d.head_dim
    t.add(f"blk.{i}.attn_q.weight", d.n_embd, q * 2 if q_gate else q)
    t.add(f"blk.{i}.attn_k.weight", d.n_embd, kv)
    t.add(f"blk.{i}.attn_v.weight", d.n_embd, kv)
    if qkv_bias:  # GLM-4.5's attention has biases; ik_llama.cpp's loader requires them
        t.add(f"blk.{i}.attn_q.bias", q * 2 if q_gate else q)
        t.add(f"blk.{i}.attn_k.bias", kv)
        t.add(f"blk.{i}.attn_v.bias", kv)
    t.add(f"blk.{i}.attn_output.weight", q, d.n_embd)
    if qk_norm:
        t.add(f"blk.{i}.attn_q_norm.weight", d.head_dim)
        t.add(f"blk.{i}.attn_k_norm.weight", d.head_dim)


def _mla_attn(t: _T, d: Dims, i: int) -> None:
    nope = d.k_head_mla - d.rope_dim
    t.add(f"blk.{i}.attn_q_a_norm.weight", d.q_lora_rank)
    t.add(f"blk.{i}.attn_kv_a_norm.weight", d.kv_lora_rank)
    t.add(f"blk.{i}.attn_q_a.weight", d.n_embd, d.q_lora_rank)
    t.add(f"blk.{i}.attn_q_b.weight", d.q_lora_rank, d.n_head * d.k_head_mla)
    t.add(f"blk.{i}.attn_kv_a_mqa.weight", d.n_embd, d.kv_lora_rank + d.rope_dim)
    t.add(f"blk.{i}.attn_k_b.weight", nope, d.kv_lora_rank, d.n_head)
    t.add(f"blk.{i}.attn_v_b.weight", d.kv_lora_rank, d.v_head_mla, d.n_head)
    t.add(f"blk.{i}.attn_output.weight", d.n_head * d.v_head_mla, d.n_embd)


def _dense_ffn(t: _T, d: Dims, i: int) -> None:
    t.add(f"blk.{i}.ffn_gate.weight", d.n_embd, d.n_ff)
    t.add(f"blk.{i}.ffn_down.weight", d.n_ff, d.n_embd)
    t.add(f"blk.{i}.ffn_up.weight", d.n_embd, d.n_ff)


def _experts(t: _T, d: Dims, i: int, *, probs_bias: bool = False) -> None:
    t.add(f"blk.{i}.ffn_gate_inp.weight", d.n_embd, d.n_expert, f32=True)
    if probs_bias:
        t.add(f"blk.{i}.exp_probs_b.bias", d.n_expert)
    t.add(f"blk.{i}.ffn_gate_exps.weight", d.n_embd, d.n_ff_exp, d.n_expert)
    t.add(f"blk.{i}.ffn_down_exps.weight", d.n_ff_exp, d.n_embd, d.n_expert)
    t.add(f"blk.{i}.ffn_up_exps.weight", d.n_embd, d.n_ff_exp, d.n_expert)


def _shared_expert(t: _T, d: Dims, i: int, width: int) -> None:
    t.add(f"blk.{i}.ffn_gate_shexp.weight", d.n_embd, width)
    t.add(f"blk.{i}.ffn_down_shexp.weight", width, d.n_embd)
    t.add(f"blk.{i}.ffn_up_shexp.weight", d.n_embd, width)


def _nextn(t: _T, d: Dims, i: int) -> None:
    t.add(f"blk.{i}.nextn.eh_proj.weight", 2 * d.n_embd, d.n_embd)
    t.add(f"blk.{i}.nextn.enorm.weight", d.n_embd)
    t.add(f"blk.{i}.nextn.hnorm.weight", d.n_embd)
    t.add(f"blk.{i}.nextn.shared_head_norm.weight", d.n_embd)


def qwen3moe(d: Dims) -> Layout:
    arch = "qwen3moe"
    meta = _common_meta(arch, d)
    meta[f"{arch}.attention.key_length"] = d.head_dim
    meta[f"{arch}.attention.value_length"] = d.head_dim
    meta[f"{arch}.rope.dimension_count"] = d.head_dim
    t = _T()
    _head(t, d)
    for i in range(d.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", d.n_embd)
        _gqa_attn(t, d, i)
        t.add(f"blk.{i}.ffn_norm.weight", d.n_embd)
        _experts(t, d, i)
    return Layout(meta, t.out)


def glm4moe(d: Dims) -> Layout:
    arch = "glm4moe"
    meta = _common_meta(arch, d)
    meta.update(
        {
            f"{arch}.attention.key_length": d.head_dim,
            f"{arch}.attention.value_length": d.head_dim,
            f"{arch}.rope.dimension_count": d.head_dim // 2,
            f"{arch}.expert_shared_count": d.n_expert_shared,
            f"{arch}.leading_dense_block_count": d.n_dense_lead,
            f"{arch}.nextn_predict_layers": d.n_nextn,
            f"{arch}.expert_weights_scale": 1.0,
            f"{arch}.expert_weights_norm": True,
            f"{arch}.expert_gating_func": 2,
        }
    )
    t = _T()
    _head(t, d)
    for i in range(d.n_blocks):
        t.add(f"blk.{i}.attn_norm.weight", d.n_embd)
        _gqa_attn(t, d, i, qkv_bias=True)
        t.add(f"blk.{i}.post_attention_norm.weight", d.n_embd)
        if i < d.n_dense_lead:
            _dense_ffn(t, d, i)
        else:
            _experts(t, d, i, probs_bias=True)
            if d.n_expert_shared:
                _shared_expert(t, d, i, d.n_ff_exp * d.n_expert_shared)
        if i >= d.n_layer:
            _nextn(t, d, i)
    return Layout(meta, t.out)


def _mla_meta(arch: str, d: Dims) -> dict[str, object]:
    meta = _common_meta(arch, d)
    meta.update(
        {
            f"{arch}.attention.head_count_kv": 1,
            f"{arch}.attention.key_length": d.kv_lora_rank + d.rope_dim,
            f"{arch}.attention.value_length": d.kv_lora_rank,
            f"{arch}.attention.key_length_mla": d.k_head_mla,
            f"{arch}.attention.value_length_mla": d.v_head_mla,
            f"{arch}.attention.q_lora_rank": d.q_lora_rank,
            f"{arch}.attention.kv_lora_rank": d.kv_lora_rank,
            f"{arch}.rope.dimension_count": d.rope_dim,
            f"{arch}.expert_shared_count": d.n_expert_shared,
            f"{arch}.leading_dense_block_count": d.n_dense_lead,
            f"{arch}.expert_weights_scale": 1.0,
            f"{arch}.expert_weights_norm": True,
            f"{arch}.expert_gating_func": 2,
        }
    )
    return meta


def _mla_block(t: _T, d: Dims, i: int) -> None:
    t.add(f"blk.{i}.attn_norm.weight", d.n_embd)
    _mla_attn(t, d, i)
    t.add(f"blk.{i}.ffn_norm.weight", d.n_embd)


def _mla_ffn(t: _T, d: Dims, i: int) -> None:
    if i < d.n_dense_lead:
        _dense_ffn(t, d, i)
    else:
        _experts(t, d, i, probs_bias=True)
        _shared_expert(t, d, i, d.n_ff_exp * d.n_expert_shared)


def deepseek2(d: Dims) -> Layout:
    arch = "deepseek2"
    meta = _mla_meta(arch, d)
    meta[f"{arch}.nextn_predict_layers"] = d.n_nextn
    t = _T()
    _head(t, d)
    for i in range(d.n_blocks):
        _mla_block(t, d, i)
        _mla_ffn(t, d, i)
        if i >= d.n_layer:
            _nextn(t, d, i)
    return Layout(meta, t.out)


def glm_dsa(d: Dims) -> Layout:
    arch = "glm-dsa"
    meta = _mla_meta(arch, d)
    meta.update(
        {
            f"{arch}.nextn_predict_layers": d.n_nextn,
            f"{arch}.attention.indexer.head_count": d.indexer_n_head,
            f"{arch}.attention.indexer.key_length": d.indexer_head_size,
            f"{arch}.attention.indexer.top_k": d.indexer_top_k,
            f"{arch}.rope.dimension_sections": [0, 0, 0, 0],
        }
    )
    t = _T()
    _head(t, d)
    for i in range(d.n_blocks):
        _mla_block(t, d, i)
        t.add(f"blk.{i}.indexer.k_norm.weight", d.indexer_head_size)
        t.add(f"blk.{i}.indexer.k_norm.bias", d.indexer_head_size)
        t.add(f"blk.{i}.indexer.proj.weight", d.n_embd, d.indexer_n_head)
        t.add(f"blk.{i}.indexer.attn_k.weight", d.n_embd, d.indexer_head_size)
        t.add(f"blk.{i}.indexer.attn_q_b.weight", d.q_lora_rank, d.indexer_n_head * d.indexer_head_size)
        _mla_ffn(t, d, i)
        if i >= d.n_layer:
            _nextn(t, d, i)
    return Layout(meta, t.out)


def qwen35moe(d: Dims) -> Layout:
    arch = "qwen35moe"
    meta = _common_meta(arch, d)
    key_dim = d.ssm_d_state * d.ssm_n_group
    value_dim = d.ssm_d_state * d.ssm_dt_rank
    meta.update(
        {
            f"{arch}.attention.key_length": d.head_dim,
            f"{arch}.attention.value_length": d.head_dim,
            f"{arch}.rope.dimension_count": d.head_dim // 4,
            f"{arch}.rope.dimension_sections": [d.head_dim // 16, d.head_dim // 16, d.head_dim // 16, 0],
            f"{arch}.expert_shared_feed_forward_length": d.n_ff_exp,
            f"{arch}.ssm.conv_kernel": d.ssm_d_conv,
            f"{arch}.ssm.inner_size": value_dim,
            f"{arch}.ssm.state_size": d.ssm_d_state,
            f"{arch}.ssm.time_step_rank": d.ssm_dt_rank,
            f"{arch}.ssm.group_count": d.ssm_n_group,
            f"{arch}.full_attention_interval": d.full_attention_interval,
            f"{arch}.nextn_predict_layers": d.n_nextn,
        }
    )
    t = _T()
    _head(t, d)
    for i in range(d.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", d.n_embd)
        t.add(f"blk.{i}.post_attention_norm.weight", d.n_embd)
        if (i + 1) % d.full_attention_interval == 0:
            _gqa_attn(t, d, i, q_gate=True)
        else:
            t.add(f"blk.{i}.attn_qkv.weight", d.n_embd, key_dim * 2 + value_dim)
            t.add(f"blk.{i}.attn_gate.weight", d.n_embd, value_dim)
            t.add(f"blk.{i}.ssm_conv1d.weight", d.ssm_d_conv, key_dim * 2 + value_dim, f32=True)
            t.add(f"blk.{i}.ssm_dt.bias", d.ssm_dt_rank)
            t.add(f"blk.{i}.ssm_a", d.ssm_dt_rank)
            t.add(f"blk.{i}.ssm_beta.weight", d.n_embd, d.ssm_dt_rank)
            t.add(f"blk.{i}.ssm_alpha.weight", d.n_embd, d.ssm_dt_rank)
            t.add(f"blk.{i}.ssm_norm.weight", d.ssm_d_state)
            t.add(f"blk.{i}.ssm_out.weight", value_dim, d.n_embd)
        _experts(t, d, i)
        t.add(f"blk.{i}.ffn_gate_inp_shexp.weight", d.n_embd)
        _shared_expert(t, d, i, d.n_ff_exp)
    return Layout(meta, t.out)


def gpt_oss(d: Dims) -> Layout:
    """llama.cpp's ``gpt-oss`` (src/models/openai-moe.cpp): attention with biases and a learned sink
        per head, even layers on a sliding window (the engine's default pattern of period 2: published
    files carry no pattern key, and neither do these), a
        router with a bias, and routed experts with biases (SwiGLU-OAI); no shared expert."""
    arch = "gpt-oss"
    meta = _common_meta(arch, d)
    meta.update(
        {
            f"{arch}.attention.key_length": d.head_dim,
            f"{arch}.attention.value_length": d.head_dim,
            f"{arch}.rope.dimension_count": d.head_dim,
            f"{arch}.attention.sliding_window": d.n_swa,
            f"{arch}.expert_weights_scale": 1.0,
        }
    )
    t = _T()
    _head(t, d)
    for i in range(d.n_layer):
        t.add(f"blk.{i}.attn_norm.weight", d.n_embd)
        _gqa_attn(t, d, i, qk_norm=False, qkv_bias=True)
        t.add(f"blk.{i}.attn_output.bias", d.n_embd)
        t.add(f"blk.{i}.attn_sinks.weight", d.n_head)
        t.add(f"blk.{i}.post_attention_norm.weight", d.n_embd)
        _experts(t, d, i)
        t.add(f"blk.{i}.ffn_gate_inp.bias", d.n_expert)
        t.add(f"blk.{i}.ffn_gate_exps.bias", d.n_ff_exp, d.n_expert, f32=True)
        t.add(f"blk.{i}.ffn_down_exps.bias", d.n_embd, d.n_expert, f32=True)
        t.add(f"blk.{i}.ffn_up_exps.bias", d.n_ff_exp, d.n_expert, f32=True)
    return Layout(meta, t.out)


ARCHS: dict[str, Callable[[Dims], Layout]] = {
    "qwen3moe": qwen3moe,
    "glm4moe": glm4moe,
    "deepseek2": deepseek2,
    "qwen35moe": qwen35moe,
    "glm-dsa": glm_dsa,
    "gpt-oss": gpt_oss,
}

# Replicas of published models, for sparse header-exact files (`testmodel --preset NAME --sparse`).
# Every shape comes from the model's published configuration (Hugging Face config.json, or the
# Megatron MODEL_ARGS that reproduce it); the repositories and paths below are where they were read.
#
# | preset              | arch      | layers (+NextN) | embd | heads/kv (head dim) | experts (used) | exp ff | shexp ff | dense lead (ff) | vocab  | ctx    | source |
# |---------------------|-----------|-----------------|------|---------------------|----------------|--------|----------|-----------------|--------|--------|--------|
# | glm-5.1             | glm-dsa   | 78 (+1)         | 6144 | 64 MLA (q_lora 2048, kv_lora 512, rope 64, k 256, v 256); indexer 32 x 128, top-k 2048 | 256 (8) | 2048 | 2048 | 3 (12288) | 154880 | 202752 | radixark/miles scripts/models/glm5-744B-A40B.sh; jd-opensource/xllm xllm/models/llm/glm5.h (vocab, ctx) |
# | glm-5.2             | glm-dsa   | as glm-5.1      |      |                     |                |        |          |                 |        | 1048576 | no published config found; 1M context as llama.cpp's src/models/glm-dsa.cpp tells GLM-5.2 apart (it then shares each full indexer's top-k with the next three layers); reference 004: the same architecture (glm_moe_dsa), 753B total (our count for this shape: 753.9B with the NextN block), `unused tensor blk.78` (one NextN block after 78) |
# | qwen3.5-397b-a17b   | qwen35moe | 60              | 4096 | 32/2 (256), gated; every 4th layer full attention | 512 (10) | 1024 | 1024 | - | 248320 | 262144 | THUDM/slime scripts/models/qwen3.5-397B-A17B.sh; delta-net 16 key heads, 64 value heads, head dim 128, conv 4: the model's config.json as quoted in public code found by the index (repository not named by it) |
# | qwen3-coder-next    | qwen35moe | 48              | 2048 | 16/2 (256), gated; every 4th layer full attention | 512 (10) | 512 | 512 | - | 151936 | 262144 | THUDM/slime scripts/models/qwen3-next-80B-A3B.sh (Qwen3-Next-80B-A3B); docker/model-runner ai/qwen3-coder-next-vllm.md (delta-net 16 QK / 32 V heads of 128) |
# | deepseek-v3         | deepseek2 | 61              | 7168 | 128 MLA (q_lora 1536, kv_lora 512, rope 64, k 192, v 128) | 256 (8) | 2048 | 2048 | 3 (18432) | 129280 | 163840 | zyzshishui/slime scripts/models/deepseek-v3.sh |
# | qwen3-235b-a22b     | qwen3moe  | 94              | 4096 | 64/4 (128)          | 128 (8)        | 1536   | -        | -               | 151936 | 40960  | zyzshishui/slime scripts/models/qwen3-235B-A22B.sh |
# | qwen3-coder-480b-a35b | qwen3moe | 62             | 6144 | 96/8 (128)          | 160 (8)        | 2560   | -        | -               | 151936 | 262144 | zyzshishui/miles scripts/models/qwen3-coder-480B-A35B.sh |
# | glm-4.6             | glm4moe   | 92 (+1)         | 5120 | 96/8 (128), qkv bias | 160 (8)       | 1536   | 1536     | 3 (12288)       | 151552 | 202752 | zyzshishui/slime scripts/models/glm4.5-355B-A32B.sh (GLM-4.5, the same network); xorbitsai/inference doc/source/models/builtin/llm/glm-4.6.rst (ctx) |
#
# | gpt-oss-120b        | gpt-oss   | 36              | 2880 | 64/8 (64), qkv/out bias, sinks; even layers slide over 128 tokens | 128 (4) | 2880 | - | - | 201088 | 131072 | openai/gpt-oss-120b config.json (as quoted by llama.cpp's convert_hf_to_gguf.py GptOssModel and test-llama-archs.cpp) |
#
# Qwen3-Coder-Next is llama.cpp's
# `qwen3next` in published GGUFs; its replica uses `qwen35moe`, the same layers and state with the
# delta-net input projections split in two (the same bytes per layer, within the row padding).
# DeepSeek-V3's GGUFs carry no MTP block (the converter drops layer 61), so neither does the replica.
_GLM5 = Dims(
    n_layer=78,
    n_nextn=1,
    n_embd=6144,
    n_head=64,
    n_ff=12288,
    n_expert=256,
    n_expert_used=8,
    n_ff_exp=2048,
    n_expert_shared=1,
    n_dense_lead=3,
    n_vocab=154880,
    n_ctx_train=202752,
    q_lora_rank=2048,
    kv_lora_rank=512,
    rope_dim=64,
    k_head_mla=256,
    v_head_mla=256,
    indexer_n_head=32,
    indexer_head_size=128,
    indexer_top_k=2048,
)

PRESETS: dict[str, tuple[str, Dims]] = {
    "glm-5.1": ("glm-dsa", _GLM5),
    "glm-5.2": ("glm-dsa", replace(_GLM5, n_ctx_train=1048576)),
    "qwen3.5-397b-a17b": (
        "qwen35moe",
        Dims(
            n_layer=60,
            n_embd=4096,
            n_head=32,
            n_head_kv=2,
            head_dim=256,
            n_ff=1024,
            n_expert=512,
            n_expert_used=10,
            n_ff_exp=1024,
            n_vocab=248320,
            n_ctx_train=262144,
            ssm_d_conv=4,
            ssm_d_state=128,
            ssm_n_group=16,
            ssm_dt_rank=64,
            full_attention_interval=4,
        ),
    ),
    "qwen3-coder-next": (
        "qwen35moe",
        Dims(
            n_layer=48,
            n_embd=2048,
            n_head=16,
            n_head_kv=2,
            head_dim=256,
            n_ff=512,
            n_expert=512,
            n_expert_used=10,
            n_ff_exp=512,
            n_vocab=151936,
            n_ctx_train=262144,
            ssm_d_conv=4,
            ssm_d_state=128,
            ssm_n_group=16,
            ssm_dt_rank=32,
            full_attention_interval=4,
        ),
    ),
    "deepseek-v3": (
        "deepseek2",
        Dims(
            n_layer=61,
            n_embd=7168,
            n_head=128,
            n_ff=18432,
            n_expert=256,
            n_expert_used=8,
            n_ff_exp=2048,
            n_expert_shared=1,
            n_dense_lead=3,
            n_vocab=129280,
            n_ctx_train=163840,
            q_lora_rank=1536,
            kv_lora_rank=512,
            rope_dim=64,
            k_head_mla=192,
            v_head_mla=128,
        ),
    ),
    "qwen3-235b-a22b": (
        "qwen3moe",
        Dims(
            n_layer=94,
            n_embd=4096,
            n_head=64,
            n_head_kv=4,
            head_dim=128,
            n_ff=12288,
            n_expert=128,
            n_expert_used=8,
            n_ff_exp=1536,
            n_vocab=151936,
            n_ctx_train=40960,
        ),
    ),
    "qwen3-coder-480b-a35b": (
        "qwen3moe",
        Dims(
            n_layer=62,
            n_embd=6144,
            n_head=96,
            n_head_kv=8,
            head_dim=128,
            n_ff=8192,
            n_expert=160,
            n_expert_used=8,
            n_ff_exp=2560,
            n_vocab=151936,
            n_ctx_train=262144,
        ),
    ),
    "glm-4.6": (
        "glm4moe",
        Dims(
            n_layer=92,
            n_nextn=1,
            n_embd=5120,
            n_head=96,
            n_head_kv=8,
            head_dim=128,
            n_ff=12288,
            n_expert=160,
            n_expert_used=8,
            n_ff_exp=1536,
            n_expert_shared=1,
            n_dense_lead=3,
            n_vocab=151552,
            n_ctx_train=202752,
        ),
    ),
    "gpt-oss-120b": (
        "gpt-oss",
        Dims(
            n_layer=36,
            n_embd=2880,
            n_head=64,
            n_head_kv=8,
            head_dim=64,
            n_ff=2880,
            n_expert=128,
            n_expert_used=4,
            n_ff_exp=2880,
            n_vocab=201088,
            n_ctx_train=131072,
            n_swa=128,
        ),
    ),
}


# Quant recipes for the presets (per tensor kind; `other` for the rest, norms stay F32). Published
# files quantize some layers' tensors finer than others; a recipe per kind approximates that mix
# (Q4_K_M: ffn_down half Q4_K, half Q6_K -> Q5_K here). Sizes of the sparse replicas written with
# them, against the published files:
#
# | preset                | recipe (published file)  | replica bytes       | published                       |
# |-----------------------|--------------------------|---------------------|---------------------------------|
# | glm-5.1               | IQ3_KS (ik, reference 000) | 318.1 GiB         | 320.2 GiB (reference 000)       |
# | glm-5.2               | UD-IQ1_M                 | 224,935,781,376     | 228,492,966,624 (reference 004), -1.6% |
# | qwen3.5-397b-a17b     | Q4_K_M                   | 243,574,057,984     | 4.92 bpw over 396.4B parameters |
# | qwen3-coder-next      | Q4_0                     | 45,920,617,472      | about 45 GB of weights (reference 000) |
# | deepseek-v3           | Q4_K_M                   | 412,885,254,144     | about 404 GB (Hugging Face listings), +2% |
# | qwen3-235b-a22b       | Q4_K_M                   | 145,386,366,976     | about 142.7 GB (Hugging Face listings), +2% |
# | qwen3-coder-480b-a35b | Q4_K_M                   | 295,114,416,128     | 290 GB (unsloth's table as quoted in public notes), +1.8% |
# | glm-4.6               | UD-Q4_K_XL               | 208,863,270,144     | 204 GB (unsloth's announcement), +2.4% |
# | gpt-oss-120b          | MXFP4 (experts), Q8_0    | 63,374,323,968      | 59.02 GiB (llama-bench's model size in llama.cpp's published gpt-oss benchmarks), 0.0% |
_Q4_K_M = "ffn_gate_exps=q4_k,ffn_up_exps=q4_k,ffn_down_exps=q5_k,token_embd=q4_k,output=q6_k,other=q8_0"
PRESET_RECIPES: dict[str, str] = {
    # GLM-5.1: the reference's IQ3_KS routed experts (gate/up iq3_ks, down iq4_ks: 1225 + 1225 + 1638
    # MiB per layer, 307110 MiB of CUDA_Host with an iq4_k token embedding, as in ../shared/reference/000)
    # and ik types for the rest: 318.1 GiB in all and about 13.5 GiB of non-expert weights on the GPU.
    "glm-5.1": (
        "ffn_gate_exps=iq3_ks,ffn_up_exps=iq3_ks,ffn_down_exps=iq4_ks,attn_output=iq5_ks,attn_q_b=iq6_k,"
        "ffn_gate_shexp=iq6_k,ffn_up_shexp=iq6_k,ffn_down_shexp=iq6_k,token_embd=iq4_k,output=iq6_k,"
        "other=q8_0"
    ),
    "glm-5.2": "ffn_gate_exps=iq2_xxs,ffn_up_exps=iq2_xxs,ffn_down_exps=iq2_s,token_embd=q4_k,output=q6_k,other=q8_0",
    "qwen3.5-397b-a17b": _Q4_K_M,
    "qwen3-coder-next": "ffn_gate_exps=q4_0,ffn_up_exps=q4_0,ffn_down_exps=q4_0,token_embd=q4_0,output=q6_k,other=q8_0",
    "deepseek-v3": _Q4_K_M,
    "qwen3-235b-a22b": _Q4_K_M,
    "qwen3-coder-480b-a35b": _Q4_K_M,
    "glm-4.6": "ffn_gate_exps=q4_k,ffn_up_exps=q4_k,ffn_down_exps=q4_k,token_embd=q4_k,output=q6_k,other=q8_0",
    "gpt-oss-120b": "ffn_gate_exps=mxfp4,ffn_up_exps=mxfp4,ffn_down_exps=mxfp4,other=q8_0",
}

# Other typical recipes: `mainline` where the default uses ik_llama.cpp types (what mainline
# llama.cpp and its llama-fit-params load), `ik` where an ik_llama.cpp quant is what users run.
PRESET_VARIANTS: dict[str, dict[str, str]] = {
    "glm-5.1": {"mainline": "ffn_gate_exps=iq3_s,ffn_up_exps=iq3_s,ffn_down_exps=iq4_xs,token_embd=q4_k,other=q8_0"},
    "qwen3-coder-next": {"ik": "ffn_gate_exps=iq4_kss,ffn_up_exps=iq4_kss,ffn_down_exps=iq4_kss,other=q8_0"},
    "deepseek-v3": {"ik": "ffn_gate_exps=iq3_k,ffn_up_exps=iq3_k,ffn_down_exps=iq4_k,token_embd=q4_k,other=q8_0"},
    "qwen3.5-397b-a17b": {"ik": "ffn_gate_exps=iq3_ks,ffn_up_exps=iq3_ks,ffn_down_exps=iq4_ks,other=q8_0"},
}


def mainline_recipe(preset: str) -> str:
    """The preset's recipe in types mainline llama.cpp loads."""
    return PRESET_VARIANTS.get(preset, {}).get("mainline", PRESET_RECIPES[preset])


# Small shapes of every family, each exercising its features (dense lead layers, NextN, MLA with
# few heads), that llama-server loads in a fraction of a second: what the test suite and the
# benches measure the engine on. `wide` doubles the width and experts, for a second point.
_SMALL: dict[str, Dims] = {
    "qwen3moe": Dims(),
    "glm4moe": Dims(n_dense_lead=1, n_nextn=1),
    "deepseek2": Dims(n_dense_lead=1, n_head=2, n_head_kv=1),
    "qwen35moe": Dims(),
    "glm-dsa": Dims(n_dense_lead=1, n_nextn=1, n_head=2, n_head_kv=1),
    "gpt-oss": Dims(n_swa=128),
}


def small_dims(arch: str, wide: bool = False) -> Dims:
    d = _SMALL[arch]
    if not wide:
        return d
    mla = d.n_head == 2
    return replace(
        d,
        n_embd=512,
        n_expert=16,
        n_expert_used=4,
        n_ff_exp=256,
        n_ff=1024,
        n_head=4 if mla else 8,
        n_head_kv=1 if mla else 4,
    )


def with_overrides(d: Dims, **kw: int | None) -> Dims:
    return replace(d, **{k: v for k, v in kw.items() if v is not None})
