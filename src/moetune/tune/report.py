"""What `moetune tune` prints: the JSON document of its contract, and the table of candidates."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from moetune.tune.loop import TuneResult, predicted_rates

ROWS_NOT_LAUNCHED = 5  # the table shows the launched candidates and this many of the rest


def _ci(stat: dict[str, Any] | None) -> dict[str, Any] | None:
    if not stat:
        return None
    return {"median": stat["median"], "ci_low": stat["ci_low"], "ci_high": stat["ci_high"]}


def _measured(r: TuneResult, i: int) -> dict[str, Any] | None:
    s = r.summaries.get(i)
    if s is None:
        return None
    w: dict[str, Any] = next(iter(s.get("workloads", {}).values()), {})
    return {"tg_tok_s": _ci(w.get("tg")), "pp_tok_s": _ci(w.get("pp")), "run": r.entries[i].run}


def _head(r: TuneResult, i: int) -> dict[str, Any]:
    m = _measured(r, i) or {}
    return {"label": r.entries[i].candidate.label, "tg_tok_s": m.get("tg_tok_s"), "pp_tok_s": m.get("pp_tok_s"),
            "run": r.entries[i].run}


def result_json(r: TuneResult) -> dict[str, Any]:
    cands = []
    for i, e in enumerate(r.entries):
        tg, pp = predicted_rates(e, r.constants, r.workload)
        cands.append({"label": e.candidate.label, "launched": e.run is not None or e.failed is not None,
                      "fits": e.fits, "predicted": {"tg_tok_s": round(tg, 3), "pp_tok_s": round(pp, 3)},
                      "measured": _measured(r, i), "verdict": r.verdicts.get(i, "")})
    return {"tune": r.tune_id, "objective": r.objective, "launches": r.launches, "stopped": r.stopped,
            "baseline": _head(r, r.baseline), "best": _head(r, r.best), "candidates": cands,
            "constants": asdict(r.constants)}


def result_table(r: TuneResult) -> Any:
    from rich.table import Table

    from moetune.report.compare_view import fmt

    doc = result_json(r)
    t = Table(title=f"tune {r.tune_id}: objective {r.objective}", title_justify="left")
    for c in ("candidate", "predicted TG", "predicted PP", "TG [95% CI]", "PP [95% CI]", "verdict"):
        t.add_column(c)
    launched = [c for c in doc["candidates"] if c["launched"]]
    rest = sorted((c for c in doc["candidates"] if not c["launched"] and c["fits"]),
                  key=lambda c: -c["predicted"][f"{r.objective}_tok_s" if r.objective != "ttft" else "tg_tok_s"])
    for c in [*launched, *rest[:ROWS_NOT_LAUNCHED]]:
        m = c["measured"] or {}

        def cell(stat: dict[str, Any] | None) -> str:
            return "" if not stat else f"{fmt(stat['median'])} [{fmt(stat['ci_low'])}-{fmt(stat['ci_high'])}]"

        t.add_row(c["label"], fmt(c["predicted"]["tg_tok_s"]), fmt(c["predicted"]["pp_tok_s"]),
                  cell(m.get("tg_tok_s")), cell(m.get("pp_tok_s")), c["verdict"])
    return t
