"""Runs on the page: each run's context and figures with their confidence intervals, the plan's
prediction beside the measurement; and the comparison of the runs against the first (the same
rows and verdicts `moetune compare` prints)."""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from moetune.bench.analysis.bench_summary import BenchSummary, Stat
from moetune.bench.analysis.stats import FASTER, SLOWER
from moetune.bench.analysis.warnings import Warning, grouped
from moetune.kinds import RunKind, RunStatus
from moetune.report.compare import CompareRow, Comparison
from moetune.report.compare_view import families, legend, verdict_text
from moetune.report.html.data import RunReport
from moetune.report.html.markup import Cell, Raw, badge, esc, facts, fmt, note, table
from moetune.report.html.svg import PALETTE, Interval, figure, interval_bars
from moetune.report.paired import PairedComparison
from moetune.report.paired_view import legend as paired_legend
from moetune.report.paired_view import paired_cell, ratios_cell, title, unpaired_cell

STATUS_TONE = {
    RunStatus.DONE: "good",
    RunStatus.RUNNING: "warn",
    RunStatus.INTERRUPTED: "warn",
    RunStatus.FAILED: "bad",
}


def run_color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _ci(s: Mapping[str, Any] | None) -> Cell:
    if not s:
        return None
    client = " (client)" if s.get("source") == "client" else ""
    return Raw(
        f"<b>{esc(fmt(s['median']))}</b> <span class=dim>[{esc(fmt(s['ci_low']))}, "
        f"{esc(fmt(s['ci_high']))}]{esc(client)}</span>"
    )


def _context(rr: RunReport) -> str:
    r, m = rr.run, rr.run.meta
    server = None
    if m.server is not None:
        slots = f", {m.server.slots} slots" if m.server.slots else ""
        server = f"{m.server.url or '-'} ({m.server.dialect}{slots})"
    counts = ", ".join(f"{k} {v}" for k, v in sorted(rr.counts.items())) or "none"
    model = None
    if m.model.path or m.model.name:
        named = m.model.name and m.model.name != m.model.path
        model = (m.model.path or "") + (f" as {m.model.name!r}" if named else "")
    return facts(
        [
            ("started (UTC)", r.created_at.replace("T", " ")[:23]),
            ("finished (UTC)", (r.finished_at or "").replace("T", " ")[:23] or "–"),
            ("target", r.target),
            ("server", server),
            ("engine build", m.engine_build),
            ("model", model),
            ("host", m.host.describe() if m.host.fingerprint else None),
            ("launch", m.launch_run),
            ("samples", counts),
            ("command", Raw(f"<code>{esc(shlex.join(m.argv))}</code>") if m.argv else None),
        ]
    )


def _stat(s: Stat | None) -> Cell:
    return None if s is None else _ci(s.to_json())


def _workloads(summary: BenchSummary | Mapping[str, object]) -> str:
    bench = summary if isinstance(summary, BenchSummary) else BenchSummary.from_json(summary)
    ws = bench.workloads
    if not ws:
        return note("no measured samples")
    rows = []
    for name, d in ws.items():
        rows.append(
            [
                name,
                _stat(d.tg),
                _stat(d.pp),
                d.n,
                f"{d.tg.cv * 100:.1f}%" if d.tg is not None else None,
                d.prompt_n if d.prompt_n is not None else d.prompt_tokens,
                d.predicted_n,
                d.cached_n,
            ]
        )
    out = table(
        ["workload", "TG tokens/s", "PP tokens/s", "n", "CV TG", "prompt", "output", "cached"],
        rows,
        caption="median [95% CI] per workload",
    )
    charts = []
    for fam, what in (("tg", "TG"), ("pp", "PP")):
        bars = [
            Interval(label=name, median=st.median, low=st.ci_low, high=st.ci_high, color=run_color(i))
            for i, (name, d) in enumerate(ws.items())
            if (st := d.tg if fam == "tg" else d.pp) is not None
        ]
        if bars:
            charts.append(
                figure(
                    f"{what}: median and 95% CI per workload", interval_bars(bars, unit=f"{what} (tokens/s)", width=520)
                )
            )
    return out + (f'<div class="charts">{"".join(charts)}</div>' if charts else "")


