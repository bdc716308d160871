"""What each engine's llama-quantize does with a recipe, tensor by tensor: which tensors it quantizes,
which type each gets (the first matching rule, else the default), the engine's fallbacks where a
type's block does not divide a row, and the bytes it writes. Pure: the size prediction of
`moetune quantize` and `plan --recipe`.

Read from the engines' sources: mainline ``src/llama-quant.cpp`` (``tensor_allows_quantization``,
``tensor_type_fallback``, ``tensor_requires_imatrix``) and ik_llama.cpp ``src/llama-quantize.cpp``
(``change_type_if_necessary``, ``interleaved_properties``, its quantize predicate). Both match the
rules with ``std::regex_search`` in order, first match wins; the recipe always ends with a
catch-all rule for its default, so the engines' own mixtures (Q4_K_M and the like) never apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.profile import ModelProfile, Tensor
from moetune.model.quants import QuantType, by_name, interleaved
from moetune.model.recipe import Recipe, rule_patterns

CATCH_ALL = "."
_PLAIN = frozenset({"F32", "F16", "BF16"})
# not storage targets of llama-quantize (scratch types of the matmul kernels, integer types)
_NOT_TARGETS = frozenset({"Q8_K", "Q8_1", "Q8_K64", "I8", "I16", "I32", "I64", "F64"})

# names (substrings) each engine never quantizes, besides 1-D tensors, non-weights and norms
_MAINLINE_KEEP = (
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "indexer.k_proj.weight",
    "indexer.q_proj.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    ".position_embd",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
)
_IK_KEEP = ("ffn_gate_inp.weight", "ssm_conv1d.weight", "ssm_x.weight", "ssm_dt.weight", "attn_rel_b.weight")
_EXACT_KEEP = ("position_embd.weight", "token_types.weight")

# mainline tensor_type_fallback: a 256-block type whose block does not divide the row
_MAINLINE_FALLBACK = {
    **dict.fromkeys(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"), "IQ4_NL"),
    **dict.fromkeys(("Q2_0", "Q2_K", "Q3_K", "TQ1_0", "TQ2_0"), "Q4_0"),
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
}
# ik change_type_if_necessary: types it checks against QK_K, and what each falls back to
_IK_FALLBACK = {
    **dict.fromkeys(
        (
            "IQ2_XXS",
            "IQ2_XXS_R4",
            "IQ2_XS",
            "IQ2_XS_R4",
            "IQ2_KS",
            "IQ2_S",
            "IQ2_S_R4",
            "IQ3_XXS",
            "IQ3_XXS_R4",
            "IQ3_S",
            "IQ3_S_R4",
            "IQ1_S",
            "IQ1_M",
            "Q2_K",
            "Q2_K_R4",
            "Q3_K",
            "Q3_K_R4",
            "IQ2_K",
            "IQ2_K_R4",
            "IQ2_KL",
            "IQ3_KS",
            "IQ3_K",
            "IQ3_K_R4",
            "IQ4_KSS",
            "IQ4_KS",
            "IQ4_KS_R4",
            "IQ4_XS_R8",
            "IQ1_KT",
            "IQ2_KT",
            "IQ3_KT",
            "IQ4_KT",
            "IQ4_XS",
        ),
        "IQ4_NL",
    ),
    **dict.fromkeys(("IQ4_K", "IQ4_K_R4", "Q4_K_R4", "IQ5_KS", "IQ5_KS_R4", "Q4_K"), "Q5_0"),
    **dict.fromkeys(("IQ5_K", "IQ5_K_R4", "Q5_K_R4", "Q5_K"), "Q6_0"),
    **dict.fromkeys(("IQ6_K", "Q6_K_R4", "Q8_K_R8", "Q6_K"), "Q8_0"),
}
_IK_CHECKED_BUT_NO_FALLBACK = frozenset({"IQ1_BN", "IQ2_BN", "IQ2_BN_R4"})  # ik throws "Unsupported tensor size"

# types quantized only with an importance matrix (the engine refuses otherwise)
_NEEDS_IMATRIX = {
    EngineKind.MAINLINE: frozenset({"IQ3_XXS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_M", "IQ1_S"}),
    EngineKind.IK: frozenset(
        {
            "IQ2_XXS",
            "IQ2_XXS_R4",
            "IQ2_XS",
            "IQ2_XS_R4",
            "IQ2_S",
            "IQ2_S_R4",
            "IQ1_S",
            "IQ1_S_R4",
            "IQ1_M",
            "IQ1_M_R4",
            "IQ1_KT",
            "IQ2_KT",
        }
    ),
}
# file types (llama-quantize's last argument) whose default tensor type is the type of the same
# name, and that need no imatrix of their own; any other default is written as Q8_0 files
_FTYPES = {
    EngineKind.MAINLINE: frozenset(
        {
            "Q4_0",
            "Q4_1",
            "Q5_0",
            "Q5_1",
            "Q8_0",
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "IQ4_NL",
            "IQ4_XS",
            "IQ3_S",
            "IQ3_XXS",
            "TQ1_0",
            "TQ2_0",
        }
    ),
    EngineKind.IK: frozenset(
        {
            "Q4_0",
            "Q4_1",
            "Q5_0",
            "Q5_1",
            "Q6_0",
            "Q8_0",
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "IQ4_NL",
            "IQ4_XS",
            "IQ3_S",
            "IQ3_XXS",
            "IQ2_K",
            "IQ2_KS",
            "IQ2_KL",
            "IQ3_K",
            "IQ3_KS",
            "IQ4_K",
            "IQ4_KS",
            "IQ4_KSS",
            "IQ5_K",
            "IQ5_KS",
            "IQ6_K",
            "IQ3_KT",
            "IQ4_KT",
        }
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorOut:
    """One tensor of the output: its type and bytes as the engine will write them."""

    name: str
    layer: int | None
    kind: str
    role: str
    shape: tuple[int, ...]
    source_type: str
    type: str
    nbytes: int
    rule: int | None  # the recipe rule (1-based) that chose it; None: the default; 0: the engine keeps it
    fallback: str = ""  # why the engine wrote another type than the rule's


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantPlan:
    kind: EngineKind
    ftype: str  # llama-quantize's file type argument
    rules: tuple[tuple[str, QuantType], ...]  # (regex, type) as passed to the engine, catch-all last
    tensors: tuple[TensorOut, ...]
    warnings: tuple[tuple[str, str], ...]  # (message, remedy)
    requantize: bool  # some quantized source tensor changes type (--allow-requantize)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def bytes_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.type] = out.get(t.type, 0) + t.nbytes
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def n_dims(shape: tuple[int, ...]) -> int:
    """ggml_n_dims: the dimensions up to the last one above 1."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return max(n, 1)


