"""Flag dialects: how each engine (and version) spells the same setting. One table per engine.

Placements are always rendered as explicit ``-ot`` overrides, which mean the same in every engine
and version; ``--n-cpu-moe N`` is not, so it is only shown as a note: mainline keeps the *first*
N layers' experts on the CPU, recent ik_llama.cpp the *last* N, older ik builds the first N.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from moetune.kinds import EngineKind


@dataclass(frozen=True, slots=True)
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
    cpu_moe: str = "--cpu-moe"
    n_cpu_moe_counts_from: str = "first"  # which layers --n-cpu-moe N keeps on the CPU
    amb: str | None = None
    mla: tuple[str, ...] = ()


MAINLINE_DIALECT = Dialect(EngineKind.MAINLINE)

IK_DIALECT = Dialect(
    EngineKind.IK,
    slots="--parallel",
    flash_attn_on=("-fa",),
    flash_attn_off=(),
    no_repack=(),  # run-time repacking is opt-in (-rtr) in ik_llama.cpp
    repack=("-rtr",),
    no_mmap=("--no-mmap",),
    fit_off=(),
    jinja=("--jinja",),
    kv_unified=(),
    n_cpu_moe_counts_from="last",
    amb="-amb",
    mla=("-mla", "3"),
)

# ik_llama.cpp builds before its --n-cpu-moe changed meaning still counted from the first layer.
IK_OLD_DIALECT = replace(IK_DIALECT, n_cpu_moe_counts_from="first")


def dialect(kind: str, old_ik: bool = False) -> Dialect:
    if kind == EngineKind.MAINLINE:
        return MAINLINE_DIALECT
    if kind == EngineKind.IK:
        return IK_OLD_DIALECT if old_ik else IK_DIALECT
    raise ValueError(f"unknown engine kind {kind!r}")


def n_cpu_moe_note(d: Dialect, n: int, n_layer: int) -> str:
    """What `--n-cpu-moe n` would mean for this dialect, in layer numbers."""
    if d.n_cpu_moe_counts_from == "first":
        return f"{d.kind}: --n-cpu-moe {n} keeps the experts of layers 0-{n - 1} on the CPU"
    return f"{d.kind}: --n-cpu-moe {n} keeps the experts of layers {n_layer - n}-{n_layer - 1} on the CPU"
