"""How a paired comparison looks: a row per (configuration, metric) with the per-round ratios, the
paired change and its interval and verdict, and the unpaired verdict of the same samples beside
it; as a rich table, Markdown or CSV."""

from __future__ import annotations

import csv
import io

from rich.console import Group
from rich.table import Table
from rich.text import Text

from moetune.report.compare_view import VERDICT_STYLE, VERDICT_TEXT, fmt, transport_line
from moetune.report.paired import PairedComparison, PairedRow


def _verdict(verdict: str, noisy: bool) -> str:
    return VERDICT_TEXT[verdict] + (" (noisy)" if noisy else "")


def _change(change: float, lo: float, hi: float) -> str:
    if hi == float("inf"):
        return f"{change:+.1f}% [no interval]"
    return f"{change:+.1f}% [{lo:+.1f}, {hi:+.1f}]"


def paired_cell(r: PairedRow) -> str:
    lo, hi = r.paired.change_ci_pct
    return f"{_change(r.paired.change_pct, lo, hi)} {_verdict(r.verdict, r.noisy)}"


def unpaired_cell(r: PairedRow) -> str:
    lo, hi = r.unpaired.change_ci_pct
    return f"{_change(r.unpaired.change_pct, lo, hi)} {_verdict(r.unpaired.verdict, r.unpaired_noisy)}"


def ratios_cell(r: PairedRow) -> str:
    return " ".join(f"{c.ratio:.3f}" for c in r.per_round)


def title(c: PairedComparison) -> str:
    how = {"launches": "a launch per plan per round", "batches": "the servers up, batches alternating"}
    n = len(c.rounds)
    what = f"sweep {c.sweep}, " if c.sweep else ""
    return (
        f"paired over {n} round{'s' if n != 1 else ''} ({what}{how.get(c.mode or '', 'runs paired in order')}); "
        f"baseline {c.baseline.label}"
    )


def legend(c: PairedComparison) -> str:
    pct = f"{c.conf * 100:.0f}%"
    return (
        f"ratio per round: the configuration's median over the baseline's in the same round; paired change: "
        f"their geometric mean, [{pct} t interval of the mean log ratio across rounds]; faster/slower when the "
        f"interval excludes 0% and the change is at least {c.min_change * 100:g}%, else same; unpaired: every "
        f"round's samples pooled, as `compare` judges separate runs (drift between rounds counts as noise)"
    )


def paired_table(c: PairedComparison) -> Group:
    t = Table(title=title(c), title_justify="left")
    for name, just in (
        ("configuration", "left"),
        ("metric", "left"),
        ("median (pooled)", "right"),
        ("ratio per round", "right"),
        ("paired change [CI]", "right"),
        ("unpaired", "right"),
    ):
        t.add_column(name, justify=just)  # type: ignore[arg-type]
    for r in c.rows:
        t.add_row(
            r.label,
            r.metric,
            f"{fmt(r.baseline_median)} → {fmt(r.median)} {r.unit}",
            ratios_cell(r),
            Text(paired_cell(r), style="yellow" if r.noisy else VERDICT_STYLE[r.verdict]),
            Text(unpaired_cell(r), style="dim"),
        )
    tr = transport_line([c.baseline, *c.others])
    return Group(t, *([Text(tr)] if tr else []), Text(legend(c), style="dim"))


def paired_markdown(c: PairedComparison) -> str:
    head = ["configuration", "metric", "median (pooled)", "ratio per round", "paired change [CI]", "unpaired"]
    out = [f"**{title(c)}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in c.rows:
        out.append(
            "| "
            + " | ".join(
                [
                    r.label,
                    r.metric,
                    f"{fmt(r.baseline_median)} → {fmt(r.median)} {r.unit}",
                    ratios_cell(r),
                    paired_cell(r),
                    unpaired_cell(r),
                ]
            )
            + " |"
        )
    tr = transport_line([c.baseline, *c.others])
    return "\n".join(out) + "\n\n" + (f"{tr}\n\n" if tr else "") + legend(c) + "\n"


def paired_csv(c: PairedComparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "label",
            "metric",
            "unit",
            "rounds",
            "ratios",
            "baseline_median",
            "median",
            "ratio",
            "change_pct",
            "change_ci_low_pct",
            "change_ci_high_pct",
            "verdict",
            "noisy",
            "unpaired_change_pct",
            "unpaired_verdict",
            "unpaired_noisy",
        ]
    )
    for r in c.rows:
        lo, hi = r.paired.change_ci_pct
        w.writerow(
            [
                r.label,
                r.metric,
                r.unit,
                r.paired.rounds,
                " ".join(f"{x:.6g}" for x in r.paired.ratios),
                r.baseline_median,
                r.median,
                r.paired.ratio,
                r.paired.change_pct,
                lo,
                hi,
                r.verdict,
                r.noisy,
                r.unpaired.change_pct,
                r.unpaired.verdict,
                r.unpaired_noisy,
            ]
        )
    return buf.getvalue()


VIEWS = (paired_markdown, paired_csv, paired_table)
