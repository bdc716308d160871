"""Real GGUF headers to mutate, a map of their fields, and the Hypothesis strategies that mutate them.

The bases are tiny models written by moetune's own generator (several architectures and storage
types, ik_llama.cpp's among them), sparse, so each is a real header followed by a hole. Their
fields (every length, count, value type, dimension, tensor type and offset) are located by
:func:`header_fields`, so that mutations hit the numbers a reader has to distrust, not only
random bytes. The seed corpus (tests/fuzz/corpus/gguf) joins the bases: a mutated file that once
broke the reader is mutated further.
"""

from __future__ import annotations

import gzip
import struct
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from moetune.model.archs import Dims
from moetune.model.gguf_read import ARRAY, SCALAR_FORMATS, STRING
from moetune.model.gguf_write import TensorToWrite, Typed, write_gguf
from moetune.model.testmodel import plan_tensors

CORPUS = Path(__file__).parent / "corpus"

_SMALL = Dims(
    n_layer=2,
    n_embd=64,
    n_head=2,
    n_head_kv=1,
    head_dim=32,
    n_ff=64,
    n_expert=4,
    n_expert_used=2,
    n_ff_exp=32,
    n_dense_lead=1,
    n_nextn=0,
    q_lora_rank=32,
    kv_lora_rank=32,
    rope_dim=16,
    k_head_mla=48,
    v_head_mla=32,
    indexer_n_head=2,
    indexer_head_size=32,
    ssm_d_state=16,
    ssm_n_group=1,
)
_WIDE = Dims(
    n_layer=2,
    n_embd=256,
    n_head=2,
    n_head_kv=1,
    head_dim=32,
    n_ff=256,
    n_expert=2,
    n_expert_used=1,
    n_ff_exp=256,
    q_lora_rank=32,
    kv_lora_rank=32,
    rope_dim=16,
    k_head_mla=48,
    v_head_mla=32,
    n_nextn=1,
)

# (architecture, shape, storage types): each architecture family, mainline and ik_llama.cpp types
BASES: tuple[tuple[str, Dims, str], ...] = (
    ("qwen3moe", _SMALL, "f16"),
    ("glm4moe", _SMALL, "q8_0"),
    ("qwen35moe", _SMALL, "q4_0"),
    ("glm-dsa", _SMALL, "ffn_gate_exps=q4_0,ffn_up_exps=q4_0,other=f32"),
    ("deepseek2", _WIDE, "ffn_gate_exps=iq4_ks,ffn_up_exps=iq3_ks,ffn_down_exps=iq2_ks,other=q8_0"),
)


@dataclass(frozen=True, slots=True)
class Field:
    offset: int
    width: int  # bytes (4 or 8, or a scalar value's size)
    kind: str  # version | count | length | vtype | value | dim | qtype | offset


@dataclass(frozen=True)
class Base:
    name: str
    data: bytes
    fields: tuple[Field, ...]
    header_end: int
    metadata: dict[str, Any]
    tensors: tuple[TensorToWrite, ...]


def header_fields(data: bytes) -> tuple[tuple[Field, ...], int]:
    """Every number of a (valid) GGUF header, and where the header ends."""
    out: list[Field] = [Field(4, 4, "version"), Field(8, 8, "count"), Field(16, 8, "count")]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def string() -> None:
        nonlocal pos
        out.append(Field(pos, 8, "length"))
        pos += 8 + struct.unpack_from("<Q", data, pos)[0]

    def value(vtype: int, keep: bool) -> None:
        nonlocal pos
        if vtype == STRING:
            if keep:
                string()
            else:
                pos += 8 + struct.unpack_from("<Q", data, pos)[0]
        else:
            size = struct.calcsize(SCALAR_FORMATS[vtype])
            if keep:
                out.append(Field(pos, size, "value"))
            pos += size

    for _ in range(n_kv):
        string()
        out.append(Field(pos, 4, "vtype"))
        vtype = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if vtype == ARRAY:
            out.append(Field(pos, 4, "vtype"))
            out.append(Field(pos + 4, 8, "count"))
            itype, n = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for i in range(n):
                value(itype, i < 4)  # the first few elements of an array; the vocabulary has hundreds
        else:
            value(vtype, True)
    for _ in range(n_tensors):
        string()
        out.append(Field(pos, 4, "count"))
        n_dims = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        for _ in range(n_dims):
            out.append(Field(pos, 8, "dim"))
            pos += 8
        out.append(Field(pos, 4, "qtype"))
        out.append(Field(pos + 4, 8, "offset"))
        pos += 12
    return tuple(out), pos


@cache
def bases() -> list[Base]:
    """Every base model, written once per session and kept in memory with its field map."""
    out = []
    with tempfile.TemporaryDirectory(prefix="moetune-fuzz-") as tmp:
        for arch, dims, types in BASES:
            layout, tensors = plan_tensors(arch, dims, types)
            meta = {**layout.metadata, **_vocab()}
            path = Path(tmp) / f"{arch}.gguf"
            write_gguf(path, meta, tensors, sparse=True)
            data = path.read_bytes()
            fields, end = header_fields(data)
            out.append(Base(arch, data, fields, end, meta, tuple(tensors)))
    return out


