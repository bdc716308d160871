"""Generate GGUF models that llama-server loads and serves: random weights, a byte-level vocabulary,
and a chat template with a thinking switch. Sparse replicas of published models (exact headers,
data region left as a hole) are written by the same code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType, LlamaFileType
from gguf.quants import quantize

from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.archs import ARCHS, Dims, Layout, TensorSpec
from moetune.model.gguf_read import I32
from moetune.model.gguf_write import TensorToWrite, Typed, write_model
from moetune.model.quants import QuantType, UnknownQuantType, by_name

# A chat template with an enable_thinking branch. With thinking on, the generation prompt opens a
# <think> block, so the server reports what the model writes as reasoning; with thinking off the
# block is closed in the prompt and everything the model writes is content. The tags end the
# generation prompt (no newline after them) and history renders `reasoning_content`: that is how
# llama-server's template analysis recognises a thinking template.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['role'] == 'assistant' and message.get('reasoning_content') -%}"
    "{{- '<think>' + message['reasoning_content'] + '</think>' -}}"
    "{%- endif -%}"
    "{{- message['content'] + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|assistant|>\\n' -}}"
    "{%- if enable_thinking is defined and not enable_thinking -%}"
    "{{- '<think></think>' -}}"
    "{%- else -%}"
    "{{- '<think>' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

_TT_NORMAL, _TT_UNKNOWN, _TT_CONTROL, _TT_UNUSED, _TT_BYTE = 1, 2, 3, 5, 6


def vocab_metadata(n_vocab: int) -> dict[str, object]:
    """A byte-level SentencePiece vocabulary: <unk>, <s>, </s>, 256 byte tokens, then padding."""
    if n_vocab < 259:
        raise InputError(f"--vocab {n_vocab} is too small: the byte vocabulary needs at least 259 tokens")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [_TT_UNKNOWN, _TT_CONTROL, _TT_CONTROL] + [_TT_BYTE] * 256
    tokens += [f"[PAD{i}]" for i in range(n_vocab - len(tokens))]
    types += [_TT_UNUSED] * (n_vocab - len(types))
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * n_vocab,
        "tokenizer.ggml.token_type": Typed(I32, types),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


@dataclass(frozen=True, slots=True)
class TypeRecipe:
    """Storage type per tensor kind; ``default`` for kinds not named."""

    default: QuantType
    by_kind: dict[str, QuantType]

    def for_tensor(self, spec: TensorSpec) -> QuantType:
        if spec.force_f32:
            return by_name("f32")
        return self.by_kind.get(spec.kind, self.default)


def parse_type_spec(spec: str, kinds: set[str]) -> TypeRecipe:
    """``q8_0`` or ``ffn_gate_exps=iq3_ks,ffn_down_exps=iq4_ks,other=q8_0``."""
    try:
        if "=" not in spec:
            return TypeRecipe(by_name(spec), {})
        default = by_name("f16")
        by_kind: dict[str, QuantType] = {}
        for part in spec.split(","):
            if not part.strip():
                continue
            key, sep, val = part.partition("=")
            key = key.strip()
            if not sep:
                raise InputError(f"--type: {part!r} is not KIND=TYPE")
            if key == "other":
                default = by_name(val)
            elif key not in kinds:
                raise InputError(
                    f"--type: no tensor kind {key!r} in this architecture (kinds: {', '.join(sorted(kinds))})"
                )
            else:
                by_kind[key] = by_name(val)
        return TypeRecipe(default, by_kind)
    except UnknownQuantType as e:
        raise InputError(f"--type: {e}") from None


def _seed(base: int, name: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{base}:{name}".encode(), digest_size=8).digest(), "little")


def _values(spec: TensorSpec, seed: int) -> np.ndarray:
    rng = np.random.default_rng(_seed(seed, spec.name))
    shape = tuple(reversed(spec.shape))  # numpy order: slowest dimension first
    if spec.kind.endswith("norm"):
        return np.ones(shape, dtype=np.float32)
    if spec.kind in ("exp_probs_b", "ssm_dt"):
        return np.zeros(shape, dtype=np.float32)
    vals = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    if spec.kind == "ssm_a":
        vals = -np.abs(vals) - np.float32(0.5)
    return vals


def _data_fn(spec: TensorSpec, qt: QuantType, seed: int) -> Callable[[], bytes]:
    def make() -> bytes:
        if qt.name == "F32":
            return _values(spec, seed).tobytes()
        if qt.name == "F16":
            return _values(spec, seed).astype(np.float16).tobytes()
        if EngineKind.MAINLINE in qt.engines and qt.id in GGMLQuantizationType._value2member_map_:
            try:
                return bytes(quantize(_values(spec, seed), GGMLQuantizationType(qt.id)).tobytes())
            except NotImplementedError:
                pass
        # No quantizer for this type here: random bytes of the right size (inspect and plan only).
        rng = np.random.default_rng(_seed(seed, spec.name))
        return rng.integers(0, 256, qt.tensor_bytes(spec.shape), dtype=np.uint8).tobytes()

    return make


def quantizable(qt: QuantType) -> bool:
    """Whether generated data of this type is real quantized weights (servable), not filler."""
    if qt.name in ("F32", "F16"):
        return True
    if EngineKind.MAINLINE not in qt.engines or qt.id not in GGMLQuantizationType._value2member_map_:
        return False
    try:
        quantize(np.zeros((1, qt.block_size), dtype=np.float32), GGMLQuantizationType(qt.id))
    except NotImplementedError:
        return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Generated:
    arch: str
    files: list[Path]
    n_tensors: int
    tensor_bytes: int
    types: dict[str, int]  # bytes by type name
    servable: bool  # every type has real data a mainline llama-server can run


def plan_tensors(arch: str, dims: Dims, type_spec: str, seed: int = 0) -> tuple[Layout, list[TensorToWrite]]:
    if arch not in ARCHS:
        raise InputError(f"--arch {arch!r} is not one moetune generates (choose from {', '.join(ARCHS)})")
    layout = ARCHS[arch](dims)
    recipe = parse_type_spec(type_spec, {t.kind for t in layout.tensors})
    out = []
    for spec in layout.tensors:
        qt = recipe.for_tensor(spec)
        if spec.shape[0] % qt.block_size:
            raise InputError(
                f"--type: tensor {spec.name} has rows of {spec.shape[0]} elements, "
                f"not a multiple of {qt.name}'s block of {qt.block_size}",
                hint="choose another type for that kind, or widen the model (--embd, --expert-ff)",
            )
        out.append(TensorToWrite(spec.name, spec.shape, qt, _data_fn(spec, qt, seed)))
    return layout, out


def generate(
    out: Path,
    arch: str,
    dims: Dims,
    type_spec: str = "f16",
    *,
    shards: int = 1,
    sparse: bool = False,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Generated:
    if shards < 1:
        raise InputError(f"--shards {shards}: must be at least 1")
    if not out.name.endswith(".gguf"):
        raise InputError(f"{out}: the output name must end in .gguf")
    if not out.parent.is_dir():
        raise InputError(f"{out.parent}: no such directory")
    layout, tensors = plan_tensors(arch, dims, type_spec, seed)
    if shards > len(tensors):
        raise InputError(f"--shards {shards}: the model has only {len(tensors)} tensors")
    meta = {**layout.metadata, **vocab_metadata(dims.n_vocab)}
    recipe_default = parse_type_spec(type_spec, {t.kind for t in layout.tensors}).default
    ftype = getattr(LlamaFileType, f"MOSTLY_{recipe_default.name}", None)
    if ftype is not None:
        meta["general.file_type"] = int(ftype)
    files = write_model(out, meta, tensors, shards=shards, sparse=sparse, progress=progress)
    types: dict[str, int] = {}
    for t in tensors:
        types[t.qtype.name] = types.get(t.qtype.name, 0) + t.nbytes
    servable = all(quantizable(t.qtype) for t in tensors)
    return Generated(
        arch=arch,
        files=files,
        n_tensors=len(tensors),
        tensor_bytes=sum(t.nbytes for t in tensors),
        types=types,
        servable=servable,
    )
