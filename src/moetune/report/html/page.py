"""The whole page: a header, a table of contents, and the five sections (plan, runs, time series,
serve-bench, comparison), each with its stable id, each present even when it has nothing to show
(it says so). One HTML string with its style sheet inline; no script, nothing loaded."""

from __future__ import annotations

from moetune.report.html.data import ReportData
from moetune.report.html.markup import esc, section
from moetune.report.html.plan_section import plan_section
from moetune.report.html.runs_section import compare_section, runs_section
from moetune.report.html.serve_section import serve_section
from moetune.report.html.timeseries import timeseries_section

SECTIONS = (
    ("plan", "Plan"),
    ("runs", "Runs"),
    ("timeseries", "Machine during the runs"),
    ("serve", "Serve-bench: latency and throughput"),
    ("compare", "Comparison"),
)

CSS = """
:root { --fg: #1f2937; --dim: #6b7280; --line: #e5e7eb; --bg: #fff; --panel: #f9fafb;
  --good: #15803d; --bad: #b91c1c; --warn: #a16207; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: var(--bg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", "Liberation Sans", sans-serif; }
main { max-width: 1240px; margin: 0 auto; padding: 20px 28px 60px; }
header { border-bottom: 2px solid var(--fg); margin-bottom: 8px; padding-bottom: 8px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 12px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 16px; margin: 24px 0 8px; }
h4 { font-size: 14px; margin: 18px 0 6px; color: #374151; }
nav a { margin-right: 16px; color: #2563eb; text-decoration: none; }
nav a:hover { text-decoration: underline; }
.dim, .note.dim { color: var(--dim); }
.note { color: var(--dim); font-style: italic; }
.warn-note { color: var(--warn); }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13px; }
caption { text-align: left; color: var(--dim); padding-bottom: 4px; font-size: 12px; }
th, td { padding: 4px 10px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: var(--panel); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 6px 0 10px; }
dl.facts.cols { grid-template-columns: repeat(3, max-content minmax(0, 1fr)); }
dl.facts dt { color: var(--dim); }
dl.facts dd { margin: 0; overflow-wrap: anywhere; }
pre { background: var(--panel); border: 1px solid var(--line); padding: 10px 12px; overflow-x: auto;
  font-size: 12px; line-height: 1.4; }
code { font-family: ui-monospace, "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 12px; }
.badge { display: inline-block; font-size: 11px; font-weight: 600; padding: 1px 7px; border-radius: 9px;
  background: #e5e7eb; color: #374151; vertical-align: middle; margin-left: 4px; }
.badge.good { background: #dcfce7; color: var(--good); }
.badge.bad { background: #fee2e2; color: var(--bad); }
.badge.warn { background: #fef3c7; color: var(--warn); }
.verdict-good { color: var(--good); font-weight: 600; }
.verdict-bad { color: var(--bad); font-weight: 600; }
.verdict-warn { color: var(--warn); }
.verdict-dim { color: var(--dim); }
ul.shortfalls { margin: 6px 0; padding-left: 18px; color: var(--bad); font-weight: 600; }
ul.warnings { margin: 6px 0; padding-left: 18px; color: var(--warn); }
ul.warnings .dim { color: var(--dim); }
.plan, article.run, .ts, .serve-run { border: 1px solid var(--line); border-radius: 8px; padding: 4px 18px 12px;
  margin: 14px 0; }
.devices { display: grid; grid-template-columns: max-content minmax(0, 720px) 1fr; align-items: center;
  gap: 10px 14px; margin: 6px 0; }
.device { display: contents; }
.dev-name { font-weight: 600; }
.dev-sum { font-size: 12px; color: var(--dim); }
.dev-sum.over { color: var(--bad); font-weight: 600; }
svg { max-width: 100%; height: auto; overflow: visible; }
svg text { fill: #374151; font-family: inherit; }
svg text.tick { fill: var(--dim); }
svg text.axis-label { fill: #374151; font-size: 11px; }
svg text.phase-label { fill: #4b5563; }
svg text.seg-label { fill: #fff; }
svg text.value { fill: #111827; font-size: 10px; }
svg rect.cell:hover, .seg:hover rect { stroke: #111827; stroke-width: 1; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(540px, 1fr)); gap: 12px 24px; }
figure.chart { margin: 8px 0; }
figcaption { font-weight: 600; font-size: 13px; margin-bottom: 4px; }
ul.legend { list-style: none; padding: 0; margin: 4px 0 0; display: flex; flex-wrap: wrap; gap: 4px 16px;
  font-size: 12px; color: #374151; }
ul.legend li { display: flex; align-items: center; gap: 6px; }
ul.legend svg { flex: none; }
footer { margin-top: 40px; color: var(--dim); font-size: 12px; }
@media print { nav { display: none; } .plan, article.run, .ts, .serve-run { break-inside: avoid; } }
"""


def render_page(data: ReportData) -> str:
    """The report as one self-contained HTML document."""
    bodies = {
        "plan": plan_section(data.plans),
        "runs": runs_section(data.runs),
        "timeseries": timeseries_section(data.runs),
        "serve": serve_section(data.runs),
        "compare": compare_section(data.comparison, data.compare_notes, len(data.runs), data.paired),
    }
    what = []
    if data.plans:
        what.append(f"{len(data.plans)} plan{'s' if len(data.plans) > 1 else ''}")
    if data.runs:
        what.append(
            f"{len(data.runs)} run{'s' if len(data.runs) > 1 else ''}: "
            + ", ".join(f"{rr.run.id} ({rr.run.label})" for rr in data.runs)
        )
    title = "moetune report" + (f": {data.runs[0].run.label}" if len(data.runs) == 1 else "")
    nav = "".join(f'<a href="#{sid}">{esc(name)}</a>' for sid, name in SECTIONS)
    sections = "".join(section(sid, name, bodies[sid]) for sid, name in SECTIONS)
    source = f" · results from {data.db_path}" if data.db_path else ""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
        f"<header><h1>{esc(title)}</h1><div class=dim>{esc('; '.join(what) or 'nothing to show')}</div>"
        f"<nav>{nav}</nav></header>{sections}"
        f"<footer>made by moetune {esc(data.version)} at {esc(data.generated_at)}{esc(source)}; "
        "figures are derived from the stored raw samples; this page loads nothing from anywhere.</footer>"
        "</main></body></html>\n"
    )
