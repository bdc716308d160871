"""KV cache and recurrent state sizes: one formula per architecture family, per engine.

- GQA: K and V rows of ``n_head_kv * head_dim`` per token per attention layer.
- MLA (DeepSeek-2, GLM-5.x): one K row of ``kv_lora_rank + rope_dim`` (the compressed latent) per
  token per layer and no V cache; mainline llama.cpp adds the DSA lightning indexer's key row
  (``indexer.key_length``) on indexer layers, which ik_llama.cpp does not implement.
- Hybrid recurrent (Qwen3-Next, Qwen3.5): KV only on the full-attention layers, plus a fixed F32
  state per sequence on the recurrent layers (convolution rows and the delta-net state).

Sliding-window attention (gpt-oss, Gemma-2/3, Cohere2, EXAONE-4 ...): the GGUF declares the window
(``attention.sliding_window``) and which layers use it (``attention.sliding_window_pattern``: one
switch per layer, or a period; without it the architecture's own default period). llama.cpp then
keeps two caches (``llama_kv_cache_iswa``): the full-attention layers' of the whole context, the
windowed layers' of about a window per sequence (``moetune.plan.ledger.swa_cells``); ik_llama.cpp
sizes every layer's cache for the context.

NextN/MTP blocks carry no KV. Checked against llama-server's own ``llama_kv_cache: size =`` and
``RS buffer size`` lines by the test suite.
"""

from __future__ import annotations

from dataclasses import dataclass

from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.profile import ModelProfile
from moetune.model.quants import by_name

CACHE_TYPES = ("f16", "q8_0", "q4_0")
F32_BYTES = 4


KV_PAD = 256  # llama.cpp pads a cache's cells per stream to this


