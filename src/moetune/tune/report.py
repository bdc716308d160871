"""What `moetune tune` prints: the JSON document of its contract, and the table of candidates.

The document's parts are frozen, keyword-only records, each written by its ``to_json`` (the JSON
shapes of `moetune tune --json`); the table reads the same records, not the JSON."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from moetune.bench.analysis.bench_summary import Stat
from moetune.bench.analysis.stats import summarize
from moetune.jsonread import integer, mapping, number
from moetune.plan.serving import ServePrediction, predict_serving
from moetune.tune import defaults as dflt
from moetune.tune import weighted as wt
from moetune.tune import workload as wl
from moetune.tune.loop import TuneResult, predicted_rates, predicted_single
from moetune.tune.verdict import compare

ROWS_NOT_LAUNCHED = 5  # the table shows the launched candidates and this many of the rest


@dataclass(frozen=True, slots=True, kw_only=True)
class Ci:
    """A median and its 95% bootstrap interval."""

    median: float
    ci_low: float
    ci_high: float

    @classmethod
    def of_stat(cls, stat: Stat | None) -> Ci | None:
        return None if stat is None else cls(median=stat.median, ci_low=stat.ci_low, ci_high=stat.ci_high)

    @classmethod
    def of_values(cls, v: Sequence[float]) -> Ci | None:
        if not v:
            return None
        s = summarize(list(v))
        return cls(median=s.median, ci_low=s.ci_low, ci_high=s.ci_high)

    def to_json(self) -> dict[str, object]:
        return {"median": self.median, "ci_low": self.ci_low, "ci_high": self.ci_high}


def _ci_json(c: Ci | None) -> dict[str, object] | None:
    return None if c is None else c.to_json()


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputFigures:
    """A candidate's measured goodput: the median of its completion windows with its 95% bootstrap
    interval, and serve-bench's own figure of the level (met requests over its span)."""

    ci: Ci
    n: int
    level_req_s: float | None
    share: float | None
    met: int | None
    of: int | None

    def to_json(self) -> dict[str, object]:
        return {
            **self.ci.to_json(),
            "n": self.n,
            "level_req_s": self.level_req_s,
            "share": self.share,
            "met": self.met,
            "of": self.of,
        }


