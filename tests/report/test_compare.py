"""Comparisons: rows, verdicts, the extractor registry for other kinds, rendering."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rich.table import Table

from moetune.bench.analysis.stats import MetricSamples
from moetune.errors import InputError
from moetune.kinds import RunKind
from moetune.report import compare as cmp
from moetune.report.compare import METRIC_EXTRACTORS, RunMetrics, compare, extract, load
from moetune.report.compare_view import comparison_csv, comparison_markdown, comparison_table
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from tests.bench.synth import run_samples

BASE = [18.80, 18.84, 18.86, 18.83, 18.85]


def rm(run: int, label: str, tgs: list[float], pps: list[float] | None = None) -> RunMetrics:
    ms = {"tg:short-json": MetricSamples(values=tuple(tgs), higher_is_better=True, unit="tokens/s", family="tg")}
    if pps:
        ms["pp:short-json"] = MetricSamples(values=tuple(pps), higher_is_better=True, unit="tokens/s", family="pp")
    return RunMetrics(run=run, label=label, kind="bench", status="done", metrics=ms)


def test_the_reference_table_with_verdicts() -> None:
    """The field report's TG table: the same placement twice, +5.8 % and +15.4 %."""
    c = compare(
        rm(1, "cpu-moe", BASE),
        [
            rm(2, "cpu-moe again", [18.81, 18.86, 18.84, 18.82, 18.85]),
            rm(4, "n-cpu-moe 64", [19.92, 19.94, 19.96, 19.93, 19.95]),
            rm(5, "head+tail", [21.73, 21.75, 21.77, 21.74, 21.76]),
            rm(6, "worse", [15.0, 15.1, 14.9, 15.05, 14.95]),
        ],
    )
    got = [(r.run, r.metric, round(r.change_pct, 1), r.verdict) for r in c.rows]
    assert got == [
        (2, "tg:short-json", 0.0, "same"),
        (4, "tg:short-json", 5.8, "faster"),
        (5, "tg:short-json", 15.4, "faster"),
        (6, "tg:short-json", -20.4, "slower"),
    ]
    doc = c.to_json()
    assert doc["baseline"]["run"] == 1
    assert {"run", "metric", "change_pct", "verdict"} <= set(doc["rows"][0])
    assert doc["rule"]["min_change_pct"] == 3.0


def test_a_verdict_between_separate_launches_says_the_interval_cannot_see_them() -> None:
    """Two runs of separate launches: the bootstrap interval is over each launch's requests, and on
    this VM back-to-back pairs of launches of one server measured -18% to +24% apart, so a verdict
    says so (issue #25: 2 of 12 such A/A pairs got a verdict other than "same")."""

    def launched(run: int, tgs: list[float], launch: str | None) -> RunMetrics:
        return replace(rm(run, f"r{run}", tgs), launch_run=launch)

    faster = [19.92, 19.94, 19.96, 19.93, 19.95]
    c = compare(launched(1, BASE, "L1"), [launched(2, faster, "L2"), launched(3, BASE, "L3")])
    assert [r.verdict for r in c.rows] == ["faster", "same"]
    (note,) = [n for n in c.notes if "launch of its own" in n]
    assert note.startswith("run 1 and run 2 were each measured in a launch of its own")  # not run 3: "same"
    assert "--interleave launches" in note
    for base, other in (("L1", "L1"), (None, "L2"), ("L1", None)):  # one launch, or a server moetune did not start
        c = compare(launched(1, BASE, base), [launched(2, faster, other)])
        assert c.rows[0].verdict == "faster" and not any("launch of its own" in n for n in c.notes)


def test_metrics_only_on_one_side_are_noted_not_compared() -> None:
    c = compare(rm(1, "a", BASE, [25.0, 25.1, 25.2]), [rm(2, "b", BASE)])
    assert [r.metric for r in c.rows] == ["tg:short-json"]
    assert c.metric_names() == ["tg:short-json"]
    assert any("pp:short-json" in n for n in c.notes)


def test_renderings_carry_every_verdict() -> None:
    c = compare(rm(1, "cpu-moe", BASE), [rm(2, "head+tail", [21.73, 21.75, 21.77, 21.74, 21.76])])
    md = comparison_markdown(c)
    assert "| cpu-moe | 1 |" in md and "+15.4% faster" in md
    assert "2,head+tail,tg:short-json" in comparison_csv(c)
    (table, legend) = comparison_table(c).renderables
    assert isinstance(table, Table) and table.row_count == 2 and table.title == "TG (tokens/s)"
    assert "ratio of medians" in str(legend)


