"""ModelProfile: what a GGUF model is made of, tensor by tensor, layer by layer.

Built from headers only (:mod:`moetune.model.gguf_read`); every later stage (the memory ledger,
placement, the speed model) works on this, never on files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from moetune.model.gguf_read import GGUFFile, read_model_files

# Roles of tensors, as placement sees them.
EXPERT = "expert"  # routed experts: ffn_{gate,up,down,gate_up}_exps
SHARED = "shared_expert"  # ffn_*_shexp
ATTENTION = "attention"
DENSE_FFN = "dense_ffn"
ROUTER = "router"
NORM = "norm"
RECURRENT = "recurrent"
NEXTN = "nextn"
EMBED = "embedding"
OUTPUT = "output"
OTHER = "other"

EXPERT_KINDS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")
_BLK = re.compile(r"^blk\.(\d+)\.(.+?)(?:\.(weight|bias|scale))?$")

# Architectures with recurrent (state-space / delta-net) layers between attention layers.
HYBRID_RECURRENT = frozenset({"qwen3next", "qwen35moe", "qwen35"})


def tensor_kind(name: str) -> tuple[int | None, str]:
    """(layer index or None, kind) of a tensor name: ``blk.3.ffn_up_exps.weight`` -> (3, ffn_up_exps)."""
    m = _BLK.match(name)
    if m:
        return int(m[1]), m[2]
    return None, name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name


def tensor_role(kind: str) -> str:
    if kind in EXPERT_KINDS:
        return EXPERT
    if kind.endswith("_shexp"):
        return SHARED
    if kind.startswith("nextn."):
        return NEXTN
    if kind in ("ffn_gate_inp", "exp_probs_b"):
        return ROUTER
    if kind.endswith("norm"):
        return NORM
    if kind.startswith(("attn_", "indexer.")):
        return ATTENTION
    if kind.startswith("ssm_"):
        return RECURRENT
    if kind in ("ffn_gate", "ffn_up", "ffn_down"):
        return DENSE_FFN
    if kind == "token_embd":
        return EMBED
    if kind in ("output", "output_norm"):
        return OUTPUT
    return OTHER


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    layer: int | None
    kind: str
    role: str
    type_name: str
    shape: tuple[int, ...]
    nbytes: int
    file_index: int
    offset: int  # absolute byte offset in its file

    @property
    def is_expert(self) -> bool:
        return self.role == EXPERT


@dataclass(frozen=True, slots=True)
class Layer:
    index: int
    kind: str  # dense | moe | nextn
    expert_bytes: int
    other_bytes: int
    experts: dict[str, tuple[str, int]]  # kind -> (type name, bytes)


@dataclass(frozen=True)
class ModelProfile:
    arch: str
    files: tuple[Path, ...]
    metadata: dict[str, Any]
    tensors: tuple[Tensor, ...]

    # --- hyperparameters --------------------------------------------------------------------
    def hp(self, key: str, default: Any = None) -> Any:
        """An architecture hyperparameter (``block_count`` reads ``<arch>.block_count``)."""
        return self.metadata.get(f"{self.arch}.{key}", default)

    @property
    def n_layer_all(self) -> int:
        return int(self.hp("block_count", 0))

    @property
    def n_nextn(self) -> int:
        return int(self.hp("nextn_predict_layers", 0) or 0)

    @property
    def n_layer(self) -> int:
        """Trunk layers (NextN/MTP blocks excluded)."""
        return self.n_layer_all - self.n_nextn

    @property
    def n_expert(self) -> int:
        return int(self.hp("expert_count", 0) or 0)

    @property
    def n_expert_used(self) -> int:
        v = self.hp("expert_used_count", 0) or 0
        return int(max(v) if isinstance(v, list) else v)

    @property
    def n_embd(self) -> int:
        return int(self.hp("embedding_length", 0))

    @property
    def n_vocab(self) -> int:
        v = self.hp("vocab_size")
        if v is None:
            tokens = self.metadata.get("tokenizer.ggml.tokens")
            v = getattr(tokens, "length", None) or (len(tokens) if isinstance(tokens, list) else 0)
        return int(v)

    @property
    def n_dense_lead(self) -> int:
        return int(self.hp("leading_dense_block_count", 0) or 0)

    @property
    def is_mla(self) -> bool:
        return self.hp("attention.key_length_mla") is not None and self.hp("attention.value_length_mla") is not None

    @property
    def is_hybrid_recurrent(self) -> bool:
        return self.arch in HYBRID_RECURRENT

    # --- tensors ------------------------------------------------------------------------------
    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def expert_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors if t.is_expert)

    @property
    def other_bytes(self) -> int:
        return self.total_bytes - self.expert_bytes

    def loaded_tensors(self, *, with_nextn: bool = False) -> list[Tensor]:
        """Tensors the engine loads. Mainline skips NextN/MTP blocks unless MTP drafting is on."""
        if with_nextn or not self.n_nextn:
            return list(self.tensors)
        return [t for t in self.tensors if t.layer is None or t.layer < self.n_layer]

    def loaded_bytes(self, *, with_nextn: bool = False) -> int:
        return sum(t.nbytes for t in self.loaded_tensors(with_nextn=with_nextn))

    @cached_property
    def layers(self) -> tuple[Layer, ...]:
        by_layer: dict[int, list[Tensor]] = {}
        for t in self.tensors:
            if t.layer is not None:
                by_layer.setdefault(t.layer, []).append(t)
        out = []
        for i in range(self.n_layer_all):
            ts = by_layer.get(i, [])
            experts = {t.kind: (t.type_name, t.nbytes) for t in ts if t.is_expert}
            kind = "nextn" if i >= self.n_layer else ("moe" if experts else "dense")
            eb = sum(b for _, b in experts.values())
            out.append(Layer(i, kind, eb, sum(t.nbytes for t in ts) - eb, experts))
        return tuple(out)

    def bytes_by_type(self, *, experts: bool | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            if experts is None or t.is_expert == experts:
                out[t.type_name] = out.get(t.type_name, 0) + t.nbytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def profile_from_files(files: list[GGUFFile]) -> ModelProfile:
    meta: dict[str, Any] = {}
    for f in reversed(files):  # the first shard's metadata wins
        meta.update(f.metadata)
    arch = str(meta.get("general.architecture", "unknown"))
    tensors = []
    for f in files:
        for ti in f.tensors:
            layer, kind = tensor_kind(ti.name)
            tensors.append(Tensor(ti.name, layer, kind, tensor_role(kind), ti.qtype.name, ti.shape, ti.nbytes,
                                  ti.file_index, ti.offset))
    return ModelProfile(arch, tuple(f.path for f in files), meta, tuple(tensors))


def load_profile(path: str | Path) -> ModelProfile:
    """Read a model (any shard of it) into a profile. Raises InputError on bad files."""
    return profile_from_files(read_model_files(path))


def fingerprint(p: ModelProfile) -> str:
    """A short stable id of a model's structure: architecture, every tensor's name, type and shape."""
    import hashlib

    h = hashlib.sha256(p.arch.encode())
    for t in p.tensors:
        h.update(f"{t.name}|{t.type_name}|{t.shape}".encode())
    return h.hexdigest()[:16]