@cache
def seeds() -> dict[str, bytes]:
    """The GGUF seed corpus: file name -> bytes."""
    return {p.name: read_corpus_gguf(p) for p in corpus_files("gguf")}


def _vocab() -> dict[str, Any]:
    from moetune.model.testmodel import vocab_metadata

    return vocab_metadata(259)


def corpus_files(kind: str) -> list[Path]:
    return sorted(p for p in (CORPUS / kind).iterdir() if not p.name.startswith(".") and p.name != "README.md")


def read_corpus_gguf(path: Path) -> bytes:
    """A corpus GGUF: gzip-compressed (the data region is zeros and costs nothing)."""
    return gzip.decompress(path.read_bytes())


# ---- byte-level mutations ---------------------------------------------------------------------

_EDGES = (
    0,
    1,
    2,
    3,
    7,
    8,
    31,
    32,
    255,
    256,
    1 << 15,
    1 << 16,
    (1 << 31) - 1,
    1 << 31,
    1 << 32,
    1 << 40,
    1 << 60,
    1 << 62,
    1 << 63,
    (1 << 64) - 1,
)


def _number(width: int, old: int) -> st.SearchStrategy[int]:
    top = (1 << (8 * width)) - 1
    near = [v & top for v in (old - 1, old + 1, old * 2, old + 4096, old << 16, ~old)]
    return st.one_of(st.sampled_from([v & top for v in _EDGES] + near), st.integers(0, top))


@dataclass(frozen=True)
class Mutated:
    """A base file and the mutations applied to it, in order; shown by its recipe, not its bytes."""

    base: str
    source: bytes = field(repr=False)
    ops: tuple[tuple[Any, ...], ...]

    @property
    def data(self) -> bytes:
        data = bytearray(self.source)
        for op, *args in self.ops:
            if op == "set":  # (offset, width, value)
                off, width, value = args
                data[off : off + width] = value.to_bytes(width, "little")
            elif op == "xor":
                data[args[0]] ^= args[1]
            elif op == "insert":
                data[args[0] : args[0]] = args[1]
            elif op == "delete":
                del data[args[0] : args[0] + args[1]]
            elif op == "truncate":
                del data[args[0] :]
            elif op == "extend":
                data += args[0]
        return bytes(data)


@st.composite
def mutated_bytes(draw: st.DrawFn, bases: list[Base], seeds: dict[str, bytes]) -> Mutated:
    """A real header (or a corpus file) with one to four mutations: a field set to an edge or random
    value, bytes flipped, inserted or deleted in the header, the file truncated or extended."""
    names = [b.name for b in bases] + sorted(seeds)
    name = draw(st.sampled_from(names))
    base = next((b for b in bases if b.name == name), None)
    if base is not None:
        source, fields, end = base.data, base.fields, base.header_end
    else:
        source, fields, end = seeds[name], (), min(len(seeds[name]), 4096)
    ops: list[tuple[Any, ...]] = []
    size = len(source)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(("set", "set", "set", "xor", "insert", "delete", "truncate", "extend")))
        head = max(0, min(end, size) - 1)
        if op == "set" and fields:
            f = draw(st.sampled_from(fields))
            if f.offset + f.width <= size:
                old = int.from_bytes(source[f.offset : f.offset + f.width], "little")
                ops.append(("set", f.offset, f.width, draw(_number(f.width, old))))
        elif op == "xor" and size > 4:
            ops.append(("xor", draw(st.integers(4, max(4, head))), draw(st.integers(1, 255))))
        elif op == "insert":
            blob = draw(st.binary(min_size=1, max_size=16))
            ops.append(("insert", draw(st.integers(0, min(end, size))), blob))
            size += len(blob)
        elif op == "delete" and size:
            n = draw(st.integers(1, 16))
            ops.append(("delete", draw(st.integers(0, head)), n))
            size = max(0, size - n)
        elif op == "truncate":
            size = draw(st.one_of(st.integers(0, min(end + 64, size)), st.integers(0, size)))
            ops.append(("truncate", size))
        elif op == "extend":
            blob = draw(st.binary(min_size=1, max_size=64))
            ops.append(("extend", blob))
            size += len(blob)
    return Mutated(name, source, tuple(ops))


# ---- metadata-level mutations: well-formed files with hostile values ---------------------------

_INT_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)  # u8 i8 u16 i16 u32 i32 u64 i64
_RANGES = {
    0: (0, 255),
    1: (-128, 127),
    2: (0, 65535),
    3: (-32768, 32767),
    4: (0, (1 << 32) - 1),
    5: (-(1 << 31), (1 << 31) - 1),
    10: (0, (1 << 64) - 1),
    11: (-(1 << 63), (1 << 63) - 1),
}


def _typed_int() -> st.SearchStrategy[Typed]:
    return st.sampled_from(_INT_TYPES).flatmap(
        lambda t: st.one_of(
            st.sampled_from([v for v in (*_EDGES, -1, -(1 << 31)) if _RANGES[t][0] <= v <= _RANGES[t][1]]),
            st.integers(*_RANGES[t]),
        ).map(lambda v, t=t: Typed(t, v))
    )


