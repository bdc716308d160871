"""Quant recipes: which storage type each tensor of a model gets (`moetune quantize --recipe`,
`moetune plan --recipe`).

A recipe is a small YAML file: a default type and rules, each selecting tensors by role (the roles of
:mod:`moetune.model.profile`), kind and layer range, or by a raw regular expression. As in
llama-quantize, the first rule that matches a tensor wins; tensors no rule names get the default::

    default: q8_0
    rules:
      - {role: expert, layers: 0-39, type: iq5_ks}       # the GPU layers' experts
      - {kind: ffn_down_exps, layers: 40-, type: iq4_ks}  # the CPU layers' down experts
      - {role: expert, layers: 40-, type: iq3_ks}

Rules become regular expressions over the source's tensor names (:func:`rule_patterns`): the engine
matches exactly those, and the size prediction (``engine.quantize``) evaluates the same expressions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.errors import InputError
from moetune.model.profile import ROLES, ModelProfile
from moetune.model.quants import QuantType, UnknownQuantType, by_name


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    type: QuantType
    roles: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    layers: tuple[int, int | None] | None = None  # first, last (None: to the last layer)
    pattern: str | None = None  # a raw regular expression instead of roles, kinds and layers

    def describe(self) -> str:
        if self.pattern is not None:
            return f"pattern {self.pattern}"
        parts = [*(f"role {r}" for r in self.roles), *(f"kind {k}" for k in self.kinds)]
        if self.layers is not None:
            a, b = self.layers
            parts.append(f"layers {a}-{'' if b is None else b}")
        return ", ".join(parts) or "every tensor"


@dataclass(frozen=True, slots=True)
class Recipe:
    default: QuantType
    rules: tuple[Rule, ...]
    source: str = "recipe"  # where it came from, for messages


def _type(v: Any, where: str) -> QuantType:
    if not isinstance(v, str):
        raise InputError(f"{where}: type must be a type name such as q8_0 or iq4_ks, not {v!r}")
    try:
        return by_name(v)
    except UnknownQuantType as e:
        raise InputError(f"{where}: {e}") from None


def _names(v: Any, where: str) -> tuple[str, ...]:
    vals = [v] if isinstance(v, str) else v
    if not isinstance(vals, list) or not all(isinstance(x, str) and x for x in vals):
        raise InputError(f"{where}: expected a name or a list of names, not {v!r}")
    return tuple(vals)


def parse_layers(v: Any, where: str) -> tuple[int, int | None]:
    """``7``, ``"0-39"`` or ``"40-"`` (from 40 to the last layer)."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v, v
    m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]*)\s*)?", str(v)) if isinstance(v, str | int) else None
    if not m:
        raise InputError(f"{where}: layers {v!r} is not N, A-B or A- (from A to the last layer)")
    a = int(m[1])
    b = a if m.lastindex == 1 else (int(m[2]) if m[2] else None)
    if b is not None and b < a:
        raise InputError(f"{where}: layers {v!r} end before they start")
    return a, b


_RULE_KEYS = {"type", "role", "kind", "layers", "pattern"}


