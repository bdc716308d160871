"""Tables of quality measurements: KLD runs against a reference, and multiple-choice soaks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from moetune.quality.kld import Candidate, Reference
    from moetune.quality.soak import SoakReport
    from moetune.quality.stats import Interval


def _iv(i: Interval | None, fmt: str, scale: float = 1.0) -> str:
    if i is None:
        return "-"
    return f"{i.mean * scale:{fmt}} [{i.ci_low * scale:{fmt}}, {i.ci_high * scale:{fmt}}]"


def kld_table(ref: Reference, cands: list[Candidate], conf: float) -> Table:
    t = Table(
        title=f"Against {ref.label} ({ref.tokens or '?'} tokens scored; {conf:.0%} intervals; "
        f"reference PPL {_iv(ref.ppl, '.3f')})"
    )
    for c in ("plan", "KLD", "KLD p99", "top-1 agree %", "PPL", "tokens", "interval", "verdict"):
        t.add_column(c, justify="left" if c in ("plan", "interval", "verdict") else "right")
    for k in cands:
        t.add_row(
            k.label,
            _iv(k.kld, ".6f"),
            "-" if k.kld_p99 is None else f"{k.kld_p99:.6f}",
            _iv(k.top1_agree, ".2f", 100.0),
            _iv(k.ppl, ".3f"),
            str(k.tokens),
            k.kld.method + ("" if k.complete else " (no summary)"),
            k.verdict,
        )
    return t


def soak_table(rep: SoakReport) -> Table:
    t = Table(
        title=f"{rep.n_questions} questions; {rep.conf:.0%} Wilson intervals; paired against "
        f"{rep.runs[0].label} (McNemar's exact test)"
    )
    for c in ("configuration", "accuracy %", "right", "unparsable", "agree %", "b / c", "p", "verdict"):
        t.add_column(c, justify="left" if c in ("configuration", "verdict") else "right")
    for i, r in enumerate(rep.runs):
        p = rep.paired[i - 1] if i else None
        t.add_row(
            r.label,
            f"{r.accuracy * 100:.2f} [{r.ci_low * 100:.2f}, {r.ci_high * 100:.2f}]",
            f"{r.right}/{r.n}",
            str(r.unparsable),
            "-" if p is None else f"{p.agreement * 100:.1f}",
            "-" if p is None else f"{p.only_baseline} / {p.only_candidate}",
            "-" if p is None else f"{p.p_value:.3g}",
            "baseline" if p is None else p.verdict,
        )
    return t