def _prediction(rep: Mapping[str, Any] | None) -> str:
    if not rep:
        return ""
    rows = []
    for name, row in (rep.get("prediction_error") or {}).items():
        for fam in ("tg", "pp"):
            r = row.get(fam) or {}
            if r.get("measured") is None:
                continue
            err = r.get("error_pct")
            flag = Raw(badge("beyond the stated band", "bad")) if r.get("outside") else ""
            rows.append(
                [
                    name,
                    fam.upper(),
                    r.get("predicted"),
                    r.get("measured"),
                    None if err is None else f"{err:+.0f}%",
                    f"±{r.get('band_pct', 0):.0f}%",
                    flag,
                ]
            )
    out = (
        table(
            ["workload", "figure", "predicted tokens/s", "measured tokens/s", "error", "stated band", ""],
            rows,
            numeric_from=2,
            caption="predicted vs measured (error = predicted over measured)",
        )
        if rows
        else ""
    )
    eff = [e for e in rep.get("efficiency") or [] if e.get("pct") is not None]
    if eff:
        out += table(
            ["device", "bandwidth reached (GB/s)", "device bandwidth (GB/s)", "share"],
            [[e["device"], e["bytes_per_s"] / 1e9, e["limit_bytes_per_s"] / 1e9, f"{e['pct']:.0f}%"] for e in eff],
            caption="decode bandwidth reached (first workload)",
        )
    return out


def _metrics(summary: Mapping[str, Any]) -> str:
    """Figures named FAMILY:SUBJECT (``ttft:c=4``) as a matrix: a row per subject, a column per family."""
    ms = summary.get("metrics") or {}
    if not ms:
        return note("no measured samples")
    fams: dict[str, str] = {}
    rows: dict[str, dict[str, Mapping[str, Any]]] = {}
    for k, s in ms.items():
        fam, _, subject = k.partition(":")
        fams.setdefault(fam, str(s.get("unit") or ""))
        rows.setdefault(subject or "-", {})[fam] = s
    heads = [f"{f} ({u})" if u else f for f, u in fams.items()]
    return table(
        ["", *heads, "n"],
        [
            [subject, *(_ci(by.get(f)) for f in fams), max((int(s.get("n") or 0) for s in by.values()), default=0)]
            for subject, by in rows.items()
        ],
        caption="median [95% CI] of the per-request figures",
    )


def warnings_list(ws: Sequence[Mapping[str, Any]]) -> str:
    items = grouped([Warning.from_json(dict(w)) for w in ws])
    if not items:
        return ""
    lis = "".join(f"<li>{esc(msg)}<br><span class=dim>→ {esc(remedy)}</span></li>" for msg, remedy in items)
    return f'<ul class="warnings">{lis}</ul>'


def run_block(rr: RunReport) -> str:
    r = rr.run
    head = (
        f"<h3>Run {r.id} · {esc(r.label)} {badge(str(r.kind))} "
        f"{badge(str(r.status), STATUS_TONE.get(r.status, ''))}</h3>"
    )
    if r.kind == RunKind.BENCH:
        body = _workloads(rr.derived) + _prediction(rr.prediction) + warnings_list(rr.derived.get("warnings") or [])
    else:
        body = _metrics(rr.derived)
        if r.kind == RunKind.SERVE_BENCH:
            body += '<p class="dim">latency and throughput per load level: <a href="#serve">serve-bench</a></p>'
    return f'<article class="run" id="run-{r.id}">{head}{_context(rr)}{body}</article>'


def runs_section(runs: Sequence[RunReport]) -> str:
    if not runs:
        return note("no runs given: only the plan (name runs by id, label or `latest` to add them)")
    return "".join(run_block(rr) for rr in runs)


# -- comparison ---------------------------------------------------------------------------------

VERDICT_TONE = {FASTER: "good", SLOWER: "bad"}


def _cmp_cell(r: CompareRow | None) -> Cell:
    if r is None:
        return None
    tone = "warn" if r.noisy else VERDICT_TONE.get(r.verdict, "dim")
    return Raw(
        f"<b>{esc(fmt(r.median))}</b> <span class=dim>[{esc(fmt(r.ci_low))}–{esc(fmt(r.ci_high))}]</span>"
        f'<br><span class="verdict-{tone}">{esc(f"{r.change_pct:+.1f}% {verdict_text(r)}")}</span>'
    )