def hostile_values() -> st.SearchStrategy[Any]:
    """Values a metadata key may hold in a well-formed file, however wrong for the key."""
    floats = st.floats(allow_nan=True, allow_infinity=True, width=32).map(lambda v: Typed(6, v))
    scalars = st.one_of(
        _typed_int(),
        floats,
        st.booleans(),
        st.text(max_size=12),
        st.floats(allow_nan=True, width=64).map(lambda v: Typed(12, v)),
    )
    int_lists = _typed_int().flatmap(
        lambda x: st.lists(st.integers(*_RANGES[x.vtype]), max_size=6).map(lambda v, t=x.vtype: Typed(t, v))
    )
    return st.one_of(
        scalars,
        scalars,
        int_lists,
        st.lists(st.text(max_size=4), max_size=4).map(lambda v: Typed(STRING, v)),
        st.lists(st.booleans(), max_size=5).map(lambda v: Typed(7, v)),
        st.integers(4097, 6000).map(lambda n: Typed(4, [1] * n)),  # kept only as its length (SkippedArray)
    )


def _tensor_names(base: Base) -> st.SearchStrategy[str]:
    kinds = sorted({t.name.split(".")[-2] if t.name.startswith("blk.") else t.name for t in base.tensors})
    layer = st.one_of(
        st.integers(0, 8).map(str),
        st.sampled_from(["1048576", str(1 << 40), "0" * 30 + "1"]),
        st.integers(4300, 6000).map(lambda n: "1" * n),  # more digits than int() takes from a str
        st.just("٣"),
    )
    return st.one_of(
        st.builds(lambda n, k: f"blk.{n}.{k}.weight", layer, st.sampled_from(kinds)),
        st.text(max_size=40),
        st.sampled_from([t.name for t in base.tensors]),
    )


@dataclass(frozen=True)
class MetaCase:
    """A base model with some metadata values changed (``changes``: key -> value, None: removed) and its
    tensor list edited; shown by what changed."""

    base: str
    changes: dict[str, Any]
    renamed: tuple[int, str] | None
    kept_tensors: int
    metadata: dict[str, Any] = field(repr=False)
    tensors: tuple[TensorToWrite, ...] = field(repr=False)

    def write(self, path: Path) -> None:
        write_gguf(path, self.metadata, self.tensors, sparse=True)


@st.composite
def mutated_metadata(draw: st.DrawFn, bases: list[Base]) -> MetaCase:
    """A well-formed file whose metadata values (the architecture's hyperparameters above all) and
    tensor names hold hostile values: wrong types, NaN, huge or negative numbers, arrays of the wrong
    length, keys missing."""
    base = draw(st.sampled_from(bases))
    meta = dict(base.metadata)
    arch = str(meta["general.architecture"])
    keys = sorted(meta)
    hparams = [k for k in keys if k.startswith(f"{arch}.")]
    changes: dict[str, Any] = {}
    for _ in range(draw(st.integers(1, 3))):
        key = draw(
            st.one_of(
                st.sampled_from(hparams),
                st.sampled_from(hparams),
                st.sampled_from(keys),
                st.sampled_from(
                    [
                        "general.alignment",
                        f"{arch}.vocab_size",
                        f"{arch}.context_length",
                        f"{arch}.attention.head_count",
                        f"{arch}.attention.head_count_kv",
                        f"{arch}.expert_used_count",
                        f"{arch}.full_attention_interval",
                        f"{arch}.attention.recurrent_layers",
                        f"{arch}.attention.indexer.types",
                        "general.name",
                    ]
                ),
            )
        )
        if draw(st.integers(0, 5)) == 0:
            meta.pop(key, None)
            changes[key] = None
        else:
            meta[key] = changes[key] = draw(hostile_values())
    if "general.alignment" in meta:
        meta["general.alignment"] = _alignment(meta["general.alignment"])
    tensors = list(base.tensors)
    renamed = None
    if draw(st.booleans()):
        i = draw(st.integers(0, len(tensors) - 1))
        t = tensors[i]
        renamed = (i, draw(_tensor_names(base)))
        tensors[i] = TensorToWrite(renamed[1], t.shape, t.qtype)
    if draw(st.integers(0, 4)) == 0:
        del tensors[draw(st.integers(0, len(tensors) - 1)) :]
    return MetaCase(base.name, changes, renamed, len(tensors), meta, tuple(tensors))


class _Alignment(Typed):
    """An alignment the file says (any value) while the writer lays the file out with 32."""

    def __int__(self) -> int:
        return 32


def _alignment(v: Any) -> _Alignment:
    if isinstance(v, Typed):
        return _Alignment(v.vtype, v.value)
    if isinstance(v, bool):
        return _Alignment(7, v)
    if isinstance(v, str):
        return _Alignment(STRING, v)
    return _Alignment(4, int(v))


def tiny_model(path: Path) -> Path:
    """A valid tiny model (the first base) at ``path``."""
    path.write_bytes(bases()[0].data)
    return path
