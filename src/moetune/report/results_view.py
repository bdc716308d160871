"""The history as tables and exports: `moetune results list|show|export`.

Exports carry every raw sample: JSON as stored (``schema_version``ed), CSV one row per sample
with the derived figures beside the raw ones in SI units (seconds, tokens/s), Markdown as a
readable summary. Figures are recomputed from the samples, never read from a cache.
"""

from __future__ import annotations

import csv
import json
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TextIO

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from moetune.bench.analysis import single as m
from moetune.bench.analysis.bench_summary import BenchSummary, Stat
from moetune.bench.analysis.level_summary import LevelSummary
from moetune.bench.analysis.serve import key_name
from moetune.bench.analysis.stats import DEFAULT_CONF, MetricSamples, median, summarize
from moetune.bench.analysis.summary import run_summary
from moetune.bench.analysis.warnings import grouped
from moetune.kinds import RunKind
from moetune.report.compare import METRIC_EXTRACTORS
from moetune.report.compare_view import fmt
from moetune.store.db import ResultsDB, Run

EXPORT_SCHEMA_VERSION = 1


def derived(run: Run, samples: Iterable[dict[str, object]], *, seed: int = 0) -> dict[str, Any]:
    """A run's figures from its measured samples (bench: the full summary; other kinds: their
    metrics, the samples read once: a long serve-bench run is streamed, never held)."""
    if run.kind == RunKind.BENCH:
        return run_summary(list(samples), seed=seed)
    fn = METRIC_EXTRACTORS.get(run.kind)
    return metric_figures(fn(samples) if fn is not None else {}, seed=seed)


def metric_figures(metrics: dict[str, MetricSamples], *, seed: int = 0) -> dict[str, object]:
    """``{metrics: {name: {median, ci_low, ci_high, ..., unit}}}`` of a run that is not a bench run."""
    return {"metrics": {k: {**summarize(v.values, seed=seed).to_json(), "unit": v.unit} for k, v in metrics.items()}}


def headline(run: Run, samples: Callable[[int], Iterable[dict[str, object]]]) -> str:
    """Two medians for a line of `results list`: TG and PP of a bench run's first workload, TTFT and
    TPOT (ms) of a serve-bench run's first level, from the figures the run stored when it ended (a
    long serve-bench run's samples take seconds to read); a run without them (still running, or
    of another kind), from its samples."""
    s = run.summary or {}
    if run.kind == RunKind.BENCH and s.get("workloads"):
        bench = BenchSummary.from_json(s)
        w = next(iter(bench.workloads))
        return ", ".join(f"{fam}:{w} {fmt(med)}" for fam in ("tg", "pp") if (med := bench.median(w, fam)) is not None)
    if run.kind == RunKind.SERVE_BENCH and s.get("levels"):
        lv = LevelSummary.from_json(s["levels"][0])
        name = key_name((lv.service, lv.load, lv.concurrency, lv.rate))
        return ", ".join(
            f"{fam}:{name} {fmt(p50)}"
            for fam, p50 in (("ttft", lv.ttft_ms.p50), ("tpot", lv.tpot_ms.p50))
            if p50 is not None
        )
    fn = METRIC_EXTRACTORS.get(run.kind)
    if fn is None:
        return ""
    ms = fn(samples(run.id))
    names = [n for n in ms if n.split(":")[0] in ("tg", "pp", "ttft", "tpot")] or list(ms)
    return ", ".join(f"{name} {fmt(median(ms[name].values))}" for name in names[:2])


def runs_table(db: ResultsDB, runs: list[Run]) -> Table:
    t = Table()
    for c in ("run", "kind", "label", "status", "flags", "started (UTC)", "samples", "median", "target"):
        t.add_column(c, justify="right" if c in ("run", "samples") else "left")
    for r in runs:
        counts = db.sample_counts(r.id)
        status = "abandoned" if r.abandoned else str(r.status)
        style = {"done": "", "running": "yellow", "interrupted": "yellow", "failed": "red", "abandoned": "red"}[status]
        t.add_row(
            str(r.id),
            r.kind,
            r.label,
            Text(status, style=style),
            Text(" ".join(r.flags().markers), "yellow"),
            r.created_at[:19].replace("T", " "),
            str(counts.get("measure", 0)),
            headline(r, db.iter_samples),
            r.target,
        )
    return t


