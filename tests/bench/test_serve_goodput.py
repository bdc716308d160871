"""Goodput against latency targets (`serve-bench --slo`): which value of a request is compared,
the exact share on the mock's known schedule, failed requests, `serve-report` judging a stored
run again, and `compare --metric goodput` ranking runs."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from moetune.bench.analysis.serve import summarize_level
from moetune.bench.analysis.slo import parse_slo, wilson
from moetune.errors import InputError
from tests.bench.mock_server import MockConfig, mock_server
from tests.bench.test_serve_metrics import sample
from tests.helpers import run_cli

# --- the rule, on hand-made samples (times are exact binary fractions) ------------------------


def _req(ttft: float, gaps: tuple[float, ...] = (0.0625,), *, error: str | None = None) -> dict[str, Any]:
    t, chunks = ttft, [[ttft, 1, 1, 0]]
    for g in gaps:
        t += g
        chunks.append([t, 1, 1, 0])
    return sample([] if error else chunks, t_send=0.0, t_end=t + 0.0078125, error=error)


def test_share_and_rate_of_requests_meeting_a_ttft_target() -> None:
    # TTFTs 125, 250, 500 ms and one failed request; target 250 ms (met when <=, as vLLM's --goodput)
    samples = [_req(0.125), _req(0.25), _req(0.5), _req(0.125, error="timeout")]
    lv = summarize_level(samples, {"ttft_ms": 250})
    g = lv["goodput"]
    assert (g["met"], g["of"], g["share"]) == (2, 4, 0.5)
    assert g["missed"] == {"ttft_ms": 1} and g["failed"] == 1 and g["unknown"] == 0
    assert g["req_s"] == pytest.approx(2 / lv["duration_s"], rel=1e-3)
    assert g["slo"] == {"ttft_ms": 250}
    assert summarize_level(samples)["goodput"] is None  # no targets, no goodput


def test_every_target_must_be_met() -> None:
    samples = [_req(0.125), _req(0.25), _req(0.5)]
    # E2E = TTFT + 62.5 + 7.8 ms: 195, 320, 570 ms; TTFT <= 300 keeps the first two, E2E <= 300 the first
    g = summarize_level(samples, {"ttft_ms": 300, "e2e_ms": 300})["goodput"]
    assert (g["met"], g["missed"]) == (1, {"ttft_ms": 1, "e2e_ms": 2})
    assert summarize_level(samples, {"ttft_ms": 1000, "e2e_ms": 1000})["goodput"]["share"] == 1.0
    assert summarize_level(samples, {"ttft_ms": 100})["goodput"]["share"] == 0.0


def test_itl_target_is_the_requests_largest_gap() -> None:
    # gaps 15.6, 15.6, 125 ms: mean 52 ms, largest 125 ms
    samples = [_req(0.125, (0.015625, 0.015625, 0.125))]
    assert summarize_level(samples, {"itl_ms": 100})["goodput"]["met"] == 0  # above the mean, below the max
    assert summarize_level(samples, {"itl_ms": 125})["goodput"]["met"] == 1  # the max itself meets it
    # TPOT is the mean: (156.25 ms) / 3 tokens = 52 ms
    assert summarize_level(samples, {"tpot_ms": 53})["goodput"]["met"] == 1
    assert summarize_level(samples, {"tpot_ms": 52})["goodput"]["met"] == 0


def test_a_one_token_request_meets_itl_and_tpot_and_an_unknown_itl_does_not() -> None:
    one = _req(0.125, ())
    assert summarize_level([one], {"itl_ms": 1, "tpot_ms": 1})["goodput"]["met"] == 1  # vLLM: TPOT 0
    unknown = sample(
        [[0.125, 1, 4, 0], [0.25, 1, 4, 0]], t_send=0.0, usage={"completion_tokens": 6}, count_source="text"
    )  # 6 tokens in 2 chunks, not counted per chunk: ITL unknown
    g = summarize_level([unknown], {"itl_ms": 1000})["goodput"]
    assert (g["met"], g["unknown"]) == (0, 1)
    assert summarize_level([unknown], {"ttft_ms": 1000})["goodput"]["met"] == 1


def test_wilson_interval() -> None:
    lo, hi = wilson(8, 16) or (0, 0)
    assert lo == pytest.approx(0.2799, abs=1e-3) and hi == pytest.approx(0.7201, abs=1e-3)
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-3))
    assert wilson(0, 0) is None


def test_parse_slo() -> None:
    assert parse_slo("e2e_ms=5000, ttft_ms=200.5") == {"ttft_ms": 200.5, "e2e_ms": 5000}
    assert list(parse_slo("tpot_ms=20,itl_ms=50")) == ["itl_ms", "tpot_ms"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("ttft=abc", ["unknown key 'ttft' (did you mean ttft_ms?)", "'abc': not a number"]),
        ("speed_ms=3", ["unknown key 'speed_ms'"]),
        ("ttft_ms=0", ["positive number of milliseconds"]),
        ("ttft_ms=-5", ["positive number of milliseconds"]),
        ("ttft_ms=inf", ["positive number of milliseconds"]),
        ("ttft_ms=1,ttft_ms=2", ["ttft_ms given twice"]),
        ("ttft_ms", ["'ttft_ms' is not KEY=MS"]),
        ("", ["no targets given"]),
    ],
)
def test_parse_slo_errors_name_the_problem_and_the_keys(text: str, says: list[str]) -> None:
    with pytest.raises(InputError) as e:
        parse_slo(text)
    for s in says:
        assert s in str(e.value)
    assert "accepted keys: ttft_ms, itl_ms, tpot_ms, e2e_ms" in str(e.value)


# --- against the mock server's known schedule --------------------------------------------------

# request i waits 20 ms (even i) or 120 ms (odd i) for its first token; gaps 5, 5, 60 ms
SCHEDULE = MockConfig(ttft_ms=(20.0, 120.0), itl_ms=(5.0, 5.0, 60.0))
RUN = ("--requests", "4", "--input-len", "40", "--output-len", "4", "--warmup", "0")


def bench(url: str, *args: str) -> dict[str, Any]:
    r = run_cli("serve-bench", url, "--json", *RUN, *args)
    assert r.exit_code == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def report(run: int, *args: str) -> dict[str, Any]:
    r = run_cli("serve-report", str(run), "--json", *args)
    assert r.exit_code == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def test_a_target_between_two_requests_latencies_and_serve_report_judging_again() -> None:
    with mock_server(SCHEDULE) as url:
        doc = bench(url, "--slo", "ttft_ms=70")
        text = run_cli("serve-bench", url, *RUN, "--slo", "ttft_ms=70,itl_ms=200")
    lv = doc["levels"][0]
    g = lv["goodput"]
    assert (g["met"], g["of"], g["share"], g["missed"]) == (2, 4, 0.5, {"ttft_ms": 2})
    assert g["req_s"] == pytest.approx(2 / lv["duration_s"], rel=1e-3)
    assert g["req_s"] == pytest.approx(lv["request_s"] / 2, rel=1e-3)
    assert doc["run"]["slo"] == {"ttft_ms": 70}
    # the table has the goodput columns and says what was judged; the progress line the count
    assert text.exit_code == 0, text.stderr
    assert "good" in text.stdout and "TTFT ≤ 70 ms, max ITL ≤ 200 ms" in text.stdout
    assert "goodput 2/4 met the targets" in text.stderr
    run = doc["run"]["id"]
    # stored with the run: serve-report judges the raw samples again by the same targets
    again = report(run)
    assert again["run"]["slo"] == {"ttft_ms": 70} and again["levels"][0]["goodput"] == g
    # ... and by others: E2E is TTFT + 70 ms (90 or 190), so 140 ms splits them as TTFT 70 does
    assert report(run, "--slo", "e2e_ms=140")["levels"][0]["goodput"]["met"] == 2
    # all met, none met: the largest gap is 60 ms, the mean gap 23 ms
    all_met = report(run, "--slo", "ttft_ms=1000,itl_ms=200,tpot_ms=100,e2e_ms=2000")["levels"][0]["goodput"]
    assert (all_met["met"], all_met["share"]) == (4, 1.0)
    none_met = report(run, "--slo", "itl_ms=30")["levels"][0]["goodput"]
    assert (none_met["met"], none_met["share"], none_met["req_s"], none_met["missed"]) == (0, 0.0, 0.0, {"itl_ms": 4})
    # the stored run is unchanged by judging it again
    assert report(run)["levels"][0]["goodput"] == g


def test_failed_requests_count_as_not_met() -> None:
    # every other request waits 1.5 s for its first token and passes --timeout 1
    with mock_server(MockConfig(ttft_ms=(20.0, 1500.0), itl_ms=(5.0,))) as url:
        doc = bench(url, "--timeout", "1", "--slo", "ttft_ms=60000,e2e_ms=60000")
    lv = doc["levels"][0]
    assert lv["errors"] == {"timeout": 2}
    g = lv["goodput"]
    assert (g["met"], g["of"], g["share"], g["failed"]) == (2, 4, 0.5, 2)
    # a level where everything failed: none met, however loose the targets
    with mock_server(MockConfig(ttft_ms=(5.0,), itl_ms=(2.0,), max_prompt_tokens=20)) as url:
        doc = bench(url, "--slo", "e2e_ms=60000")
    g = doc["levels"][0]["goodput"]
    assert (g["met"], g["of"], g["share"], g["failed"]) == (0, 4, 0.0, 4)


def test_serve_bench_rejects_bad_targets_before_sending_anything() -> None:
    with mock_server(SCHEDULE) as url:
        r = run_cli("serve-bench", url, *RUN, "--slo", "ttft=abc")
        with urllib.request.urlopen(f"{url}/mock/stats", timeout=5) as resp:
            stats = json.load(resp)
    assert r.exit_code == 2
    assert "unknown key 'ttft'" in r.stderr and "ttft_ms, itl_ms, tpot_ms, e2e_ms" in r.stderr
    assert stats["requests"] == 0
    assert run_cli("results", "list", "--json").stdout.count('"id"') == 0  # nothing stored
    r = run_cli("serve-report", "1", "--slo", "e2e=1")
    assert r.exit_code == 2 and "unknown key 'e2e'" in r.stderr


def test_compare_ranks_runs_by_goodput() -> None:
    with mock_server(MockConfig(ttft_ms=(150.0,), itl_ms=(5.0,))) as slow:
        a = bench(slow, "--label", "slow", "--slo", "ttft_ms=100")["run"]["id"]
    with mock_server(MockConfig(ttft_ms=(20.0,), itl_ms=(5.0,))) as fast:
        b = bench(fast, "--label", "fast", "--slo", "ttft_ms=100")["run"]["id"]
        c = bench(fast, "--label", "fast, other targets", "--slo", "ttft_ms=10")["run"]["id"]
    # by the targets both runs were measured with: the fast one first, all its requests met
    r = run_cli("compare", str(a), str(b), "--metric", "goodput", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["slo"] == {"ttft_ms": 100} and doc["slo_source"] == "stored"
    assert doc["baseline"] == {"run": a, "label": "slow"}
    assert [(x["rank"], x["label"]) for x in doc["ranking"]] == [(1, "fast"), (2, "slow")]
    fast_lv, slow_lv = doc["ranking"][0]["levels"][0], doc["ranking"][1]["levels"][0]
    assert (fast_lv["level"], fast_lv["met"], fast_lv["of"], fast_lv["share"]) == ("c=1", 4, 4, 1.0)
    assert (slow_lv["met"], slow_lv["share"], slow_lv["req_s"]) == (0, 0.0, 0.0)
    assert doc["ranking"][0]["best"]["req_s"] == fast_lv["req_s"] > 0
    assert [x["change_pct"] for x in doc["ranking"]] == [None, None]  # no change from a baseline of 0/s
    # runs judged by other targets must be given the same ones
    r = run_cli("compare", str(a), str(b), str(c), "--metric", "goodput")
    assert r.exit_code == 2 and "different latency targets" in r.stderr and "--slo" in r.stderr
    # --slo judges all three by one set of targets (and implies --metric goodput): all met, so the
    # faster runs (more requests per second) rank first, the slow baseline last
    r = run_cli("compare", str(a), str(b), str(c), "--slo", "ttft_ms=1000", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["slo_source"] == "--slo"
    assert [x["run"] for x in doc["ranking"]][-1] == a
    assert all(x["levels"][0]["share"] == 1.0 for x in doc["ranking"])
    rates = [x["best"]["req_s"] for x in doc["ranking"]]
    assert rates == sorted(rates, reverse=True)
    assert all(x["change_pct"] > 0 for x in doc["ranking"][:2])
    # the table
    r = run_cli("compare", str(a), str(b), "--metric", "goodput")
    assert r.exit_code == 0, r.stderr
    assert "GOODPUT" in r.stdout and "TTFT ≤ 100 ms" in r.stdout and "baseline" in r.stdout
    assert r.stdout.index("fast") < r.stdout.index("slow")
    r = run_cli("compare", str(a), str(b), "--metric", "goodput", "--format", "csv")
    assert r.stdout.splitlines()[1].startswith(f"1,{b},fast,c=1,1,,4,4,1.0,")


def test_compare_goodput_needs_targets() -> None:
    with mock_server(MockConfig(ttft_ms=(20.0,), itl_ms=(5.0,))) as url:
        a = bench(url)["run"]["id"]
        b = bench(url)["run"]["id"]
    r = run_cli("compare", str(a), str(b), "--metric", "goodput")
    assert r.exit_code == 2 and "none of these runs was measured with --slo" in r.stderr
    r = run_cli("compare", str(a), str(b), "--slo", "ttft=1")
    assert r.exit_code == 2 and "accepted keys" in r.stderr
