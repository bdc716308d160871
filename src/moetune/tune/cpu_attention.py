"""The CPU's attention kernels, measured on this machine (`moetune hw attention`): how fast the engine attends over its cache here, with flash attention and an f16
cache, without flash attention, and over a q8_0 cache, while decoding and while prefilling.

These rates are properties of the CPU and the engine's kernels, not of a placement: on the AMX Xeon
the speed model's built-in factors were measured on, a q8_0 cache decoded 44% faster than f16 with
flash attention; on this project's AMD EPYC (AVX-512, no AMX) it decodes slower, and prefills at
about a fifth of f16's attention rate (issue #25). A calibration from two runs of f16 placements cannot see either. So
llama-bench measures the three variants at depth 0, half a depth and a depth on a generated model
(three launches of each, interleaved: on a shared machine a whole launch runs slow or fast), and the
speed model's own equations are fitted to those rows (:func:`moetune.plan.calibrate.fit`, moving
the eight attention constants and, as nuisances, the costs the rows share); the eight are kept in the
hardware file (``cpu.speed``) and every plan on that hardware starts from them
(:func:`moetune.plan.speed.base_constants`).

Pure: the rows in, the constants out (:func:`fit_attention`); llama-bench runs at the edge
(:func:`measure`), its best sample of each test kept (interference only slows a run down)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from moetune.errors import InputError
from moetune.hardware import CPU_SPEED_KEYS
from moetune.hardware.inventory import Inventory, Node
from moetune.kinds import EngineKind
from moetune.model.profile import ModelProfile
from moetune.plan.calibrate import Observation, fit, predict_pp, predict_tg
from moetune.plan.placement import cpu_moe
from moetune.plan.settings import Settings
from moetune.plan.speed import SpeedConstants, Work, decode_context, work

# (flash attention, cache type of K and V): the engine's default, the one without flash attention,
# the quantized one (a quantized V needs flash attention)
VARIANTS: tuple[tuple[bool, str], ...] = ((True, "f16"), (False, "f16"), (True, "q8_0"))
# what the rows also depend on, fitted beside the attention terms and then dropped
NUISANCE = ("token_overhead_us", "cpu_core_gbs", "cpu_bw_eff", "cpu_gflops_per_core", "ubatch_overhead_us")
DEFAULT_DEPTH = 2048
PP_TOKENS = 256
TG_TOKENS = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One llama-bench test: a variant at a depth, its best TG (``tg64``) and PP (``pp256``)."""

    flash_attn: bool
    cache: str
    depth: int
    tg_tok_s: float
    pp_tok_s: float

    @property
    def label(self) -> str:
        return f"{'fa' if self.flash_attn else 'no-fa'} {self.cache}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Fitted:
    constants: dict[str, float]  # the eight attention constants, rounded
    rows: tuple[Row, ...]
    predicted: tuple[tuple[float, float], ...]  # (TG, PP) per row, with the fitted constants
    threads: int

    def to_json(self) -> dict[str, object]:
        return {
            "constants": self.constants,
            "threads": self.threads,
            "rows": [
                {
                    "variant": r.label,
                    "depth": r.depth,
                    "tg_tok_s": round(r.tg_tok_s, 1),
                    "pp_tok_s": round(r.pp_tok_s, 1),
                    "predicted_tg_tok_s": round(p[0], 1),
                    "predicted_pp_tok_s": round(p[1], 1),
                }
                for r, p in zip(self.rows, self.predicted, strict=True)
            ],
        }


def probe_settings(threads: int, flash_attn: bool, cache: str, depth: int) -> Settings:
    """What llama-bench runs: all on the CPU, weights not repacked, one slot holding the test."""
    return Settings(
        ctx=depth + PP_TOKENS + TG_TOKENS + 64,
        threads=threads,
        flash_attn=flash_attn,
        ctk=cache,
        ctv=cache,
        repack=False,
        engine=EngineKind.MAINLINE,
    )


# The probe's model and cache sit in the CPU's caches (60 MB of weights, a few MB of cache a token):
# read at this rate, its memory traffic costs next to nothing, and the rows' time over the context is
# the kernels' own. A plan's cache read from RAM costs its bytes at the RAM's bandwidth on top.
PROBE_BW_GBS = 1000.0


def cpu_only(node: Node) -> Inventory:
    return Inventory((replace(node, devices=(), ram_bw_gbs=PROBE_BW_GBS),), name=node.name)


def observations(profile: ModelProfile, node: Node, threads: int, rows: list[Row]) -> list[Observation]:
    """The rows as equations of the speed model: the work of the probe model on this CPU alone."""
    hw = cpu_only(node)
    works: dict[tuple[bool, str], Work] = {}
    out = []
    for i, r in enumerate(rows):
        key = (r.flash_attn, r.cache)
        if key not in works:
            s = probe_settings(threads, r.flash_attn, r.cache, r.depth)
            works[key] = work(profile, hw, cpu_moe(profile, hw), s)
        out.append(
            Observation(
                run=i,
                work=works[key],
                depth=r.depth,
                measured_tg=r.tg_tok_s,
                measured_pp=r.pp_tok_s,
                prompt_tokens=PP_TOKENS,
                tg_depth=decode_context(r.depth, 0, TG_TOKENS),  # llama-bench's tg N @ dD
            )
        )
    return out


