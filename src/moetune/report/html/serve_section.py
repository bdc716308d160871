"""Serve-bench runs on the page: latency (TTFT, ITL percentiles) and throughput against the load
level, from the levels document `moetune serve-report --json` prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from moetune.bench.analysis.level_summary import LevelSummary, Percentiles
from moetune.kinds import RunKind
from moetune.report.html.data import RunReport
from moetune.report.html.markup import esc, note, table
from moetune.report.html.svg import PALETTE, Series, figure, legend, line_chart, tick_label

PCTS = ("p50", "p90", "p99")
PCT_COLORS = dict(zip(PCTS, (PALETTE[0], PALETTE[1], PALETTE[3]), strict=True))


def _axis(levels: Sequence[LevelSummary]) -> tuple[list[float], str]:
    """The x of each level: its offered rate when every level is open-loop, else its concurrency."""
    if levels and all(lv.rate for lv in levels):
        return [float(lv.rate or 0) for lv in levels], "offered load (requests/s)"
    return [float(lv.concurrency) for lv in levels], "concurrency (streams)"


def _pcts(p: Percentiles) -> tuple[float | None, float | None, float | None]:
    """p50, p90, p99 (:data:`PCTS`)."""
    return p.p50, p.p90, p.p99


def _pct_series(xs: Sequence[float], values: Sequence[Percentiles]) -> list[Series]:
    out = []
    for i, p in enumerate(PCTS):
        pts = tuple((x, _pcts(v)[i]) for x, v in zip(xs, values, strict=True))
        if any(y is not None for _, y in pts):
            out.append(Series(name=f"{p}", points=pts, color=PCT_COLORS[p], dash=p != "p50", unit="ms"))
    return out


def level_charts(docs: Sequence[Mapping[str, Any]]) -> str:
    levels = [LevelSummary.from_json(d) for d in docs]
    xs, x_label = _axis(levels)
    ticks = sorted(set(xs))  # a tick at every level measured
    log = bool(ticks) and ticks[0] > 0 and ticks[-1] / ticks[0] >= 8  # 1, 2, 4 … 64 evenly spaced

    def chart(caption: str, series: list[Series], y_label: str) -> str:
        return figure(
            caption,
            line_chart(
                series,
                x_label=x_label,
                y_label=y_label,
                width=560,
                x_ticks=ticks,
                x_tick_labels=[tick_label(x) for x in ticks],
                log2_x=log,
            ),
            legend(series),
        )

    def per_level(values: Sequence[float | None]) -> tuple[tuple[float, float | None], ...]:
        return tuple(zip(xs, values, strict=True))

    pcts = (
        ("TTFT", "Time to first token", [lv.ttft_ms for lv in levels]),
        ("ITL", "Inter-token latency", [lv.itl_ms for lv in levels]),
    )
    charts = [
        chart(f"{what} (percentiles)", series, f"{name} (ms)")
        for name, what, values in pcts
        if (series := _pct_series(xs, values))
    ]
    charts.append(
        chart(
            "Throughput: output tokens",
            [
                Series(
                    name="output tokens/s",
                    points=per_level([lv.output_tok_s for lv in levels]),
                    color=PALETTE[2],
                    unit="tokens/s",
                )
            ],
            "output (tokens/s)",
        )
    )
    reqs = [
        Series(
            name="requests/s completed",
            points=per_level([lv.request_s for lv in levels]),
            color=PALETTE[4],
            unit="requests/s",
        )
    ]
    good = per_level([None if lv.goodput is None else lv.goodput.req_s for lv in levels])
    if any(y is not None for _, y in good):
        reqs.append(
            Series(
                name="goodput (met every target), requests/s",
                points=good,
                color=PALETTE[6],
                dash=True,
                unit="requests/s",
            )
        )
    charts.append(chart("Throughput: requests", reqs, "requests/s"))
    return f'<div class="charts">{"".join(charts)}</div>'


def levels_table(docs: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for lv in map(LevelSummary.from_json, docs):
        errs = ", ".join(f"{k} {v}" for k, v in lv.errors.items()) or None
        share = None if lv.goodput is None else lv.goodput.share
        rows.append(
            [
                f"c={lv.concurrency}" + (f" @{lv.rate}/s" if lv.rate else ""),
                f"{lv.ok}/{lv.requests}",
                *_pcts(lv.ttft_ms),
                *_pcts(lv.itl_ms),
                lv.output_tok_s,
                lv.request_s,
                None if share is None else f"{share * 100:.0f}%",
                errs,
            ]
        )
    return table(
        [
            "level",
            "ok",
            "TTFT p50",
            "p90",
            "p99",
            "ITL p50",
            "p90",
            "p99",
            "output tok/s",
            "requests/s",
            "goodput",
            "errors",
        ],
        rows,
        caption="per load level (latencies in ms)",
    )


def session_charts(sessions: Mapping[str, Any]) -> str:
    """An agent-session run turn by turn: the prompt tokens each turn processed and reused from the
    prefix cache, and its TTFT and decode speed, against the turn (`serve-bench --sessions`)."""
    turns = sessions.get("turns") or []
    if not turns:
        return ""
    xs = [float(t["turn"]) for t in turns]

    def p50(key: str) -> tuple[tuple[float, float | None], ...]:
        return tuple((x, (t.get(key) or {}).get("p50")) for x, t in zip(xs, turns, strict=True))

    def chart(caption: str, series: list[Series], y_label: str) -> str:
        return figure(
            caption,
            line_chart(
                series,
                x_label="turn",
                y_label=y_label,
                width=560,
                x_ticks=xs,
                x_tick_labels=[tick_label(x) for x in xs],
            ),
            legend(series),
        )

    tokens = [
        Series(name="processed", points=p50("prompt_tokens_processed"), color=PALETTE[1], unit="tokens"),
        Series(name="reused from the cache", points=p50("prompt_tokens_reused"), color=PALETTE[2], unit="tokens"),
        Series(name="context", points=p50("context_tokens"), color=PALETTE[0], dash=True, unit="tokens"),
    ]
    speed = [Series(name="TTFT p50", points=p50("ttft_ms"), color=PALETTE[3], unit="ms")]
    decode = [Series(name="decode p50", points=p50("tg_tok_s"), color=PALETTE[4], unit="tokens/s")]
    spec = sessions.get("spec") or {}
    what = f"{spec.get('sessions')} sessions x {spec.get('turns')} turns" + (
        ", thinking stripped from the history" if spec.get("strip_thinking") else ""
    )
    return (
        f'<p class="dim">agent sessions: {esc(what)}</p><div class="charts">'
        + chart(
            "Prompt tokens per turn (median)", [x for x in tokens if any(y is not None for _, y in x.points)], "tokens"
        )
        + chart("Time to first token per turn", speed, "TTFT (ms)")
        + chart("Decode speed per turn", decode, "tokens/s")
        + "</div>"
    )


def _slowdown(r: Mapping[str, Any]) -> str:
    from moetune.report.layout_view import slowdown_text

    return slowdown_text(r)


def layout_block(doc: Mapping[str, Any]) -> str:
    """A layout run (`serve-bench LAYOUT_PLAN --load ...`): each service alone and under the shared
    load, its slowdown with the interval, its throughput, and what was busy phase by phase."""
    lay = doc.get("layout") or {}
    levels = doc.get("levels") or []
    services = "".join(
        f"<li>{esc(s['name'])}: {esc((s.get('workload') or {}).get('describe', ''))}</li>"
        for s in lay.get("services") or []
    )
    rows = [
        [
            lv.service,
            lv.load,
            lv.concurrency,
            f"{lv.ok}/{lv.requests}",
            lv.ttft_ms.p50,
            lv.itl_ms.p50,
            lv.tpot_ms.p50,
            lv.output_tok_s,
            lv.request_s,
        ]
        for lv in map(LevelSummary.from_json, levels)
    ]
    out = (
        f'<p class="dim">layout: every service alone (the others idle), then all at once</p><ul>{services}</ul>'
        + table(
            ["service", "load", "c", "ok", "TTFT p50", "ITL p50", "TPOT p50", "output tok/s", "requests/s"],
            rows,
            numeric_from=2,
            caption="per service and load (latencies in ms)",
        )
    )
    cont = lay.get("contention") or []
    if cont:
        out += table(
            ["service", "metric", "alone", "shared", "unit", "slowdown [95% CI]", "verdict"],
            [
                [
                    r["service"],
                    r["metric"],
                    r["alone_median"],
                    r["shared_median"],
                    r["unit"],
                    _slowdown(r),
                    r["verdict"],
                ]
                for r in cont
            ],
            numeric_from=2,
            caption="contention: the shared load against alone (medians; > 1x is slower)",
        )
    thr = lay.get("throughput") or []
    if thr:
        out += table(
            ["service", "output tok/s alone", "shared", "shared/alone"],
            [[r["service"], r["alone_output_tok_s"], r["shared_output_tok_s"], r["ratio"]] for r in thr],
            caption="throughput per service",
        )
    seen = [b for b in lay.get("busy") or [] if b.get("snapshots")]
    if seen:
        procs = list(dict.fromkeys(p for b in seen for p in b.get("cpu_cores") or {}))
        gpus = list(dict.fromkeys(g for b in seen for g in b.get("gpu_util_pct") or {}))
        out += table(
            ["phase", "host CPU %", *(f"{p} (cores)" for p in procs), *(f"{g} %" for g in gpus)],
            [
                [
                    b["phase"],
                    b.get("host_cpu_pct"),
                    *((b.get("cpu_cores") or {}).get(p) for p in procs),
                    *((b.get("gpu_util_pct") or {}).get(g) for g in gpus),
                ]
                for b in seen
            ],
            caption="busy while measuring (the sampler): which process and device",
        )
    return out


def serve_block(rr: RunReport) -> str:
    doc = rr.serve or {}
    levels = doc.get("levels") or []
    head = f"<h3>Run {rr.run.id} · {esc(rr.run.label)}</h3>"
    if not levels:
        return f'<div class="serve-run">{head}{note("no measured levels")}</div>'
    if doc.get("layout"):
        return f'<div class="serve-run">{head}{layout_block(doc)}</div>'
    run = doc.get("run") or {}
    warns = "".join(f"<li>{esc(w)}</li>" for w in run.get("warnings") or [])
    warns += "".join(f"<li>{esc(w)}</li>" for lv in levels for w in lv.get("warnings") or [])
    slo = run.get("slo")
    slo_line = (
        f'<p class="dim">goodput targets: {esc(", ".join(f"{k} {v}" for k, v in slo.items()))}</p>' if slo else ""
    )
    sessions = session_charts(doc["sessions"]) if doc.get("sessions") else ""
    return (
        f'<div class="serve-run">{head}{sessions}{level_charts(levels)}{levels_table(levels)}{slo_line}'
        + (f'<ul class="warnings">{warns}</ul>' if warns else "")
        + "</div>"
    )


def serve_section(runs: Sequence[RunReport]) -> str:
    serve = [rr for rr in runs if rr.run.kind == RunKind.SERVE_BENCH]
    if not serve:
        return note("no serve-bench runs")
    return "".join(serve_block(rr) for rr in serve)
