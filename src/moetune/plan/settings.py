"""Run settings that change memory and speed (context, slots, batches, cache types, engine), and
how the server is run and reached (``ServerOptions``: listen address, API key file, alias,
defaults for its requests, the user's own extra flags)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.kv import CACHE_TYPES

IK_MLA_MODES = (2, 3)  # the -mla modes the ledger counts: both keep the latent cache alone


LOOPBACK = "127.0.0.1"
ROPE_SCALINGS = ("yarn", "linear")  # llama-server's --rope-scaling choices that stretch the context
# -sm values moetune plans: layer (every engine's default) and ik_llama.cpp's graph, which divides each
# offloaded layer's tensors across the GPUs (plan.graph_split); mainline's row and tensor put every
# layer's KV and experts on the main GPU and divide only its matrices, which the ledger does not model
SPLIT_MODES = ("layer", "graph")
ENGINE_CTX_CHECKPOINTS = 32  # both engines' default --ctx-checkpoints (mainline common.h, ik 0.1.5 common.h)
# mainline's default --cache-ram (common.h ``cache_ram_mib``): the host RAM its prompt cache may take
ENGINE_CACHE_RAM_MIB = 8192
WILDCARDS = ("0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerOptions:
    """What the server is told besides memory and speed. None of it changes the ledger; all of it
    is rendered into every command, kept in the plan and used by every launch."""

    host: str = LOOPBACK  # the address llama-server listens on (--listen)
    api_key_file: str | None = None  # llama-server reads its keys from it; the plan keeps the path, never the key
    alias: str | None = None  # the model's name in the API (-a)
    thinking: bool | None = None  # the default for requests that do not say (None: the template's own)
    sampling: tuple[tuple[str, float], ...] = ()  # the server's sampling defaults: (temp, 0.7), (top_k, 45)
    warmup_batch: bool = False  # ik_llama.cpp --warmup-batch: warm up with a whole batch
    extra_args: tuple[str, ...] = ()  # the user's own flags, checked against the engine's (engine.server_args)
    env: tuple[tuple[str, str], ...] = ()  # the server's environment, besides moetune's own
    rope_scaling: str | None = None  # "yarn" | "linear": stretch the positions past the trained context

    @property
    def public(self) -> bool:
        """Listening beyond this machine (every interface, or an address others can reach)."""
        return not is_loopback(self.host)


def engine_repacks(engine: str) -> bool:
    """The engine's default with no repacking flag: mainline llama.cpp repacks (``--no-repack``/``-nr``
    turns it off; common/arg.cpp), ik_llama.cpp does not (``-rtr`` turns it on)."""
    return engine == EngineKind.MAINLINE


REPACK_CHOICES = {"auto": None, "on": True, "off": False}  # plan --repack


def repack_word(repack: bool | None) -> str:
    """``--repack``'s word for a setting (None: auto, the engine's default)."""
    return next(k for k, v in REPACK_CHOICES.items() if v is repack)


@dataclass(frozen=True, slots=True, kw_only=True)
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
    # CPU weight repacking: None follows the engine (mainline repacks CPU-resident weights into its
    # CPU_REPACK/AMX buffers unless -nr; ik_llama.cpp repacks in place only with -rtr); True/False say it
    repack: bool | None = None
    mtp: bool = False  # load NextN/MTP blocks (speculative drafting)
    kv_unified: bool = False
    swa_full: bool = False  # --swa-full: sliding-window layers get a cache of the whole context
    amb_mib: int = 0  # ik_llama.cpp -amb: attention max batch (MiB), bounds the attention's scratch; 0 = unbounded
    mla: int = 3  # ik_llama.cpp -mla mode on MLA models (2 and 3 keep the latent cache alone; 3 is ik's default)
    fused_moe: bool = True  # ik_llama.cpp's fused MoE up/gate kernels (on by default; -no-fmoe turns them off)
    merge_up_gate: bool = False  # ik_llama.cpp -muge: each layer's up and gate experts merged into one tensor at load
    gpu_overhead_mib: float = 300.0  # CUDA context at load time, outside llama.cpp's buffers
    margin_mib: float = 1024.0  # head-room on each GPU for what grows after load (CUDA pools, graphs)
    host_margin_mib: float = 2048.0  # head-room kept free in host RAM
    threads: int | None = None
    threads_batch: int | None = None  # -tb: threads for prefill (default: the engine's, = threads)
    merge_qkv: bool = False  # ik_llama.cpp --merge-qkv: Q, K and V merged into one tensor at load
    grouped_experts: bool = False  # ik_llama.cpp -ger: grouped expert routing
    ctx_checkpoints: int | None = None  # --ctx-checkpoints: per slot at most (None: the engine's default, 32)
    split_mode: str = "layer"  # -sm: layer, or ik_llama.cpp's graph (SPLIT_MODES)
    # --cache-ram: the host RAM (MiB) mainline's prompt cache may hold (-1 no limit, 0 none); None: the
    # engine's 8 GiB where the host has it left, else what it has left (the plan then renders it)
    cache_ram_mib: int | None = None
    server: ServerOptions = field(default_factory=ServerOptions)

    @property
    def checkpoints_per_slot(self) -> int:
        """Context checkpoints each slot may keep (``--ctx-checkpoints``, else the engines' default)."""
        return ENGINE_CTX_CHECKPOINTS if self.ctx_checkpoints is None else self.ctx_checkpoints

    @property
    def repacks(self) -> bool:
        """Whether the engine repacks CPU-resident weights under these settings: the option where it
        is given, else the engine's own default (:func:`engine_repacks`)."""
        return engine_repacks(self.engine) if self.repack is None else self.repack

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
            raise InputError(
                f"-mla {self.mla}: moetune plans modes {' and '.join(map(str, IK_MLA_MODES))}",
                hint="modes 0 and 1 keep another cache (full K/V, or a transposed V without flash "
                "attention), which the ledger does not count",
            )
        if self.server.rope_scaling not in (None, *ROPE_SCALINGS):
            raise InputError(f"--rope-scaling {self.server.rope_scaling}: choose {' or '.join(ROPE_SCALINGS)}")
        if self.cache_ram_mib is not None and self.cache_ram_mib < -1:
            raise InputError(f"--cache-ram {self.cache_ram_mib}: give MiB, 0 (no prompt cache) or -1 (no limit)")
        if self.ctx_checkpoints is not None and self.ctx_checkpoints < 0:
            raise InputError(f"--ctx-checkpoints {self.ctx_checkpoints}: must be 0 (none) or more")
        if self.split_mode not in SPLIT_MODES:
            raise InputError(
                f"--split-mode {self.split_mode}: moetune plans {' or '.join(SPLIT_MODES)}",
                hint="row and tensor (mainline) keep every layer's KV cache and experts on the main GPU "
                "and divide only its matrices, which the ledger does not model",
            )
        if self.split_mode == "graph" and self.engine != EngineKind.IK:
            raise InputError(
                f"--split-mode graph: engine {self.engine} has no graph split (its -sm takes none, layer, row, tensor)",
                hint="plan with --engine ik_llama.cpp, or leave --split-mode at layer",
            )
        if self.threads_batch is not None and self.threads_batch < 1:
            raise InputError(f"--threads-batch {self.threads_batch}: must be at least 1")
        if self.ctx // self.slots < 256:
            raise InputError(f"--ctx {self.ctx} over {self.slots} slots leaves under 256 tokens per slot")
