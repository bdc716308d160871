"""The single-stream bench summary as a typed document: the JSON shape users see (keys, their order
and their types) pinned, and the one reader of stored summaries (old shapes included)."""

from __future__ import annotations

import json
from typing import Any

from moetune.bench.analysis.bench_summary import BenchSummary, ClientFigures, Stat, WorkloadSummary
from moetune.bench.analysis.summary import bench_summary, run_summary
from tests.bench.synth import run_samples

NUM = (int, float)
STAT = {
    "median": float,
    "ci_low": float,
    "ci_high": float,
    "n": int,
    "mean": float,
    "stdev": float,
    "cv": float,
    "min": float,
    "max": float,
    "outliers": list,
    "source": str,
}
# a workload's keys in the order `bench --json` prints them, and each one's type when it has a value
WORKLOAD: dict[str, Any] = {
    "kind": str,
    "depth": int,
    "thinking": bool,
    "tg": STAT,
    "pp": STAT,
    "overhead_ms": float,
    "wall_ms": float,
    "client": {"tg": float, "pp": float, "ttft_ms": float},
    "prompt_tokens": float,
    "prompt_n": float,
    "predicted_n": float,
    "cached_n": float,
    "cache_confirmed": float,
    "reasoning_share": float,
    "n": int,
}
WARNING = {"code": str, "subject": str, "detail": str, "message": str, "remedy": str}
TOP: dict[str, Any] = {
    "schema_version": int,
    "tg": STAT,
    "pp": STAT,
    "overhead_ms": float,
    "workloads": {"short-json": WORKLOAD, "deep": WORKLOAD},
    "warnings": list,
    "n_samples": int,
}


def _samples() -> list[dict[str, Any]]:
    """A chat workload with thinking (one slow repeat: an outlier) and a depth workload, cached."""
    chat = run_samples([20.0, 21.0, 19.5, 20.2, 5.0], thinking=True, reasoning_chunks=6)
    deep = run_samples(
        [15.0, 15.5, 14.8], [300.0, 310.0, 305.0], "deep", depth=8192, thinking=None, cache_n=8000, expect_cached=8000
    )
    return chat + deep


def _check(value: Any, want: Any, where: str, nullable: tuple[str, ...] = ()) -> None:
    if isinstance(want, dict):
        assert isinstance(value, dict), where
        assert list(value) == list(want), where
        for k, w in want.items():
            _check(value[k], w, f"{where}.{k}", nullable)
        return
    if where in nullable:
        assert value is None, f"{where} should be null"
        return
    assert value is not None, f"{where} has no value"
    is_bool = isinstance(value, bool)
    assert isinstance(value, want) and is_bool == (want is bool), f"{where}: {type(value).__name__}"


def test_the_json_shape_of_a_bench_summary_is_pinned() -> None:
    d = run_summary(_samples())
    _check(
        d,
        TOP,
        "run",
        nullable=("run.workloads.short-json.depth", "run.workloads.deep.thinking"),
    )
    chat, deep = d["workloads"]["short-json"], d["workloads"]["deep"]
    assert d["tg"] == chat["tg"] and d["pp"] == chat["pp"] and d["overhead_ms"] == chat["overhead_ms"] == 4.0
    assert (d["schema_version"], d["n_samples"], chat["n"], deep["n"]) == (1, 8, 5, 3)
    assert (chat["kind"], chat["thinking"], deep["kind"], deep["depth"]) == ("chat", True, "depth", 8192)
    assert chat["tg"]["outliers"] == [4] and chat["tg"]["median"] == 20.0 and chat["tg"]["source"] == "server"
    assert deep["pp"]["median"] == 305.0 and deep["cached_n"] == 8000.0 and deep["cache_confirmed"] == 1.0
    for w in d["warnings"]:
        _check(w, WARNING, "warning")
    assert [w["code"] for w in d["warnings"]] == ["outliers", "noisy"]


def test_a_run_without_samples_has_nulls_at_the_top() -> None:
    d = run_summary([])
    assert d == {
        "schema_version": 1,
        "tg": None,
        "pp": None,
        "overhead_ms": None,
        "workloads": {},
        "warnings": [],
        "n_samples": 0,
    }


def test_the_typed_summary_reads_as_attributes() -> None:
    s = bench_summary(_samples())
    assert s.head is s.workloads["short-json"] and s.tg is s.head.tg
    assert s.median("deep", "pp") == 305.0 and s.median("deep", "ttft") is None and s.median("none", "tg") is None
    assert s.workloads["deep"].depth == 8192 and s.workloads["deep"].client.ttft_ms is not None
    assert s.to_json() == run_summary(_samples())


def test_a_stored_summary_round_trips_through_its_reader() -> None:
    for ss in (_samples(), _samples()[5:], []):
        d = json.loads(json.dumps(run_summary(ss, seed=7)))
        s = BenchSummary.from_json(d)
        assert s == bench_summary(ss, seed=7)
        assert json.dumps(s.to_json()) == json.dumps(d)  # byte for byte, key order included


def test_an_older_stored_summary_reads_with_empty_values() -> None:
    """A summary of an older moetune: no client figures, no cache keys, a warning code since
    dropped, extra keys beside the figures; what it lacks reads as empty, what it has is kept."""
    old = {
        "tg": {"median": 20, "ci_low": 19, "ci_high": 21, "n": 3},
        "workloads": {"w": {"kind": "chat", "tg": {"median": 20, "ci_low": 19, "ci_high": 21, "n": 3}, "n": 3}},
        "warnings": [{"code": "gone_code", "message": "x"}, {"code": "noisy", "message": "y"}],
        "error": "stopped",
    }
    s = BenchSummary.from_json(old)
    w = s.workloads["w"]
    assert w.tg == Stat(median=20, ci_low=19, ci_high=21, n=3, mean=0.0, stdev=0.0, cv=0.0, min=0.0, max=0.0, source="")
    assert (w.pp, w.client, w.prompt_n, w.depth, w.thinking) == (None, ClientFigures(), None, None, None)
    assert [x.message for x in s.warnings] == ["y"] and s.n_samples == 0
    assert BenchSummary.from_json({}) == BenchSummary() and WorkloadSummary.from_json(None) == WorkloadSummary()