def full_cells(ctx: int, slots: int, unified: bool = False) -> int:
    """KV cells llama.cpp allocates: per stream ``ctx / slots`` padded to 256, times the streams
    (one stream for one slot or a unified cache)."""
    if unified or slots <= 1:
        return -(-ctx // KV_PAD) * KV_PAD
    return -(-(ctx // slots) // KV_PAD) * KV_PAD * slots


def swa_cells(ctx: int, slots: int, ubatch: int, n_swa: int, *, unified: bool = False, swa_full: bool = False) -> int:
    """Cells of the sliding-window layers' cache (``llama_kv_cache_iswa``): per stream the window
    times the sequences it is shared by (all of them in a unified cache, one otherwise) plus one
    ubatch, at most the full cache's, padded to 256; the full cache's with ``--swa-full``."""
    full = full_cells(ctx, slots, unified)
    if n_swa <= 0 or swa_full:
        return full
    streams = 1 if unified or slots <= 1 else slots
    per = min(full // streams, n_swa * (slots if unified else 1) + ubatch)
    return -(-per // KV_PAD) * KV_PAD * streams


@dataclass(frozen=True, slots=True)
class LayerKV:
    layer: int
    k_rows: tuple[int, ...]  # elements per token of each K row (MLA latent, indexer key)
    v_rows: tuple[int, ...]
    swa: bool = False  # a sliding-window layer: its cache holds about a window, not the context


@dataclass(frozen=True, slots=True, kw_only=True)
class KVShape:
    family: str  # gqa | mla | hybrid
    layers: tuple[LayerKV, ...]
    recurrent_layers: tuple[int, ...] = ()
    rs_bytes_per_layer_seq: int = 0  # F32 recurrent state per recurrent layer and sequence
    n_swa: int = 0  # the sliding window (tokens) of the layers flagged ``swa``; 0: none

    def bytes_per_token_split(self, ctk: str = "f16", ctv: str = "f16") -> tuple[int, int]:
        """KV bytes per cached token of the full-attention layers and of the sliding-window ones."""
        full = sum(self.layer_bytes_per_token(lk, ctk, ctv) for lk in self.layers if not lk.swa)
        return full, self.bytes_per_token(ctk, ctv) - full

    def bytes_per_token(self, ctk: str = "f16", ctv: str = "f16") -> int:
        return sum(self.layer_bytes_per_token(lk, ctk, ctv) for lk in self.layers)

    @staticmethod
    def layer_bytes_per_token(lk: LayerKV, ctk: str = "f16", ctv: str = "f16") -> int:
        """InputError where a cache type cannot hold this layer's rows (a quantized type needs rows
        that are whole blocks; llama.cpp refuses the context otherwise)."""
        tk, tv = by_name(ctk), by_name(ctv)
        try:
            return sum(tk.row_bytes(n) for n in lk.k_rows) + sum(tv.row_bytes(n) for n in lk.v_rows)
        except ValueError as e:
            raise InputError(
                f"KV cache type {ctk}/{ctv} cannot hold layer {lk.layer}'s rows ({e})",
                hint="choose f16 for the cache (--ctk/--ctv)",
            ) from None

    def by_layer(self, ctk: str = "f16", ctv: str = "f16") -> dict[int, int]:
        return {lk.layer: self.layer_bytes_per_token(lk, ctk, ctv) for lk in self.layers}

    @property
    def rs_bytes_per_seq(self) -> int:
        return self.rs_bytes_per_layer_seq * len(self.recurrent_layers)


def _per_layer(p: ModelProfile, key: str, default: int) -> list[int]:
    v = p.hp(key, default)
    if isinstance(v, list):
        return [int(x) for x in v]
    return [int(v)] * p.n_layer_all


# Architectures with interleaved sliding-window attention in llama.cpp (src/models/<arch>.cpp,
# ``load_swa_pattern(ml, n_pattern, dense_first)``): the period used when the GGUF has no
# ``sliding_window_pattern`` key, and whether the full-attention layer opens the period.
SWA_DEFAULT_PATTERN: dict[str, tuple[int, bool]] = {
    "gpt-oss": (2, False),
    "gemma2": (2, False),
    "gemma3": (6, False),
    "cohere2": (4, False),
    "cohere2moe": (4, True),
    "exaone4": (4, False),
    "exaone-moe": (4, False),
    "afmoe": (4, False),
    "olmo2": (4, False),
    "mellum": (4, False),
    "muse-glimmer": (4, False),
}


def swa_layers(p: ModelProfile) -> tuple[int, frozenset[int]]:
    """The sliding window and the trunk layers that use it, as llama.cpp reads them
    (``llama_hparams::set_swa_pattern``): a per-layer switch array wins; otherwise a period ``n``
    (the key's, else the architecture's default) makes layer ``il`` windowed unless it is the last
    of its period (``il % n < n - 1``), or, where the full layer comes first, the first
    (``il % n != 0``); ``n = 0`` windows every layer. No window, or an architecture llama.cpp
    gives no pattern and the GGUF none: no windowed layers."""
    n_swa = p.hp_int("attention.sliding_window")
    pat = p.hp("attention.sliding_window_pattern")
    known = SWA_DEFAULT_PATTERN.get(p.arch)
    if n_swa <= 0 or (pat is None and known is None):
        return 0, frozenset()
    n = p.n_layer
    if isinstance(pat, list):
        return n_swa, frozenset(i for i, on in enumerate(pat[:n]) if on)
    if pat is not None and (isinstance(pat, bool) or not isinstance(pat, int) or pat < 0):
        raise InputError(
            f"metadata {p.arch}.attention.sliding_window_pattern is {pat!r}; expected a period or one switch per layer",
            hint="the file's header is damaged",
        )
    period, dense_first = known or (2, False)
    if pat is not None:
        period = int(pat)
    if period == 0:
        return n_swa, frozenset(range(n))
    if dense_first:
        return n_swa, frozenset(i for i in range(n) if i % period != 0)
    return n_swa, frozenset(i for i in range(n) if i % period < period - 1)


def kv_shape(p: ModelProfile, engine: str = EngineKind.MAINLINE) -> KVShape:
    n = p.n_layer
    if p.is_mla:
        latent = p.hp_int("attention.kv_lora_rank") + p.hp_int("rope.dimension_count")
        idx = p.hp_int("attention.indexer.key_length") if engine == EngineKind.MAINLINE else 0
        idx_layers = set(range(n))
        types = p.hp("attention.indexer.types")
        if isinstance(types, list):
            idx_layers = {i for i, t in enumerate(types) if t}
        elif p.arch == "glm-dsa" and p.hp_int("context_length") >= 1048576:
            # GLM-5.2 defaults: indexers on layers 0, 1, then every fourth from 2
            idx_layers = {i for i in range(n) if i < 2 or (i - 2) % 4 == 0}
        layers = tuple(LayerKV(i, (latent, idx) if idx and i in idx_layers else (latent,), ()) for i in range(n))
        return KVShape(family="mla", layers=layers)
    heads = _per_layer(p, "attention.head_count", 0)
    heads_kv = _per_layer(p, "attention.head_count_kv", heads[0] if heads else 0)
    if len(heads_kv) == 1:
        heads_kv = heads_kv * p.n_layer_all
    hk = p.hp_int("attention.key_length", p.n_embd // max(1, heads[0] if heads else 1))
    hv = p.hp_int("attention.value_length", hk)
    if p.is_hybrid_recurrent:
        recr = p.hp("attention.recurrent_layers")
        if isinstance(recr, list):
            rec = [bool(x) for x in recr[:n]]
        else:
            interval = p.hp_int("full_attention_interval", 4)
            rec = [(i + 1) % interval != 0 for i in range(n)]
        attn = [i for i in range(n) if not rec[i]]
        d_conv = p.hp_int("ssm.conv_kernel")
        d_inner = p.hp_int("ssm.inner_size")
        d_state = p.hp_int("ssm.state_size")
        n_group = p.hp_int("ssm.group_count")
        r = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
        s = d_state * d_inner
        layers = tuple(LayerKV(i, (heads_kv[i] * hk,), (heads_kv[i] * hv,)) for i in attn)
        return KVShape(
            family="hybrid",
            layers=layers,
            recurrent_layers=tuple(i for i in range(n) if rec[i]),
            rs_bytes_per_layer_seq=(r + s) * F32_BYTES,
        )
    # ik_llama.cpp (0.1.5) has no split cache: it masks the window but keeps every layer's context
    n_swa, swa = swa_layers(p) if engine == EngineKind.MAINLINE else (0, frozenset[int]())
    layers = tuple(LayerKV(i, (heads_kv[i] * hk,), (heads_kv[i] * hv,), i in swa) for i in range(n) if heads_kv[i])
    return KVShape(family="gqa", layers=layers, n_swa=n_swa if swa else 0)


def checkpoint_bytes(
    kv: KVShape,
    engine: str,
    ctk: str = "f16",
    ctv: str = "f16",
    *,
    tokens_per_slot: int = 0,
    swa_full: bool = False,
    streams: int = 1,
) -> int:
    """Bytes of one context checkpoint: the part of a sequence's state that cannot be rolled back,
    which the server copies to host memory (``llama_state_seq_get_size_ext(ctx, seq,
    LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)``); 0 where the server keeps none.

    Mainline (``tools/server/server-context.cpp``, ``create_checkpoint``) keeps them for hybrid
    recurrent models and for sliding-window ones without ``--swa-full``. A hybrid model's is the
    recurrent state of one sequence (``llama_memory_recurrent::state_write``: one cell, every
    recurrent layer's conv and delta-net rows, with their small headers), the same size at any
    depth. A sliding-window model's is the windowed layers' K and V of the ``n_swa`` cells inside
    the window (``llama_kv_cache::state_write`` skips masked cells): at most this, once a prompt is
    longer than the window. ik_llama.cpp 0.1.5 keeps them for recurrent models only; its state
    (``llama_data_write::write_kv_cache``) also lists every cached cell's position, so this is its
    size for a slot filled to ``tokens_per_slot``. ``streams``: the KV cache's (one per slot, or
    one when unified), each of which the sliding-window state names."""
    if kv.recurrent_layers:
        n_rec = len(kv.recurrent_layers)
        if engine == EngineKind.IK:
            n_layer = len(kv.layers) + n_rec
            return 16 + 8 * tokens_per_slot + 40 * n_layer + kv.rs_bytes_per_seq
        # magic and seq id, the cell count, the cell's pos and seq count, s_trans and the layer
        # count; per recurrent layer a type and a row size before each of its two rows
        return 28 + 24 * n_rec + kv.rs_bytes_per_seq
    if engine != EngineKind.MAINLINE or not kv.n_swa or swa_full:
        return 0
    swa = [lk for lk in kv.layers if lk.swa]
    rows = sum(KVShape.layer_bytes_per_token(lk, ctk, ctv) for lk in swa)
    cells = kv.n_swa if not tokens_per_slot else min(kv.n_swa, tokens_per_slot)
    # magic and seq id, the stream count and each stream's cell count, each cell's pos, seq count
    # and seq id, the v_trans / layer / rope headers, a type and row size before each layer's K and V
    return 8 + 4 + 4 * streams + 12 * cells + 16 + 24 * len(swa) + cells * rows
