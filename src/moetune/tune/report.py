"""What `moetune tune` prints: the JSON document of its contract, and the table of candidates."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from moetune.bench.analysis.stats import summarize
from moetune.plan.serving import predict_serving
from moetune.tune import defaults as dflt
from moetune.tune.loop import TuneResult, predicted_rates

ROWS_NOT_LAUNCHED = 5  # the table shows the launched candidates and this many of the rest


def _ci(stat: dict[str, Any] | None) -> dict[str, Any] | None:
    if not stat:
        return None
    return {"median": stat["median"], "ci_low": stat["ci_low"], "ci_high": stat["ci_high"]}


def _goodput(r: TuneResult, i: int) -> dict[str, Any] | None:
    """A candidate's measured goodput: the median of its completion windows with its 95% bootstrap
    interval, and serve-bench's own figure of the level (met requests over its span)."""
    g = r.goodputs.get(i)
    if g is None or not g.values:
        return None
    s = summarize(g.values)
    level = g.level.get("goodput") or {}
    return {"median": s.median, "ci_low": s.ci_low, "ci_high": s.ci_high, "n": s.n, "level_req_s": g.level_req_s,
            "share": level.get("share"), "met": level.get("met"), "of": level.get("of")}


def _serve(r: TuneResult, i: int) -> dict[str, Any] | None:
    g = r.goodputs.get(i)
    if g is None:
        return None
    lv = g.level
    return {"request_s": lv.get("request_s"), "output_tok_s": lv.get("output_tok_s"),
            "ttft_ms_p50": (lv.get("ttft_ms") or {}).get("p50"), "itl_ms_p50": (lv.get("itl_ms") or {}).get("p50"),
            "tpot_ms_p50": (lv.get("tpot_ms") or {}).get("p50"), "ok": lv.get("ok"), "requests": lv.get("requests")}


def _measured(r: TuneResult, i: int) -> dict[str, Any] | None:
    if i in r.goodputs:
        return {"tg_tok_s": None, "pp_tok_s": None, "goodput_req_s": _goodput(r, i), "serve": _serve(r, i),
                "run": r.entries[i].run}
    s = r.summaries.get(i)
    if s is None:
        return None
    w: dict[str, Any] = next(iter(s.get("workloads", {}).values()), {})
    return {"tg_tok_s": _ci(w.get("tg")), "pp_tok_s": _ci(w.get("pp")), "goodput_req_s": None,
            "run": r.entries[i].run}


def _head(r: TuneResult, i: int) -> dict[str, Any]:
    m = _measured(r, i) or {}
    return {"label": r.entries[i].candidate.label, "tg_tok_s": m.get("tg_tok_s"), "pp_tok_s": m.get("pp_tok_s"),
            "goodput_req_s": m.get("goodput_req_s"), "run": r.entries[i].run}


def _predicted(r: TuneResult, i: int) -> dict[str, Any]:
    e = r.entries[i]
    tg, pp = predicted_rates(e, r.constants, r.workload)
    out: dict[str, Any] = {"tg_tok_s": round(tg, 3), "pp_tok_s": round(pp, 3), "goodput_req_s": None}
    if r.serve is not None:
        sp = predict_serving(e.work, r.constants, r.serve)
        out.update(goodput_req_s=round(sp.goodput_req_s, 4), serve=sp.to_json())
    return out


def result_json(r: TuneResult, kld: dict[int, float] | None = None) -> dict[str, Any]:
    """The result as a document; ``kld``: the mean KLD from the baseline of the candidates
    ``--max-kld`` measured, by candidate index (a candidate's ``kld`` is null where none was)."""
    cands = []
    for i, e in enumerate(r.entries):
        cands.append({"label": e.candidate.label, "launched": e.run is not None or e.failed is not None,
                      "fits": e.fits, "predicted": _predicted(r, i), "measured": _measured(r, i),
                      "verdict": r.verdicts.get(i, ""), "kld": (kld or {}).get(i)})
    return {"tune": r.tune_id, "objective": r.objective, "launches": r.launches, "stopped": r.stopped,
            "workload": None if r.serve else _workload(r),
            "serve": r.serve.to_json() if r.serve else None,
            "baseline": _head(r, r.baseline), "best": None if r.best is None else _head(r, r.best), "candidates": cands,
            "engine_defaults": _defaults(r), "max_pp_loss": r.max_pp_loss if r.objective == "tg" else None,
            "constants": asdict(r.constants)}


def _workload(r: TuneResult) -> dict[str, Any]:
    """What the single-stream objective measured: the depth, the prompt and the output lengths."""
    w = r.workload
    return {"name": w.name, "depth": w.depth, "pp_tokens": w.pp_tokens, "tg_tokens": w.max_tokens,
            "text": dflt.workload_text(w)}


def _rate_ci(v: tuple[float, ...]) -> dict[str, Any] | None:
    if not v:
        return None
    s = summarize(list(v))
    return {"median": s.median, "ci_low": s.ci_low, "ci_high": s.ci_high}