def recipe_from_doc(doc: Any, source: str) -> Recipe:
    """A recipe from its parsed YAML document; InputError naming the place of anything unusable."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: a recipe is a mapping with `default` and `rules`")
    unknown = set(doc) - {"default", "rules"}
    if unknown:
        raise InputError(f"{source}: unknown key {sorted(unknown)[0]!r} (a recipe has `default` and `rules`)")
    if "default" not in doc:
        raise InputError(f"{source}: no `default` type", hint="add `default: q8_0` (the type of tensors no rule names)")
    default = _type(doc["default"], f"{source}: default")
    raw = doc.get("rules") or []
    if not isinstance(raw, list):
        raise InputError(f"{source}: rules must be a list")
    rules = []
    for i, r in enumerate(raw, 1):
        where = f"{source}: rule {i}"
        if not isinstance(r, dict):
            raise InputError(f"{where}: a rule is a mapping such as {{role: expert, layers: 0-9, type: iq4_ks}}")
        bad = set(r) - _RULE_KEYS
        if bad:
            raise InputError(f"{where}: unknown key {sorted(bad)[0]!r} (keys: {', '.join(sorted(_RULE_KEYS))})")
        if "type" not in r:
            raise InputError(f"{where}: no type")
        roles = _names(r["role"], where) if "role" in r else ()
        for role in roles:
            if role not in ROLES:
                raise InputError(f"{where}: unknown role {role!r} (roles: {', '.join(ROLES)})")
        pattern = r.get("pattern")
        if pattern is not None:
            if set(r) & {"role", "kind", "layers"}:
                raise InputError(f"{where}: a pattern rule takes no role, kind or layers (the pattern says it all)")
            if not isinstance(pattern, str) or not pattern:
                raise InputError(f"{where}: pattern must be a regular expression")
            try:
                re.compile(pattern)
            except re.error as e:
                raise InputError(f"{where}: pattern {pattern!r} is not a regular expression ({e})") from None
            if "," in pattern or "=" in pattern:
                raise InputError(
                    f"{where}: pattern {pattern!r} has ',' or '=', which llama-quantize's rule syntax splits on",
                    hint="use alternation (a|b) instead of {m,n} or a list",
                )
        rules.append(
            Rule(
                type=_type(r["type"], where),
                roles=roles,
                kinds=_names(r["kind"], where) if "kind" in r else (),
                layers=parse_layers(r["layers"], where) if "layers" in r else None,
                pattern=pattern,
            )
        )
    return Recipe(default, tuple(rules), source)


def load_recipe(path: str | Path) -> Recipe:
    from moetune import yamlfile
    from moetune.paths import readable_file

    p = Path(path)
    return recipe_from_doc(yamlfile.parse(readable_file(p, "recipe").read_bytes(), str(p)), str(p))


def _alt(xs: list[str]) -> str:
    return xs[0] if len(xs) == 1 else "(" + "|".join(xs) + ")"


def rule_pattern(rule: Rule, profile: ModelProfile) -> str | None:
    """The regular expression of a rule over this model's tensor names (None: it selects no tensor
    of the model). Only ``.weight`` tensors: the engines quantize nothing else."""
    from moetune.model.layer_regex import layers_regex

    if rule.pattern is not None:
        return rule.pattern
    layered: set[str] = set()
    single: set[str] = set()
    last = profile.n_layer_all - 1
    lo, hi = rule.layers if rule.layers is not None else (0, None)
    hi = last if hi is None else min(hi, last)
    layers: set[int] = set()
    for t in profile.tensors:
        if (
            not t.name.endswith(".weight")
            or (rule.roles and t.role not in rule.roles)
            or (rule.kinds and t.kind not in rule.kinds)
        ):
            continue
        if t.layer is None:
            if rule.layers is None:
                single.add(t.kind)
        elif lo <= t.layer <= hi:
            layered.add(t.kind)
            layers.add(t.layer)
    parts = []
    if layered:
        parts.append(r"blk\." + layers_regex(sorted(layers)) + r"\." + _alt(sorted(re.escape(k) for k in layered)))
    if single:
        parts.append(_alt(sorted(re.escape(k) for k in single)))
    if not parts:
        return None
    return "^" + _alt(parts) + r"\.weight$"


def rule_patterns(recipe: Recipe, profile: ModelProfile) -> list[tuple[str | None, QuantType]]:
    """Each rule's expression (None where it selects nothing) and type, in the recipe's order."""
    return [(rule_pattern(r, profile), r.type) for r in recipe.rules]


def default_output(source: str | Path, recipe: str | Path) -> Path:
    """Where a quantized copy goes when no -o is given: beside the source, named after the recipe."""
    s, r = Path(source), Path(recipe)
    return s.with_name(f"{s.name.removesuffix('.gguf')}-{r.stem}.gguf")
