"""The plan on the page: memory per device against its capacity, the layer map (which device
holds each layer and each expert tensor), the predicted speed, the verdict and the exact commands.

Reads the plan's JSON document (``moetune.engine.command.plan_json``); a document without some
part (a hand-written launch file has only ``launch``) shows what it has.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from moetune.model.profile import EXPERT_KINDS, expert_part
from moetune.report.html.data import PlanSource
from moetune.report.html.markup import Raw, badge, code_block, esc, facts, fmt, fmt_mib, note, table
from moetune.report.html.svg import PALETTE, Segment, legend, n, stacked_bar, svg, text, title

CPU_COLOR = "#a3a3a3"
NONE_COLOR = "#f3f4f6"
MEMORY_COLORS = {
    "weights": "#4e79a7",
    "weights (pinned)": "#3b5f86",
    "kv": "#f28e2b",
    "compute": "#e15759",
    "overhead": "#9c755f",
    "output": "#76b7b2",
    "repack": "#b07aa1",
    "margin": "#d4d4d8",
    "weights (split)": "#6a8fc0",
    "checkpoints": "#edc948",
    "prompt cache": "#ff9da7",
}
WHAT_NAMES = {
    "kv": "KV cache",
    "compute": "compute buffer",
    "overhead": "backend overhead",
    "output": "output buffer",
    "margin": "safety margin",
    "repack": "repacked weights",
    "checkpoints": "context checkpoints",
    "prompt cache": "prompt cache (grows as prompts are cached)",
}


def what_name(what: str) -> str:
    return WHAT_NAMES.get(what, what)


def device_colors(doc: Mapping[str, Any]) -> dict[str, str]:
    """A colour per device, the same in every chart of the page: the CPU grey, accelerators in order."""
    names: list[str] = [str(d.get("name")) for d in doc.get("devices") or []]
    for sj in doc.get("services") or []:
        for layer in sj.get("layers") or []:
            names += [str(layer.get("device")), *(str(v) for v in (layer.get("experts") or {}).values())]
    out: dict[str, str] = {}
    for name in names:
        if name in out:
            continue
        out[name] = CPU_COLOR if name == "CPU" else PALETTE[sum(1 for k in out if k != "CPU") % len(PALETTE)]
    return out


def _memory_color(what: str, i: int) -> str:
    return MEMORY_COLORS.get(what, PALETTE[(i + 5) % len(PALETTE)])


def memory_bars(devices: Sequence[Mapping[str, Any]], *, width: float = 720) -> str:
    """One stacked bar per device, its full length the device's capacity."""
    several = len({str(it.get("service") or "") for d in devices for it in d.get("items") or []} - {""}) > 1
    rows: list[str] = []
    seen: dict[str, str] = {}
    for d in devices:
        name, cap = str(d.get("name")), float(d.get("capacity_mib") or 0.0)
        segs = []
        for it in d.get("items") or []:
            what, mib = str(it.get("what")), float(it.get("mib") or 0.0)
            svc = str(it.get("service") or "")
            color = seen.setdefault(what, _memory_color(what, len(seen)))
            label = f"{what_name(what)} ({svc})" if several and svc else what_name(what)
            segs.append(Segment(label, mib, color, f"{name}: {label} {fmt_mib(mib)}"))
        used = float(d.get("used_mib") or sum(s.value for s in segs))
        free = cap - used
        state = "over" if free < 0 else "ok"
        summary = f"{fmt_mib(used)} of {fmt_mib(cap)} used · " + (
            f"{fmt_mib(-free)} over" if free < 0 else f"{fmt_mib(free)} free"
        )
        rows.append(
            f'<div class="device" data-device="{esc(name)}"><div class="dev-name">{esc(name)} '
            f'<span class="dim">{esc(d.get("kind") or "")}</span></div>'
            f"{stacked_bar(segs, cap, width=width, label=f'memory of {name}')}"
            f'<div class="dev-sum {state}">{esc(summary)}</div></div>'
        )
    return f'<div class="devices">{"".join(rows)}</div>' + legend(
        [(what_name(w), c) for w, c in seen.items()], swatch="box"
    )


def _tensor_rows(layers: Sequence[Mapping[str, Any]]) -> list[str]:
    kinds = {str(k) for layer in layers for k in (layer.get("experts") or {})}
    return [k for k in EXPERT_KINDS if k in kinds] + sorted(kinds - set(EXPERT_KINDS))


