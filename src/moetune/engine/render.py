"""Render a placement and settings into an engine's argv (``formats`` turns it into a shell script, a
container command or a llama-swap entry). Pure: the same plan always renders the same text.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from moetune.engine import ik_split
from moetune.engine.dialect import Dialect, engine_devices
from moetune.engine.server_args import need_flag, server_options
from moetune.errors import InputError, InternalError
from moetune.kinds import EngineKind
from moetune.model.layer_regex import layers_regex
from moetune.model.profile import EXPERT_PARTS, ModelProfile, expert_part
from moetune.plan.placement import CPU, Placement
from moetune.plan.settings import Settings, engine_repacks

MAX_OVERRIDES = 4096  # llama.cpp's limit on tensor buffer overrides
# every routed expert of every layer, written shortest part first as llama.cpp's docs write it:
# \.ffn_(up|down|gate|gate_up)_exps
ALL_EXPERTS = r"\.ffn_(" + "|".join(sorted(EXPERT_PARTS, key=lambda k: (len(k), k))) + ")_exps"


@dataclass(frozen=True, slots=True)
class OverrideRule:
    pattern: str
    device: str

    def __str__(self) -> str:
        return f"{self.pattern}={self.device}"


def override_rules(p: ModelProfile, pl: Placement) -> list[OverrideRule]:
    """One rule per device and set of expert kinds, for experts not on their layer's device.
    The CPU rule comes last: llama.cpp applies the first pattern that matches."""
    moved: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for t in p.tensors:
        if not t.is_expert or t.layer is None or t.layer >= len(pl.layer_device):
            continue
        dev = pl.experts().get(t.name)
        if dev is None or dev == pl.layer_device[t.layer]:
            continue
        moved[dev][t.layer].add(expert_part(t.kind))
    all_moe = {t.layer for t in p.tensors if t.is_expert and t.layer is not None and t.layer < p.n_layer}
    rules: list[OverrideRule] = []
    for dev in sorted(moved, key=lambda d: (d == CPU, d)):
        by_kinds: dict[frozenset[str], list[int]] = defaultdict(list)
        for layer, kinds in moved[dev].items():
            by_kinds[frozenset(kinds)].append(layer)
        for kind_set, layers in sorted(by_kinds.items(), key=lambda kv: min(kv[1])):
            k = sorted(kind_set)
            kind_re = k[0] if len(k) == 1 else "(" + "|".join(k) + ")"
            if dev == CPU and set(layers) == all_moe and len(k) >= 3:
                rules.append(OverrideRule(ALL_EXPERTS, dev))
            else:
                rules.append(OverrideRule(rf"blk\.{layers_regex(layers)}\.ffn_{kind_re}_exps", dev))
    return rules


def check_rules(p: ModelProfile, pl: Placement, rules: list[OverrideRule]) -> None:
    """The rules, applied first-match like llama.cpp, must send every expert tensor where the plan
    says; :class:`InternalError` where one does not (the rules and the plan disagree: a bug)."""
    compiled = [(re.compile(r.pattern), r.device) for r in rules]
    experts = pl.experts()
    for t in p.tensors:
        if not t.is_expert or t.layer is None or t.name not in experts:
            continue
        dev = next((d for rx, d in compiled if rx.search(t.name)), pl.layer_device[t.layer])
        if dev != experts[t.name]:
            raise InternalError(f"override rules send {t.name} to {dev}, the plan says {experts[t.name]}")


def _tensor_split(
    p: ModelProfile, pl: Placement, s: Settings, d: Dialect, *, accelerators: list[tuple[str, bool]] | None
) -> tuple[float, ...]:
    """-ts in the engine's terms: mainline takes the plan's layer counts; ik_llama.cpp, which splits
    by bytes over its own device numbering, the shares that give the plan's layers (ik_split)."""
    order = engine_devices(d, accelerators or [])
    if s.split_mode == "graph":  # the share of every split layer each GPU gets (plan.graph_split.percents)
        return pl.tensor_split
    if accelerators is None or d.kind != EngineKind.IK or len(order) < 2:
        return pl.tensor_split
    index = {n: i for i, n in enumerate(order)}
    layers = [*pl.layer_device, pl.output_device]
    if any(n not in index for n in layers):
        raise InputError(
            f"layers on {sorted({n for n in layers if n not in index})} cannot be offloaded by -ts "
            f"(ik_llama.cpp's devices: {', '.join(order)})"
        )
    sizes, mc = ik_split.layer_sizes(p, s, s.mla if p.is_mla and d.mla else 0)
    return ik_split.tensor_split(sizes, mc, [index[n] for n in layers], len(order))