def fit_attention(
    profile: ModelProfile, node: Node, threads: int, rows: list[Row], prior: SpeedConstants | None = None
) -> Fitted:
    """The eight attention constants that explain the rows (with the shared costs as nuisances)."""
    if {(r.flash_attn, r.cache) for r in rows} != set(VARIANTS) or len({r.depth for r in rows}) < 2:
        raise InputError(
            "the attention probe needs every variant (flash attention on and off with an f16 cache, on with "
            "a q8_0 cache) at two depths or more",
            hint="run `moetune hw attention` again; a test llama-bench failed is named in its output",
        )
    obs = observations(profile, node, threads, rows)
    k = fit(obs, prior or SpeedConstants(), iterations=120, names=(*CPU_SPEED_KEYS, *NUISANCE))
    constants = {n: float(f"{getattr(k, n):.3g}") for n in CPU_SPEED_KEYS}
    return Fitted(
        constants=constants,
        rows=tuple(rows),
        predicted=tuple((predict_tg(o, k), predict_pp(o, k)) for o in obs),
        threads=threads,
    )


# ---- the edge: llama-bench ------------------------------------------------------------------------


def probe_model(d: Path) -> Path:
    """The default model to measure on: a generated qwen3moe (8 layers, GQA 2, head 64, q8_0)."""
    from moetune.model.archs import small_dims
    from moetune.model.testmodel import generate

    out = d / "attention-probe.gguf"
    generate(out, "qwen3moe", replace(small_dims("qwen3moe", True), n_layer=8), "q8_0")
    return out


# ---- ------------------------------------------------------------------------


def bench_argv(
    binary: Path, model: Path, *, threads: int, depth: int, flash_attn: bool, cache: str, repeats: int
) -> list[str]:
    return [
        str(binary),
        "-m",
        str(model),
        "-o",
        "json",
        "-p",
        str(PP_TOKENS),
        "-n",
        str(TG_TOKENS),
        "-d",
        f"0,{depth // 2},{depth}",
        "-t",
        str(threads),
        "-fa",
        "on" if flash_attn else "off",
        "-ctk",
        cache,
        "-ctv",
        cache,
        "--repack",
        "0",
        "-r",
        str(repeats),
    ]


def parse_bench(text: str, flash_attn: bool, cache: str) -> list[Row]:
    """llama-bench's ``-o json`` for one variant: a row per depth, the best sample of each test."""
    try:
        tests = json.loads(text)
    except ValueError:
        raise InputError("llama-bench printed no JSON", hint="run it by hand to see why") from None
    by_depth: dict[int, dict[str, float]] = {}
    for t in tests:
        best = max(t.get("samples_ts") or [t["avg_ts"]])
        by_depth.setdefault(int(t.get("n_depth") or 0), {})["pp" if t["n_prompt"] else "tg"] = float(best)
    return [
        Row(flash_attn=flash_attn, cache=cache, depth=d, tg_tok_s=v["tg"], pp_tok_s=v["pp"])
        for d, v in sorted(by_depth.items())
        if "tg" in v and "pp" in v
    ]


def best_rows(rows: list[Row]) -> list[Row]:
    """One row per variant and depth: the best TG and the best PP any launch measured (a launch
    runs slow or fast for its whole life on a shared machine; interference only slows one down)."""
    best: dict[tuple[bool, str, int], Row] = {}
    for r in rows:
        key = (r.flash_attn, r.cache, r.depth)
        b = best.get(key)
        best[key] = (
            r if b is None else replace(b, tg_tok_s=max(b.tg_tok_s, r.tg_tok_s), pp_tok_s=max(b.pp_tok_s, r.pp_tok_s))
        )
    return [best[k] for k in sorted(best, key=lambda k: (VARIANTS.index(k[:2]), k[2]))]


def measure(
    binary: Path,
    model: Path,
    *,
    threads: int,
    depth: int = DEFAULT_DEPTH,
    repeats: int = 2,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Run llama-bench ``rounds`` times per variant, the variants interleaved (0, half ``depth``
    and ``depth`` tokens deep, PP and TG, ``repeats`` samples a launch); the best of each test."""
    rows: list[Row] = []
    for i in range(rounds):
        for j, (fa, cache) in enumerate(VARIANTS):
            if progress is not None:
                n = i * len(VARIANTS) + j + 1
                progress(f"llama-bench: {'fa' if fa else 'no-fa'} {cache} ({n}/{rounds * len(VARIANTS)})")
            argv = bench_argv(binary, model, threads=threads, depth=depth, flash_attn=fa, cache=cache, repeats=repeats)
            r = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
            if r.returncode != 0:
                tail = (r.stderr or "").strip().splitlines()[-3:]
                raise InputError(
                    f"llama-bench failed (rc {r.returncode}) on {'fa' if fa else 'no-fa'} {cache}: " + " / ".join(tail),
                    hint="check the engine with `moetune doctor`",
                )
            rows += parse_bench(r.stdout, fa, cache)
    return best_rows(rows)
