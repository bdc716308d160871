"""Run settings that change memory and speed: context, slots, batches, cache types, engine."""

from __future__ import annotations

from dataclasses import dataclass

from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.kv import CACHE_TYPES

IK_MLA_MODES = (2, 3)  # the -mla modes the ledger counts: both keep the latent cache alone


@dataclass(frozen=True, slots=True)
class Settings:
    ctx: int = 4096  # total context (-c), shared by the slots
    slots: int = 1  # --parallel
    batch: int = 2048  # -b
    ubatch: int = 512  # -ub
    ctk: str = "f16"
    ctv: str = "f16"
    flash_attn: bool = True
    engine: EngineKind = EngineKind.MAINLINE
    mmap: bool = True
    repack: bool = False  # CPU weight repacking (extra CPU_REPACK buffer); off by default on this project
    mtp: bool = False  # load NextN/MTP blocks (speculative drafting)
    kv_unified: bool = False
    amb_mib: int = 0  # ik_llama.cpp -amb: attention max batch (MiB), bounds the attention's scratch; 0 = unbounded
    mla: int = 3  # ik_llama.cpp -mla mode on MLA models (2 and 3 keep the latent cache alone; 3 is ik's default)
    fused_moe: bool = True  # ik_llama.cpp's fused MoE up/gate kernels (on by default; -no-fmoe turns them off)
    merge_up_gate: bool = False  # ik_llama.cpp -muge: each layer's up and gate experts merged into one tensor at load
    gpu_overhead_mib: float = 300.0  # CUDA context at load time, outside llama.cpp's buffers
    margin_mib: float = 1024.0  # head-room on each GPU for what grows after load (CUDA pools, graphs)
    host_margin_mib: float = 2048.0  # head-room kept free in host RAM
    threads: int | None = None

    def validate(self) -> None:
        if self.engine not in (EngineKind.MAINLINE, EngineKind.IK):
            raise InputError(f"engine kind {self.engine!r}: choose {EngineKind.MAINLINE} or {EngineKind.IK}")
        for name, v in (("--ctx", self.ctx), ("--parallel", self.slots), ("-b", self.batch), ("-ub", self.ubatch)):
            if v < 1:
                raise InputError(f"{name} {v}: must be at least 1")
        if self.ubatch > self.batch:
            raise InputError(f"-ub {self.ubatch} is larger than -b {self.batch}", hint="llama.cpp caps -ub at -b")
        for name, t in (("--ctk", self.ctk), ("--ctv", self.ctv)):
            if t not in CACHE_TYPES:
                raise InputError(f"{name} {t}: choose one of {', '.join(CACHE_TYPES)}")
        if self.ctv != "f16" and not self.flash_attn:
            raise InputError("a quantized V cache needs flash attention", hint="drop --no-flash-attn or use --ctv f16")
        if self.mla not in IK_MLA_MODES:
            raise InputError(f"-mla {self.mla}: moetune plans modes {' and '.join(map(str, IK_MLA_MODES))}",
                             hint="modes 0 and 1 keep another cache (full K/V, or a transposed V without flash "
                                  "attention), which the ledger does not count")
        if self.ctx // self.slots < 256:
            raise InputError(f"--ctx {self.ctx} over {self.slots} slots leaves under 256 tokens per slot")
