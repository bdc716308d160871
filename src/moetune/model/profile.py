"""ModelProfile: what a GGUF model is made of, tensor by tensor, layer by layer.

Built from headers only (:mod:`moetune.model.gguf_read`), of local files or over HTTP
(:mod:`moetune.model.remote`, :mod:`moetune.model.hf`: imported only for a remote model); every
later stage (the memory ledger, placement, the speed model) works on this, never on files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.errors import InputError
from moetune.model.gguf_read import GGUFFile, SkippedArray, read_model_files, shown

if TYPE_CHECKING:
    from moetune.model.remote import Client

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

# every role, as recipes (`moetune quantize --recipe`) name them
ROLES = (EXPERT, SHARED, ATTENTION, DENSE_FFN, ROUTER, NORM, RECURRENT, NEXTN, EMBED, OUTPUT, OTHER)

# The routed experts' tensor kinds, in the order tables show them (gate, up, down; the fused
# gate+up last): the one table of them, which every other use derives from (expert_part, EXPERT_PARTS).
EXPERT_KINDS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps")


def expert_part(kind: str) -> str:
    """What an expert kind names between ``ffn_`` and ``_exps``: ``ffn_gate_up_exps`` -> ``gate_up``
    (the word ``-ot`` patterns, the routing counts and the plan's tables use)."""
    return kind.removeprefix("ffn_").removesuffix("_exps")


EXPERT_PARTS = tuple(expert_part(k) for k in EXPERT_KINDS)  # gate, up, down, gate_up
# the layer as llama.cpp formats it (ASCII digits; more than nine is no layer llama.cpp loads)
_BLK = re.compile(r"^blk\.([0-9]{1,9})\.(.+?)(?:\.(weight|bias|scale))?$")

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


@dataclass(frozen=True, slots=True, kw_only=True)
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Layer:
    index: int
    kind: str  # dense | moe | nextn
    expert_bytes: int
    other_bytes: int
    experts: dict[str, tuple[str, int]]  # kind -> (type name, bytes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Remote:
    """A model whose headers were read over HTTP: where a plan expects it once downloaded, how to
    download it, and what reading the headers cost."""

    local_path: str  # the first file relative to the download directory: what -m says
    download: str  # a command that downloads every file into the current directory
    bytes_fetched: int
    requests: int
    range_ignored: tuple[
        str, ...
    ] = ()  # files whose server answered Range with the whole file (closed after the header)

    def fetched_text(self) -> str:
        return f"fetched {self.bytes_fetched / 1024:,.0f} KiB in {self.requests} requests"


@dataclass(frozen=True, kw_only=True)
class ModelProfile:
    arch: str
    files: tuple[Path | str, ...]  # URLs (str) for a remote model
    metadata: dict[str, Any]
    tensors: tuple[Tensor, ...]
    remote: Remote | None = None

    @property
    def server_path(self) -> str:
        """What llama-server's -m says: the first file, or for a remote model where its download puts it."""
        return self.remote.local_path if self.remote else str(self.files[0])

    # --- hyperparameters --------------------------------------------------------------------
    def hp(self, key: str, default: Any = None) -> Any:
        """An architecture hyperparameter (``block_count`` reads ``<arch>.block_count``)."""
        return self.metadata.get(f"{self.arch}.{key}", default)

    def hp_int(self, key: str, default: int = 0) -> int:
        """An integer hyperparameter (one of :data:`INT_HPARAMS`, checked when the profile was built);
        of a per-layer array, its largest entry."""
        v = self.hp(key)
        if v is None:
            return default
        return int(max(v)) if isinstance(v, list) else int(v)

    # cached: asked once per tensor by the ledger and the speed model (the metadata never changes)
    @cached_property
    def n_layer_all(self) -> int:
        return self.hp_int("block_count")

    @cached_property
    def n_nextn(self) -> int:
        return self.hp_int("nextn_predict_layers")

    @cached_property
    def n_layer(self) -> int:
        """Trunk layers (NextN/MTP blocks excluded)."""
        return self.n_layer_all - self.n_nextn

    @property
    def n_expert(self) -> int:
        return self.hp_int("expert_count")

    @property
    def n_expert_used(self) -> int:
        return self.hp_int("expert_used_count")

    @property
    def n_embd(self) -> int:
        return self.hp_int("embedding_length")

    @property
    def n_vocab(self) -> int:
        if self.hp("vocab_size") is not None:
            return self.hp_int("vocab_size")
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, SkippedArray):
            return tokens.length
        return len(tokens) if isinstance(tokens, list) else 0

    @property
    def n_dense_lead(self) -> int:
        return self.hp_int("leading_dense_block_count")

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
            experts: dict[str, tuple[str, int]] = {}
            for t in ts:
                if t.is_expert:  # a kind's bytes include its bias (gpt-oss); its type is the weight's
                    ty, b = experts.get(t.kind, (t.type_name, 0))
                    experts[t.kind] = (ty if t.name.endswith(".bias") else t.type_name, b + t.nbytes)
            kind = "nextn" if i >= self.n_layer else ("moe" if experts else "dense")
            eb = sum(b for _, b in experts.values())
            out.append(
                Layer(index=i, kind=kind, expert_bytes=eb, other_bytes=sum(t.nbytes for t in ts) - eb, experts=experts)
            )
        return tuple(out)

    def bytes_by_type(self, *, experts: bool | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            if experts is None or t.is_expert == experts:
                out[t.type_name] = out.get(t.type_name, 0) + t.nbytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# The architecture's integer hyperparameters moetune reads (``<arch>.KEY``), and whether a key may
# hold one value per layer (an array, as llama.cpp's get_key_or_arr reads it) instead of one value.
INT_HPARAMS: dict[str, bool] = {
    "block_count": False,
    "nextn_predict_layers": False,
    "leading_dense_block_count": False,
    "context_length": False,
    "embedding_length": False,
    "vocab_size": False,
    "expert_count": False,
    "expert_used_count": True,
    "expert_shared_count": False,
    "feed_forward_length": True,
    "expert_feed_forward_length": True,
    "expert_shared_feed_forward_length": False,
    "attention.head_count": True,
    "attention.head_count_kv": True,
    "attention.key_length": False,
    "attention.value_length": False,
    "attention.key_length_mla": False,
    "attention.value_length_mla": False,
    "attention.kv_lora_rank": False,
    "rope.dimension_count": False,
    "attention.indexer.key_length": False,
    "attention.indexer.top_k": False,
    "full_attention_interval": False,
    "ssm.conv_kernel": False,
    "ssm.inner_size": False,
    "ssm.state_size": False,
    "ssm.group_count": False,
    "ssm.time_step_rank": False,
    "attention.q_lora_rank": False,
    "attention.indexer.head_count": False,
    "attention.sliding_window": False,
}
# per-layer arrays of switches (any scalar: 0/1, bool)
LAYER_FLAGS = ("attention.recurrent_layers", "attention.indexer.types", "attention.sliding_window_pattern")
MAX_LAYERS = 1 << 16  # llama.cpp loads at most 512; more is a damaged header, and a plan would loop over them
MAX_HPARAM = (1 << 32) - 1  # llama.cpp reads these as uint32


def check_hparams(arch: str, meta: dict[str, Any], where: Path | str) -> None:
    """InputError unless every hyperparameter moetune computes with is an integer it can use (a
    damaged header or one from a tool that writes other types must not end in a traceback)."""

    def bad(key: str, v: Any, want: str) -> InputError:
        shown = repr(v)
        return InputError(
            f"{where}: metadata {arch}.{key} is {shown[:60]}{'...' if len(shown) > 60 else ''}; expected {want}",
            hint="the file's header is damaged, or was written by a tool that does not follow llama.cpp's types",
        )

    def is_count(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_HPARAM

    n_all = meta.get(f"{arch}.block_count", 0)
    if not (is_count(n_all) and n_all <= MAX_LAYERS):
        raise bad("block_count", n_all, f"a layer count from 0 to {MAX_LAYERS}")
    for key, per_layer in INT_HPARAMS.items():
        v = meta.get(f"{arch}.{key}")
        if v is None or is_count(v):
            continue
        if not (per_layer and isinstance(v, list) and v and all(is_count(x) for x in v)):
            raise bad(key, v, "an integer from 0 to 2^32-1" + (", or one per layer" if per_layer else ""))
    n_nextn = meta.get(f"{arch}.nextn_predict_layers") or 0
    if n_nextn > n_all:
        raise bad("nextn_predict_layers", n_nextn, f"at most block_count ({n_all})")
    if meta.get(f"{arch}.full_attention_interval") == 0:
        raise bad("full_attention_interval", 0, "at least 1")
    for key in (*[k for k, per_layer in INT_HPARAMS.items() if per_layer], *LAYER_FLAGS):
        v = meta.get(f"{arch}.{key}")
        # one value per layer (the trunk's or every block's); an array of one integer stands for all
        if isinstance(v, list) and not (n_all - n_nextn <= len(v) <= n_all or (len(v) == 1 and key in INT_HPARAMS)):
            raise bad(key, v, f"one value per layer ({n_all})")


def profile_from_files(files: list[GGUFFile], remote: Remote | None = None) -> ModelProfile:
    meta: dict[str, Any] = {}
    for f in reversed(files):  # the first shard's metadata wins
        meta.update(f.metadata)
    arch = str(meta.get("general.architecture", "unknown"))
    check_hparams(arch, meta, files[0].path)
    tensors = []
    n_layer_all = meta.get(f"{arch}.block_count", 0)
    for f in files:
        for ti in f.tensors:
            layer, kind = tensor_kind(ti.name)
            if layer is not None and layer >= n_layer_all:
                raise InputError(
                    f"{f.path}: tensor {shown(ti.name)} is in layer {layer}, but the model has "
                    f"{n_layer_all} layers ({arch}.block_count)",
                    hint="llama.cpp refuses a file with tensors it does not expect; the header is "
                    "damaged, or the file was cut from another model",
                )
            tensors.append(
                Tensor(
                    name=ti.name,
                    layer=layer,
                    kind=kind,
                    role=tensor_role(kind),
                    type_name=ti.qtype.name,
                    shape=ti.shape,
                    nbytes=ti.nbytes,
                    file_index=ti.file_index,
                    offset=ti.offset,
                )
            )
    return ModelProfile(
        arch=arch, files=tuple(f.path for f in files), metadata=meta, tensors=tuple(tensors), remote=remote
    )


def is_url(path: str | os.PathLike[str]) -> bool:
    return isinstance(path, str) and path[:8].lower().startswith(("http://", "https://"))


def load_profile(path: str | Path, *, timeout_s: float = 30.0) -> ModelProfile:
    """Read a model (any shard of it: a local file or an http(s) URL) into a profile. Raises
    InputError on bad files, RuntimeFailure when a server does not answer as it should."""
    if is_url(path):
        return _load_url(str(path), timeout_s=timeout_s)
    key, shards = _profile_key(path)
    cached = _cached_profile(key, shards)
    if cached is not None:
        return cached
    profile = profile_from_files(read_model_files(path))
    _cache_profile(key, profile)
    return profile


# A local model's profile is kept under the identity of all its shards (path, size, mtime, inode):
# the next plan or inspect builds its tensors from plain rows (~30 ms of a ~250 ms plan for the
# 1,800 tensors of GLM-5.1), without reading a header. Any shard that changes gives a new key.
_PROFILE_CACHE_VERSION = "2"  # 2: profiles whose hyperparameters were checked


def _profile_key(path: str | Path) -> tuple[str | None, list[Path]]:
    import hashlib

    from moetune import __version__
    from moetune.model.gguf_read import shard_paths
    from moetune.paths import readable_file

    parts = [_PROFILE_CACHE_VERSION, __version__]
    shards = shard_paths(path)
    try:
        for q in shards:
            st = os.stat(readable_file(q, "GGUF file"))
            parts.append(f"{os.path.abspath(q)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}")
    except OSError:
        return None, shards
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32], shards


def _cached_profile(key: str | None, shards: list[Path]) -> ModelProfile | None:
    """The cached profile, its files as this command spells them."""
    import pickle

    from moetune import filecache

    data = filecache.get("profiles", key) if key else None
    if data is None:
        return None
    try:
        arch, files, meta, rows = pickle.loads(data)
        if len(files) != len(shards):
            return None
        return ModelProfile(
            arch=arch,
            files=tuple(shards),
            metadata=meta,
            tensors=tuple(
                Tensor(
                    name=n,
                    layer=la,
                    kind=k,
                    role=r,
                    type_name=ty,
                    shape=tuple(sh),
                    nbytes=nb,
                    file_index=fi,
                    offset=off,
                )
                for n, la, k, r, ty, sh, nb, fi, off in rows
            ),
        )
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        return None


def _cache_profile(key: str | None, p: ModelProfile) -> None:
    import pickle

    from moetune import filecache

    if key is None:
        return
    rows = [
        (t.name, t.layer, t.kind, t.role, t.type_name, t.shape, t.nbytes, t.file_index, t.offset) for t in p.tensors
    ]
    try:
        data = pickle.dumps((p.arch, [str(f) for f in p.files], p.metadata, rows), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return
    filecache.put("profiles", key, data)


def open_model(path: str | Path | None, hf: str | None = None, *, timeout_s: float = 30.0) -> ModelProfile:
    """The model a command names: a GGUF file, an http(s) URL of one, or ``--hf OWNER/REPO[:QUANT]``."""
    if hf is not None:
        if path is not None:
            raise InputError(f"give a MODEL or --hf, not both (MODEL {path}, --hf {hf})")
        return _load_hf(hf, timeout_s=timeout_s)
    if path is None:
        raise InputError("missing MODEL: a GGUF file (any shard), an http(s) URL of one, or --hf OWNER/REPO[:QUANT]")
    return load_profile(path, timeout_s=timeout_s)


def _load_url(
    url: str,
    *,
    timeout_s: float,
    local_path: str | None = None,
    download: str | None = None,
    client: Client | None = None,
) -> ModelProfile:
    from moetune.model import remote as r

    client = client or r.Client.from_env(timeout_s)
    files = r.read_remote_files(url, client)
    urls = [str(f.path) for f in files]
    st = client.stats
    return profile_from_files(
        files,
        Remote(
            local_path=local_path or r.file_name(urls[0]),
            download=download or r.curl_command(urls),
            bytes_fetched=st.bytes_fetched,
            requests=st.requests,
            range_ignored=tuple(st.range_ignored),
        ),
    )


def _load_hf(spec: str, *, timeout_s: float) -> ModelProfile:
    from moetune.model import hf, remote

    client = remote.Client.from_env(timeout_s)
    choice, url = hf.resolve(client, remote.hf_endpoint(), spec)
    return _load_url(
        url, timeout_s=timeout_s, local_path=choice.path, download=choice.download_command(), client=client
    )


def fingerprint(p: ModelProfile) -> str:
    """A short stable id of a model's structure: architecture, every tensor's name, type and shape."""
    import hashlib

    h = hashlib.sha256(p.arch.encode())
    for t in p.tensors:
        h.update(f"{t.name}|{t.type_name}|{t.shape}".encode())
    return h.hexdigest()[:16]
