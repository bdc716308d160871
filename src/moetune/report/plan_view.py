"""`moetune plan` for people: device ledger, layer map, prediction, verdict, command."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from moetune.model.profile import expert_part
from moetune.plan.ledger import whole_mib
from moetune.plan.plan import Plan

if TYPE_CHECKING:  # the run package (launch, processes) has no business in every plan's start-up
    from moetune.run.verify import Verification


def _runs(layers: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Compress the layer map into runs: ('3-63', 'experts CPU'), ('64-77', 'experts CUDA0')."""
    rows: list[tuple[str, str]] = []
    start = prev_sig = None
    last = -1
    for layer in layers:
        ex = layer["experts"]
        devs = sorted(set(ex.values()))
        if not ex:
            sig = f"{layer['kind']} on {layer['device']}"
        elif len(devs) == 1:
            sig = f"layer on {layer['device']}, experts on {devs[0]}"
        else:
            sig = f"layer on {layer['device']}, experts " + ", ".join(
                f"{expert_part(k)}:{v}" for k, v in sorted(ex.items())
            )
        if sig != prev_sig:
            if prev_sig is not None:
                rows.append((f"{start}" if start == last else f"{start}-{last}", prev_sig))
            start, prev_sig = layer["index"], sig
        last = layer["index"]
    if prev_sig is not None:
        rows.append((f"{start}" if start == last else f"{start}-{last}", prev_sig))
    return rows


def print_plan(plan: Plan, doc: dict[str, Any], out: Console) -> None:
    several = len(plan.services) > 1  # a layout: each line names the service it is for
    t = Table(title="memory per device (MiB)")
    t.add_column("device")
    if several:
        t.add_column("service")
    t.add_column("what")
    t.add_column("MiB", justify="right")
    t.add_column("capacity", justify="right")
    t.add_column("free", justify="right")
    notes: list[str] = []  # what an item's figure means, where its name alone does not say
    for d in doc["devices"]:
        first = True
        for it in d["items"]:
            service = [Text(it["service"] or "(all)")] if several else []
            if it.get("note"):
                notes.append(f"{d['name']} {it['what']}: {it['note']}")
            t.add_row(d["name"] if first else "", *service, Text(it["what"]), f"{it['mib']:,.1f}", "", "")
            first = False
        free = whole_mib(d["capacity_mib"]) - whole_mib(d["used_mib"])  # as the verdict says it
        t.add_row(
            "",
            *([""] if several else []),
            Text("total", style="bold"),
            f"{d['used_mib']:,.1f}",
            f"{whole_mib(d['capacity_mib']):,}",
            Text(f"{free:,}", style="red" if d["free_mib"] < 0 else "green"),
            end_section=True,
        )
    out.print(t)
    for n in dict.fromkeys(notes):
        out.print(Text(n, style="dim"))
    for sj in doc["services"]:
        lm = Table(title=f"layer map: {sj['name']} ({sj['strategy']})")
        lm.add_column("layers")
        lm.add_column("placement")
        for rng, sig in _runs(sj["layers"]):
            lm.add_row(rng, sig)
        out.print(lm)
        pr = sj["predicted"]
        out.print(
            f"predicted {sj['name']}: TG {pr['tg_tok_s']:.1f} tok/s, PP {pr['pp_tok_s']:.0f} tok/s "
            f"({pr['graph_splits']} graph splits)",
            markup=False,
        )
        if r := sj.get("routing"):
            out.print(
                Text(
                    f"routing: measured over {r['tokens']:,} tokens ({r['source']}): 64 tokens touch "
                    f"{100 * r['touched_at_64_tokens']:.0f}% of a layer's experts (every expert alike: "
                    f"{100 * r['uniform_at_64_tokens']:.0f}%); it moves PP where experts stay on the host",
                    style="dim",
                )
            )
        for n in sj["notes"]:
            out.print(Text("note: " + n, style="dim"))
    if doc["fits"]:
        out.print(Text("verdict: fits", style="bold green"))
    else:
        for s in doc["shortfalls"]:
            out.print(Text(f"verdict: does not fit: {s['message']}", style="bold red"))
    out.print(Text("command:", style="bold"))
    out.print(doc["shell"], markup=False, end="")
    c = doc["speed_constants"]
    out.print(Text(calibration_line(doc), style="dim"))
    out.print(
        Text(
            "speed constants: "
            + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in c.items()),
            style="dim",
        )
    )


def calibration_line(doc: dict[str, Any]) -> str:
    """Which calibration the plan's speed came from: how many runs and placements, when, and its
    stated uncertainty (the built-in constants' when there is none)."""
    cal = doc.get("speed_calibration")
    band = doc.get("speed_uncertainty") or (cal or {}).get("uncertainty") or {}
    unc = f"stated uncertainty TG +/-{band.get('tg_pct')}%, PP +/-{band.get('pp_pct')}%"
    cpu = (
        f"; this CPU's attention kernels as `moetune hw attention` measured them ({len(doc['speed_cpu_measured'])} terms)"
        if doc.get("speed_cpu_measured")
        else ""
    )
    if not cal:
        return f"calibration: none, the built-in constants ({unc}; `moetune calibrate` fits them to benchmarks){cpu}"
    import datetime

    when = (
        ""
        if not cal.get("created_unix")
        else " of " + datetime.datetime.fromtimestamp(cal["created_unix"], datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    )
    places = f" over {cal['placements']} placements" if cal.get("placements") else ""
    err = cal.get("error") or {}
    loo = (
        ""
        if err.get("tg_median_abs_pct") is None
        else f"; leave-one-run-out error TG {err['tg_median_abs_pct']}%, PP {err.get('pp_median_abs_pct')}%"
    )
    left = f"; {cal['left_out_contended']} contended runs left out" if cal.get("left_out_contended") else ""
    return (
        f"calibration{when}: {cal.get('hardware') or 'this hardware'} / {cal.get('engine') or 'engine'}, from "
        f"{cal['runs']} runs{places} ({unc}{loo}{left}){cpu}"
    )


def print_verify(vs: list[Verification], out: Console) -> None:
    """The engine's dry run beside the plan, per service and device; what disagrees, said."""
    for v in vs:
        title = f"{v.service}: the engine's own allocation ({v.tool})" if v.tool else f"{v.service}: not verified"
        if v.why is not None:
            out.print(f"{title}: {v.why}", markup=False)
            continue
        t = Table(title=title, title_justify="left")
        for c in (
            "device",
            "model plan",
            "model engine",
            "context plan",
            "context engine",
            "compute plan",
            "compute engine",
            "",
        ):
            t.add_column(c, justify="left" if c in ("device", "") else "right")
        theirs = {f.device: f for f in v.engine}
        bad = {d.split(" ", 1)[0].rstrip(":") for d in v.disagreements}
        for ours in v.ledger:
            e = theirs.get(ours.device)
            cells = [
                f"{x:,.1f}"
                for x in (
                    ours.model_mib,
                    e.model_mib if e else 0.0,
                    ours.context_mib,
                    e.context_mib if e else 0.0,
                    ours.compute_mib,
                    e.compute_mib if e else 0.0,
                )
            ]
            t.add_row(ours.device, *cells, Text("differs", style="red") if ours.device in bad else Text("ok", "green"))
        out.print(t)
        if v.note:
            out.print(Text(v.note, style="dim"))
        for d in v.disagreements:
            out.print(f"  {d}", markup=False)
