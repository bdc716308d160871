"""`moetune tune --objective goodput`: the completion windows its verdicts judge, what it refuses,
and a search on this machine's testbed (tests/tune_testbed.py) measured by serve-bench: the JSON
keeps its shape and adds goodput, each candidate is planned with a slot per stream, the runs are
serve-bench runs filed under the tune, and running it again launches nothing twice."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from moetune.bench.analysis.stats import FASTER, SAME
from moetune.bench.target import CTX, PARALLEL, flag_value
from moetune.kinds import RunKind
from moetune.plan.serving import ServeLoad
from moetune.run.prepare import read_plan
from moetune.store.db import ResultsDB
from moetune.tune.goodput import measured, windows
from moetune.tune.verdict import compare
from tests.bench.test_serve_metrics import sample
from tests.engine_harness import free_port
from tests.helpers import run_cli
from tests.tune_testbed import make_testbed

SLO = {"ttft_ms": 100.0}


def req(t_send: float, ttft: float, end: float, *, error: str | None = None) -> dict[str, Any]:
    """A request sent at ``t_send`` whose first token came ``ttft`` s later and that ended at ``end``."""
    chunks = [] if error else [[t_send + ttft, 1, 1, 0], [end - 0.001, 1, 1, 0]]
    return sample(chunks, t_send=t_send, t_end=end, error=error, c=2)


def test_completion_windows_are_rounds_of_the_streams() -> None:
    # two streams in step: rounds end at 0.5, 1.0, 1.5, 2.0 s; in the second round one request is slow
    # to its first token (150 ms), in the third one fails
    s = [
        req(0.0, 0.05, 0.5),
        req(0.0, 0.05, 0.5),
        req(0.5, 0.15, 1.0),
        req(0.5, 0.05, 1.0),
        req(1.0, 0.05, 1.5),
        req(1.0, 0.0, 1.5, error="http_500"),
        req(1.5, 0.05, 2.0),
        req(1.5, 0.05, 2.0),
    ]
    good, rates = windows(s, SLO, 2)
    assert good == pytest.approx([4.0, 2.0, 2.0, 4.0])  # met requests / 0.5 s
    assert rates == pytest.approx([4.0, 4.0, 2.0, 4.0])  # completed requests / 0.5 s
    g = measured(s, ServeLoad(concurrency=2, requests=8, input_len=16, output_len=16, slo=tuple(SLO.items())))
    assert g.level_req_s == pytest.approx(6 / 2.0)  # serve-bench's figure: 6 met over the level's 2 s
    assert statistics.mean(good) == pytest.approx(g.level_req_s)  # windows of equal spans average to it
    assert g.floor == pytest.approx(0.25)  # half a request over the level's 2 s


def test_a_last_partial_round_joins_the_one_before() -> None:
    s = [req(0.0, 0.05, 0.5), req(0.0, 0.05, 0.5), req(0.5, 0.05, 1.0), req(0.5, 0.05, 1.0), req(1.0, 0.05, 1.25)]
    good, rates = windows(s, SLO, 2)
    assert good == pytest.approx([4.0, 3 / 0.75]) and rates == good


def test_a_baseline_that_met_nothing_is_beaten_by_a_candidate_whose_interval_stays_above_zero() -> None:
    assert compare([0.0, 0.0, 0.0, 0.0], [3.0, 4.0, 3.5, 4.2])[0] == FASTER
    assert compare([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 4.0])[0] == SAME
    assert compare([4.0, 4.1, 3.9, 4.0], [0.0, 0.0, 0.0, 0.0])[1].startswith("slower")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--objective", "goodput"], "--objective goodput needs latency targets"),
        (["--slo", "ttft_ms=100"], "--slo: only with --objective goodput"),
        (["--objective", "goodput", "--slo", "ttft=1"], "unknown key 'ttft'"),
        (
            ["--objective", "goodput", "--slo", "ttft_ms=100", "--concurrency", "4", "--requests", "6"],
            "--requests 6: at least 2 x --concurrency (8)",
        ),
        (["--objective", "goodput", "--slo", "ttft_ms=100", "--depth", "512"], "--depth: a single-stream workload"),
        (["--try-muge", "on,off"], "--try-muge: an ik_llama.cpp option; this search runs llama.cpp"),
    ],
)
def test_what_tune_refuses(tmp_path: Path, args: list[str], says: str) -> None:
    model, hw = make_testbed(tmp_path)
    r = run_cli("tune", str(model), "--hw", str(hw), *args, "--db", str(tmp_path / "t.db"))
    assert r.exit_code == 2 and says in r.stderr, r.stderr


@pytest.mark.server
def test_a_goodput_search_on_the_testbed(bin_dir: Path, tmp_path: Path) -> None:
    model, hw = make_testbed(tmp_path)
    db = tmp_path / "t.db"
    args = [
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--ctx",
        "512",
        "--objective",
        "goodput",
        "--slo",
        "ttft_ms=2000,itl_ms=500",
        "--concurrency",
        "2",
        "--requests",
        "8",
        "--pp-tokens",
        "64",
        "--tg-tokens",
        "16",
        "--strategy",
        "cpu-moe",
        "-t",
        "1",
        "--try-strategy",
        "auto,cpu-moe",
        "--try-threads",
        "1",
        "--try-ubatch",
        "512",
        "--try-fa",
        "on",
        "--try-cache",
        "f16/f16",
        "--try-repack",
        "off",
        "--budget",
        "2",
        "--port",
        str(free_port()),
        "--db",
        str(db),
        "--json",
    ]
    r = run_cli(*args)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["objective"] == "goodput" and doc["serve"] == {
        "concurrency": 2,
        "requests": 8,
        "input_len": 64,
        "output_len": 16,
        "slo": {"ttft_ms": 2000.0, "itl_ms": 500.0},
    }
    assert doc["baseline"]["label"] == "cpu-moe t1 ub512 fa" and 1 <= doc["launches"] <= 2
    base = doc["baseline"]["goodput_req_s"]
    # targets every request meets on this machine: the goodput is the request rate, judged by windows
    assert base["met"] == base["of"] == 8 and base["n"] == 4 and base["ci_low"] <= base["median"] <= base["ci_high"]
    assert base["level_req_s"] > 0 and doc["baseline"]["tg_tok_s"] is None
    for c in doc["candidates"]:
        assert set(c["predicted"]) == {"tg_tok_s", "pp_tok_s", "goodput_req_s", "serve"}
        assert c["predicted"]["serve"]["ttft_ms"] > 0 and c["predicted"]["goodput_req_s"] >= 0
    launched = [c for c in doc["candidates"] if c["launched"]]
    assert len(launched) == doc["launches"] and all(c["measured"]["goodput_req_s"] for c in launched)
    with ResultsDB.open(db) as h:
        runs = h.runs()
        assert {r.kind for r in runs} == {RunKind.SERVE_BENCH} and len(runs) == doc["launches"]
        assert {r.sweep_id for r in runs} == {doc["tune"]}
        first = h.run(doc["baseline"]["run"])
        level = first.summary["levels"][0]
        assert level["goodput"]["req_s"] == pytest.approx(base["level_req_s"])
        assert level["concurrency"] == 2 and level["ok"] == 8
        argv = tuple(level["server"]["argv"])  # planned with a slot per stream, 512 tokens each
        assert (flag_value(argv, PARALLEL), flag_value(argv, CTX)) == ("2", "1024")
    spec, plan = read_plan(Path(doc["plan"]))  # the winner's plan has the slots it was measured with
    assert plan["label"] == doc["best"]["label"]
    assert (flag_value(spec.servers()[0].argv, PARALLEL), flag_value(spec.servers()[0].argv, CTX)) == ("2", "1024")
    again = run_cli(*args)  # resumed: nothing measured is launched again
    assert again.exit_code == 0, again.stderr
    assert "resuming tune" in again.stderr and json.loads(again.stdout)["launches"] == doc["launches"]
    with ResultsDB.open(db) as h:
        assert len(h.runs()) == doc["launches"]