def comparison_tables(c: Comparison) -> str:
    """One table per metric family (TG, PP, TTFT…): a row per run, a column per workload or level."""
    by = {(r.run, r.metric): r for r in c.rows}
    order = {c.baseline.run: 0, **{o.run: i + 1 for i, o in enumerate(c.others)}}
    out = []
    for fam, names in families(c).items():
        unit = c.baseline.metrics[names[0]].unit
        base: list[Cell] = [c.baseline.label, c.baseline.run]
        for nm in names:
            s = c.baseline_stats[nm]
            base.append(
                Raw(
                    f"<b>{esc(fmt(s.median))}</b> <span class=dim>[{esc(fmt(s.ci_low))}–"
                    f"{esc(fmt(s.ci_high))}]</span><br><span class=dim>baseline</span>"
                )
            )
        rows = [base] + [[o.label, o.run, *(_cmp_cell(by.get((o.run, nm))) for nm in names)] for o in c.others]
        out.append(f"<h4>{esc(fam.upper())} ({esc(unit)})</h4>")
        out.append(table(["run", "id", *(nm.split(":", 1)[-1] for nm in names)], rows, cls="compare"))
        bars = []
        for nm in names:
            pre = "" if len(names) == 1 else f"{nm.split(':', 1)[-1]} · "  # one metric: the run alone names a bar
            s = c.baseline_stats[nm]
            bars.append(
                Interval(
                    label=pre + c.baseline.label, median=s.median, low=s.ci_low, high=s.ci_high, color=run_color(0)
                )
            )
            for o in c.others:
                r = by.get((o.run, nm))
                if r is not None:
                    bars.append(
                        Interval(
                            label=pre + o.label,
                            median=r.median,
                            low=r.ci_low,
                            high=r.ci_high,
                            color=run_color(order[o.run]),
                        )
                    )
        out.append(
            figure(
                f"{fam.upper()}: median and {c.conf * 100:.0f}% CI per run",
                interval_bars(bars, unit=f"{fam.upper()} ({unit})", width=720, label_w=240),
            )
        )
    return "".join(out) + note(legend(c), "dim")


def paired_tables(c: PairedComparison) -> str:
    """`compare --paired`'s rows (the paired verdict, the unpaired one beside it) and, per metric, each
    configuration's ratio to the baseline with its interval (100% = the baseline, round by round)."""
    rows: list[list[Cell]] = []
    for r in c.rows:
        tone = "warn" if r.noisy else VERDICT_TONE.get(r.verdict, "dim")
        rows.append(
            [
                r.label,
                r.metric,
                f"{fmt(r.baseline_median)} → {fmt(r.median)} {r.unit}",
                ratios_cell(r),
                Raw(f'<span class="verdict-{tone}">{esc(paired_cell(r))}</span>'),
                Raw(f"<span class=dim>{esc(unpaired_cell(r))}</span>"),
            ]
        )
    out = [
        f"<h4>{esc(title(c))}</h4>",
        table(
            ["configuration", "metric", "median (pooled)", "ratio per round", "paired change [CI]", "unpaired"],
            rows,
            cls="compare",
        ),
    ]
    order = {o.label: i + 1 for i, o in enumerate(c.others)}
    for metric in c.metric_names():
        bars = []
        for r in c.rows:
            if r.metric == metric:
                lo, hi = r.paired.ratio_ci_low, r.paired.ratio_ci_high
                if not (math.isfinite(lo) and math.isfinite(hi)):  # one round: no interval
                    lo = hi = r.paired.ratio
                bars.append(
                    Interval(
                        label=r.label,
                        median=100 * r.paired.ratio,
                        low=100 * lo,
                        high=100 * hi,
                        color=run_color(order.get(r.label, 0)),
                    )
                )
        out.append(
            figure(
                f"{metric}: paired ratio to {c.baseline.label} and its {c.conf * 100:.0f}% interval",
                interval_bars(bars, unit=f"% of {c.baseline.label}", width=720, label_w=240),
            )
        )
    return "".join(out) + note(paired_legend(c), "dim")


def compare_section(
    c: Comparison | None, notes: Sequence[str], n_runs: int, paired: PairedComparison | None = None
) -> str:
    parts = []
    if paired is not None:
        parts.append(paired_tables(paired))
        notes = [*paired.notes, *notes]
    elif c is not None:
        parts.append(comparison_tables(c))
    elif n_runs < 2:
        parts.append(note("no comparison: it needs two or more runs (the first is the baseline)"))
    parts += [note(x, "warn-note") for x in notes]
    return "".join(parts)