def _defaults(r: TuneResult) -> dict[str, Any] | None:
    """The engine-defaults baseline: its command, what it measured, and the winner against it."""
    d = r.defaults
    if d is None:
        return None
    best = r.rates.get(r.best) if r.best is not None else None
    return {"label": dflt.LABEL, "argv": d.argv, "run": d.run, "failed": d.failed,
            "tg_tok_s": _rate_ci(r.defaults_rates.tg), "pp_tok_s": _rate_ci(r.defaults_rates.pp),
            "best_vs_defaults": dflt.versus(r.defaults_rates, best) if best and d.run is not None else None}


def _cell(stat: dict[str, Any] | None) -> str:
    from moetune.report.compare_view import fmt

    return "" if not stat else f"{fmt(stat['median'])} [{fmt(stat['ci_low'])}-{fmt(stat['ci_high'])}]"


def _opt(x: float | None) -> str:
    from moetune.report.compare_view import fmt

    return "" if x is None else fmt(x)


def _kld_cell(r: TuneResult, c: dict[str, Any]) -> str:
    from moetune.tune.quality_guard import changes_numerics

    if c["kld"] is not None:
        return f"{c['kld']:.6f}"
    if not c["launched"]:
        return ""
    i = next(i for i, e in enumerate(r.entries) if e.candidate.label == c["label"])
    if i == r.baseline:
        return "baseline"
    return "not checked" if changes_numerics(r.entries[r.baseline], r.entries[i]) else "same numerics"


def result_table(r: TuneResult, kld: dict[int, float] | None = None) -> Any:
    """The candidates as a table; with ``kld`` (``--max-kld``'s measurements) a KLD column: the mean
    KLD from the baseline where it was measured; "same numerics" for a launched candidate that moves the
    baseline's arithmetic elsewhere (placement, threads), "not checked" for one that changes it but was
    never the best."""
    from rich.table import Table

    from moetune.report.compare_view import fmt

    doc = result_json(r, kld)
    wl = f" ({dflt.workload_text(r.workload)})" if r.serve is None else ""
    t = Table(title=f"tune {r.tune_id}: objective {r.objective}{wl}", title_justify="left")
    key = {"tg": "tg_tok_s", "pp": "pp_tok_s", "ttft": "tg_tok_s", "goodput": "goodput_req_s"}[r.objective]
    launched = [c for c in doc["candidates"] if c["launched"]]
    rest = sorted((c for c in doc["candidates"] if not c["launched"] and c["fits"]),
                  key=lambda c: -(c["predicted"][key] or 0.0))
    rows = [*launched, *rest[:ROWS_NOT_LAUNCHED]]
    if r.serve is not None:
        for col in ("candidate", "predicted goodput/s", "predicted TTFT ms", "predicted ITL ms",
                    "goodput/s [95% CI]", "met", "TTFT p50 ms", "ITL p50 ms", "verdict"):
            t.add_column(col)
        for c in rows:
            m, p = c["measured"] or {}, c["predicted"]["serve"]
            g, sv = m.get("goodput_req_s") or {}, m.get("serve") or {}
            met = f"{g['met']}/{g['of']}" if g else ""
            t.add_row(c["label"], fmt(p["goodput_req_s"]), fmt(p["ttft_ms"]), fmt(p["itl_ms"]), _cell(g or None), met,
                      _opt(sv.get("ttft_ms_p50")), _opt(sv.get("itl_ms_p50")), c["verdict"])
        return t
    quality = kld is not None
    for col in ("candidate", "predicted TG", "predicted PP", "TG [95% CI]", "PP [95% CI]",
                *(["KLD"] if quality else []), "verdict"):
        t.add_column(col)
    for c in rows:
        m = c["measured"] or {}
        q = [] if not quality else [_kld_cell(r, c)]
        t.add_row(c["label"], fmt(c["predicted"]["tg_tok_s"]), fmt(c["predicted"]["pp_tok_s"]),
                  _cell(m.get("tg_tok_s")), _cell(m.get("pp_tok_s")), *q, c["verdict"])
    d = doc["engine_defaults"]
    if d is not None:
        t.add_row(dflt.LABEL, "", "", _cell(d["tg_tok_s"]), _cell(d["pp_tok_s"]), *([""] if quality else []),
                  "failed: " + d["failed"].splitlines()[0] if d["failed"] else "the engine with no tuning flags")
    return t


def defaults_lines(doc: dict[str, Any]) -> list[str]:
    """The winner against the engine's defaults, TG and PP, as lines to print."""
    d = doc.get("engine_defaults")
    if not d or not d.get("best_vs_defaults"):
        return []
    out = [f"engine defaults: {' '.join(d['argv'])}"]
    for what, v in d["best_vs_defaults"].items():
        if v:
            out.append(f"  best vs engine defaults, {what.upper()}: {v['text'].replace('baseline', 'engine defaults')}")
    return out
