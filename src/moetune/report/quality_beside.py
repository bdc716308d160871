"""The quality of the plans a speed comparison measured: `moetune quality` runs of the same plans.

A bench run and a quality run come from the same plan when the plan documents they stored give the
same server command (its port aside: a plan re-rendered on another port is the same configuration).
The newest finished quality run of each plan is shown beside its speed, so a faster placement and
the KLD it costs (none, for a placement that moves the same arithmetic) are read together.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moetune.kinds import RunKind, RunStatus
from moetune.store.db import ResultsDB, Run

_VOLATILE = frozenset({"--port"})  # flags whose value does not change the configuration


@dataclass(frozen=True, slots=True, kw_only=True)
class QualityBeside:
    run: int  # the quality run
    reference: bool  # the run that saved the logits the others are measured against (no KLD of its own)
    kld_mean: float | None
    top1_agree: float | None
    ppl: float | None
    verdict: str | None  # the quality run's own: same | close | worse

    def text(self) -> str:
        if self.reference:
            return f"reference{'' if self.ppl is None else f', ppl {self.ppl:.4g}'} (run {self.run})"
        parts = [] if self.kld_mean is None else [f"KLD {self.kld_mean:.6f}"]
        if self.top1_agree is not None:
            parts.append(f"top-1 {self.top1_agree * 100:.1f}%")
        if self.verdict:
            parts.append(self.verdict)
        return f"{', '.join(parts) or 'no figures'} (run {self.run})"

    def to_json(self) -> dict[str, object]:
        return {
            "run": self.run,
            "reference": self.reference,
            "kld_mean": self.kld_mean,
            "top1_agree": self.top1_agree,
            "ppl": self.ppl,
            "verdict": self.verdict,
        }


def plan_identity(plan: Mapping[str, Any] | None) -> str | None:
    """The server command a plan document gives, without its port; None without one."""
    argv = (plan or {}).get("argv")
    if not isinstance(argv, list) or not argv:
        return None
    kept: list[str] = []
    skip = False
    for a in argv[1:]:
        if skip:
            skip = False
        elif a in _VOLATILE:
            skip = True
        else:
            kept.append(str(a))
    return json.dumps(kept)


def _mean(doc: Any) -> float | None:
    v = doc.get("mean") if isinstance(doc, Mapping) else None
    return float(v) if isinstance(v, int | float) else None


def beside(q: Run) -> QualityBeside:
    s = q.summary or {}
    return QualityBeside(
        run=q.id,
        reference=q.meta.details.get("role") == "reference",
        kld_mean=_mean(s.get("kld")),
        top1_agree=_mean(s.get("top1_agree")),
        ppl=_mean(s.get("ppl")),
        verdict=s.get("verdict") if isinstance(s.get("verdict"), str) else None,
    )


def quality_of(db: ResultsDB, runs: Sequence[Run]) -> dict[int, QualityBeside]:
    """For each speed run with a plan, the newest finished quality run of the same plan."""
    wanted: dict[str, list[int]] = {}
    for r in runs:
        if r.kind in (RunKind.QUALITY, RunKind.QA):
            continue
        if (ident := plan_identity(r.meta.plan)) is not None:
            wanted.setdefault(ident, []).append(r.id)
    if not wanted:
        return {}
    out: dict[int, QualityBeside] = {}
    for q in db.runs(RunKind.QUALITY, status=RunStatus.DONE):  # newest first: the first match stays
        ident = plan_identity(q.meta.plan)
        for rid in wanted.pop(ident, []) if ident is not None else []:
            out[rid] = beside(q)
        if not wanted:
            break
    return out
