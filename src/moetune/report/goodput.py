"""`moetune compare --metric goodput`: serve-bench runs ranked by goodput against latency targets.

Each run's levels are judged again from its raw samples by one set of targets (``--slo``, else
the targets the runs were measured with, which must then agree), and the runs are ranked by their
best level's goodput (met requests per second), then by that level's share. Beside each level's
share is its 95 % Wilson interval: two shares whose intervals overlap are not told apart by these
requests.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from moetune.bench.analysis.level_summary import LevelGoodput
from moetune.bench.analysis.serve import key_name, level_figures, level_span
from moetune.bench.analysis.slo import SLO_EXAMPLE, goodput, slo_text, wilson
from moetune.errors import InputError
from moetune.kinds import RunKind
from moetune.store.db import ResultsDB, Run

GOODPUT_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputLevel:
    """One level of a run judged by the ranking's targets: its goodput and the 95% Wilson interval
    of its share."""

    level: str  # the level's name (``c=4``, ``c=4 @2/s``)
    concurrency: int
    rate: float | None
    goodput: LevelGoodput
    share_ci: tuple[float, float] | None

    @property
    def req_s(self) -> float | None:
        return self.goodput.req_s

    @property
    def share(self) -> float | None:
        return self.goodput.share

    def to_json(self) -> dict[str, object]:
        """``{level, concurrency, rate, share, share_ci, req_s, met, of, missed, failed, unknown}``."""
        return {
            "level": self.level,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "share": self.share,
            "share_ci": None if self.share_ci is None else list(self.share_ci),
            **{k: v for k, v in self.goodput.to_json().items() if k not in ("slo", "share")},
        }


@dataclass(frozen=True, slots=True)
class RunGoodput:
    run: int
    label: str
    levels: list[GoodputLevel]

    @property
    def best(self) -> GoodputLevel | None:
        rated = [(lv, r) for lv in self.levels if (r := lv.req_s) is not None]
        best = max(rated, key=lambda x: (x[1], x[0].share or 0.0), default=None)
        return None if best is None else best[0]

    def key(self) -> tuple[float, float]:
        b = self.best
        return (b.req_s or 0.0, b.share or 0.0) if b else (-1.0, -1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputRanking:
    slo: dict[str, float]
    slo_source: str  # "--slo" or "stored"
    baseline: RunGoodput
    ranked: list[RunGoodput]  # best first; the baseline among them
    notes: list[str] = field(default_factory=list)

    def change_pct(self, r: RunGoodput) -> float | None:
        b, o = self.baseline.best, r.best
        if b is None or o is None or not b.req_s or o.req_s is None:
            return None
        return float(o.req_s / b.req_s - 1) * 100

    def to_json(self) -> dict[str, object]:
        return {
            "schema_version": GOODPUT_SCHEMA_VERSION,
            "metric": "goodput",
            "slo": self.slo,
            "slo_source": self.slo_source,
            "baseline": {"run": self.baseline.run, "label": self.baseline.label},
            "ranking": [
                {
                    "rank": i + 1,
                    "run": r.run,
                    "label": r.label,
                    "best": None if (b := r.best) is None else b.to_json(),
                    "change_pct": self.change_pct(r),
                    "levels": [lv.to_json() for lv in r.levels],
                }
                for i, r in enumerate(self.ranked)
            ],
            "notes": self.notes,
        }


def run_goodput(run: Run, samples: Iterable[dict[str, object]], slo: Mapping[str, float]) -> RunGoodput:
    """Each level's goodput, the samples read once (a run of any length, streamed)."""
    levels = []
    for key, f in level_figures(s for s in samples if "chunks" in s).items():
        c, rate = key[2], key[3]
        g = goodput(f.ms, slo, level_span(f.heads))
        ci = wilson(g.met, g.of)
        levels.append(
            GoodputLevel(
                level=key_name(key),
                concurrency=c,
                rate=rate,
                goodput=g,
                share_ci=None if ci is None else (round(ci[0], 4), round(ci[1], 4)),
            )
        )
    return RunGoodput(run.id, run.label, levels)


def choose_slo(runs: list[Run], slo: dict[str, float] | None) -> tuple[dict[str, float], str]:
    """``slo`` when given; else the targets every run was measured with, which must agree."""
    if slo:
        return slo, "--slo"
    stored = {r.id: r.meta.details.get("slo") or None for r in runs}
    kinds = {tuple(sorted(s.items())) if s else None for s in stored.values()}
    if kinds == {None}:
        raise InputError(
            "no latency targets to judge goodput by: none of these runs was measured with --slo",
            hint=f"give them: --slo {SLO_EXAMPLE}",
        )
    if len(kinds) > 1:
        said = "; ".join(f"run {i}: {slo_text(s) if s else 'none'}" for i, s in stored.items())
        raise InputError(
            f"the runs were measured with different latency targets ({said})",
            hint="give --slo to judge them all by the same targets",
        )
    first = next(iter(stored.values()))
    assert first is not None
    return dict(first), "stored"


