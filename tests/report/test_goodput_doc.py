"""The goodput ranking's level document (`moetune compare --metric goodput --json`): its keys, in
their order, from the typed :class:`GoodputLevel`, and the best level of a run."""

from __future__ import annotations

from moetune.bench.analysis.level_summary import LevelGoodput
from moetune.report.goodput import GoodputLevel, GoodputRanking, RunGoodput, ranking_csv, ranking_rows


def level(name: str, req_s: float | None, share: float | None) -> GoodputLevel:
    g = LevelGoodput(
        share=share, req_s=req_s, slo={"ttft_ms": 500.0}, met=3, of=4, missed={"ttft_ms": 1}, failed=0, unknown=0
    )
    return GoodputLevel(level=name, concurrency=4, rate=None, goodput=g, share_ci=(0.3, 0.95))


def test_a_level_keeps_its_json_shape() -> None:
    assert level("c=4", 1.5, 0.75).to_json() == {
        "level": "c=4",
        "concurrency": 4,
        "rate": None,
        "share": 0.75,
        "share_ci": [0.3, 0.95],
        "req_s": 1.5,
        "met": 3,
        "of": 4,
        "missed": {"ttft_ms": 1},
        "failed": 0,
        "unknown": 0,
    }
    assert list(level("c=4", 1.5, 0.75).to_json()) == [
        "level",
        "concurrency",
        "rate",
        "share",
        "share_ci",
        "req_s",
        "met",
        "of",
        "missed",
        "failed",
        "unknown",
    ]


def test_the_best_level_is_the_highest_goodput_then_share_and_a_level_without_a_rate_is_never_best() -> None:
    r = RunGoodput(
        1, "a", [level("c=1", 1.0, 0.5), level("c=2", 2.0, 0.4), level("c=4", 2.0, 0.6), level("c=8", None, 0.9)]
    )
    assert r.best is not None and r.best.level == "c=4" and r.key() == (2.0, 0.6)
    assert RunGoodput(2, "b", [level("c=1", None, None)]).best is None


def test_the_ranking_document_and_rows() -> None:
    base = RunGoodput(1, "base", [level("c=4", 1.0, 0.5)])
    fast = RunGoodput(2, "fast", [level("c=4", 2.0, 0.75)])
    g = GoodputRanking(slo={"ttft_ms": 500.0}, slo_source="--slo", baseline=base, ranked=[fast, base])
    doc = g.to_json()
    assert [(x["rank"], x["label"], x["change_pct"]) for x in doc["ranking"]] == [(1, "fast", 100.0), (2, "base", 0.0)]
    assert doc["ranking"][0]["best"] == fast.levels[0].to_json() == doc["ranking"][0]["levels"][0]
    head, rows = ranking_rows(g)
    assert head == ["rank", "configuration", "run", "best", "change", "c=4"]
    assert rows[0] == ["1", "fast", "2", "2.00/s at c=4", "+100.0%", "2.00/s 75% [30–95]"]
    assert ranking_csv(g).splitlines()[1] == "1,2,fast,c=4,4,,3,4,0.75,0.3,0.95,2.0,ttft_ms=500"