def _row_name(kind: str) -> str:
    if kind == "layer":
        return "layer (attention, KV)"
    return "experts " + expert_part(kind).replace("_", "+")


def layer_map(layers: Sequence[Mapping[str, Any]], colors: Mapping[str, str], *, width: float = 1160) -> str:
    """A grid: a column per layer, a row for the layer itself (attention, norms and its KV cache,
    which follow -ngl) and one per expert tensor kind; each cell coloured by the device holding it."""
    if not layers:
        return note("the plan has no layer map")
    rows = ["layer", *_tensor_rows(layers)]
    label_w, cell_h, top, bottom = 150.0, 18.0, 4.0, 30.0
    cw = max(5.0, min(36.0, (width - label_w - 8) / len(layers)))
    w = label_w + cw * len(layers) + 8
    h = top + cell_h * len(rows) + bottom
    parts = []
    for r, kind in enumerate(rows):
        y = top + r * cell_h
        parts.append(text(label_w - 8, y + cell_h / 2 + 4, _row_name(kind), anchor="end"))
        for c, layer in enumerate(layers):
            idx = layer.get("index", c)
            x = label_w + c * cw
            if kind == "layer":
                dev = str(layer.get("device"))
                tip = f"layer {idx} ({layer.get('kind', '')}): on {dev}"
            else:
                got = (layer.get("experts") or {}).get(kind)
                dev = "" if got is None else str(got)
                tip = (
                    (
                        f"layer {idx} {kind}: on {dev}"
                        + (
                            f" ({fmt_mib(float(layer['expert_mib']))} of experts in this layer)"
                            if layer.get("expert_mib")
                            else ""
                        )
                    )
                    if dev
                    else f"layer {idx}: {layer.get('kind', 'dense')}, no {kind}"
                )
            fill = colors.get(dev, NONE_COLOR) if dev else NONE_COLOR
            parts.append(
                f'<rect class="cell" data-layer="{esc(idx)}" data-tensor="{esc(kind)}" '
                f'data-device="{esc(dev)}" x="{n(x + 0.5)}" y="{n(y + 1)}" width="{n(cw - 1)}" '
                f'height="{n(cell_h - 2)}" fill="{fill}">{title(tip)}</rect>'
            )
    step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 1000) if s * cw >= 24)
    base = top + cell_h * len(rows)
    for c, layer in enumerate(layers):
        idx = layer.get("index", c)
        if isinstance(idx, int) and idx % step == 0:
            x = label_w + c * cw + cw / 2
            parts.append(f'<line x1="{n(x)}" x2="{n(x)}" y1="{n(base)}" y2="{n(base + 4)}" stroke="#6b7280"/>')
            parts.append(text(x, base + 15, str(idx), anchor="middle", cls="tick"))
    parts.append(text(label_w + cw * len(layers) / 2, h - 2, "layer index", anchor="middle", cls="axis-label"))
    used = {str(layer.get("device")) for layer in layers} | {
        str(v) for layer in layers for v in (layer.get("experts") or {}).values()
    }
    items = [(name, c) for name, c in colors.items() if name in used]
    if any(not layer.get("experts") for layer in layers) and len(rows) > 1:
        items.append(("no expert tensor (dense layer)", NONE_COLOR))
    return svg(w, h, "".join(parts), label="layer map", cls="layer-map") + legend(items, swatch="box")


def _routing(r: Mapping[str, Any] | None) -> str | None:
    if not r:
        return None
    return (
        f"measured over {r['tokens']:,} tokens ({r['source']}): 64 tokens touch "
        f"{100 * r['touched_at_64_tokens']:.0f}% of a layer's experts (alike: {100 * r['uniform_at_64_tokens']:.0f}%)"
    )


def _prediction(sj: Mapping[str, Any]) -> str:
    pr = sj.get("predicted") or {}
    if not pr:
        return ""
    head = facts(
        [
            ("predicted TG", Raw(f"<b>{esc(fmt(pr.get('tg_tok_s')))}</b> tokens/s")),
            ("predicted PP", Raw(f"<b>{esc(fmt(pr.get('pp_tok_s')))}</b> tokens/s")),
            ("graph splits", pr.get("graph_splits")),
            ("RPC hops", pr.get("rpc_hops") or None),
            ("per token", f"{fmt(pr['ms_per_token'])} ms" if pr.get("ms_per_token") else None),
            ("routing", _routing(sj.get("routing"))),
        ]
    )
    per = pr.get("per_device") or []
    rows = [(d.get("device"), d.get("read_mib_per_token"), d.get("decode_ms"), d.get("bw_gbs")) for d in per]
    return head + (
        table(
            ["device", "read per token (MiB)", "decode time per token (ms)", "bandwidth (GB/s)"],
            rows,
            caption="where a token's time goes (decode)",
        )
        if rows
        else ""
    )


