"""Write GGUF files: one file or shards named as llama-gguf-split names them, dense or sparse.

A sparse file has an exact header and a data region that is a file hole, so a replica of a
320 GiB model has its real layout and costs a few kilobytes of disk.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, SupportsInt

from moetune.model.gguf_read import (
    ARRAY,
    BOOL,
    DEFAULT_ALIGNMENT,
    F32,
    GGUF_MAGIC,
    I32,
    I64,
    SCALAR_FORMATS,
    STRING,
    U16,
    U32,
)
from moetune.model.quants import QuantType

# GGUF value types


@dataclass(frozen=True, slots=True)
class Typed:
    """A metadata value with an explicit GGUF type (for arrays: the element type)."""

    vtype: int
    value: Any


@dataclass(frozen=True, slots=True)
class TensorToWrite:
    name: str
    shape: tuple[int, ...]  # ggml order
    qtype: QuantType
    # returns the tensor's bytes; None for sparse output
    data: Callable[[], bytes] | None = None

    @property
    def nbytes(self) -> int:
        return self.qtype.tensor_bytes(self.shape)


def _infer(v: Any) -> int:
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        return U32 if 0 <= v < 1 << 32 else I64
    if isinstance(v, float):
        return F32
    if isinstance(v, str):
        return STRING
    raise TypeError(f"cannot infer a GGUF type for {v!r}")


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, v: Any) -> bytes:
    if vtype == STRING:
        return _str(v)
    return struct.pack(SCALAR_FORMATS[vtype], v)


def _kv(key: str, v: object) -> bytes:
    out = bytearray(_str(key))
    if isinstance(v, Typed):
        vtype, val = v.vtype, v.value
    else:
        vtype, val = (None, v)
    if isinstance(val, (list, tuple)):
        item = vtype if vtype is not None else (_infer(val[0]) if val else U32)
        out += struct.pack("<IIQ", ARRAY, item, len(val))
        for x in val:
            out += _value(item, x)
        return bytes(out)
    vt = vtype if vtype is not None else _infer(val)
    out += struct.pack("<I", vt) + _value(vt, val)
    return bytes(out)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def write_gguf(path: Path, metadata: Mapping[str, object], tensors: Sequence[TensorToWrite], *, sparse: bool) -> int:
    """Write one GGUF file; returns its size in bytes."""
    align = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, str | SupportsInt):  # what int() takes (a test's typed value, too)
        raise TypeError(f"general.alignment: {align!r} is not a number")
    alignment = int(align)
    header = bytearray(GGUF_MAGIC)
    header += struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for k, v in metadata.items():
        header += _kv(k, v)
    offsets = []
    off = 0
    for t in tensors:
        offsets.append(off)
        off = _align(off + t.nbytes, alignment)
    for t, o in zip(tensors, offsets, strict=True):
        header += _str(t.name)
        header += struct.pack("<I", len(t.shape))
        for n in t.shape:
            header += struct.pack("<Q", n)
        header += struct.pack("<IQ", t.qtype.id, o)
    data_start = _align(len(header), alignment)
    total = data_start + (offsets[-1] + tensors[-1].nbytes if tensors else 0)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(b"\0" * (data_start - len(header)))
        if not sparse:
            for t, o in zip(tensors, offsets, strict=True):
                f.seek(data_start + o)
                blob = t.data() if t.data is not None else b""
                if blob:
                    if len(blob) != t.nbytes:
                        raise ValueError(f"{t.name}: {len(blob)} bytes of data for a {t.nbytes}-byte tensor")
                    f.write(blob)
        f.truncate(total)
    os.replace(tmp, path)
    return total


def shard_name(path: Path, i: int, count: int) -> Path:
    stem = path.name[:-5] if path.name.endswith(".gguf") else path.name
    return path.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf")


def split_evenly(tensors: Sequence[TensorToWrite], count: int) -> list[list[TensorToWrite]]:
    """Cut the tensor list, in order, into `count` runs of about equal bytes, none empty."""
    if count > len(tensors):
        raise ValueError(f"cannot make {count} shards of {len(tensors)} tensors")
    total = max(1, sum(t.nbytes for t in tensors))
    groups: list[list[TensorToWrite]] = [[] for _ in range(count)]
    acc, g = 0, 0
    for i, t in enumerate(tensors):
        want = min(count - 1, acc * count // total)
        g = min(max(g, want), g + 1 if groups[g] else g)  # never skip a shard
        g = max(g, count - (len(tensors) - i))  # leave a tensor for each later shard
        groups[g].append(t)
        acc += t.nbytes
    return groups


def write_model(
    path: Path,
    metadata: Mapping[str, object],
    tensors: Sequence[TensorToWrite],
    *,
    shards: int = 1,
    sparse: bool = False,
    progress: Callable[[int], None] | None = None,
) -> list[Path]:
    """Write a model as one file or as `shards` files; returns the paths written."""
    if shards <= 1:
        write_gguf(path, metadata, tensors, sparse=sparse)
        if progress:
            progress(1)
        return [path]
    out: list[Path] = []
    for i, group in enumerate(split_evenly(tensors, shards)):
        meta: dict[str, object] = dict(metadata) if i == 0 else {}
        meta["split.no"] = Typed(U16, i)
        meta["split.count"] = Typed(U16, shards)
        meta["split.tensors.count"] = Typed(I32, len(tensors))
        if "general.alignment" in metadata:
            meta["general.alignment"] = metadata["general.alignment"]
        p = shard_name(path, i + 1, shards)
        write_gguf(p, meta, group, sparse=sparse)
        out.append(p)
        if progress:
            progress(i + 1)
    return out