def rank_goodput(db: ResultsDB, runs: list[Run], slo: dict[str, float] | None) -> GoodputRanking:
    """The serve-bench runs among ``runs`` (the first is the baseline), ranked by goodput; runs of
    other kinds are left out with a note, and fewer than two serve-bench runs is an input error."""
    notes = [
        f"run {r.id} ({r.label}) is a {r.kind} run: goodput is a serve-bench figure, not compared"
        for r in runs
        if r.kind != RunKind.SERVE_BENCH
    ]
    serve = [r for r in runs if r.kind == RunKind.SERVE_BENCH]
    if not serve or serve[0] is not runs[0]:
        raise InputError(
            f"--metric goodput ranks serve-bench runs; the baseline run {runs[0].id} ({runs[0].label}) "
            f"is a {runs[0].kind} run",
            hint="list serve-bench runs (`moetune results list --kind serve-bench`)",
        )
    if len(serve) < 2:
        raise InputError("--metric goodput needs at least two serve-bench runs", hint="; ".join(notes) or None)
    targets, source = choose_slo(serve, slo)
    data = [run_goodput(r, db.iter_samples(r.id), targets) for r in serve]
    for d in data:
        if not d.levels:
            raise InputError(
                f"run {d.run} ({d.label}) has no measured samples to judge",
                hint="it may have been interrupted before its first sample; run it again",
            )
    ranked = sorted(data, key=lambda d: d.key(), reverse=True)  # stable: ties keep the order given
    return GoodputRanking(slo=targets, slo_source=source, baseline=data[0], ranked=ranked, notes=notes)


def _cell(lv: GoodputLevel | None) -> str:
    if lv is None:
        return "–"
    rate = "-" if lv.req_s is None else f"{lv.req_s:.2f}/s"
    share = "-" if lv.share is None else f"{lv.share * 100:.0f}%"
    ci = lv.share_ci
    return f"{rate} {share}" + (f" [{ci[0] * 100:.0f}–{ci[1] * 100:.0f}]" if ci else "")


def _level_names(g: GoodputRanking) -> list[str]:
    names: list[str] = []
    for r in g.ranked:
        names += [lv.level for lv in r.levels if lv.level not in names]
    return names


def legend(g: GoodputRanking) -> str:
    return (
        f"goodput: requests with {slo_text(g.slo)} ({'--slo' if g.slo_source == '--slo' else 'the runs’ own targets'}; "
        f"failed ones count as not met), per second of the level, and their share [95% Wilson interval]; "
        f"ranked by the best level's goodput; change vs baseline {g.baseline.label} (run {g.baseline.run})"
    )


def ranking_rows(g: GoodputRanking) -> tuple[list[str], list[list[str]]]:
    names = _level_names(g)
    head = ["rank", "configuration", "run", "best", "change", *names]
    rows = []
    for i, r in enumerate(g.ranked):
        by = {lv.level: lv for lv in r.levels}
        best = r.best
        ch = g.change_pct(r)
        change = "baseline" if r is g.baseline else ("-" if ch is None else f"{ch:+.1f}%")
        rows.append(
            [
                str(i + 1),
                r.label,
                str(r.run),
                "-" if best is None else f"{best.req_s or 0.0:.2f}/s at {best.level}",
                change,
                *[_cell(by.get(n)) for n in names],
            ]
        )
    return head, rows


def ranking_table(g: GoodputRanking) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head, rows = ranking_rows(g)
    t = Table(title="GOODPUT (met requests/s, share met)", title_justify="left")
    for i, h in enumerate(head):
        t.add_column(h, justify="left" if i == 1 else "right")
    for row in rows:
        t.add_row(*row)
    return Group(t, Text(legend(g), style="dim"))


def ranking_markdown(g: GoodputRanking) -> str:
    head, rows = ranking_rows(g)
    out = ["**GOODPUT** (met requests/s, share met)", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join([*out, "", legend(g)]) + "\n"


def ranking_csv(g: GoodputRanking) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(
        [
            "rank",
            "run",
            "label",
            "level",
            "concurrency",
            "rate",
            "met",
            "of",
            "share",
            "share_ci_low",
            "share_ci_high",
            "req_s",
            "slo",
        ]
    )
    for i, r in enumerate(g.ranked):
        for lv in r.levels:
            ci = lv.share_ci or (None, None)
            w.writerow(
                [
                    i + 1,
                    r.run,
                    r.label,
                    lv.level,
                    lv.concurrency,
                    lv.rate,
                    lv.goodput.met,
                    lv.goodput.of,
                    lv.share,
                    ci[0],
                    ci[1],
                    lv.req_s,
                    ",".join(f"{k}={v:g}" for k, v in g.slo.items()),
                ]
            )
    return buf.getvalue()