def _settings(sj: Mapping[str, Any]) -> str:
    s = sj.get("settings") or {}
    kv = f"{s.get('ctk')}/{s.get('ctv')}" if s.get("ctk") else None
    return facts(
        [
            ("model", sj.get("model_given") or sj.get("model")),
            ("architecture", sj.get("arch")),
            ("strategy", sj.get("strategy")),
            ("engine", s.get("engine")),
            ("context", s.get("ctx")),
            ("slots", s.get("slots")),
            ("batch / ubatch", f"{s.get('batch')} / {s.get('ubatch')}" if s.get("batch") else None),
            ("KV cache types", kv),
            ("flash attention", None if "flash_attn" not in s else ("on" if s["flash_attn"] else "off")),
            ("tensor split", ",".join(str(x) for x in sj.get("tensor_split") or []) or None),
        ],
        cls="facts cols",
    )


def commands(doc: Mapping[str, Any]) -> str:
    """The exact commands: the plan's shell script, else each launch process's argv."""
    if doc.get("shell"):
        return code_block(str(doc["shell"]))
    procs = (doc.get("launch") or {}).get("processes") or []
    lines = []
    for p in procs:
        binary = "rpc-server" if p.get("role") == "rpc" else "llama-server"
        lines.append(
            f"# {p.get('name')} ({p.get('role')}, engine {p.get('engine')})\n"
            + shlex.join([binary, *(str(a) for a in p.get("argv") or [])])
        )
    return code_block("\n".join(lines)) if lines else note("the plan holds no command")


def verdict_badge(doc: Mapping[str, Any]) -> str:
    if "fits" not in doc:
        return ""
    return badge("fits", "good") if doc["fits"] else badge("does not fit", "bad")


def verdict(doc: Mapping[str, Any]) -> str:
    """What keeps the plan from fitting, and what to watch."""
    msgs = "".join(f"<li>{esc(s.get('message', s))}</li>" for s in doc.get("shortfalls") or [])
    out = f'<ul class="shortfalls">{msgs}</ul>' if msgs else ""
    warns = "".join(
        f"<li>{esc(w.get('message'))}<br><span class=dim>→ {esc(w.get('remedy') or '')}</span></li>"
        for w in doc.get("warnings") or []
    )
    return out + (f'<ul class="warnings">{warns}</ul>' if warns else "")


def plan_block(src: PlanSource) -> str:
    doc = src.doc
    colors = device_colors(doc)
    label = f" · {doc['label']}" if doc.get("label") else ""
    hw = f" on {str(doc['hardware']).rsplit('/', 1)[-1]}" if doc.get("hardware") else ""  # a file: its name
    parts = [
        f'<h3>{esc(src.title)}{esc(label)}<span class="dim">{esc(hw)}</span> {verdict_badge(doc)}</h3>',
        verdict(doc),
    ]
    if doc.get("devices"):
        parts += ["<h4>Memory per device</h4>", memory_bars(doc["devices"])]
    services = doc.get("services") or []
    for sj in services:
        name = f" of {sj.get('name')}" if len(services) > 1 else ""
        parts += [
            f"<h4>Service {esc(sj.get('name'))}</h4>" if len(services) > 1 else "",
            _settings(sj),
            f"<h4>Layer map{esc(name)}</h4>",
            layer_map(sj.get("layers") or [], colors),
            f"<h4>Predicted speed{esc(name)}</h4>",
            _prediction(sj),
        ]
        parts += [note("note: " + str(x), "dim") for x in sj.get("notes") or []]
    parts += ["<h4>Command</h4>", commands(doc)]
    return f'<div class="plan">{"".join(parts)}</div>'


def plan_section(plans: Sequence[PlanSource]) -> str:
    if not plans:
        return note(
            "no plan: give a plan file (moetune plan MODEL --hw HW -o plan.json), or runs of a plan moetune launched"
        )
    return "".join(plan_block(p) for p in plans)
