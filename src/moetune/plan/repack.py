"""Which CPU-resident weights the engine repacks, and the host buffer they move into. Pure.

Mainline llama.cpp (``--repack``, its default; ``-nr`` turns it off) offers the CPU's extra buffer
types before the plain CPU buffer (``make_cpu_buft_list`` in src/llama-model.cpp): a weight goes
to the first one that can run its operation (``select_weight_buft``), and is copied there from the
mapped file, re-laid out, at load. Their order is AMX, then CPU_REPACK (ggml-cpu.cpp
``ggml_backend_cpu_get_extra_buffer_types``). A host buffer of a local GPU (``CUDA_Host``) comes
before them, so with a CUDA GPU the CPU's weights stay in the mapped file or pinned memory and
nothing is repacked (RPC devices have no host buffer: beside them the CPU repacks).

- AMX (ggml-cpu/amx/amx.cpp ``supports_op``, a build for a CPU with AMX-INT8): 2-D matmul weights
  (``MUL_MAT``, not the experts' ``MUL_MAT_ID``) whose output rows are a multiple of 32 and whose
  rows a multiple of the type's block; its layout adds per-block bytes for some types
  (amx/mmq.cpp ``get_row_size``), and it keeps F16 as it is.
- CPU_REPACK (ggml-cpu/repack.cpp ``ggml_repack_get_optimal_repack_type``): 2-D matmul weights and
  3-D expert tensors of the types that have an interleaved kernel on the CPU's vector extensions,
  with rows a multiple of the interleave; same bytes (``get_alloc_size`` is ``ggml_nbytes``).

ik_llama.cpp repacks in place, only with ``-rtr`` (src/llama.cpp: ``iqk_repack_tensor`` on every
host tensor after load): no second buffer, but ``-rtr`` turns mmap off (llama-model-loader.cpp), so
the weights are read into memory instead of being mapped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from moetune.kinds import EngineKind
from moetune.model.profile import Tensor

TENSOR_ALIGNMENT = 32  # ggml's buffer alignment: each tensor's size is padded to it
X86_DEFAULT_ISA = ("avx2",)  # what a CPU is assumed to have when its hardware file does not say
ISA_WORDS = ("avx2", "avx512", "amx", "dotprod", "i8mm")  # the extensions the kernels below test

# CPU_REPACK: type -> ((extension, row multiple), ...), the first the CPU has wins (x86, then Arm)
CPU_REPACK: dict[str, tuple[tuple[str, int], ...]] = {
    "Q4_0": (("avx2", 8), ("i8mm", 4), ("dotprod", 4)),
    "Q4_K": (("avx2", 8), ("i8mm", 8), ("dotprod", 8)),
    "Q2_K": (("avx512", 8),),
    "Q5_K": (("i8mm", 8), ("dotprod", 8)),
    "Q6_K": (("i8mm", 8), ("dotprod", 8)),
    "IQ4_NL": (("avx2", 8), ("dotprod", 4)),
    "MXFP4": (("avx2", 8), ("dotprod", 4)),
    "Q8_0": (("i8mm", 4), ("dotprod", 4)),
}
# AMX: type -> (elements per block, the row length's multiple, bytes per block, bytes AMX adds per block)
AMX: dict[str, tuple[int, int, int, int]] = {
    "Q4_0": (32, 32, 18, 0),
    "Q4_1": (32, 32, 20, 0),
    "Q8_0": (32, 32, 34, 4),
    "Q4_K": (256, 256, 144, 4),
    "Q5_K": (256, 256, 176, 4),
    "Q6_K": (256, 256, 210, 0),
    "IQ4_XS": (256, 256, 136, 2),
    "F16": (1, 16, 2, 0),
}
AMX_ROWS = 32  # the output rows (ne[1]) AMX needs a multiple of: TILE_N * 2
NOT_MATMUL = ("token_embd",)  # 2-D weights read by GET_ROWS, which no extra buffer runs


@dataclass(frozen=True, slots=True)
class Repacked:
    """The weights the engine repacks: per buffer (AMX, CPU_REPACK), the tensors and the bytes."""

    buffers: tuple[tuple[str, int], ...] = ()  # (buffer name, bytes as allocated)
    names: frozenset[str] = frozenset()

    @property
    def nbytes(self) -> int:
        return sum(b for _, b in self.buffers)


def _pad(n: int) -> int:
    return -(-n // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT


def amx_bytes(t: Tensor) -> int | None:
    """The tensor's size in the AMX buffer, None where AMX does not take it."""
    spec = AMX.get(t.type_name)
    if spec is None or len(t.shape) != 2 or t.is_expert or t.kind in NOT_MATMUL:
        return None
    block, align, block_bytes, extra = spec
    k, n = t.shape[0], t.shape[1]
    if n % AMX_ROWS or k % align:
        return None
    return n * (k // block) * (block_bytes + extra)


def cpu_repack_ok(t: Tensor, isa: Iterable[str]) -> bool:
    """CPU_REPACK takes the tensor: a 2-D matmul weight or a 3-D expert tensor of a type with an
    interleaved kernel on these extensions, its rows a multiple of the interleave."""
    has = set(isa)
    if t.kind in NOT_MATMUL or len(t.shape) != (3 if t.is_expert else 2):
        return False
    rule = next(((ext, m) for ext, m in CPU_REPACK.get(t.type_name, ()) if ext in has), None)
    return rule is not None and t.shape[1] % rule[1] == 0


def repacks_cpu_weights(engine: str, repack: bool, local_gpu: bool) -> bool:
    """Whether the CPU-resident weights run repacked at all: ik's ``-rtr`` in place, mainline's
    buffers unless a local CUDA GPU's host buffer comes first (:func:`repacked` says which)."""
    return repack and not (engine == EngineKind.MAINLINE and local_gpu)


def repacked(
    cpu_tensors: Iterable[Tensor], *, engine: str, repack: bool, isa: Iterable[str] | None, local_gpu: bool
) -> Repacked:
    """What mainline moves into its repack buffers, of the CPU-resident tensors (``isa``: the CPU's
    extensions, None: :data:`X86_DEFAULT_ISA`; ``local_gpu``: a CUDA host buffer comes first, and
    nothing is repacked). ik_llama.cpp's ``-rtr`` repacks in place: no buffer here."""
    if engine != EngineKind.MAINLINE or not repacks_cpu_weights(engine, repack, local_gpu):
        return Repacked()
    has = tuple(X86_DEFAULT_ISA if isa is None else isa)
    sizes: dict[str, int] = {}
    names: set[str] = set()
    for t in cpu_tensors:
        b = amx_bytes(t) if "amx" in has else None
        buf = "AMX"
        if b is None:
            if not cpu_repack_ok(t, has):
                continue
            b, buf = t.nbytes, "CPU_REPACK"
        sizes[buf] = sizes.get(buf, 0) + _pad(b)
        names.add(t.name)
    return Repacked(tuple(sorted(sizes.items())), frozenset(names))


def in_place(engine: str, repack: bool) -> bool:
    """ik_llama.cpp's ``-rtr``: repacked in place, which turns mmap off."""
    return engine == EngineKind.IK and repack