def quantizable(kind: EngineKind, name: str, shape: tuple[int, ...]) -> bool:
    """Whether the engine's llama-quantize quantizes this tensor at all (else it copies it)."""
    if not name.endswith("weight") or n_dims(shape) < 2 or "_norm.weight" in name or name in _EXACT_KEEP:
        return False
    keep = _MAINLINE_KEEP if kind == EngineKind.MAINLINE else _IK_KEEP
    return not any(k in name for k in keep)


def check_type(kind: EngineKind, qt: QuantType, where: str) -> None:
    if kind not in qt.engines:
        other = next(iter(qt.engines))
        raise InputError(
            f"{where}: type {qt.name.lower()} is not one {kind} has ({other} only)",
            hint=f"quantize with --engine {other}, or choose a {kind} type",
        )
    if qt.name in _NOT_TARGETS:
        raise InputError(
            f"{where}: {qt.name.lower()} is not a type llama-quantize writes",
            hint="choose a storage type such as q8_0, q4_k or iq4_xs",
        )


def _fallback(kind: EngineKind, t: Tensor, qt: QuantType) -> tuple[QuantType, str]:
    ncols = t.shape[0] if t.shape else 1
    if kind == EngineKind.MAINLINE:
        if ncols % qt.block_size == 0:
            return qt, ""
        target = _MAINLINE_FALLBACK.get(qt.name)
        if target is None and qt.block_size > 32:
            raise InputError(
                f"{t.name}: rows of {ncols} are not a multiple of {qt.name.lower()}'s block of "
                f"{qt.block_size}, and llama.cpp has no fallback for it",
                hint="give this tensor another type with a rule",
            )
        ret = by_name(target) if target else qt
        if ncols % ret.block_size:
            ret = by_name("f16")
        return ret, f"rows of {ncols} not a multiple of {qt.block_size}: {qt.name.lower()} -> {ret.name.lower()}"
    out, note = qt, ""
    if (qt.name in _IK_FALLBACK and ncols % 256) or (qt.name in _IK_CHECKED_BUT_NO_FALLBACK and ncols % 64):
        if qt.name not in _IK_FALLBACK:
            raise InputError(
                f"{t.name}: rows of {ncols} are not a multiple of {qt.name.lower()}'s block, and "
                "ik_llama.cpp has no fallback for it",
                hint="give this tensor another type with a rule",
            )
        out = by_name(_IK_FALLBACK[qt.name])
        note = f"rows of {ncols} not a multiple of 256: {qt.name.lower()} -> {out.name.lower()}"
    if ncols % out.block_size:
        raise InputError(
            f"{t.name}: rows of {ncols} are not a multiple of {out.name.lower()}'s block of {out.block_size}",
            hint="give this tensor a type with a smaller block (q8_0, f16)",
        )
    il = interleaved(out)
    if il is not None:
        base, rows = il
        n_rows = t.shape[1] if len(t.shape) > 1 else 1
        if t.name == "token_embd.weight" or n_rows % rows:
            why = (
                "token embeddings are never interleaved"
                if t.name == "token_embd.weight"
                else f"{n_rows} rows not a multiple of {rows}"
            )
            note = (note + "; " if note else "") + f"{why}: {out.name.lower()} -> {base.name.lower()}"
            out = base
    return out, note