def runs_json(db: ResultsDB, runs: list[Run]) -> list[dict[str, object]]:
    out = []
    for r in runs:
        d = r.to_json()
        d.pop("meta")
        d.pop("summary")
        d["samples"] = db.sample_counts(r.id)
        out.append(d)
    return out


def _context_lines(run: Run) -> list[str]:
    """What a run measured and how, from its record: the same lines for every kind of run."""
    m = run.meta
    status = f"{run.status}, abandoned: the moetune process writing it is gone" if run.abandoned else run.status
    lines = [
        f"run {run.id}: {run.label} ({run.kind}, {status})",
        f"target: {run.target}",
        f"started: {run.created_at}   finished: {run.finished_at or '-'}",
    ]
    if m.server is not None:
        slots = f", {m.server.slots} slots" if m.server.slots else ""
        lines.append(f"server: {m.server.url or '-'} ({m.server.dialect}{slots})")
    if run.kind != RunKind.LINK_TEST:
        lines.append(f"engine build: {m.engine_build or '-'}")
        name = f" as {m.model.name!r}" if m.model.name else ""
        lines.append(f"model: {m.model.path or '-'}{name} (fingerprint {m.model.fingerprint or '-'})")
    else:
        d = m.details
        lines.append(
            f"link: {d.get('from', '?')} -> {d.get('to', '?')} at {d.get('addr', '?')}:{d.get('port', '?')} "
            f"({d.get('tool', '?')}, {d.get('duration_s', '?')} s per test)"
        )
    if m.launch_run:
        lines.append(f"launched: run {m.launch_run} (`moetune ps`; its logs: `moetune doctor {m.launch_run}`)")
    if m.launch is not None:
        lines.append(f"transport: {m.launch.describe()}")
    lines.append(f"host: {m.host.describe()}")
    if (c := run.contention) is not None:
        lines.append(
            f"CPU while measuring: the engine {c.engine_cores:.2f} cores, moetune {c.client_cores:.2f}, "
            f"foreign {c.foreign_cores:.2f} (peak {c.foreign_peak_cores:.2f}) of {c.cores}"
            + (
                " (contended)"
                if c.contended
                else ""
                if c.judged
                else " (not judged: the engine's processes were not seen on this machine)"
            )
        )
    lines.append(f"command: {shlex.join(m.argv) or '-'}")  # quoted: it pastes back into a shell
    return lines


def workloads_table(summary: BenchSummary | Mapping[str, object], conf: float = DEFAULT_CONF) -> Table:
    """A bench run's figures per workload (its :class:`BenchSummary`, or the summary's JSON)."""
    bench = summary if isinstance(summary, BenchSummary) else BenchSummary.from_json(summary)
    t = Table(title=f"median [{conf * 100:.0f}% CI], tokens/s", title_justify="left")
    for c in ("workload", "TG", "PP", "n", "CV TG", "prompt", "output", "cached", "overhead ms", "client TG"):
        t.add_column(c, justify="left" if c == "workload" else "right")

    def cell(s: Stat | None) -> str:
        if s is None:
            return "–"
        label = " (client)" if s.source == "client" else ""  # no server timings: the client's clock
        return f"{fmt(s.median)} [{fmt(s.ci_low)}, {fmt(s.ci_high)}]{label}"

    def num(x: float | None, f: str = "{:.0f}") -> str:
        if x is None:
            return "–"
        t = f.format(x)
        return t.lstrip("-") if t.strip("-0.") == "" else t  # no "-0.0" for a value just below zero

    for w, d in bench.workloads.items():
        cached = num(d.cached_n)
        if d.cache_confirmed is not None:
            cached += " ✓" if d.cache_confirmed == 1 else f" ({d.cache_confirmed * 100:.0f}% as expected)"
        t.add_row(
            w,
            cell(d.tg),
            cell(d.pp),
            str(d.n),
            num(d.tg.cv * 100 if d.tg else None, "{:.1f}%"),
            num(d.prompt_n if d.prompt_n is not None else d.prompt_tokens),
            num(d.predicted_n),
            cached,
            num(d.overhead_ms, "{:.1f}"),
            num(d.client.tg, "{:.1f}"),
        )
    return t


