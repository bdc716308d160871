"""What `moetune tune` prints: the JSON document of its contract, and the table of candidates."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from moetune.bench.analysis.bench_summary import Stat
from moetune.bench.analysis.stats import summarize
from moetune.plan.serving import predict_serving
from moetune.tune import defaults as dflt
from moetune.tune import weighted as wt
from moetune.tune import workload as wl
from moetune.tune.loop import TuneResult, predicted_rates, predicted_single
from moetune.tune.verdict import compare

ROWS_NOT_LAUNCHED = 5  # the table shows the launched candidates and this many of the rest


def _ci(stat: Stat | None) -> dict[str, float] | None:
    if stat is None:
        return None
    return {"median": stat.median, "ci_low": stat.ci_low, "ci_high": stat.ci_high}


def _goodput(r: TuneResult, i: int) -> dict[str, Any] | None:
    """A candidate's measured goodput: the median of its completion windows with its 95% bootstrap
    interval, and serve-bench's own figure of the level (met requests over its span)."""
    g = r.goodputs.get(i)
    if g is None or not g.values:
        return None
    s = summarize(g.values)
    level = g.level.goodput
    return {
        "median": s.median,
        "ci_low": s.ci_low,
        "ci_high": s.ci_high,
        "n": s.n,
        "level_req_s": g.level_req_s,
        "share": None if level is None else level.share,
        "met": None if level is None else level.met,
        "of": None if level is None else level.of,
    }


def _serve(r: TuneResult, i: int) -> dict[str, Any] | None:
    g = r.goodputs.get(i)
    if g is None:
        return None
    lv = g.level
    return {
        "request_s": lv.request_s,
        "output_tok_s": lv.output_tok_s,
        "ttft_ms_p50": lv.ttft_ms.p50,
        "itl_ms_p50": lv.itl_ms.p50,
        "tpot_ms_p50": lv.tpot_ms.p50,
        "ok": lv.ok,
        "requests": lv.requests,
    }


def work_json(m: wl.Measured | None) -> dict[str, Any] | None:
    """A workload objective's measurement: the seconds per pass (turn) with their median's 95%
    bootstrap interval, the passes that failed, and the prompt tokens the server processed and
    reused over them, as it reported them."""
    if m is None:
        return None
    s = summarize(list(m.seconds)) if m.seconds else None
    share = m.cache.reused_share
    return {
        "median_s": s.median if s else None,
        "ci_low_s": s.ci_low if s else None,
        "ci_high_s": s.ci_high if s else None,
        "n": len(m.seconds),
        "seconds": list(m.seconds),
        "failed": m.totals.failed,
        "requests": m.requests,
        "ok": m.ok,
        "prompt_tokens_processed": m.cache.processed,
        "prompt_tokens_reused": m.cache.reused,
        "reused_share": None if share is None else round(share, 4),
    }


def _measured(r: TuneResult, i: int) -> dict[str, Any] | None:
    if i in r.loaded:  # under the other services' load (--with-load), and alone
        m = r.loaded[i]
        out = {
            "tg_tok_s": _rate_ci(m.shared.tg),
            "pp_tok_s": _rate_ci(m.shared.pp),
            "goodput_req_s": None,
            "alone": {"tg_tok_s": _rate_ci(m.alone.tg), "pp_tok_s": _rate_ci(m.alone.pp)},
            "run": r.entries[i].run,
        }
        if r.weighted is not None:
            out["weighted"] = _score_json(r.scores.get(i))
        return out
    if i in r.works:
        return {
            "tg_tok_s": None,
            "pp_tok_s": None,
            "goodput_req_s": None,
            r.objective: work_json(r.works[i]),
            "run": r.entries[i].run,
        }
    if i in r.goodputs:
        return {
            "tg_tok_s": None,
            "pp_tok_s": None,
            "goodput_req_s": _goodput(r, i),
            "serve": _serve(r, i),
            "run": r.entries[i].run,
        }
    s = r.summaries.get(i)
    if s is None:
        return None
    return {"tg_tok_s": _ci(s.tg), "pp_tok_s": _ci(s.pp), "goodput_req_s": None, "run": r.entries[i].run}