def _ftype(kind: EngineKind, default: QuantType) -> str:
    return default.name if default.name in _FTYPES[kind] else "Q8_0"


def plan_quantize(
    profile: ModelProfile, recipe: Recipe, kind: EngineKind, *, imatrix: bool = False, allow_requantize: bool = False
) -> QuantPlan:
    """The output of quantizing ``profile`` with ``recipe`` on this engine kind, tensor by tensor.
    InputError where the engine would refuse (a type it lacks, a missing imatrix, requantizing)."""
    check_type(kind, recipe.default, f"{recipe.source}: default")
    warnings: list[tuple[str, str]] = []
    rules: list[tuple[str, QuantType]] = []
    kept_by: dict[int, int] = {}
    for i, ((pattern, qt), rule) in enumerate(zip(rule_patterns(recipe, profile), recipe.rules, strict=True), 1):
        check_type(kind, qt, f"{recipe.source}: rule {i}")
        if pattern is None:
            warnings.append(
                (
                    f"{recipe.source}: rule {i} ({rule.describe()}) matches no tensor of the model",
                    "check its role, kind and layers against `moetune inspect SOURCE`",
                )
            )
            continue
        if kind == EngineKind.MAINLINE and pattern != pattern.lower():
            raise InputError(
                f"{recipe.source}: rule {i}: mainline llama-quantize lowercases patterns, and "
                f"{pattern!r} has upper case",
                hint="write the pattern in lower case",
            )
        rules.append((pattern, qt))
        kept_by[len(rules) - 1] = i
    rules.append((CATCH_ALL, recipe.default))
    compiled = [re.compile(p) for p, _ in rules]
    took: set[int] = set()  # rules that chose a quantized tensor's type
    kept: set[int] = set()  # rules whose first match is a tensor the engine copies as it is
    out: list[TensorOut] = []
    needs: list[str] = []
    requant: list[str] = []
    for t in profile.tensors:
        src = by_name(t.type_name)
        j = next(j for j, rx in enumerate(compiled) if rx.search(t.name))
        if not quantizable(kind, t.name, t.shape):
            out.append(
                TensorOut(
                    name=t.name,
                    layer=t.layer,
                    kind=t.kind,
                    role=t.role,
                    shape=t.shape,
                    source_type=src.name,
                    type=src.name,
                    nbytes=t.nbytes,
                    rule=0,
                )
            )
            kept.add(j)
            continue
        took.add(j)
        qt, note = _fallback(kind, t, rules[j][1])
        if qt.name != src.name:
            if src.name not in _PLAIN:
                requant.append(t.name)
            if qt.name in _NEEDS_IMATRIX[kind] and t.name not in ("token_embd.weight", "output.weight") and not imatrix:
                needs.append(f"{t.name} ({qt.name.lower()})")
        out.append(
            TensorOut(
                name=t.name,
                layer=t.layer,
                kind=t.kind,
                role=t.role,
                shape=t.shape,
                source_type=src.name,
                type=qt.name,
                nbytes=qt.tensor_bytes(t.shape),
                rule=kept_by.get(j),
                fallback=note,
            )
        )
    for j in range(len(rules) - 1):
        if j in took:
            continue
        if j in kept:
            warnings.append(
                (
                    f"{recipe.source}: rule {kept_by[j]} ({recipe.rules[kept_by[j] - 1].describe()}) "
                    f"matches only tensors {kind}'s llama-quantize never quantizes (norms, the router, "
                    "1-D tensors); they keep their type",
                    "drop the rule",
                )
            )
        else:
            warnings.append(
                (
                    f"{recipe.source}: rule {kept_by[j]} ({recipe.rules[kept_by[j] - 1].describe()}) "
                    "matches only tensors an earlier rule took (the first match wins)",
                    "move it above the rule that takes them, or drop it",
                )
            )
    if needs:
        raise InputError(
            f"{', '.join(needs[:3])}{f' and {len(needs) - 3} more' if len(needs) > 3 else ''}: "
            f"{kind}'s llama-quantize writes these types only with an importance matrix",
            hint="give --imatrix FILE (made by llama-imatrix from a calibration text), or a type of 3 bits or more",
        )
    if requant and not allow_requantize:
        raise InputError(
            f"{requant[0]}{f' and {len(requant) - 1} more' if len(requant) > 1 else ''}: the source is "
            "quantized already; llama-quantize refuses to requantize it",
            hint="quantize from an f16/bf16 source, or give --allow-requantize (quality suffers)",
        )
    return QuantPlan(
        kind=kind,
        ftype=_ftype(kind, recipe.default),
        rules=tuple(rules),
        tensors=tuple(out),
        warnings=tuple(warnings),
        requantize=bool(requant),
    )


def output_profile(profile: ModelProfile, qp: QuantPlan, out: Path) -> ModelProfile:
    """The model the quantized file will be: the source's metadata and shapes with the plan's types
    and sizes, in one file ``out`` (planned before it exists)."""
    from dataclasses import replace

    by_name_ = {t.name: t for t in qp.tensors}
    tensors = []
    offset = 0
    for t in profile.tensors:
        o = by_name_[t.name]
        tensors.append(replace(t, type_name=o.type, nbytes=o.nbytes, file_index=0, offset=offset))
        offset += -(-o.nbytes // 32) * 32
    return replace(profile, files=(out,), tensors=tuple(tensors), remote=None)


# the quantizer's per-tensor line (both engines): "[   5/  51]  blk.0.ffn_up_exps.weight - [  512, ..."
PROGRESS_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)\s+-\s+\[")


def progress_of(line: str) -> tuple[int, int, str] | None:
    """(tensor number, tensor count, name) of a llama-quantize line that starts a tensor."""
    m = PROGRESS_LINE.match(line)
    return (int(m[1]), int(m[2]), m[3]) if m else None
