"""Serve-bench runs on the page: latency (TTFT, ITL percentiles) and throughput against the load
level, from the levels document `moetune serve-report --json` prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from moetune.kinds import RunKind
from moetune.report.html.data import RunReport
from moetune.report.html.markup import esc, note, table
from moetune.report.html.svg import PALETTE, Series, figure, legend, line_chart, tick_label

PCTS = ("p50", "p90", "p99")
PCT_COLORS = dict(zip(PCTS, (PALETTE[0], PALETTE[1], PALETTE[3]), strict=True))


def _axis(levels: Sequence[Mapping[str, Any]]) -> tuple[list[float], str]:
    """The x of each level: its offered rate when every level is open-loop, else its concurrency."""
    if levels and all(lv.get("rate") for lv in levels):
        return [float(lv["rate"]) for lv in levels], "offered load (requests/s)"
    return [float(lv.get("concurrency") or 0) for lv in levels], "concurrency (streams)"


def _pct_series(levels: Sequence[Mapping[str, Any]], xs: Sequence[float], key: str) -> list[Series]:
    out = []
    for p in PCTS:
        pts = tuple((x, (lv.get(key) or {}).get(p)) for x, lv in zip(xs, levels, strict=True))
        if any(y is not None for _, y in pts):
            out.append(Series(f"{p}", pts, PCT_COLORS[p], dash=p != "p50", unit="ms"))
    return out


def level_charts(levels: Sequence[Mapping[str, Any]]) -> str:
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

    def per_level(key: str) -> tuple[tuple[float, float | None], ...]:
        return tuple((x, lv.get(key)) for x, lv in zip(xs, levels, strict=True))

    charts = [
        chart(f"{what} (percentiles)", series, f"{key.split('_')[0].upper()} (ms)")
        for key, what in (("ttft_ms", "Time to first token"), ("itl_ms", "Inter-token latency"))
        if (series := _pct_series(levels, xs, key))
    ]
    charts.append(
        chart(
            "Throughput: output tokens",
            [Series("output tokens/s", per_level("output_tok_s"), PALETTE[2], unit="tokens/s")],
            "output (tokens/s)",
        )
    )
    reqs = [Series("requests/s completed", per_level("request_s"), PALETTE[4], unit="requests/s")]
    good = tuple((x, (lv.get("goodput") or {}).get("req_s")) for x, lv in zip(xs, levels, strict=True))
    if any(y is not None for _, y in good):
        reqs.append(Series("goodput (met every target), requests/s", good, PALETTE[6], dash=True, unit="requests/s"))
    charts.append(chart("Throughput: requests", reqs, "requests/s"))
    return f'<div class="charts">{"".join(charts)}</div>'


def levels_table(levels: Sequence[Mapping[str, Any]]) -> str:
    def p(lv: Mapping[str, Any], key: str) -> list[float | None]:
        d = lv.get(key) or {}
        return [d.get(q) for q in PCTS]

    rows = []
    for lv in levels:
        errs = ", ".join(f"{k} {v}" for k, v in (lv.get("errors") or {}).items()) or None
        gp = lv.get("goodput") or {}
        rows.append(
            [
                f"c={lv.get('concurrency')}" + (f" @{lv['rate']}/s" if lv.get("rate") else ""),
                f"{lv.get('ok')}/{lv.get('requests')}",
                *p(lv, "ttft_ms"),
                *p(lv, "itl_ms"),
                lv.get("output_tok_s"),
                lv.get("request_s"),
                None if gp.get("share") is None else f"{gp['share'] * 100:.0f}%",
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
        Series("processed", p50("prompt_tokens_processed"), PALETTE[1], unit="tokens"),
        Series("reused from the cache", p50("prompt_tokens_reused"), PALETTE[2], unit="tokens"),
        Series("context", p50("context_tokens"), PALETTE[0], dash=True, unit="tokens"),
    ]
    speed = [Series("TTFT p50", p50("ttft_ms"), PALETTE[3], unit="ms")]
    decode = [Series("decode p50", p50("tg_tok_s"), PALETTE[4], unit="tokens/s")]
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
            lv.get("service"),
            lv.get("load"),
            lv.get("concurrency"),
            f"{lv.get('ok')}/{lv.get('requests')}",
            *((lv.get(k) or {}).get("p50") for k in ("ttft_ms", "itl_ms", "tpot_ms")),
            lv.get("output_tok_s"),
            lv.get("request_s"),
        ]
        for lv in levels
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