def _head(r: TuneResult, i: int) -> dict[str, Any]:
    m = _measured(r, i) or {}
    out = {
        "label": r.entries[i].candidate.label,
        "tg_tok_s": m.get("tg_tok_s"),
        "pp_tok_s": m.get("pp_tok_s"),
        "goodput_req_s": m.get("goodput_req_s"),
        "run": r.entries[i].run,
    }
    if r.work is not None:
        out[r.objective] = m.get(r.objective)
    if r.weighted is not None:
        out["weighted"] = m.get("weighted")
    return out


def _score_json(sc: wt.Score | None) -> dict[str, Any] | None:
    """A candidate's weighted score: each term (its figure, the baseline's, the ratio and the
    weighted contribution), the score (their sum) and its 95% interval over the score's samples."""
    if sc is None:
        return None
    out = sc.to_json()
    s = summarize(list(sc.samples)) if len(sc.samples) > 1 else None
    out["ci_low"], out["ci_high"] = (s.ci_low, s.ci_high) if s else (None, None)
    return out


def _predicted(r: TuneResult, i: int) -> dict[str, Any]:
    e = r.entries[i]
    tg, pp = predicted_rates(e, r.constants, r.workload)
    out: dict[str, Any] = {"tg_tok_s": round(tg, 3), "pp_tok_s": round(pp, 3), "goodput_req_s": None}
    if r.serve is not None:
        sp = predict_serving(e.work, r.constants, r.serve)
        out.update(goodput_req_s=round(sp.goodput_req_s, 4), serve=sp.to_json())
    if r.work is not None:
        out[f"{r.objective}_s"] = round(wl.predicted_seconds(r.work, e.work, r.constants), 4)
    if r.weighted is not None:
        base = predicted_single(r.entries[r.baseline], r.constants, r.workload)
        mine = predicted_single(e, r.constants, r.workload)
        out["weighted_score"] = round(wt.predicted(r.weighted, e.plan.main.spec.name, mine, base), 4)
    return out


def result_json(r: TuneResult, kld: dict[int, float] | None = None) -> dict[str, Any]:
    """The result as a document; ``kld``: the mean KLD from the baseline of the candidates
    ``--max-kld`` measured, by candidate index (a candidate's ``kld`` is null where none was)."""
    cands = []
    for i, e in enumerate(r.entries):
        cands.append(
            {
                "label": e.candidate.label,
                "launched": e.run is not None or e.failed is not None,
                "fits": e.fits,
                "predicted": _predicted(r, i),
                "measured": _measured(r, i),
                "verdict": r.verdicts.get(i, ""),
                "kld": (kld or {}).get(i),
            }
        )
    return {
        "tune": r.tune_id,
        "objective": r.objective,
        "launches": r.launches,
        "stopped": r.stopped,
        "workload": None if r.serve or r.work else _workload(r),
        "work": None
        if r.work is None
        else {
            **r.work.key(),
            "text": wl.describe(r.work),
            **({"file": str(r.work.file)} if isinstance(r.work, wl.ReplayObjective) else {}),
        },
        "serve": r.serve.to_json() if r.serve else None,
        "baseline": _head(r, r.baseline),
        "best": None if r.best is None else _head(r, r.best),
        "candidates": cands,
        "engine_defaults": _defaults(r),
        "max_pp_loss": r.max_pp_loss if r.objective == "tg" else None,
        "constants": asdict(r.constants),
        "with_load": [ld.to_json() for ld in r.with_load] or None,
        "weighted": None if r.weighted is None else r.weighted.to_json(),
    }


