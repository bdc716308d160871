"""How a comparison looks: the reference report's table (one row per configuration, a column per
metric), with each cell's interval and change, as a rich table, Markdown or CSV."""

from __future__ import annotations

import csv
import io

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from moetune.bench.analysis.stats import FASTER, SAME, SLOWER
from moetune.report.compare import CompareRow, Comparison, RunMetrics
from moetune.store.record import NO_RPC

VERDICT_TEXT = {FASTER: "faster", SLOWER: "slower", SAME: "same"}
VERDICT_STYLE = {FASTER: "green", SLOWER: "red", SAME: "dim"}
# families whose metrics measure something other than speed: a lower KLD is better, not faster
FAMILY_WORDS = {"quality": {FASTER: "better", SLOWER: "worse", SAME: "same"}}


def verdict_text(r: CompareRow) -> str:
    return FAMILY_WORDS.get(r.family, VERDICT_TEXT)[r.verdict] + (" (noisy)" if r.noisy else "")


def fmt(x: float) -> str:
    return f"{x:,.1f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"


def families(c: Comparison) -> dict[str, list[str]]:
    """Compared metrics grouped as the reference report groups its tables: TG, then PP, …"""
    out: dict[str, list[str]] = {}
    for n in c.metric_names():
        ms = c.baseline.metrics[n]
        out.setdefault(ms.family or n.split(":")[0], []).append(n)
    return out


def _short(name: str) -> str:
    return name.split(":", 1)[-1]


def _rpc(runs: list[RunMetrics]) -> bool:
    return any(r.transport not in (None, NO_RPC) for r in runs)


def transports(runs: list[RunMetrics]) -> dict[int, str] | None:
    """Each run's RPC transport as its launch confirmed it (``none`` without RPC, ``-`` for a run
    moetune did not launch); None when no run used RPC (no column then)."""
    if not _rpc(runs):
        return None
    return {r.run: r.transport or "-" for r in runs}


def transport_line(runs: list[RunMetrics]) -> str | None:
    """``transport (confirmed at launch): A TCP, B RDMA``, for views with a row per metric; None
    when no run used RPC."""
    if not _rpc(runs):
        return None
    return "transport (confirmed at launch): " + ", ".join(f"{r.label} {r.transport or '-'}" for r in runs)


def _cells(c: Comparison, names: list[str]) -> list[tuple[str, int, dict[str, tuple[str, CompareRow | None]]]]:
    by: dict[tuple[int, str], CompareRow] = {(r.run, r.metric): r for r in c.rows}
    base: dict[str, tuple[str, CompareRow | None]] = {}
    for n in names:
        s = c.baseline_stats[n]
        base[n] = (f"{fmt(s.median)} [{fmt(s.ci_low)}–{fmt(s.ci_high)}]", None)
    lines = [(c.baseline.marked, c.baseline.run, base)]
    for o in c.others:
        row: dict[str, tuple[str, CompareRow | None]] = {}
        for n in names:
            r = by.get((o.run, n))
            row[n] = (f"{fmt(r.median)} [{fmt(r.ci_low)}–{fmt(r.ci_high)}]", r) if r else ("–", None)
        lines.append((o.marked, o.run, row))
    return lines


def _unit(c: Comparison, names: list[str]) -> str:
    return c.baseline.metrics[names[0]].unit if names else ""


def quality_line(c: Comparison) -> str | None:
    """``quality of the same plans (moetune quality): A reference…; B KLD …``; None when no run has one."""
    runs = [c.baseline, *c.others]
    if not any(r.quality for r in runs):
        return None
    return "quality of the same plans (moetune quality): " + "; ".join(
        f"{r.label} {r.quality.text() if r.quality else 'not measured'}" for r in runs
    )


def legend(c: Comparison) -> str:
    worded = sorted({r.family for r in c.rows if r.family in FAMILY_WORDS})
    words = "faster/slower" + (f" (better/worse for {', '.join(worded)})" if worded else "")
    return (
        f"median [{c.conf * 100:.0f}% CI]; change vs baseline {c.baseline.label} (run {c.baseline.run}): "
        f"{words} when the {c.conf * 100:.0f}% CI of the ratio of medians excludes 1 and the change is "
        f"at least {c.min_change * 100:g}%, else same (no significant difference); same (noisy): the medians "
        f"differ more than that, but the runs are too noisy to tell"
    )


def comparison_table(c: Comparison) -> Group:
    """One table per metric family (TG, PP…): a row per configuration, a column per workload."""
    tables: list[RenderableType] = []
    tr = transports([c.baseline, *c.others])
    for fam, names in families(c).items():
        t = Table(title=f"{fam.upper()} ({_unit(c, names)})", title_justify="left")
        t.add_column("configuration")
        t.add_column("run", justify="right")
        if tr is not None:
            t.add_column("transport")
        for n in names:
            t.add_column(_short(n), justify="right")
        for i, (label, run, cells) in enumerate(_cells(c, names)):
            # Text(label): a label's [brackets] are not markup
            row: list[str | Text] = [Text(label), str(run), *([tr[run]] if tr is not None else [])]
            for n in names:
                text, r = cells[n]
                cell = Text(text)
                if i == 0:
                    cell.append("\nbaseline", style="dim")
                elif r is not None:
                    cell.append(
                        f"\n{r.change_pct:+.1f}% {verdict_text(r)}",
                        style="yellow" if r.noisy else VERDICT_STYLE[r.verdict],
                    )
                row.append(cell)
            t.add_row(*row)
        tables.append(t)
    if q := quality_line(c):
        tables.append(Text(q))
    tables.append(Text(legend(c), style="dim"))
    return Group(*tables)


def comparison_markdown(c: Comparison) -> str:
    out: list[str] = []
    tr = transports([c.baseline, *c.others])
    for fam, names in families(c).items():
        head = ["configuration", "run", *(["transport"] if tr is not None else []), *[_short(n) for n in names]]
        out += [f"**{fam.upper()}** ({_unit(c, names)})", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for i, (label, run, cells) in enumerate(_cells(c, names)):
            vals = []
            for n in names:
                text, r = cells[n]
                if i == 0:
                    text += " baseline"
                elif r is not None:
                    text += f" {r.change_pct:+.1f}% {verdict_text(r)}"
                vals.append(text)
            out.append("| " + " | ".join([label, str(run), *([tr[run]] if tr is not None else []), *vals]) + " |")
        out.append("")
    if q := quality_line(c):
        out += [q, ""]
    return "\n".join(out) + legend(c) + "\n"


def comparison_csv(c: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "run",
            "label",
            "metric",
            "unit",
            "n",
            "median",
            "ci_low",
            "ci_high",
            "baseline_run",
            "baseline_median",
            "change_pct",
            "change_ci_low_pct",
            "change_ci_high_pct",
            "verdict",
            "noisy",
        ]
    )
    for r in c.rows:
        w.writerow(
            [
                r.run,
                r.label,
                r.metric,
                r.unit,
                r.n,
                r.median,
                r.ci_low,
                r.ci_high,
                c.baseline.run,
                r.baseline_median,
                r.change_pct,
                r.change_ci_low_pct,
                r.change_ci_high_pct,
                r.verdict,
                r.noisy,
            ]
        )
    return buf.getvalue()
