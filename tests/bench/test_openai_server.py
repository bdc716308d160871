"""`moetune bench` and `serve-bench` against an OpenAI-compatible server that is not llama-server
(the vLLM mock): what the probe finds, the figures the client's clock and the responses' usage
give (token counts equal to the mock's own), and the nulls and warnings where llama-server's
extras are missing."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moetune.bench.http.client import connect
from moetune.bench.http.clock import run as run_loop
from moetune.bench.server import probe
from moetune.bench.single.workloads import SHORT_JSON_PROMPT
from moetune.store.db import ResultsDB
from moetune.store.record import Capabilities, ServerInfo
from tests.bench import mock_server
from tests.bench.vllm_mock import MockConfig, chat_prompt_tokens, vllm_mock
from tests.helpers import json_shape, run_cli

CFG = MockConfig(ttft_ms=20.0, pp_ms_per_token=0.1, itl_ms=5.0, tokens_per_chunk=(1, 3, 2))
NULL_PCT = {"p50": None, "p90": None, "p99": None, "mean": None}
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to the mock on 127.0.0.1


@pytest.fixture(scope="module")
def vllm() -> Iterator[str]:
    with vllm_mock(CFG) as url:
        yield url


def mock_log(url: str) -> list[dict[str, Any]]:
    with DIRECT.open(url + "/mock/log", timeout=10) as r:  # the mock, on 127.0.0.1
        log: list[dict[str, Any]] = json.loads(r.read())
    return log


def cli_json(*args: str) -> dict[str, Any]:
    r = run_cli(*args, "--json")
    assert r.exit_code == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def codes(warnings: list[dict[str, Any]]) -> set[str]:
    return {str(w["code"]) for w in warnings}


async def _probe(url: str) -> ServerInfo:
    http = connect(url, timeout_s=10)
    try:
        return await probe(http, url)
    finally:
        await http.aclose()


def test_the_probe_decides_the_capabilities(vllm: str) -> None:
    info = run_loop(_probe(vllm))
    assert (info.dialect, info.caps, info.model_alias) == ("openai", Capabilities(), CFG.model)
    assert (info.slots, info.n_ctx_slot, info.build) == (None, None, None)
    assert not info.caps.exact_prompts and not info.caps.depth
    with mock_server.mock_server(mock_server.MockConfig()) as llama_like:
        lin = run_loop(_probe(llama_like))
    assert (lin.dialect, lin.caps) == ("llama.cpp", Capabilities.llama())
    assert lin.caps.exact_prompts and lin.caps.depth
    # stored and read back; a record from before capabilities were stored has its dialect's
    assert ServerInfo.from_json(info.to_json()) == info
    old = {k: v for k, v in lin.to_json().items() if k != "caps"}
    assert ServerInfo.from_json(old).caps == Capabilities.llama()


def test_bench_client_figures_usage_counts_and_nulls(vllm: str) -> None:
    before = len(mock_log(vllm))
    doc = cli_json("bench", vllm, "-w", "short-json", "--max-tokens", "16", "--ignore-eos", "-r", "3")
    sent = mock_log(vllm)[before:]
    assert len(sent) == 4 and all(e["stream"] and e["model"] == CFG.model for e in sent)
    assert all(e["stream_options"] == {"include_usage": True} for e in sent)
    truth_prompt = chat_prompt_tokens([{"role": "user", "content": SHORT_JSON_PROMPT}])
    assert {e["prompt_tokens"] for e in sent} == {truth_prompt} and {e["completion_tokens"] for e in sent} == {16}
    assert {tuple(e["chunks"]) for e in sent} == {(1, 3, 2, 1, 3, 2, 1, 3)}  # several tokens per chunk

    w = doc["workloads"]["short-json"]
    # token counts: the server's usage, equal to the mock's truth
    assert (w["prompt_tokens"], w["predicted_n"]) == (truth_prompt, 16)
    # figures by the client's clock, labelled so
    assert doc["tg"]["source"] == doc["pp"]["source"] == "client" and doc["tg"]["n"] == 3
    assert 150 <= doc["tg"]["median"] <= 1000 / CFG.itl_ms * 1.05  # 15 tokens at 5 ms each: 200/s
    ttft_truth = CFG.ttft_ms + CFG.pp_ms_per_token * truth_prompt
    assert ttft_truth <= w["client"]["ttft_ms"] <= ttft_truth + 50
    assert w["client"]["pp"] == pytest.approx(truth_prompt / w["client"]["ttft_ms"] * 1000, rel=0.05)
    assert w["client"]["tg"] == doc["tg"]["median"]
    # what needs llama-server's timings is null, and said
    assert doc["overhead_ms"] is None and w["overhead_ms"] is None
    assert (w["prompt_n"], w["cached_n"], w["cache_confirmed"]) == (None, None, None)
    assert {"client_figures", "cache_unknown"} <= codes(doc["warnings"])
    figures = next(x for x in doc["warnings"] if x["code"] == "client_figures")
    assert "no llama.cpp timings" in figures["message"] and "llama-server" in figures["remedy"]
    with ResultsDB.open() as db:
        run = db.run(int(doc["run"]["id"]))
        assert run.meta.server is not None and run.meta.server.caps == Capabilities()
        for s in db.samples(run.id):
            assert s["timings"] is None and s["usage"]["completion_tokens"] == 16


def test_bench_table_labels_client_figures(vllm: str) -> None:
    r = run_cli("bench", vllm, "--max-tokens", "8", "--ignore-eos", "-r", "2")
    assert r.exit_code == 0, r.stderr
    assert "(client)" in r.stdout
    assert "no llama.cpp timings" in r.stderr


def test_bench_depth_needs_llama_server(vllm: str) -> None:
    r = run_cli("bench", vllm, "--depth", "0", "--pp-tokens", "16", "--tg-tokens", "4", "-r", "1")
    assert r.exit_code == 2
    assert "need llama-server" in r.stderr and "/tokenize" in r.stderr and "drop --depth" in r.stderr


def test_serve_bench_counts_from_usage_and_leaves_server_figures_null(vllm: str) -> None:
    before = len(mock_log(vllm))
    doc = cli_json("serve-bench", vllm, "-C", "1,2", "--requests", "4", "--input-len", "40", "--output-len", "12")
    log = mock_log(vllm)[before:]
    probes = [e for e in log if not e["stream"]]
    streamed = [e for e in log if e["stream"]]
    assert probes and all(e["max_tokens"] == 1 for e in probes)
    assert len(streamed) == 2 + 4 + 4  # warm-up and both levels
    # no prompt the benchmark sent was counted (and so cached) by a probe before
    assert not {e["prompt"] for e in probes} & {e["prompt"] for e in streamed}
    assert all(e["stream_options"] == {"include_usage": True, "continuous_usage_stats": True} for e in streamed)
    assert {e["prompt_tokens"] for e in streamed} == {40}  # fitted on the probe prompt, and exact here

    run = doc["run"]
    assert run["server"]["caps"] == Capabilities().to_json() and run["server"]["slots"] is None
    assert codes(run["advice"]) >= {"no_slot_info", "no_server_timings", "no_tokenizer"}
    for lv in doc["levels"]:
        assert lv["ok"] == 4 and lv["errors"] == {}
        assert lv["prompt_tokens_mean"] == 40 and lv["prompt_token_mismatches"] == 0
        assert lv["output_tokens"] == 4 * 12  # usage, not chunks (4 per request) nor characters
        assert (lv["itl_unknown"], lv["no_usage"]) == (0, 0)
        # per-chunk counts from continuous usage: ITL per token, around the mock's 5 ms
        assert 4.0 <= lv["itl_ms"]["p50"] <= 8.0 and 4.0 <= lv["tpot_ms"]["p50"] <= 8.0
        assert lv["ttft_ms"]["p50"] >= CFG.ttft_ms + CFG.pp_ms_per_token * 40
        assert lv["server_itl_ms"] == lv["server_wait_ms"] == NULL_PCT
    r = run_cli("serve-report", str(run["id"]), "--json")
    assert r.exit_code == 0, r.stderr
    again = json.loads(r.stdout)
    assert [lv["itl_ms"] for lv in again["levels"]] == [lv["itl_ms"] for lv in doc["levels"]]
    assert again["run"]["warnings"] == run["warnings"]


@pytest.mark.parametrize(("chunks", "itl_known"), [((1, 3, 2), False), ((1,), True)])
def test_serve_bench_without_per_chunk_counts(chunks: tuple[int, ...], itl_known: bool) -> None:
    """A server that ignores continuous_usage_stats (LM Studio, Ollama): usage only at the end.
    One token per chunk, as that usage confirms, keeps ITL; several make it unknown, never guessed."""
    cfg = MockConfig(ttft_ms=10.0, itl_ms=5.0, tokens_per_chunk=chunks, continuous_usage=False)
    with vllm_mock(cfg) as url:
        doc = cli_json(
            "serve-bench", url, "--requests", "3", "--input-len", "30", "--output-len", "12", "--warmup", "0"
        )
    (lv,) = doc["levels"]
    assert lv["ok"] == 3 and lv["output_tokens"] == 36 and lv["prompt_tokens_mean"] == 30
    assert 4.0 <= lv["tpot_ms"]["p50"] <= 8.0
    if itl_known:
        assert lv["itl_unknown"] == 0 and 4.0 <= lv["itl_ms"]["p50"] <= 8.0
        assert not [w for w in lv["warnings"] if "ITL is unknown" in w]
    else:
        assert lv["itl_unknown"] == 3 and lv["itl_ms"] == NULL_PCT
        (warning,) = [a for a in lv["advice"] if a["code"] == "itl_unknown"]
        assert "3 of 3 requests" in warning["message"] and "continuous_usage_stats" in warning["remedy"]


def test_serve_bench_dataset_needs_an_output_length(vllm: str, tmp_path: Path) -> None:
    rows = [{"conversations": [{"from": "human", "value": "short one, please"}, {"from": "gpt", "value": "ok"}]}]
    (tmp_path / "sg.json").write_text(json.dumps(rows))
    r = run_cli("serve-bench", vllm, "--dataset", str(tmp_path / "sg.json"), "--requests", "2")
    assert r.exit_code == 2 and "no /tokenize" in r.stderr and "--output-len" in r.stderr
    before = len(mock_log(vllm))
    doc = cli_json(
        "serve-bench",
        vllm,
        "--dataset",
        str(tmp_path / "sg.json"),
        "--requests",
        "2",
        "--output-len",
        "5",
        "--warmup",
        "0",
    )
    sent = mock_log(vllm)[before:]
    assert not [e for e in sent if not e["stream"]]  # nothing to probe: dataset prompts are sent as they are
    (lv,) = doc["levels"]
    assert lv["ok"] == 2 and lv["output_tokens"] == 10
    assert lv["prompt_tokens_mean"] == sum(e["prompt_tokens"] for e in sent) / 2


def test_serve_bench_json_has_one_shape_for_every_server(vllm: str) -> None:
    args = ("-C", "1,2", "--requests", "2", "--input-len", "40", "--output-len", "6", "--warmup", "0")
    other = cli_json("serve-bench", vllm, *args)
    with mock_server.mock_server(mock_server.MockConfig(ttft_ms=(10.0,), itl_ms=(4.0,))) as llama_like:
        llama = cli_json("serve-bench", llama_like, *args)
    assert json_shape(other) == json_shape(llama)
    assert json_shape(other["levels"][1]) == json_shape(llama["levels"][1])
    assert llama["run"]["server"]["caps"] == Capabilities.llama().to_json()
    # the llama-like server's extras give the figures the other leaves null
    assert llama["levels"][0]["server_itl_ms"]["p50"] is not None and other["levels"][0]["server_itl_ms"]["p50"] is None


def test_the_mock_is_vllm_like(vllm: str) -> None:
    """What the tests above rely on: none of llama-server's extras, usage only where asked for."""
    for path in ("/props", "/slots"):
        with pytest.raises(urllib.error.HTTPError) as e:
            DIRECT.open(vllm + path, timeout=10)
        assert e.value.code == 404
    for path in ("/tokenize", "/apply-template", "/completion"):
        req = urllib.request.Request(vllm + path, data=b'{"content": "a"}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            DIRECT.open(req, timeout=10)
        assert e.value.code == 404
    body = {
        "model": CFG.model,
        "prompt": "one two three",
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(vllm + "/v1/completions", data=json.dumps(body).encode(), method="POST")
    with DIRECT.open(req, timeout=10) as r:
        events = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: {")]
    assert all("timings" not in ev for ev in events)
    assert [ev["usage"] for ev in events if ev.get("usage")] == [
        {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    ]
    assert "".join(ev["choices"][0]["text"] for ev in events if ev["choices"]) == " w0 w1 w2 w3 w4"