def _workload(r: TuneResult) -> dict[str, Any]:
    """What the single-stream objective measured: the depth, the prompt and the output lengths."""
    w = r.workload
    return {
        "name": w.name,
        "depth": w.depth,
        "pp_tokens": w.pp_tokens,
        "tg_tokens": w.max_tokens,
        "text": dflt.workload_text(w),
    }


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
    if r.work is not None:
        mine = r.works.get(r.best) if r.best is not None else None
        theirs = r.defaults_work
        vs = None
        if mine is not None and theirs is not None and len(mine.values) >= 2 and len(theirs.values) >= 2:
            verdict, text = compare(theirs.values, mine.values, as_time=True)
            ratio = statistics.median(mine.seconds) / statistics.median(theirs.seconds)
            vs = {r.objective: {"ratio_s": round(ratio, 4), "verdict": verdict, "text": text}}
        return {
            "label": dflt.LABEL,
            "argv": d.argv,
            "run": d.run,
            "failed": d.failed,
            "tg_tok_s": None,
            "pp_tok_s": None,
            r.objective: work_json(theirs),
            "best_vs_defaults": vs,
        }
    best = r.rates.get(r.best) if r.best is not None else None
    return {
        "label": dflt.LABEL,
        "argv": d.argv,
        "run": d.run,
        "failed": d.failed,
        "tg_tok_s": _rate_ci(r.defaults_rates.tg),
        "pp_tok_s": _rate_ci(r.defaults_rates.pp),
        "best_vs_defaults": dflt.versus(r.defaults_rates, best) if best and d.run is not None else None,
    }


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
    text = f" ({dflt.workload_text(r.workload)})" if r.serve is None and r.work is None else ""
    text = f" ({wl.describe(r.work)})" if r.work is not None else text
    if r.with_load:
        text += ", beside " + "; ".join(f"{ld.service}: {ld.describe()}" for ld in r.with_load)
    t = Table(title=f"tune {r.tune_id}: objective {r.objective}{text}", title_justify="left")
    launched = [c for c in doc["candidates"] if c["launched"]]
    if r.work is not None:
        rest = sorted(
            (c for c in doc["candidates"] if not c["launched"] and c["fits"]),
            key=lambda c: c["predicted"][f"{r.objective}_s"] or 0.0,
        )
        return _work_table(t, r, doc, [*launched, *rest[:ROWS_NOT_LAUNCHED]])
    if r.weighted is not None:
        rest = sorted(
            (c for c in doc["candidates"] if not c["launched"] and c["fits"]),
            key=lambda c: -c["predicted"]["weighted_score"],
        )
        return _weighted_table(t, r.weighted, [*launched, *rest[:ROWS_NOT_LAUNCHED]])
    key = {"tg": "tg_tok_s", "pp": "pp_tok_s", "ttft": "tg_tok_s", "goodput": "goodput_req_s"}[r.objective]
    rest = sorted(
        (c for c in doc["candidates"] if not c["launched"] and c["fits"]), key=lambda c: -(c["predicted"][key] or 0.0)
    )
    rows = [*launched, *rest[:ROWS_NOT_LAUNCHED]]
    if r.serve is not None:
        for col in (
            "candidate",
            "predicted goodput/s",
            "predicted TTFT ms",
            "predicted ITL ms",
            "goodput/s [95% CI]",
            "met",
            "TTFT p50 ms",
            "ITL p50 ms",
            "verdict",
        ):
            t.add_column(col)
        for c in rows:
            m, p = c["measured"] or {}, c["predicted"]["serve"]
            g, sv = m.get("goodput_req_s") or {}, m.get("serve") or {}
            met = f"{g['met']}/{g['of']}" if g else ""
            t.add_row(
                c["label"],
                fmt(p["goodput_req_s"]),
                fmt(p["ttft_ms"]),
                fmt(p["itl_ms"]),
                _cell(g or None),
                met,
                _opt(sv.get("ttft_ms_p50")),
                _opt(sv.get("itl_ms_p50")),
                c["verdict"],
            )
        return t
    quality = kld is not None
    loaded = bool(r.with_load)  # the measured columns are under the others' load; alone beside them
    under = " under load" if loaded else ""
    for col in (
        "candidate",
        "predicted TG",
        "predicted PP",
        f"TG{under} [95% CI]",
        f"PP{under} [95% CI]",
        *(["TG alone", "PP alone"] if loaded else []),
        *(["KLD"] if quality else []),
        "verdict",
    ):
        t.add_column(col)
    for c in rows:
        m = c["measured"] or {}
        q = [] if not quality else [_kld_cell(r, c)]
        alone = m.get("alone") or {}
        t.add_row(
            c["label"],
            fmt(c["predicted"]["tg_tok_s"]),
            fmt(c["predicted"]["pp_tok_s"]),
            _cell(m.get("tg_tok_s")),
            _cell(m.get("pp_tok_s")),
            *([_cell(alone.get("tg_tok_s")), _cell(alone.get("pp_tok_s"))] if loaded else []),
            *q,
            c["verdict"],
        )
    d = doc["engine_defaults"]
    if d is not None:
        t.add_row(
            dflt.LABEL,
            "",
            "",
            _cell(d["tg_tok_s"]),
            _cell(d["pp_tok_s"]),
            *([""] if quality else []),
            "failed: " + d["failed"].splitlines()[0] if d["failed"] else "the engine with no tuning flags",
        )
    return t


