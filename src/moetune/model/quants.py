"""The one table of tensor storage types: ids, names and byte sizes, mainline and ik_llama.cpp.

Mainline types come from the `gguf` package's own table (``GGML_QUANT_SIZES``), so they cannot
drift from what llama.cpp writes; types that package does not know yet, and ik_llama.cpp's own
types, are added here with their block geometry read from the engines' ``ggml-common.h``.

ik_llama.cpp types may carry a per-row header (``row_meta_size`` in its type traits: a float or
fp16 scale per row), so the size of a tensor is computed per row, never per element.

The table is built on first use. ``gguf.constants`` is read without running the ``gguf`` package's
``__init__``, which imports numpy and the whole reader and writer (about 0.2 s): reading a header
should not cost more than the header.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from functools import cache
from types import ModuleType

from moetune.kinds import EngineKind


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantType:
    id: int
    name: str  # upper case, as llama.cpp prints it (Q8_0, IQ3_KS)
    block_size: int  # elements per block
    type_size: int  # bytes per block
    row_meta_bytes: int = 0  # bytes of per-row header (ik_llama.cpp only)
    engines: frozenset[EngineKind] = frozenset(EngineKind)

    def row_bytes(self, n_elements: int) -> int:
        if n_elements % self.block_size:
            raise ValueError(f"{self.name}: a row of {n_elements} elements is not a multiple of {self.block_size}")
        return self.row_meta_bytes + n_elements // self.block_size * self.type_size

    def tensor_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of a tensor with ggml shape (ne0 first: the row length). No dimension at all is one
        element, as ggml reads a GGUF tensor of zero dimensions."""
        rows = 1
        for n in shape[1:]:
            rows *= n
        return rows * self.row_bytes(shape[0] if shape else 1)


# Mainline types the installed gguf package may not know yet: id -> (name, block, bytes).
_MAINLINE_EXTRA: dict[int, tuple[str, int, int]] = {
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
    42: ("Q2_0", 64, 18),
}

