"""Flag dialects: how each engine build spells the same setting. The base table per engine kind is
adjusted by the build's own facts (``engine.facts``): flash attention's syntax, the flags it has.

Placements are always rendered as explicit ``-ot`` overrides, which mean the same in every engine
and version; ``--n-cpu-moe N`` is not, so it is only shown as a note, in the build's own rule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from moetune.engine.facts import KNOWN, EngineFacts, NCpuMoeRule, n_cpu_moe_layers
from moetune.kinds import EngineKind


@dataclass(frozen=True, slots=True, kw_only=True)
class Dialect:
    kind: str
    ctx: str = "-c"
    slots: str = "--parallel"
    batch: str = "-b"
    ubatch: str = "-ub"
    ctk: str = "-ctk"
    ctv: str = "-ctv"
    ngl: str = "-ngl"
    ngl_all: str = "999"
    override: str = "-ot"
    tensor_split: str = "-ts"
    rpc: str = "--rpc"
    threads: str = "-t"
    flash_attn_on: tuple[str, ...] = ("-fa", "on")
    flash_attn_off: tuple[str, ...] = ("-fa", "off")
    no_repack: tuple[str, ...] = ("-nr",)  # repacking is on by default in mainline
    repack: tuple[str, ...] = ()
    no_mmap: tuple[str, ...] = ("-lm", "none")
    fit_off: tuple[str, ...] = ("-fit", "off")  # keep --fit from second-guessing the plan
    jinja: tuple[str, ...] = ()  # mainline applies the model's template by default
    kv_unified: tuple[str, ...] = ("--kv-unified",)
    swa_full: tuple[str, ...] = ("--swa-full",)  # sliding-window layers' cache for the whole context
    ctx_checkpoints: str = "--ctx-checkpoints"  # both engines: checkpoints per slot
    cache_ram: str | None = "--cache-ram"  # mainline's prompt cache in host RAM (MiB)
    split_mode: str = "-sm"
    cpu_moe: str = "--cpu-moe"
    n_cpu_moe: NCpuMoeRule = NCpuMoeRule.FIRST  # which layers --n-cpu-moe N keeps on the CPU
    amb: str | None = None  # ik_llama.cpp: attention max batch, the value Settings.amb_mib
    mla: str | None = None  # ik_llama.cpp: the MLA mode flag, the value Settings.mla (MLA models only)
    fused_moe_on: tuple[str, ...] = ()  # ik_llama.cpp's fused MoE: opt-in (-fmoe) in older builds,
    fused_moe_off: tuple[str, ...] = ()  # on by default and turned off (-no-fmoe) in newer ones
    merge_up_gate: tuple[str, ...] = ()  # ik_llama.cpp -muge
    merge_qkv: tuple[str, ...] = ()  # ik_llama.cpp --merge-qkv
    grouped_experts: tuple[str, ...] = ()  # ik_llama.cpp -ger
    # every option the build takes (its --help, and what its probes accepted); empty where the
    # build's help is not known here, and then nothing is checked against it
    flags: frozenset[str] = frozenset()
    no_log_file: tuple[str, ...] = ()  # ik_llama.cpp writes llama.log into the working directory unless told
    version: str = ""  # the build whose facts shaped this dialect


MAINLINE_DIALECT = Dialect(kind=EngineKind.MAINLINE)

IK_DIALECT = Dialect(
    kind=EngineKind.IK,
    slots="--parallel",
    no_repack=(),  # run-time repacking is opt-in (-rtr) in ik_llama.cpp
    repack=("-rtr",),
    no_mmap=("--no-mmap",),
    fit_off=(),  # --fit is opt-in
    jinja=("--jinja",),
    kv_unified=(),
    swa_full=(),  # no split cache to make full: every layer's holds the context already
    cache_ram=None,  # ik_llama.cpp 0.1.5 has no host prompt cache
    n_cpu_moe=NCpuMoeRule.IK_SPLIT_TAIL,
    amb="-amb",
    mla="-mla",
    fused_moe_off=("-no-fmoe",),
    merge_up_gate=("-muge",),
    merge_qkv=("--merge-qkv",),
    grouped_experts=("-ger",),
    no_log_file=("--log-disable",),  # only the file: the log on stderr stays
)


def dialect(kind: str, facts: EngineFacts | None = None) -> Dialect:
    """The dialect of an engine build: its kind's table, adjusted by what the build says it accepts
    (``facts``; None: the build `moetune engine install` makes, ``facts.KNOWN``)."""
    if kind == EngineKind.MAINLINE:
        base = MAINLINE_DIALECT
    elif kind == EngineKind.IK:
        base = IK_DIALECT
    else:
        raise ValueError(f"unknown engine kind {kind!r}")
    f = facts or KNOWN[EngineKind(kind)]
    fa_on: tuple[str, ...]
    fa_off: tuple[str, ...]
    if f.flash_attn_takes_value:
        fa_on, fa_off = ("-fa", "on"), ("-fa", "off")
    else:  # an older build: a bare -fa turns it on, and off is the default (or -no-fa)
        fa_on, fa_off = ("-fa",), (("-no-fa",) if f.has("-no-fa") else ())
    no_mmap = ("-lm", "none") if f.has("-lm none") else ("--no-mmap",) if f.has("--no-mmap") else ()
    fmoe: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    if base.kind == EngineKind.IK:
        fmoe = ((), ("-no-fmoe",)) if f.has("-no-fmoe") else (("-fmoe",), ()) if f.has("-fmoe") else ((), ())
    return replace(
        base,
        flash_attn_on=fa_on,
        flash_attn_off=fa_off,
        n_cpu_moe=f.n_cpu_moe,
        version=f.version,
        no_mmap=no_mmap,
        fit_off=base.fit_off if f.has("-fit off") else (),
        no_repack=base.no_repack if f.has("-nr") else (),
        repack=base.repack if f.has("-rtr") else (),
        kv_unified=base.kv_unified if f.has("--kv-unified") else (),
        jinja=base.jinja if f.has("--jinja") else (),
        amb=base.amb if base.amb and f.has(base.amb) else None,
        mla=base.mla if base.mla and f.has(base.mla) else None,
        fused_moe_on=fmoe[0],
        fused_moe_off=fmoe[1],
        merge_up_gate=base.merge_up_gate if base.merge_up_gate and f.has(base.merge_up_gate[0]) else (),
        no_log_file=base.no_log_file if base.no_log_file and f.has(base.no_log_file[0]) else (),
        merge_qkv=base.merge_qkv if not f.help_flags or f.has("--merge-qkv") else (),
        grouped_experts=base.grouped_experts if not f.help_flags or f.has("-ger") else (),
        flags=f.help_flags | {a.split()[0] for a in f.accepts} if f.help_flags else frozenset(),
    )


IK_LOCAL_CPU = "(the CPU, as ik's local device)"


def engine_devices(d: Dialect, accelerators: list[tuple[str, bool]]) -> list[str]:
    """The engine's devices for a plan's accelerators ((name, is an RPC device), in llama.cpp's
    order: RPC devices, then local GPUs), in the engine's own numbering, which ``-ts`` follows.

    ik_llama.cpp numbers its devices the other way (local GPUs, then RPC servers), and a build
    without a GPU backend still counts one local device (the CPU) before the RPC servers."""
    if d.kind != EngineKind.IK or not any(r for _, r in accelerators):
        return [n for n, _ in accelerators]
    local = [n for n, r in accelerators if not r]
    return [*(local or [IK_LOCAL_CPU]), *(n for n, r in accelerators if r)]


def n_cpu_moe_note(
    d: Dialect, n: int, n_layer: int, layer_device: list[str] | None = None, *, n_devices: int | None = None
) -> str:
    """What `--n-cpu-moe n` means for this build, in layer numbers (``layer_device``: each layer's
    device, and ``n_devices``, the engine's device count: the multi-device rules depend on them)."""
    layers = n_cpu_moe_layers(d.n_cpu_moe, n, n_layer, layer_device, n_devices=n_devices)
    return f"{d.kind}: --n-cpu-moe {n} keeps the experts of layers {_ranges(layers)} on the CPU"


def _ranges(xs: list[int]) -> str:
    if not xs:
        return "(none)"
    runs: list[list[int]] = []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# ---- llama-quantize ----------------------------------------------------------------------------
# Both take the rules as std::regex patterns over tensor names, the first match winning; the
# recipe's default comes last as a catch-all, so the file type argument's own mixture never applies.


def mainline_quantize_args(rules: list[tuple[str, str]]) -> list[str]:
    """Mainline: one ``--tensor-type PATTERN=TYPE`` per rule (the tool lowercases the pattern and
    matches type names in any case)."""
    return [a for p, t in rules for a in ("--tensor-type", f"{p}={t.lower()}")]


def ik_quantize_args(rules: list[tuple[str, str]]) -> list[str]:
    """ik_llama.cpp: ``--custom-q P1=t1,P2=t2`` (split on commas; type names as ggml spells them,
    in lower case, compared exactly)."""
    return ["--custom-q", ",".join(f"{p}={t.lower()}" for p, t in rules)] if rules else []


def quantize_argv(
    kind: str,
    binary: str,
    source: str,
    output: str,
    *,
    ftype: str,
    rules: list[tuple[str, str]],
    imatrix: str | None = None,
    allow_requantize: bool = False,
    threads: int | None = None,
) -> list[str]:
    """The llama-quantize command of a recipe: its rules in the engine's dialect, then SOURCE OUT FTYPE."""
    if kind == EngineKind.MAINLINE:
        flags = mainline_quantize_args(rules)
    elif kind == EngineKind.IK:
        flags = ik_quantize_args(rules)
    else:
        raise ValueError(f"unknown engine kind {kind!r}")
    return [
        binary,
        *(["--imatrix", imatrix] if imatrix else []),
        *(["--allow-requantize"] if allow_requantize else []),
        *flags,
        source,
        output,
        ftype,
        *([str(threads)] if threads else []),
    ]