def _weighted_table(t: Any, w: wt.Weighted, rows: list[dict[str, Any]]) -> Any:
    """The table of a weighted objective: per term the figure under the shared load and its weighted
    share of the score (weight x figure / the baseline's; a latency the baseline's / the figure)."""
    from moetune.report.compare_view import fmt

    t.title += f" = {' + '.join(f'{x.weight:g} x {x.name}' for x in w.terms)}, each relative to the baseline"
    t.add_column("candidate")
    t.add_column("predicted score")
    for x in w.terms:
        t.add_column(f"{x.service} {x.metric} {x.unit} -> x{x.weight:g}" + ("" if x.higher else " (inverted)"))
    t.add_column("score [95% CI]")
    t.add_column("verdict")
    for c in rows:
        sc = (c["measured"] or {}).get("weighted") or {}
        parts = sc.get("terms") or [{} for _ in w.terms]
        cells = [
            "" if p.get("value") is None else f"{fmt(p['value'])} -> {_opt(p.get('contribution')) or '?'}"
            for p in parts
        ]
        total = sc.get("score")
        score = "" if total is None else fmt(total)
        if total is not None and sc.get("ci_low") is not None:
            score += f" [{fmt(sc['ci_low'])}-{fmt(sc['ci_high'])}]"
        t.add_row(c["label"], fmt(c["predicted"]["weighted_score"]), *cells, score, c["verdict"])
    return t


def _seconds(m: dict[str, Any] | None) -> str:
    from moetune.report.compare_view import fmt

    if not m or m.get("median_s") is None:
        return ""
    return f"{fmt(m['median_s'])} [{fmt(m['ci_low_s'])}-{fmt(m['ci_high_s'])}]"


def _cache_cell(m: dict[str, Any] | None) -> str:
    if not m or m.get("prompt_tokens_reused") is None:
        return ""
    return f"{m['prompt_tokens_processed']} / {m['prompt_tokens_reused']} ({m['reused_share'] or 0:.0%})"


def _work_table(t: Any, r: TuneResult, doc: dict[str, Any], rows: list[dict[str, Any]]) -> Any:
    """The table of a workload objective: predicted and measured seconds, and the prefix cache as the
    server reported it (prompt tokens processed / reused, over every measured pass)."""
    from moetune.report.compare_view import fmt

    what = "total s" if r.objective == "replay" else "turn s"
    for col in ("candidate", f"predicted {what}", f"{what} [95% CI]", "prompt processed / reused", "verdict"):
        t.add_column(col)
    for c in rows:
        m = (c["measured"] or {}).get(r.objective)
        t.add_row(c["label"], fmt(c["predicted"][f"{r.objective}_s"]), _seconds(m), _cache_cell(m), c["verdict"])
    d = doc["engine_defaults"]
    if d is not None:
        t.add_row(
            dflt.LABEL,
            "",
            _seconds(d.get(r.objective)),
            _cache_cell(d.get(r.objective)),
            "failed: " + d["failed"].splitlines()[0] if d["failed"] else "the engine with no tuning flags",
        )
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


def work_lines(doc: dict[str, Any]) -> list[str]:
    """A workload objective's seconds for the baseline, the engine defaults and the winner, as lines."""
    name = doc.get("objective")
    if not doc.get("work") or name not in ("replay", "turn"):
        return []
    what = "replay total" if name == "replay" else "turn time"

    def line(who: str, m: dict[str, Any] | None) -> str:
        if not m or m.get("median_s") is None:
            return f"  {who}: not measured"
        cache = (
            ""
            if m.get("prompt_tokens_reused") is None
            else (
                f"; prompt tokens processed {m['prompt_tokens_processed']}, reused {m['prompt_tokens_reused']} "
                f"from the cache"
            )
        )
        return (
            f"  {who}: {m['median_s']:.4g} s [{m['ci_low_s']:.4g}-{m['ci_high_s']:.4g}] over {m['n']} "
            f"{'passes' if name == 'replay' else 'sessions'}{cache}"
        )

    d = doc.get("engine_defaults") or {}
    out = [
        f"{what} ({doc['work']['text']}):",
        line(f"baseline ({doc['baseline']['label']})", doc["baseline"].get(name)),
    ]
    if d:
        out.append(line(dflt.LABEL, d.get(name)) if not d.get("failed") else f"  {dflt.LABEL}: failed")
    if doc.get("best") is not None and doc["best"]["label"] != doc["baseline"]["label"]:
        out.append(line(f"best ({doc['best']['label']})", doc["best"].get(name)))
    return out