def prediction_lines(rep: dict[str, Any] | None) -> list[str]:
    """The plan's prediction beside the measurement, and each device's share of its bandwidth."""
    if not rep:
        return []
    out = ["predicted vs measured (tokens/s; error = predicted over measured):"]
    for name, row in rep["prediction_error"].items():
        cells = []
        for fam in ("tg", "pp"):
            r = row[fam]
            if r["measured"] is None:
                continue
            err = "" if r["error_pct"] is None else f" ({r['error_pct']:+.0f}%{' !' if r.get('outside') else ''})"
            cells.append(f"{fam.upper()} {fmt(r['predicted'])} vs {fmt(r['measured'])}{err}")
        if cells:
            out.append(f"  {name}: " + ", ".join(cells))
    for mp in rep.get("mispredicted", []):
        out.append(
            f"  ! {mp['workload']} {mp['family'].upper()}: off by {mp['error_pct']:+.0f}%, beyond the model's stated "
            f"+/-{mp['band_pct']:.0f}%: the speed model does not describe this configuration yet; "
            "`moetune calibrate` learns from this run"
        )
    eff = [e for e in rep["efficiency"] if e["pct"] is not None]
    if eff:
        out.append(
            "decode bandwidth reached (first workload): "
            + ", ".join(
                f"{e['device']} {e['bytes_per_s'] / 1e9:.1f} of {e['limit_bytes_per_s'] / 1e9:.0f} GB/s ({e['pct']:.0f}%)"
                for e in eff
            )
        )
    return out


def show(run: Run, summary: dict[str, Any], counts: dict[str, int]) -> RenderableType:
    parts: list[RenderableType] = [Text("\n".join(_context_lines(run)))]
    parts.append(Text(f"samples: {', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'none'}", style="dim"))
    if run.kind == RunKind.BENCH:
        parts.append(workloads_table(summary))
        from moetune.bench.analysis.predicted import report

        lines = prediction_lines(report(summary, dict(run.meta.details)))
        if lines:
            parts.append(Text("\n".join(lines)))
    else:
        if summary.get("layout"):
            from moetune.report.layout_view import layout_tables, service_lines

            lay = summary["layout"]
            parts.append(Text("\n".join(service_lines(lay["services"]))))
            parts += layout_tables({"levels": lay["levels"], "layout": lay})
        t = Table()
        for c in ("metric", "median", "CI", "n", "unit"):
            t.add_column(c)
        for k, s in summary.get("metrics", {}).items():
            t.add_row(k, fmt(s["median"]), f"[{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]", str(s["n"]), s["unit"])
        parts.append(t)
    return Group(*parts)


# -- exports -----------------------------------------------------------------------------------


def export_json(db: ResultsDB, runs: list[Run], out: TextIO) -> None:
    """``{schema_version, db, runs: [{...run, derived, samples: [{phase, seq, created_at, data}]}]}``,
    written a sample a line as the samples are read (a long run is never held whole)."""
    out.write(f'{{"schema_version": {EXPORT_SCHEMA_VERSION}, "db": {json.dumps(str(db.path))}, "runs": [')
    for i, r in enumerate(runs):
        d = r.to_json()
        d["derived"] = derived(r, db.iter_samples(r.id))
        out.write(("\n" if i == 0 else ",\n") + json.dumps(d, default=str)[:-1] + ', "samples": [')
        for j, s in enumerate(db.iter_sample_rows(r.id)):
            row = {"phase": s.phase, "seq": s.seq, "created_at": s.created_at, "data": s.data}
            out.write(("\n" if j == 0 else ",\n") + json.dumps(row, default=str))
        out.write("]}")
    out.write("\n]}\n")


BENCH_COLUMNS = (
    "workload",
    "depth",
    "thinking",
    "repeat",
    "t_unix_s",
    "prompt_n",
    "prompt_s",
    "predicted_n",
    "predicted_s",
    "cached_n",
    "wall_s",
    "overhead_s",
    "pp_tokens_per_s",
    "tg_tokens_per_s",
    "client_ttft_s",
    "client_tg_tokens_per_s",
    "finish_reason",
    "reasoning_chars",
    "content_chars",
)


