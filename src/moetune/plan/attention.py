"""Flash attention and the KV cache type of a plan, where the user left them to moetune: the
variant the speed model (with the plan's constants: a calibration where there is one) predicts
decodes fastest at the plan's context, among those that fit. Pure: settings in, settings out.

Where the engine's cost differs by these (issue #25, the CPU testbed at depth 512: flash attention
on with an f16 cache 354 tok/s, off 455, on with a q8_0 cache 510) the model's terms
(:class:`moetune.plan.speed.SpeedConstants` ``cpu_noflash_ctx_factor``, ``cpu_ctx_quant_factor``)
choose; where it predicts no difference worth having (under :data:`MIN_GAIN`) the plan keeps
the engine's own defaults, flash attention on and an f16 cache. q4_0 is never chosen on its own:
its error is not a speed question (``--ctk q4_0 --ctv q4_0`` asks for it)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from moetune.kinds import EngineKind
from moetune.plan.settings import Settings

MIN_GAIN = 0.02  # a variant replaces the default only if predicted at least this much faster
CACHES = (("f16", "f16"), ("q8_0", "q8_0"))


@dataclass(frozen=True, slots=True)
class Choose:
    """Which of the two the user left open."""

    flash_attn: bool = False
    cache: bool = False

    def __bool__(self) -> bool:
        return self.flash_attn or self.cache


def decision_depth(s: Settings) -> int:
    """The context depth the choice is made at: half a slot's context, the mean depth of a
    conversation that fills it from empty."""
    return max(0, s.ctx // max(1, s.slots) // 2)


def variants(s: Settings, choose: Choose) -> list[Settings]:
    """The settings to compare, the default first (flash attention on, the given or an f16 cache);
    only combinations the engine accepts (a quantized V cache needs flash attention). The terms
    were measured on mainline: ik_llama.cpp keeps its defaults (seen: ik's RPC worker crashed on a
    q8_0 cache the choice had picked, in llama-sweep-bench)."""
    if s.engine != EngineKind.MAINLINE:
        return [s]
    fas = (True, False) if choose.flash_attn else (s.flash_attn,)
    caches = CACHES if choose.cache else ((s.ctk, s.ctv),)
    out = [replace(s, flash_attn=fa, ctk=k, ctv=v) for fa in fas for k, v in caches if fa or v == "f16"]
    return list(dict.fromkeys(out))


def label(s: Settings) -> str:
    return f"flash attention {'on' if s.flash_attn else 'off'}, {s.ctk}/{s.ctv} cache"


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    settings: Settings
    depth: int
    tg_tok_s: float
    default: Settings
    default_tg_tok_s: float
    rejected_for_memory: int = 0

    def note(self) -> str:
        """The one line the plan prints."""
        why = (
            f"{label(self.settings)}: predicted TG {self.tg_tok_s:.1f} tok/s at depth {self.depth}, "
            f"{label(self.default)} {self.default_tg_tok_s:.1f}"
        )
        if self.settings == self.default:
            why = (
                f"{label(self.settings)}: no variant predicted {MIN_GAIN:.0%} faster at depth {self.depth} "
                f"({self.tg_tok_s:.1f} tok/s)"
            )
        if self.rejected_for_memory:
            why += f"; {self.rejected_for_memory} faster variant(s) do not fit"
        return why + " (the speed model; --flash-attn on|off, --ctk/--ctv to choose)"


def pick(scored: list[tuple[Settings, float, bool]], depth: int) -> Choice:
    """From (settings, predicted TG at ``depth``, fits) with the default first: the fastest that
    fits, where it gains at least :data:`MIN_GAIN` over the default."""
    default, default_tg, _ = scored[0]
    fitting = [x for x in scored if x[2]]
    best = max(fitting, key=lambda x: x[1]) if fitting else scored[0]
    if scored[0][2] and best[1] < default_tg * (1 + MIN_GAIN):
        best = scored[0]
    rejected = sum(1 for s, tg, fits in scored if not fits and tg > best[1])
    return Choice(
        settings=best[0],
        depth=depth,
        tg_tok_s=best[1],
        default=default,
        default_tg_tok_s=default_tg,
        rejected_for_memory=rejected,
    )