@pytest.fixture
def latency_kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A kind of run whose figure is a latency (lower is better), registered as other kinds are."""

    def latency_metrics(samples: list[dict[str, Any]]) -> dict[str, MetricSamples]:
        return {
            "ttft_s": MetricSamples(
                values=tuple(s["ttft_s"] for s in samples), higher_is_better=False, unit="s", family="ttft"
            )
        }

    monkeypatch.setitem(METRIC_EXTRACTORS, "link-test", latency_metrics)
    yield


def test_other_kinds_through_the_extractor_registry(tmp_path: Path, latency_kind: None) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        ids = []
        for label, ttft in (("p1", 0.50), ("p2", 0.40)):
            rid = db.create_run(RunMeta(kind=RunKind("link-test")), label=label, target="t")
            for d in (-0.002, 0.0, 0.001, 0.002, -0.001):
                db.add_sample(rid, {"ttft_s": ttft + d})
            db.finish_run(rid)
            ids.append(rid)
        a, b = load(db, [db.run(i) for i in ids])
    (row,) = compare(a, [b]).rows
    assert (row.metric, row.unit, row.verdict) == ("ttft_s", "s", "faster")  # lower latency is faster
    assert row.change_pct == pytest.approx(-20.0, abs=0.5)


def test_unknown_kinds_and_empty_runs_are_input_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(METRIC_EXTRACTORS, RunKind.LINK_TEST)
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        rid = db.create_run(RunMeta(kind=RunKind("link-test")), label="l", target="t")  # no extractor registered
        with pytest.raises(InputError, match="link-test"):
            extract(db.run(rid), [])
        empty = db.create_run(RunMeta(kind=RunKind("bench")), label="e", target="t")
        with pytest.raises(InputError, match="no measured samples"):
            load(db, [db.run(empty)])
        full = db.create_run(RunMeta(kind=RunKind("bench")), label="f", target="t")
        for s in run_samples([20.0, 20.1, 19.9]):
            db.add_sample(full, s)
        (got,) = cmp.load(db, [db.run(full)])
        assert list(got.metrics) == ["tg:short-json", "pp:short-json"]


def test_a_large_change_drowned_in_noise_is_same_but_flagged_noisy() -> None:
    c = compare(rm(1, "quiet", BASE), [rm(2, "noisy", [8.0, 30.0, 12.0, 25.0, 11.0])])
    (row,) = c.rows
    assert row.verdict == "same" and row.noisy and row.change_pct < -30
    assert "same (noisy)" in comparison_markdown(c)
    (quiet,) = compare(rm(1, "a", BASE), [rm(2, "b", [18.81, 18.86, 18.84, 18.82, 18.85])]).rows
    assert quiet.verdict == "same" and not quiet.noisy


def test_every_kind_of_run_is_registered() -> None:
    assert set(METRIC_EXTRACTORS) == set(RunKind)


def serve_rm(run: int, label: str, ttft_by_c: dict[int, list[float]]) -> RunMetrics:
    return RunMetrics(
        run=run,
        label=label,
        kind="serve-bench",
        status="done",
        metrics={
            f"ttft:c={c}": MetricSamples(
                values=tuple(v), higher_is_better=False, unit="ms", family="ttft", x=float(c), x_label="concurrency"
            )
            for c, v in ttft_by_c.items()
        },
    )


def test_a_run_sharing_nothing_is_named_and_the_rest_compared() -> None:
    other = RunMetrics(
        run=4,
        label="other workload",
        kind="bench",
        status="done",
        metrics={
            "tg:long-openapi": MetricSamples(
                values=(10.0, 10.1, 10.2), higher_is_better=True, unit="tokens/s", family="tg"
            )
        },
    )
    c = compare(rm(1, "a", BASE), [rm(2, "b", [18.81, 18.86, 18.84, 18.82, 18.85]), other])
    assert [o.run for o in c.others] == [2] and [o.run for o in c.not_compared] == [4]
    assert [r.run for r in c.rows] == [2]
    assert c.metric_names() == ["tg:short-json"]  # the table is still drawn
    (note,) = c.notes
    assert note.startswith("run 4 (other workload) shares no metric with the baseline run 1 (a)")
    assert "tg:long-openapi" in note and note.endswith("not compared")
    assert c.to_json()["not_compared"] == [{"run": 4, "label": "other workload", "kind": "bench"}]
    cmp.require_rows(c)  # something was compared: no error


def test_a_column_two_runs_share_stays_when_a_third_lacks_it() -> None:
    c = compare(rm(1, "a", BASE, [25.0, 25.1, 25.2]), [rm(2, "b", BASE, [26.0, 26.1, 26.2]), rm(3, "c", BASE)])
    assert c.metric_names() == ["tg:short-json", "pp:short-json"]
    md = comparison_markdown(c)
    pp = md.split("**PP**", 1)[1]
    assert "| b | 2 | 26.10" in pp and "| c | 3 | – |" in pp  # run 3 shows a dash, not a dropped column
    assert any("run 3 (c) lacks the baseline's pp:short-json" in n for n in c.notes)


@pytest.mark.parametrize(
    ("others", "message"),
    [
        (
            [serve_rm(2, "serve", {1: [5.0, 6.0]})],
            "nothing to compare: run 2 (serve) is a serve-bench run and the baseline run 1 (a) a bench run",
        ),
        (
            [
                RunMetrics(
                    run=2,
                    label="x",
                    kind="bench",
                    status="done",
                    metrics={"tg:other": MetricSamples(values=(1.0,), higher_is_better=True)},
                ),
                RunMetrics(
                    run=3,
                    label="y",
                    kind="bench",
                    status="done",
                    metrics={"tg:else": MetricSamples(values=(1.0,), higher_is_better=True)},
                ),
            ],
            "nothing to compare: runs 2, 3 share no metric with the baseline run 1 (a)",
        ),
    ],
)
def test_nothing_comparable_is_an_input_error(others: list[RunMetrics], message: str) -> None:
    c = compare(rm(1, "a", BASE), others)
    assert not c.rows
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        cmp.require_rows(c)
    assert ("one kind" in (e.value.hint or "")) == (others[0].kind != "bench")


def test_plot_panels_are_titled_by_their_axis_with_a_tick_at_each_level() -> None:
    from moetune.bench.analysis.single import DEPTH_AXIS
    from moetune.report.plot import panels

    serve = [serve_rm(1, "p4", {1: [5.0, 6.0], 2: [9.0, 11.0]}), serve_rm(2, "p1", {1: [5.0], 3: [50.0]})]
    (p,) = panels(serve)
    assert (p.style, p.title, p.xlabel, p.xticks, p.xticklabels) == (
        "line",
        "TTFT vs concurrency",
        "concurrency",
        (1.0, 2.0, 3.0),
        ("1", "2", "3"),
    )
    assert not p.log_x
    (wide,) = panels([serve_rm(1, "a", {c: [1.0] for c in (1, 2, 4, 8, 16)})])
    assert wide.log_x and wide.xticklabels == ("1", "2", "4", "8", "16")
    depth = RunMetrics(
        run=1,
        label="d",
        kind="bench",
        status="done",
        metrics={
            f"tg:d{d}": MetricSamples(
                values=(20.0,), higher_is_better=True, unit="tokens/s", family="tg", x=float(d), x_label=DEPTH_AXIS
            )
            for d in (0, 4096)
        },
    )
    (dp,) = panels([depth])
    assert dp.title == "TG vs context depth" and dp.xticks == (0.0, 4096.0) and not dp.log_x
    (bar,) = panels([rm(1, "a", BASE)])
    assert (bar.style, bar.title) == ("bar", "TG")


def test_quality_rows_are_worded_better_or_worse_not_faster() -> None:
    """A lower KLD is better, not faster: the views word quality verdicts by their family, while the
    JSON keeps the verdict's code and says the family."""
    from moetune.quality.metrics import quality_metrics

    def q(run: int, label: str, klds: list[float]) -> RunMetrics:
        return RunMetrics(
            run=run, label=label, kind=RunKind.QUALITY, status="done", metrics=quality_metrics({"kld": k} for k in klds)
        )

    c = compare(
        q(1, "f16", [0.010, 0.011, 0.012, 0.011, 0.010]),
        [q(2, "q4", [0.050, 0.052, 0.051, 0.049, 0.050]), q(3, "q8", [0.002, 0.002, 0.003, 0.002, 0.002])],
    )
    md = comparison_markdown(c)
    assert "worse" in md and "better" in md and "faster" not in md.split("median [")[0]
    assert "better/worse for quality" in md
    assert [r["verdict"] for r in c.to_json()["rows"]] == ["slower", "faster"]
    assert {r["family"] for r in c.to_json()["rows"]} == {"quality"}
    # a speed comparison keeps its words and its legend
    s = comparison_markdown(compare(rm(1, "a", BASE), [rm(2, "b", [21.73, 21.75, 21.77, 21.74, 21.76])]))
    assert "faster" in s and "better/worse" not in s