def ik_flags(p: ModelProfile, s: Settings, d: Dialect) -> list[str]:
    """ik_llama.cpp's own options, as far as the build takes them (mainline's dialect has none):
    ``-amb`` when set, the MLA mode on MLA models, fused MoE where it is not the build's default,
    ``-muge``."""
    if s.engine != d.kind:
        return []
    argv = [d.amb, str(s.amb_mib)] if d.amb and s.amb_mib else []
    argv += [d.mla, str(s.mla)] if d.mla and p.is_mla else []
    argv += list(d.fused_moe_on if s.fused_moe else d.fused_moe_off)
    return argv + (list(d.merge_up_gate) if s.merge_up_gate else [])


def repack_flags(s: Settings, d: Dialect) -> list[str]:
    """Repacking's flag, only where the plan differs from the engine's default (mainline repacks
    unless ``-nr``; ik_llama.cpp only with ``-rtr``): nothing when the plan follows the engine."""
    if s.repack is None or s.repack == engine_repacks(d.kind):
        return []
    return list(d.repack if s.repack else d.no_repack)


def defaults_argv(
    p: ModelProfile,
    s: Settings,
    d: Dialect,
    *,
    port: int = 8080,
    rpc: list[str] | None = None,
    model_path: str | None = None,
) -> list[str]:
    """The engine run with the model and no tuning flags (tune's "engine defaults" baseline): the
    model, the context, the devices (``--rpc``) and what the plan's own server needs to run: the
    repacking it turns off (where the engine would crash with it), ik_llama.cpp's ``--jinja`` and
    no log file, the address and the API key file. Placement, threads, batches, flash attention
    and cache types are the engine's own."""
    argv = ["-m", model_path or p.server_path, d.ctx, str(s.ctx)]
    if rpc:
        argv += [d.rpc, ",".join(rpc)]
    if s.repack is False:
        argv += repack_flags(s, d)
    argv += [*d.jinja, *d.no_log_file, "--host", s.server.host, "--port", str(port)]
    if s.server.api_key_file:
        argv += ["--api-key-file", s.server.api_key_file]
    return argv


def server_argv(
    p: ModelProfile,
    pl: Placement,
    s: Settings,
    d: Dialect,
    *,
    engine: str = "",
    port: int = 8080,
    rpc: list[str] | None = None,
    model_path: str | None = None,
    extra: list[str] | None = None,
    accelerators: list[tuple[str, bool]] | None = None,
) -> list[str]:
    """Arguments after the llama-server binary. ``accelerators``: the plan's (name, is an RPC
    device), in llama.cpp's order, which the engine's -ts depends on."""
    argv = [
        "-m",
        model_path or p.server_path,
        d.ctx,
        str(s.ctx),
        d.slots,
        str(s.slots),
        d.batch,
        str(s.batch),
        d.ubatch,
        str(s.ubatch),
        d.ctk,
        s.ctk,
        d.ctv,
        s.ctv,
    ]
    argv += list(d.flash_attn_on if s.flash_attn else d.flash_attn_off)
    if s.kv_unified:
        argv += list(d.kv_unified)
    if s.swa_full and p.hp_int("attention.sliding_window"):
        argv += list(d.swa_full)
    if s.ctx_checkpoints is not None:
        need_flag(d, engine or d.kind, "--ctx-checkpoints", d.ctx_checkpoints)
        argv += [d.ctx_checkpoints, str(s.ctx_checkpoints)]
    if s.cache_ram_mib is not None and d.cache_ram:
        need_flag(d, engine or d.kind, "--cache-ram", d.cache_ram)
        argv += [d.cache_ram, str(s.cache_ram_mib)]
    elif s.cache_ram_mib:  # 0 says what an engine without a prompt cache does anyway
        raise InputError(
            f"--cache-ram: engine {engine or d.kind} keeps no prompt cache in host RAM", hint="leave --cache-ram out"
        )
    argv += [d.ngl, d.ngl_all]
    if s.split_mode != "layer":
        need_flag(d, engine or d.kind, "--split-mode", d.split_mode)
        argv += [d.split_mode, s.split_mode]
    if rpc:
        argv += [d.rpc, ",".join(rpc)]
    if ts := _tensor_split(p, pl, s, d, accelerators=accelerators):
        argv += [d.tensor_split, ",".join(f"{x:g}" for x in ts)]
    rules = override_rules(p, pl)
    n_over = sum(1 for t in p.tensors if t.is_expert)
    if n_over > MAX_OVERRIDES and len(rules) > MAX_OVERRIDES:
        raise InputError(f"the placement needs {len(rules)} tensor overrides; llama.cpp accepts {MAX_OVERRIDES}")
    if rules:
        check_rules(p, pl, rules)
        argv += [d.override, ",".join(str(r) for r in rules)]
    argv += ik_flags(p, s, d)
    argv += list(d.fit_off)
    argv += repack_flags(s, d)
    if not s.mmap:
        argv += list(d.no_mmap)
    argv += list(d.jinja)
    argv += list(d.no_log_file)
    if s.threads:
        argv += [d.threads, str(s.threads)]
    argv += ["--host", s.server.host, "--port", str(port)]
    return argv + list(extra or []) + server_options(s, d, engine, p.hp_int("context_length"))