def _goodput(r: TuneResult, i: int) -> GoodputFigures | None:
    g = r.goodputs.get(i)
    if g is None or not g.values:
        return None
    s = summarize(g.values)
    level = g.level.goodput
    return GoodputFigures(
        ci=Ci(median=s.median, ci_low=s.ci_low, ci_high=s.ci_high),
        n=s.n,
        level_req_s=g.level_req_s,
        share=None if level is None else level.share,
        met=None if level is None else level.met,
        of=None if level is None else level.of,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeFigures:
    """serve-bench's figures of a candidate's level."""

    request_s: float | None
    output_tok_s: float | None
    ttft_ms_p50: float | None
    itl_ms_p50: float | None
    tpot_ms_p50: float | None
    ok: int
    requests: int

    def to_json(self) -> dict[str, object]:
        return {
            "request_s": self.request_s,
            "output_tok_s": self.output_tok_s,
            "ttft_ms_p50": self.ttft_ms_p50,
            "itl_ms_p50": self.itl_ms_p50,
            "tpot_ms_p50": self.tpot_ms_p50,
            "ok": self.ok,
            "requests": self.requests,
        }


def _serve(r: TuneResult, i: int) -> ServeFigures | None:
    g = r.goodputs.get(i)
    if g is None:
        return None
    lv = g.level
    return ServeFigures(
        request_s=lv.request_s,
        output_tok_s=lv.output_tok_s,
        ttft_ms_p50=lv.ttft_ms.p50,
        itl_ms_p50=lv.itl_ms.p50,
        tpot_ms_p50=lv.tpot_ms.p50,
        ok=lv.ok,
        requests=lv.requests,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkFigures:
    """A workload objective's measurement: the seconds per pass (turn) with their median's 95%
    bootstrap interval, the passes that failed, and the prompt tokens the server processed and
    reused over them, as it reported them."""

    median_s: float | None
    ci_low_s: float | None
    ci_high_s: float | None
    n: int
    seconds: tuple[float, ...]
    failed: int
    requests: int
    ok: int
    prompt_tokens_processed: int | None
    prompt_tokens_reused: int | None
    reused_share: float | None

    @classmethod
    def of(cls, m: wl.Measured) -> WorkFigures:
        s = summarize(list(m.seconds)) if m.seconds else None
        share = m.cache.reused_share
        return cls(
            median_s=s.median if s else None,
            ci_low_s=s.ci_low if s else None,
            ci_high_s=s.ci_high if s else None,
            n=len(m.seconds),
            seconds=tuple(m.seconds),
            failed=m.totals.failed,
            requests=m.requests,
            ok=m.ok,
            prompt_tokens_processed=m.cache.processed,
            prompt_tokens_reused=m.cache.reused,
            reused_share=None if share is None else round(share, 4),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "median_s": self.median_s,
            "ci_low_s": self.ci_low_s,
            "ci_high_s": self.ci_high_s,
            "n": self.n,
            "seconds": list(self.seconds),
            "failed": self.failed,
            "requests": self.requests,
            "ok": self.ok,
            "prompt_tokens_processed": self.prompt_tokens_processed,
            "prompt_tokens_reused": self.prompt_tokens_reused,
            "reused_share": self.reused_share,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> WorkFigures:
        def opt_int(x: object) -> int | None:
            return x if isinstance(x, int) and not isinstance(x, bool) else None

        seconds = d.get("seconds")
        return cls(
            median_s=number(d.get("median_s")),
            ci_low_s=number(d.get("ci_low_s")),
            ci_high_s=number(d.get("ci_high_s")),
            n=integer(d.get("n")),
            seconds=tuple(v for x in seconds if (v := number(x)) is not None) if isinstance(seconds, list) else (),
            failed=integer(d.get("failed")),
            requests=integer(d.get("requests")),
            ok=integer(d.get("ok")),
            prompt_tokens_processed=opt_int(d.get("prompt_tokens_processed")),
            prompt_tokens_reused=opt_int(d.get("prompt_tokens_reused")),
            reused_share=number(d.get("reused_share")),
        )


def work_json(m: wl.Measured | None) -> dict[str, object] | None:
    """A workload objective's measurement as JSON (:class:`WorkFigures`)."""
    return None if m is None else WorkFigures.of(m).to_json()


def _work(m: wl.Measured | None) -> WorkFigures | None:
    return None if m is None else WorkFigures.of(m)


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreFigures:
    """A candidate's weighted score: each term (its figure, the baseline's, the ratio and the
    weighted contribution), the score (their sum) and its 95% interval over the score's samples."""

    score: wt.Score
    ci: tuple[float, float] | None

    @classmethod
    def of(cls, sc: wt.Score | None) -> ScoreFigures | None:
        if sc is None:
            return None
        s = summarize(list(sc.samples)) if len(sc.samples) > 1 else None
        return cls(score=sc, ci=(s.ci_low, s.ci_high) if s else None)

    def to_json(self) -> dict[str, object]:
        lo, hi = self.ci if self.ci else (None, None)
        return {**self.score.to_json(), "ci_low": lo, "ci_high": hi}


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """What a launched candidate measured, by its objective: TG and PP (single-stream, or under the
    other services' load with the figures alone beside), goodput and serve-bench's figures, or a
    workload's seconds (under the objective's name); and a weighted score."""

    run: int | None
    tg_tok_s: Ci | None = None
    pp_tok_s: Ci | None = None
    goodput_req_s: GoodputFigures | None = None
    serve: ServeFigures | None = None  # --objective goodput
    alone: tuple[Ci | None, Ci | None] | None = None  # --with-load: (TG, PP) of the service alone
    work: tuple[str, WorkFigures | None] | None = None  # a workload objective: its name, its figures
    weighted: tuple[ScoreFigures | None] | None = None  # --objective weighted: (the score,)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "tg_tok_s": _ci_json(self.tg_tok_s),
            "pp_tok_s": _ci_json(self.pp_tok_s),
            "goodput_req_s": None if self.goodput_req_s is None else self.goodput_req_s.to_json(),
        }
        if self.serve is not None:
            out["serve"] = self.serve.to_json()
        if self.alone is not None:
            out["alone"] = {"tg_tok_s": _ci_json(self.alone[0]), "pp_tok_s": _ci_json(self.alone[1])}
        if self.work is not None:
            name, w = self.work
            out[name] = None if w is None else w.to_json()
        out["run"] = self.run
        if self.weighted is not None:
            (sc,) = self.weighted
            out["weighted"] = None if sc is None else sc.to_json()
        return out

    @property
    def work_figures(self) -> WorkFigures | None:
        return None if self.work is None else self.work[1]

    @property
    def score(self) -> ScoreFigures | None:
        return None if self.weighted is None else self.weighted[0]


def _measured(r: TuneResult, i: int) -> Measured | None:
    run = r.entries[i].run
    if i in r.loaded:  # under the other services' load (--with-load), and alone
        m = r.loaded[i]
        return Measured(
            run=run,
            tg_tok_s=Ci.of_values(m.shared.tg),
            pp_tok_s=Ci.of_values(m.shared.pp),
            alone=(Ci.of_values(m.alone.tg), Ci.of_values(m.alone.pp)),
            weighted=None if r.weighted is None else (ScoreFigures.of(r.scores.get(i)),),
        )
    if i in r.works:
        return Measured(run=run, work=(r.objective, _work(r.works[i])))
    if i in r.goodputs:
        return Measured(run=run, goodput_req_s=_goodput(r, i), serve=_serve(r, i))
    s = r.summaries.get(i)
    if s is None:
        return None
    return Measured(run=run, tg_tok_s=Ci.of_stat(s.tg), pp_tok_s=Ci.of_stat(s.pp))


@dataclass(frozen=True, slots=True, kw_only=True)
class Head:
    """The baseline or the best: its label and what it measured."""

    label: str
    measured: Measured | None
    run: int | None
    objective: str
    work: bool  # a workload objective: its figures under the objective's name
    weighted: bool

    def to_json(self) -> dict[str, object]:
        m = self.measured
        out: dict[str, object] = {
            "label": self.label,
            "tg_tok_s": None if m is None else _ci_json(m.tg_tok_s),
            "pp_tok_s": None if m is None else _ci_json(m.pp_tok_s),
            "goodput_req_s": None if m is None or m.goodput_req_s is None else m.goodput_req_s.to_json(),
            "run": self.run,
        }
        if self.work:
            w = None if m is None else m.work_figures
            out[self.objective] = None if w is None else w.to_json()
        if self.weighted:
            sc = None if m is None else m.score
            out["weighted"] = None if sc is None else sc.to_json()
        return out


def _head(r: TuneResult, i: int) -> Head:
    return Head(
        label=r.entries[i].candidate.label,
        measured=_measured(r, i),
        run=r.entries[i].run,
        objective=r.objective,
        work=r.work is not None,
        weighted=r.weighted is not None,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Predicted:
    """What the speed model expects of a candidate, by the objective."""

    tg_tok_s: float
    pp_tok_s: float
    serve: ServePrediction | None = None
    work: tuple[str, float] | None = None  # a workload objective's name and its seconds
    weighted_score: float | None = None

    @property
    def goodput_req_s(self) -> float | None:
        return None if self.serve is None else round(self.serve.goodput_req_s, 4)

    def of(self, key: str) -> float | None:
        """``tg_tok_s``, ``pp_tok_s`` or ``goodput_req_s``."""
        return {"tg_tok_s": self.tg_tok_s, "pp_tok_s": self.pp_tok_s, "goodput_req_s": self.goodput_req_s}[key]

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"tg_tok_s": self.tg_tok_s, "pp_tok_s": self.pp_tok_s, "goodput_req_s": None}
        if self.serve is not None:
            out.update(goodput_req_s=self.goodput_req_s, serve=self.serve.to_json())
        if self.work is not None:
            out[f"{self.work[0]}_s"] = self.work[1]
        if self.weighted_score is not None:
            out["weighted_score"] = self.weighted_score
        return out


def _predicted(r: TuneResult, i: int) -> Predicted:
    e = r.entries[i]
    tg, pp = predicted_rates(e, r.constants, r.workload)
    score = None
    if r.weighted is not None:
        base = predicted_single(r.entries[r.baseline], r.constants, r.workload)
        mine = predicted_single(e, r.constants, r.workload)
        score = round(wt.predicted(r.weighted, e.plan.main.spec.name, mine, base), 4)
    return Predicted(
        tg_tok_s=round(tg, 3),
        pp_tok_s=round(pp, 3),
        serve=None if r.serve is None else predict_serving(e.work, r.constants, r.serve),
        work=None if r.work is None else (r.objective, round(wl.predicted_seconds(r.work, e.work, r.constants), 4)),
        weighted_score=score,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateRow:
    """One candidate of the document: planned, perhaps launched, judged."""

    index: int
    label: str
    launched: bool
    fits: bool
    predicted: Predicted
    measured: Measured | None
    verdict: str
    kld: float | None  # the mean KLD from the baseline, where --max-kld measured it

    def to_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "launched": self.launched,
            "fits": self.fits,
            "predicted": self.predicted.to_json(),
            "measured": None if self.measured is None else self.measured.to_json(),
            "verdict": self.verdict,
            "kld": self.kld,
        }


def candidate_rows(r: TuneResult, kld: dict[int, float] | None = None) -> list[CandidateRow]:
    won = r.defaults_win is not None  # the engine defaults beat the best: it is the best candidate only

    def verdict(i: int) -> str:
        v = r.verdicts.get(i, "")
        if won and i == r.best:
            return v.replace("best", "best candidate", 1)
        return v

    return [
        CandidateRow(
            index=i,
            label=e.candidate.label,
            launched=e.run is not None or e.failed is not None,
            fits=e.fits,
            predicted=_predicted(r, i),
            measured=_measured(r, i),
            verdict=verdict(i),
            kld=(kld or {}).get(i),
        )
        for i, e in enumerate(r.entries)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class DefaultsRow:
    """The engine-defaults baseline: its command, what it measured, and the winner against it."""

    argv: list[str]
    run: int | None
    failed: str | None
    tg_tok_s: Ci | None = None
    pp_tok_s: Ci | None = None
    work: tuple[str, WorkFigures | None] | None = None  # a workload objective's name and figures
    best_vs_defaults: dict[str, object] | None = None  # per figure: ratio, verdict, text

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "label": dflt.LABEL,
            "argv": self.argv,
            "run": self.run,
            "failed": self.failed,
            "tg_tok_s": _ci_json(self.tg_tok_s),
            "pp_tok_s": _ci_json(self.pp_tok_s),
        }
        if self.work is not None:
            name, w = self.work
            out[name] = None if w is None else w.to_json()
        out["best_vs_defaults"] = self.best_vs_defaults
        return out

    @property
    def work_figures(self) -> WorkFigures | None:
        return None if self.work is None else self.work[1]


def _defaults(r: TuneResult) -> DefaultsRow | None:
    d = r.defaults
    if d is None:
        return None
    if r.work is not None:
        mine = r.works.get(r.best) if r.best is not None else None
        theirs = r.defaults_work
        vs: dict[str, object] | None = None
        if mine is not None and theirs is not None and len(mine.values) >= 2 and len(theirs.values) >= 2:
            verdict, text = compare(theirs.values, mine.values, as_time=True)
            ratio = statistics.median(mine.seconds) / statistics.median(theirs.seconds)
            vs = {r.objective: {"ratio_s": round(ratio, 4), "verdict": verdict, "text": text}}
        return DefaultsRow(
            argv=d.argv, run=d.run, failed=d.failed, work=(r.objective, _work(theirs)), best_vs_defaults=vs
        )
    best = r.rates.get(r.best) if r.best is not None else None
    return DefaultsRow(
        argv=d.argv,
        run=d.run,
        failed=d.failed,
        tg_tok_s=Ci.of_values(r.defaults_rates.tg),
        pp_tok_s=Ci.of_values(r.defaults_rates.pp),
        best_vs_defaults=dflt.versus(r.defaults_rates, best) if best and d.run is not None else None,
    )


def result_json(r: TuneResult, kld: dict[int, float] | None = None) -> dict[str, object]:
    """The result as a document; ``kld``: the mean KLD from the baseline of the candidates
    ``--max-kld`` measured, by candidate index (a candidate's ``kld`` is null where none was)."""
    defaults = _defaults(r)
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
        "baseline": _head(r, r.baseline).to_json(),
        "best": _best(r, defaults),
        "best_candidate": None if r.best is None else _head(r, r.best).to_json(),
        "defaults_win": r.defaults_win,
        "confirmed": [{"label": k, "medians": [round(v, 3) for v in vs]} for k, vs in r.confirmed.items()],
        "candidates": [c.to_json() for c in candidate_rows(r, kld)],
        "engine_defaults": None if defaults is None else defaults.to_json(),
        "max_pp_loss": r.max_pp_loss if r.objective == "tg" else None,
        "constants": asdict(r.constants),
        "with_load": [ld.to_json() for ld in r.with_load] or None,
        "weighted": None if r.weighted is None else r.weighted.to_json(),
    }


def _best(r: TuneResult, defaults: DefaultsRow | None) -> dict[str, object] | None:
    """The recommendation: the engine defaults where they beat the best candidate, else it."""
    if r.best is None:
        return None
    if r.defaults_win is None or defaults is None:
        return _head(r, r.best).to_json()
    d = defaults.to_json()
    return {
        **{k: d[k] for k in ("label", "tg_tok_s", "pp_tok_s", *([r.objective] if r.work else []))},
        "goodput_req_s": None,
        "run": d["run"],
    }


def _workload(r: TuneResult) -> dict[str, object]:
    """What the single-stream objective measured: the depth, the prompt and the output lengths."""
    w = r.workload
    return {
        "name": w.name,
        "depth": w.depth,
        "pp_tokens": w.pp_tokens,
        "tg_tokens": w.max_tokens,
        "text": dflt.workload_text(w),
    }


def _cell(stat: Ci | GoodputFigures | None) -> str:
    from moetune.report.compare_view import fmt

    c = stat.ci if isinstance(stat, GoodputFigures) else stat
    return "" if c is None else f"{fmt(c.median)} [{fmt(c.ci_low)}-{fmt(c.ci_high)}]"


def _opt(x: float | None) -> str:
    from moetune.report.compare_view import fmt

    return "" if x is None else fmt(x)


def _kld_cell(r: TuneResult, c: CandidateRow) -> str:
    from moetune.tune.quality_guard import changes_numerics

    if c.kld is not None:
        return f"{c.kld:.6f}"
    if not c.launched:
        return ""
    if c.index == r.baseline:
        return "baseline"
    return "not checked" if changes_numerics(r.entries[r.baseline], r.entries[c.index]) else "same numerics"


def _failed_text(d: DefaultsRow, won: str | None = None) -> str:
    if d.failed:
        return "failed: " + d.failed.splitlines()[0]
    return f"best, {won}" if won else "the engine with no tuning flags"


def result_table(r: TuneResult, kld: dict[int, float] | None = None) -> Any:
    """The candidates as a table; with ``kld`` (``--max-kld``'s measurements) a KLD column: the mean
    KLD from the baseline where it was measured; "same numerics" for a launched candidate that moves the
    baseline's arithmetic elsewhere (placement, threads), "not checked" for one that changes it but was
    never the best."""
    from rich.table import Table

    cands = candidate_rows(r, kld)
    defaults = _defaults(r)
    text = f" ({dflt.workload_text(r.workload)})" if r.serve is None and r.work is None else ""
    text = f" ({wl.describe(r.work)})" if r.work is not None else text
    if r.with_load:
        text += ", beside " + "; ".join(f"{ld.service}: {ld.describe()}" for ld in r.with_load)
    t = Table(title=f"tune {r.tune_id}: objective {r.objective}{text}", title_justify="left")
    launched = [c for c in cands if c.launched]
    rest = [c for c in cands if not c.launched and c.fits]
    if r.work is not None:
        rest.sort(key=lambda c: (c.predicted.work[1] if c.predicted.work else 0.0) or 0.0)
        return _work_table(t, r, defaults, [*launched, *rest[:ROWS_NOT_LAUNCHED]])
    if r.weighted is not None:
        rest.sort(key=lambda c: -(c.predicted.weighted_score or 0.0))
        return _weighted_table(t, r.weighted, [*launched, *rest[:ROWS_NOT_LAUNCHED]])
    key = {"tg": "tg_tok_s", "pp": "pp_tok_s", "ttft": "tg_tok_s", "goodput": "goodput_req_s"}[r.objective]
    rest.sort(key=lambda c: -(c.predicted.of(key) or 0.0))
    rows = [*launched, *rest[:ROWS_NOT_LAUNCHED]]
    if r.serve is not None:
        return _serve_table(t, rows)
    return _single_table(t, r, rows, defaults, quality=kld is not None)


def _serve_table(t: Any, rows: list[CandidateRow]) -> Any:
    from moetune.report.compare_view import fmt

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
        m = c.measured
        p = c.predicted.serve.to_json() if c.predicted.serve is not None else {}
        g = None if m is None else m.goodput_req_s
        sv = None if m is None else m.serve
        met = f"{g.met}/{g.of}" if g else ""
        t.add_row(
            c.label,
            fmt(p["goodput_req_s"]),
            fmt(p["ttft_ms"]),
            fmt(p["itl_ms"]),
            _cell(g),
            met,
            _opt(None if sv is None else sv.ttft_ms_p50),
            _opt(None if sv is None else sv.itl_ms_p50),
            c.verdict,
        )
    return t


def _single_table(t: Any, r: TuneResult, rows: list[CandidateRow], d: DefaultsRow | None, *, quality: bool) -> Any:
    from moetune.report.compare_view import fmt

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
        m = c.measured
        q = [] if not quality else [_kld_cell(r, c)]
        alone = (None, None) if m is None or m.alone is None else m.alone
        t.add_row(
            c.label,
            fmt(c.predicted.tg_tok_s),
            fmt(c.predicted.pp_tok_s),
            _cell(None if m is None else m.tg_tok_s),
            _cell(None if m is None else m.pp_tok_s),
            *([_cell(alone[0]), _cell(alone[1])] if loaded else []),
            *q,
            c.verdict,
        )
    if d is not None:
        t.add_row(
            dflt.LABEL,
            "",
            "",
            _cell(d.tg_tok_s),
            _cell(d.pp_tok_s),
            *([""] if quality else []),
            _failed_text(d, r.defaults_win),
        )
    return t


def _weighted_table(t: Any, w: wt.Weighted, rows: list[CandidateRow]) -> Any:
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
        sc = None if c.measured is None else c.measured.score
        parts: Sequence[wt.Part | None] = sc.score.parts if sc is not None and sc.score.parts else [None] * len(w.terms)
        cells = [
            "" if p is None or p.value is None else f"{fmt(p.value)} -> {_opt(p.contribution) or '?'}" for p in parts
        ]
        total = None if sc is None else sc.score.total
        score = "" if total is None else fmt(total)
        if total is not None and sc is not None and sc.ci is not None:
            score += f" [{fmt(sc.ci[0])}-{fmt(sc.ci[1])}]"
        t.add_row(c.label, _opt(c.predicted.weighted_score), *cells, score, c.verdict)
    return t


def _seconds(m: WorkFigures | None) -> str:
    from moetune.report.compare_view import fmt

    if m is None or m.median_s is None:
        return ""
    return f"{fmt(m.median_s)} [{_opt(m.ci_low_s)}-{_opt(m.ci_high_s)}]"


def _cache_cell(m: WorkFigures | None) -> str:
    if m is None or m.prompt_tokens_reused is None:
        return ""
    return f"{m.prompt_tokens_processed} / {m.prompt_tokens_reused} ({m.reused_share or 0:.0%})"


def _work_table(t: Any, r: TuneResult, d: DefaultsRow | None, rows: list[CandidateRow]) -> Any:
    """The table of a workload objective: predicted and measured seconds, and the prefix cache as the
    server reported it (prompt tokens processed / reused, over every measured pass)."""

    what = "total s" if r.objective == "replay" else "turn s"
    for col in ("candidate", f"predicted {what}", f"{what} [95% CI]", "prompt processed / reused", "verdict"):
        t.add_column(col)
    for c in rows:
        m = None if c.measured is None else c.measured.work_figures
        t.add_row(
            c.label, _opt(c.predicted.work[1] if c.predicted.work else None), _seconds(m), _cache_cell(m), c.verdict
        )
    if d is not None:
        m = d.work_figures
        t.add_row(dflt.LABEL, "", _seconds(m), _cache_cell(m), _failed_text(d, r.defaults_win))
    return t


def defaults_lines(doc: Mapping[str, object]) -> list[str]:
    """The winner against the engine's defaults, TG and PP, as lines to print (from the document)."""
    d = mapping(doc.get("engine_defaults"))
    vs = mapping(d.get("best_vs_defaults"))
    if not vs:
        return []
    argv = d.get("argv")
    who = "best candidate" if doc.get("defaults_win") else "best"
    out = [f"engine defaults: {' '.join(str(a) for a in argv) if isinstance(argv, list) else ''}"]
    for what, v in vs.items():
        if v:
            said = str(mapping(v).get("text") or "")
            out.append(f"  {who} vs engine defaults, {what.upper()}: {said.replace('baseline', 'engine defaults')}")
    return out


def confirm_lines(doc: Mapping[str, object]) -> list[str]:
    """--confirm's round, as lines: each configuration launched again, its launches' medians."""
    given = doc.get("confirmed")
    rows = [mapping(c) for c in given if isinstance(c, Mapping)] if isinstance(given, list) else []
    if not rows:
        return []
    units = {
        "tg": " tok/s TG",
        "pp": " tok/s PP",
        "ttft": " first tokens/s",
        "replay": " s a pass",
        "turn": " s a turn",
    }
    unit = units.get(str(doc.get("objective")), "")
    out = [f"confirmed: the {len(rows)} best launched again, judged on both launches pooled"]
    for c in rows:
        medians = c.get("medians")
        ms = " then ".join(f"{float(v):.4g}" for v in medians) if isinstance(medians, list) else ""
        out.append(f"  {c.get('label')}: {ms}{unit}")
    return out


def work_lines(doc: Mapping[str, object]) -> list[str]:
    """A workload objective's seconds for the baseline, the engine defaults and the winner, as lines
    (from the document)."""
    name = doc.get("objective")
    work = mapping(doc.get("work"))
    if not work or name not in ("replay", "turn"):
        return []
    what = "replay total" if name == "replay" else "turn time"

    def line(who: str, x: object) -> str:
        m = WorkFigures.from_json(mapping(x))
        if m.median_s is None or m.ci_low_s is None or m.ci_high_s is None:
            return f"  {who}: not measured"
        cache = (
            ""
            if m.prompt_tokens_reused is None
            else (
                f"; prompt tokens processed {m.prompt_tokens_processed}, reused {m.prompt_tokens_reused} from the cache"
            )
        )
        return (
            f"  {who}: {m.median_s:.4g} s [{m.ci_low_s:.4g}-{m.ci_high_s:.4g}] over {m.n} "
            f"{'passes' if name == 'replay' else 'sessions'}{cache}"
        )

    d = mapping(doc.get("engine_defaults"))
    base, best = mapping(doc.get("baseline")), mapping(doc.get("best"))
    out = [f"{what} ({work.get('text')}):", line(f"baseline ({base.get('label')})", base.get(name))]
    if d:
        out.append(line(dflt.LABEL, d.get(name)) if not d.get("failed") else f"  {dflt.LABEL}: failed")
    if doc.get("best") is not None and best.get("label") != base.get("label"):
        out.append(line(f"best ({best.get('label')})", best.get(name)))
    return out