# ik_llama.cpp-only types: id -> (name, block elements, block bytes, row meta bytes).
# Block sizes from ik_llama.cpp ggml/src/ggml-common.h, row meta from ggml.c type_traits.
_QK_K = 256
_IK_ONLY: dict[int, tuple[str, int, int, int]] = {
    31: ("Q4_0_4_4", 32, 18, 0),
    32: ("Q4_0_4_8", 32, 18, 0),
    33: ("Q4_0_8_8", 32, 18, 0),
    36: ("I2_S", 1, 1, 0),
    133: ("Q6_0", 32, 2 + 16 + 8, 0),
    134: ("IQ1_BN", 64, 13, 2),
    135: ("IQ2_BN", 64, 16, 4),
    136: ("Q8_K64", 64, 4 + 64, 0),
    137: ("IQ2_K", _QK_K, 2 + 2 + _QK_K // 32 + _QK_K // 4, 0),
    138: ("IQ3_K", _QK_K, 2 + 4 + _QK_K // 32 + _QK_K // 4 + _QK_K // 8, 0),
    139: ("IQ4_K", _QK_K, 2 + 2 + _QK_K // 2 + 3 * _QK_K // 64, 0),
    140: ("IQ5_K", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 3 * _QK_K // 64, 0),
    141: ("IQ6_K", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16, 0),
    144: ("IQ4_KS", _QK_K, _QK_K // 32 + _QK_K // 2, 4),
    145: ("IQ2_KS", _QK_K, 2 + _QK_K // 64 + _QK_K // 4, 2),
    146: ("IQ4_KSS", _QK_K, _QK_K // 8 * 4, 4),
    152: ("IQ5_KS", _QK_K, _QK_K // 32 + _QK_K // 2 + _QK_K // 8, 4),
    153: ("IQ2_KT", _QK_K, _QK_K // 4 + _QK_K // 64, 4),
    154: ("IQ3_KT", _QK_K, _QK_K // 4 + _QK_K // 8 + _QK_K // 64, 4),
    155: ("IQ4_KT", _QK_K, _QK_K // 2, 4),
    156: ("IQ3_KS", _QK_K, 2 + _QK_K // 64 + _QK_K // 4 + _QK_K // 8, 2),
    157: ("IQ2_KL", _QK_K, 2 + _QK_K // 64 + _QK_K // 4 + _QK_K // 16, 2),
    158: ("IQ1_KT", _QK_K, _QK_K // 8 + _QK_K // 16 + _QK_K // 32, 4),
}

# Interleaved (row-repacked) forms: id -> (name, base id, row meta bytes). Same bytes per weight
# as their base type; the interleaving changes the layout, not the size.
_IK_REPACKED: dict[int, tuple[str, int, int]] = {
    202: ("Q4_0_R8", 20, 0),
    206: ("Q5_0_R4", 6, 0),
    208: ("Q8_0_R8", 8, 0),
    210: ("Q2_K_R4", 10, 0),
    211: ("Q3_K_R4", 11, 0),
    212: ("Q4_K_R4", 12, 0),
    213: ("Q5_K_R4", 13, 0),
    214: ("Q6_K_R4", 14, 0),
    216: ("IQ2_XXS_R4", 16, 0),
    217: ("IQ2_XS_R4", 17, 0),
    218: ("IQ3_XXS_R4", 18, 0),
    220: ("IQ4_NL_R4", 20, 0),
    221: ("IQ3_S_R4", 21, 0),
    222: ("IQ2_S_R4", 22, 0),
    223: ("IQ4_XS_R8", 23, 0),
    230: ("BF16_R16", 30, 0),
    233: ("Q6_0_R4", 133, 0),
    335: ("IQ2_BN_R4", 135, 4),
    337: ("IQ2_K_R4", 137, 0),
    338: ("IQ3_K_R4", 138, 0),
    339: ("IQ4_K_R4", 139, 0),
    340: ("IQ5_K_R4", 140, 0),
    344: ("IQ4_KS_R4", 144, 4),
    352: ("IQ5_KS_R4", 152, 4),
    353: ("MXFP4_R8", 39, 0),
}
# R4 forms of the 1-bit types use their own 32-element blocks.
_IK_OWN_BLOCKS: dict[int, tuple[str, int, int, int]] = {
    219: ("IQ1_S_R4", 32, 6, 2),
    229: ("IQ1_M_R4", 32, 7, 2),
}


@cache
def gguf_constants() -> ModuleType:
    """gguf's ``constants.py``: the imported ``gguf.constants`` if the package is loaded already,
    else the same file loaded alone under a private name (it imports only the standard library).

    Only ints and names leave this module, so a second copy of gguf's enums in the process is harmless.
    """
    if "gguf.constants" in sys.modules:
        return sys.modules["gguf.constants"]
    pkg = importlib.util.find_spec("gguf")  # finds the package without running its __init__
    if pkg is None or not pkg.submodule_search_locations:
        raise ImportError("the gguf package is not installed")
    path = next(iter(pkg.submodule_search_locations)) + "/constants.py"
    spec = importlib.util.spec_from_file_location("moetune._gguf_constants", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gguf_sizes() -> dict[int, tuple[str, int, int]]:
    """gguf's table of mainline types, id -> (name, block size, type size); kept in moetune's cache
    under the identity of gguf's constants.py, since running that file costs ~20 ms per command."""
    import json
    import os

    from moetune import filecache

    pkg = importlib.util.find_spec("gguf")
    path = (
        next(iter(pkg.submodule_search_locations)) + "/constants.py" if pkg and pkg.submodule_search_locations else None
    )
    key = None
    if path is not None:
        try:
            st = os.stat(path)
            key = f"gguf-{st.st_size}-{st.st_mtime_ns}-{st.st_ino}.json"
        except OSError:
            pass
    data = filecache.get("quants", key) if key else None
    if data is not None:
        try:
            return {int(k): (str(v[0]), int(v[1]), int(v[2])) for k, v in json.loads(data).items()}
        except (ValueError, TypeError, IndexError, AttributeError):
            pass
    c = gguf_constants()
    out = {
        int(qt): (c.GGMLQuantizationType(qt).name, int(block), int(size))
        for qt, (block, size) in c.GGML_QUANT_SIZES.items()
    }
    if key:
        filecache.put("quants", key, json.dumps(out).encode())
    return out


def _build() -> dict[int, QuantType]:
    table: dict[int, QuantType] = {}
    for qt, (name, block, size) in _gguf_sizes().items():
        table[qt] = QuantType(id=qt, name=name, block_size=block, type_size=size)
    for tid, (name, block, size) in _MAINLINE_EXTRA.items():
        table.setdefault(tid, QuantType(id=tid, name=name, block_size=block, type_size=size))
    for tid, (name, block, size, meta) in {**_IK_ONLY, **_IK_OWN_BLOCKS}.items():
        table[tid] = QuantType(
            id=tid, name=name, block_size=block, type_size=size, row_meta_bytes=meta, engines=frozenset({EngineKind.IK})
        )
    for tid, (name, base, meta) in _IK_REPACKED.items():
        b = table[base]
        table[tid] = QuantType(
            id=tid,
            name=name,
            block_size=b.block_size,
            type_size=b.type_size,
            row_meta_bytes=meta,
            engines=frozenset({EngineKind.IK}),
        )
    # ik_llama.cpp reads mainline files but not the newest mainline-only types.
    for tid in (34, 35, 40, 42):
        if tid in table:
            t = table[tid]
            table[tid] = QuantType(
                id=t.id,
                name=t.name,
                block_size=t.block_size,
                type_size=t.type_size,
                row_meta_bytes=t.row_meta_bytes,
                engines=frozenset({EngineKind.MAINLINE}),
            )
    return table


@cache
def quant_types() -> dict[int, QuantType]:
    """Every known type by id, mainline and ik_llama.cpp."""
    return _build()


@cache
def _by_name() -> dict[str, QuantType]:
    return {t.name.lower(): t for t in quant_types().values()}


class UnknownQuantType(ValueError):
    pass


def by_id(type_id: int) -> QuantType:
    try:
        return quant_types()[type_id]
    except KeyError:
        raise UnknownQuantType(f"unknown tensor type id {type_id}") from None


def by_name(name: str) -> QuantType:
    try:
        return _by_name()[name.strip().lower()]
    except KeyError:
        known = ", ".join(sorted(t.name.lower() for t in quant_types().values()))
        raise UnknownQuantType(f"unknown tensor type {name!r} (known: {known})") from None


_INTERLEAVED_ROWS = {"Q4_0_4_4": 4, "Q4_0_4_8": 4, "Q4_0_8_8": 8}


def interleaved(t: QuantType) -> tuple[QuantType, int] | None:
    """(base type, rows interleaved) of an ik_llama.cpp row-interleaved type (``IQ4_KS_R4`` ->
    (IQ4_KS, 4)); None for a plain type. From ik's ``interleaved_properties``."""
    if t.name in _INTERLEAVED_ROWS:
        return by_name("q4_0"), _INTERLEAVED_ROWS[t.name]
    for tid, (name, base, _meta) in _IK_REPACKED.items():
        if tid == t.id:
            return by_id(base), int(name.rsplit("_R", 1)[1])
    for tid, (name, _b, _s, _m) in _IK_OWN_BLOCKS.items():
        if tid == t.id:
            return by_name(name.removesuffix("_R4")), 4
    return None
