"""The engine's own options in a tune's search space: ik_llama.cpp's -amb, -mla, fused MoE and
-muge, as far as the build renders them (its dialect, from its probed facts) and the model makes
them matter. Mainline searches have none of them."""

from __future__ import annotations

from typing import Any

from moetune.engine import registry
from moetune.engine.dialect import dialect
from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.plan import tune as core
from moetune.plan.settings import Settings


def engine_options(engine: str, kind: EngineKind, mla_model: bool) -> core.EngineOptions:
    """The engine's own options the search may change: what the build's dialect renders (its facts
    probed, else those of moetune's build) and the model makes matter."""
    if kind != EngineKind.IK:
        return core.EngineOptions()
    d = dialect(kind, registry.facts_for({engine}).get(engine))
    return core.EngineOptions(
        amb=d.amb is not None,
        mla_model=mla_model,
        mla=d.mla is not None and mla_model,
        fused_moe=d.fused_moe_on != d.fused_moe_off,
        merge_up_gate=bool(d.merge_up_gate),
    )


_ENGINE_AXES = {
    "amb_mib": ("--try-amb", "amb"),
    "mla": ("--try-mla", "mla"),
    "fused_moe": ("--try-fmoe", "fused_moe"),
    "merge_up_gate": ("--try-muge", "merge_up_gate"),
}


def check_engine_axes(
    axes: dict[str, tuple[Any, ...]], base: Settings, options: core.EngineOptions, kind: EngineKind
) -> None:
    """An engine option asked to vary must be one the build can be told (and, for -mla, one the model has)."""
    for name, (flag, option) in _ENGINE_AXES.items():
        values = axes.get(name)
        if values is None or set(values) <= {getattr(base, name)} or getattr(options, option):
            continue
        if kind != EngineKind.IK:
            raise InputError(
                f"{flag}: an ik_llama.cpp option; this search runs {kind}",
                hint="--engine ik_llama.cpp, or drop the option",
            )
        why = (
            "the model has no MLA attention"
            if name == "mla" and not options.mla_model
            else "this ik_llama.cpp build does not take it"
        )
        raise InputError(f"{flag}: {why}", hint="drop the option")
