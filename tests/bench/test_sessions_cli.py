"""`moetune serve-bench --sessions` against the mock servers: the options' checks (exit 2), the
JSON contract, what is stored, serve-report, and a server without /tokenize or cache figures."""

from __future__ import annotations

import itertools
import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from moetune.store.db import ResultsDB
from tests.bench.mock_server import MockConfig, mock_server
from tests.bench.vllm_mock import MockConfig as VllmConfig
from tests.bench.vllm_mock import vllm_mock
from tests.helpers import run_cli

TURN_KEYS = {"turn", "context_tokens", "prompt_tokens_processed", "prompt_tokens_reused", "ttft_ms", "tg_tok_s"}
NOWHERE = "http://127.0.0.1:9"  # nothing listens: the checks come before any request


@pytest.fixture(scope="module")
def llama_like() -> Iterator[str]:
    """Speaks llama-server's dialect (/tokenize, timings), 8 of each reply's tokens reasoning."""
    with mock_server(MockConfig(ttft_ms=(5.0,), itl_ms=(1.0,), reasoning_tokens=8, slots=4, n_ctx=4096)) as url:
        yield url


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--turns", "3"], "--turns shape agent sessions"),
        (["--strip-thinking", "--think-time", "1"], "--think-time, --strip-thinking shape agent sessions"),
        (["--sessions", "2", "--concurrency", "1,2"], "--concurrency do not apply"),
        (["--sessions", "2", "--input-len", "64", "--requests", "4"], "--input-len, --requests do not apply"),
        (["--sessions", "2", "--rate", "5"], "--rate do not apply"),
        (["--sessions", "2", "--prefix-cache"], "--prefix-cache do not apply"),
        (["--sessions", "2", "--strip-thinking", "--thinking", "off"], "with --thinking off the replies have none"),
        (["--sessions", "0"], "--sessions"),
        (["--sessions", "2", "--system-tokens", "8"], "--system-tokens"),
    ],
)
def test_combinations_that_make_no_sense(args: list[str], words: str) -> None:
    r = run_cli("serve-bench", NOWHERE, *args)
    assert r.exit_code == 2, r.stderr
    assert words in r.stderr


def test_sessions_that_do_not_fit_a_slot() -> None:
    with mock_server(MockConfig(slots=2, n_ctx=512)) as url:
        r = run_cli(
            "serve-bench",
            url,
            "--sessions",
            "2",
            "--turns",
            "4",
            "--system-tokens",
            "256",
            "--turn-tokens",
            "64",
            "--output-len",
            "32",
        )
    assert r.exit_code == 2, r.stderr
    assert "= 640 tokens do not fit the server's per-slot context of 512 tokens" in r.stderr
    assert "--parallel 2 -c 1600" in r.stderr


def test_json_contract_storage_and_report(llama_like: str) -> None:
    r = run_cli(
        "serve-bench",
        llama_like,
        "--sessions",
        "2",
        "--turns",
        "3",
        "--system-tokens",
        "64",
        "--turn-tokens",
        "32",
        "--output-len",
        "16",
        "--thinking",
        "on",
        "--label",
        "sess",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"run", "levels", "sessions"}
    (level,) = doc["levels"]  # the sessions' requests are one level: concurrency = sessions
    assert (level["concurrency"], level["requests"], level["ok"]) == (2, 6, 6)
    s = doc["sessions"]
    assert s["spec"] == {
        "sessions": 2,
        "turns": 3,
        "system_tokens": 64,
        "turn_tokens": 32,
        "output_len": 16,
        "think_time_s": 0.0,
        "strip_thinking": False,
    }
    assert [t["turn"] for t in s["turns"]] == [1, 2, 3]
    for t in s["turns"]:
        assert set(t) >= TURN_KEYS
        assert set(t["ttft_ms"]) == {"p50", "p90", "p99", "mean"}
        assert t["ok"] == 2 and t["ttft_ms"]["p50"] > 0
    # the mock counts the prompt with the template (exact: /tokenize) and reuses nothing
    ctx = [t["context_tokens"]["p50"] for t in s["turns"]]
    assert ctx[0] < ctx[1] < ctx[2]
    assert s["cache_source"] == "timings" and s["prompt_tokens_reused"] == 0
    assert any("reused no prompt tokens" in w for w in s["warnings"])
    assert [p["session"] for p in s["per_session"]] == [0, 1]
    with ResultsDB.open() as db:
        samples = db.samples(doc["run"]["id"])
        assert len(db.samples(doc["run"]["id"], "warmup")) == 2
        stored = db.run(doc["run"]["id"]).meta.details["sessions"]
    assert stored == s["spec"]
    assert sorted((x["session"], x["turn"]) for x in samples) == [(a, b) for a in (0, 1) for b in (1, 2, 3)]
    assert all(x["messages"] == 2 * x["turn"] for x in samples)  # system + (user, assistant) per turn + user
    # figures derived again from the stored samples are the same
    again = run_cli("serve-report", str(doc["run"]["id"]), "--json")
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout)["sessions"] == s
    table = run_cli("serve-report", str(doc["run"]["id"]))
    assert "sessions per turn" in table.stdout and "per session" in table.stdout
    assert "2 sessions x 3 turns" in table.stdout


def _mock_log(url: str) -> list[dict[str, Any]]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url + "/mock/log", timeout=10) as r:
        log: list[dict[str, Any]] = json.loads(r.read())
    return log


@pytest.mark.parametrize("report_cached", [False, True])
def test_a_server_without_tokenize_or_timings(report_cached: bool) -> None:
    with vllm_mock(VllmConfig(ttft_ms=5.0, itl_ms=1.0, report_cached=report_cached)) as url:
        r = run_cli(
            "serve-bench",
            url,
            "--sessions",
            "2",
            "--turns",
            "3",
            "--system-tokens",
            "200",
            "--turn-tokens",
            "50",
            "--output-len",
            "8",
            "--warmup",
            "0",
            "--json",
        )
        log = _mock_log(url)
    assert r.exit_code == 0, r.stderr
    s = json.loads(r.stdout)["sessions"]
    assert [t["ok"] for t in s["turns"]] == [2, 2, 2]
    sent = [e for e in log if e["stream"]]
    assert len(sent) == 6 and all("cache_prompt" in e["fields"] for e in sent)
    # each turn's prompt (the template applied) begins with the one its session sent before
    by: dict[str, list[str]] = {}
    for e in sent:
        tag = re.search(r"\.s(\d+) ", e["prompt"])
        assert tag is not None
        by.setdefault(tag.group(1), []).append(e["prompt"])
    assert sorted(by) == ["0", "1"]
    for prompts in by.values():
        prompts.sort(key=len)
        assert all(b.startswith(a) for a, b in itertools.pairwise(prompts))
    first = min(e["prompt_tokens"] for e in sent)
    # the sizes are fitted to the server's count by characters: near, not exact
    assert 200 + 50 <= first <= 1.3 * (200 + 50) + 20
    if report_cached:
        assert s["cache_source"] == "usage" and s["prompt_tokens_reused"] == 0
        assert s["prompt_tokens_processed"] == sum(e["prompt_tokens"] for e in sent)
    else:
        assert s["cache_source"] is None and s["prompt_tokens_processed"] is None
        assert s["turns"][2]["prompt_tokens_reused"]["p50"] is None
        assert s["turns"][2]["context_tokens"]["p50"] > s["turns"][0]["context_tokens"]["p50"]
        assert any("neither timings.cache_n nor" in w for w in s["warnings"])