def _bench_row(s: dict[str, object]) -> dict[str, object]:
    t = m.timings(s)

    def sec(ms: Any) -> float | None:
        return None if ms is None else float(ms) / 1000.0

    ttft = m.client_ttft_ms(s)
    return {
        "workload": s.get("workload"),
        "depth": s.get("depth"),
        "thinking": s.get("thinking"),
        "repeat": s.get("repeat"),
        "t_unix_s": s.get("t_unix_s"),
        "prompt_n": t.get("prompt_n"),
        "prompt_s": sec(t.get("prompt_ms")),
        "predicted_n": t.get("predicted_n"),
        "predicted_s": sec(t.get("predicted_ms")),
        "cached_n": m.cached_tokens(s),
        "wall_s": s.get("end_s"),
        "overhead_s": sec(m.overhead_ms(s)),
        "pp_tokens_per_s": m.pp_tps(s),
        "tg_tokens_per_s": m.tg_tps(s),
        "client_ttft_s": None if ttft is None else ttft / 1000.0,
        "client_tg_tokens_per_s": m.client_tg_tps(s),
        "finish_reason": s.get("finish_reason"),
        "reasoning_chars": s.get("reasoning_chars"),
        "content_chars": s.get("content_chars"),
    }


def _scalars(d: dict[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_scalars(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[prefix + k] = v
    return out


def export_csv(db: ResultsDB, runs: list[Run], out: TextIO) -> None:
    """One row per sample of every phase: run columns, then the figures (bench) or the flattened
    scalar raw values (other kinds). The samples are read twice, a batch at a time: once for the
    columns (every key any sample has), once for the rows."""

    def rows() -> Iterator[dict[str, object]]:
        for r in runs:
            for s in db.iter_sample_rows(r.id):
                base = {"run": r.id, "label": r.label, "kind": r.kind, "phase": s.phase, "seq": s.seq}
                yield {**base, **(_bench_row(s.data) if r.kind == RunKind.BENCH else _scalars(s.data))}

    cols: dict[str, None] = dict.fromkeys(("run", "label", "kind", "phase", "seq"))
    if any(r.kind == RunKind.BENCH for r in runs):
        cols.update(dict.fromkeys(BENCH_COLUMNS))
    for row in rows():
        cols.update(dict.fromkeys(row))
    w = csv.DictWriter(out, fieldnames=list(cols), lineterminator="\n")
    w.writeheader()
    for row in rows():
        w.writerow({k: "" if v is None else v for k, v in row.items()})


def export_md(db: ResultsDB, runs: list[Run], sink: TextIO) -> None:
    out: list[str] = []
    for r in runs:
        d = derived(r, db.iter_samples(r.id))
        out.append(f"## Run {r.id}: {r.label}\n")
        out += [f"- {line}" for line in _context_lines(r)[1:]]
        out.append(f"- status: {r.status}; measured samples: {db.sample_counts(r.id).get('measure', 0)}\n")
        if r.kind == RunKind.BENCH:
            out.append(
                "| workload | TG tokens/s (median [95% CI]) | PP tokens/s | n | prompt | output | cached "
                "| overhead ms |"
            )
            out.append("|---|---|---|---|---|---|---|---|")
            bench = BenchSummary.from_json(d)
            for w, x in bench.workloads.items():

                def c(s: Stat | None) -> str:
                    return "–" if s is None else f"{fmt(s.median)} [{fmt(s.ci_low)}, {fmt(s.ci_high)}]"

                def n(v: float | None) -> str:
                    return "–" if v is None else f"{v:.0f}"

                oh = x.overhead_ms
                out.append(
                    f"| {w} | {c(x.tg)} | {c(x.pp)} | {x.n} | {n(x.prompt_n)} | "
                    f"{n(x.predicted_n)} | {n(x.cached_n)} | "
                    f"{'–' if oh is None else f'{oh:.1f}'} |"
                )
            for message, remedy in grouped(list(bench.warnings)):
                out.append(f"\n> warning: {message}  \n> → {remedy}")
        else:
            out.append("| metric | median | 95% CI | n | unit |")
            out.append("|---|---|---|---|---|")
            for k, s in d.get("metrics", {}).items():
                out.append(
                    f"| {k} | {fmt(s['median'])} | [{fmt(s['ci_low'])}, {fmt(s['ci_high'])}] | {s['n']} | {s['unit']} |"
                )
        out.append("")
    sink.write("\n".join(out) + "\n")
