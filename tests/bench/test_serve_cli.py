"""`moetune serve-bench` and `serve-report` against the mock server: the JSON contract, storage,
warnings, errors and exit codes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from moetune.store.db import ResultsDB
from tests.bench.mock_server import MockConfig, mock_server
from tests.helpers import free_port, run_cli

LEVEL_KEYS = {"concurrency", "ttft_ms", "itl_ms", "output_tok_s", "request_s", "errors", "warnings"}


@pytest.fixture(scope="module")
def one_slot() -> Iterator[str]:
    """Reports 1 slot (but answers everything at once), rejects prompts over 60 tokens."""
    with mock_server(MockConfig(ttft_ms=(20.0,), itl_ms=(4.0,), slots=1, n_ctx=400, max_prompt_tokens=60)) as url:
        yield url


def bench(url: str, *args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    r = run_cli("serve-bench", url, "--json", *args)
    return r.exit_code, (json.loads(r.stdout) if r.exit_code == 0 else {}), r.stderr


def test_json_contract_and_storage(one_slot: str) -> None:
    code, doc, err = bench(
        one_slot,
        "--concurrency",
        "1,2",
        "--requests",
        "4",
        "--input-len",
        "40",
        "--output-len",
        "8",
        "--label",
        "contract",
    )
    assert code == 0, err
    assert set(doc) == {"run", "levels"}
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    for lv in doc["levels"]:
        assert set(lv) >= LEVEL_KEYS
        for k in ("ttft_ms", "itl_ms"):
            assert set(lv[k]) >= {"p50", "p90", "p99"}
        assert lv["ok"] == 4 and lv["errors"] == {}
        assert lv["prompt_tokens_mean"] == 40  # exact, through /apply-template and /tokenize
        assert lv["output_tokens"] == 32
    # c=2 on a 1-slot server: the queueing warning, with its word
    assert doc["levels"][0]["warnings"] == []
    assert any("queue" in w for w in doc["levels"][1]["warnings"])
    assert "queue" in err
    run = doc["run"]
    assert run["kind"] == "serve-bench" and run["label"] == "contract" and run["samples"] == 10
    assert run["server"]["slots"] == 1 and run["server"]["n_ctx_slot"] == 400
    with ResultsDB.open() as db:
        stored = db.run(run["id"])
        assert stored.status == "done" and stored.target == one_slot
        assert stored.meta.server is not None and stored.meta.server.url == one_slot
        assert stored.meta.host.fingerprint and stored.meta.details["workload"]["input_len"] == 40
        samples = db.samples(run["id"])
        assert len(samples) == 8 and len(db.samples(run["id"], "warmup")) == 2
        s = samples[0]
        assert {"t_sched", "t_slot", "t_send", "t_end", "chunks", "status", "error", "concurrency"} <= set(s)
    # figures derived again from the stored samples are the same
    r = run_cli("serve-report", str(run["id"]), "--json")
    assert r.exit_code == 0, r.stderr
    again = json.loads(r.stdout)
    assert [lv["ttft_ms"] for lv in again["levels"]] == [lv["ttft_ms"] for lv in doc["levels"]]
    assert again["levels"][1]["warnings"] == doc["levels"][1]["warnings"]


def test_http_400_counted_and_reported(one_slot: str) -> None:
    code, doc, err = bench(one_slot, "--requests", "3", "--input-len", "80", "--output-len", "4", "--warmup", "0")
    assert code == 0, err
    lv = doc["levels"][0]
    assert lv["requests"] == 3 and lv["ok"] == 0
    assert lv["errors"] == {"http_400:exceed_context_size_error": 3}
    assert any("3 of 3 requests failed" in w for w in lv["warnings"])
    assert lv["ttft_ms"]["p50"] is None
    r = run_cli("serve-bench", one_slot, "--requests", "3", "--input-len", "80", "--output-len", "4", "--warmup", "0")
    assert r.exit_code == 0 and "failed" in r.stderr


def test_human_output_and_plots(one_slot: str, tmp_path: Path) -> None:
    r = run_cli(
        "serve-bench",
        one_slot,
        "-C",
        "1,2",
        "--requests",
        "2",
        "--input-len",
        "40",
        "--output-len",
        "4",
        "--plot",
        str(tmp_path),
    )
    assert r.exit_code == 0, r.stderr
    assert "TTFT" in r.stdout and "ITL" in r.stdout and "stored as run" in r.stderr
    assert (tmp_path / "serve-latency.png").stat().st_size > 1000
    assert (tmp_path / "serve-throughput.png").stat().st_size > 1000


def test_dataset(one_slot: str, tmp_path: Path) -> None:
    rows = [
        {"conversations": [{"from": "human", "value": "short one"}, {"from": "gpt", "value": "ok ok"}]},
        {"conversations": [{"from": "human", "value": "x" * 500}, {"from": "gpt", "value": "too long"}]},
    ]
    (tmp_path / "sg.json").write_text(json.dumps(rows))
    code, doc, err = bench(one_slot, "--dataset", str(tmp_path / "sg.json"), "--requests", "3")
    assert code == 0, err
    assert doc["levels"][0]["ok"] == 3
    assert any("skipped" in w for w in doc["run"]["warnings"])


def test_compare_two_runs(one_slot: str) -> None:
    ids = []
    for _ in range(2):
        code, doc, err = bench(one_slot, "-C", "1,2", "--requests", "4", "--input-len", "40", "--output-len", "6")
        assert code == 0, err
        ids.append(str(doc["run"]["id"]))
    r = run_cli("compare", *ids, "--json")
    assert r.exit_code == 0, r.stderr
    json.loads(r.stdout)
    assert "ttft:c=1" in r.stdout and "itl:c=2" in r.stdout


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["-C", "0"], 2, "--concurrency"),
        (["-C", "1,x"], 2, "--concurrency"),
        (["--requests", "2", "--duration", "1"], 2, "not both"),
        (["--dataset", "pyproject.toml", "--input-len", "9"], 2, "--input-len"),
        (["--match-slots"], 2, "cannot change a running one"),
        (["--server", "main"], 2, "TARGET is a URL"),
        (["--input-len", "380", "--output-len", "40"], 2, "per-slot context of 400"),
        (["--input-len", "5"], 2, "fixed part"),
    ],
)
def test_input_errors(one_slot: str, args: list[str], code: int, text: str) -> None:
    r = run_cli("serve-bench", one_slot, *args)
    assert r.exit_code == code, r.stderr
    assert text in r.stderr


def test_targets_that_are_not_servers(tmp_path: Path) -> None:
    r = run_cli("serve-bench", "nothing-here")
    assert r.exit_code == 2 and "neither a server URL nor a plan" in r.stderr
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"launch": {"processes": []}}))
    r = run_cli("serve-bench", str(plan), "--match-slots")
    assert r.exit_code == 2 and "starts no server" in r.stderr
    r = run_cli("serve-bench", f"http://127.0.0.1:{free_port()}")
    assert r.exit_code == 1 and "cannot reach" in r.stderr and "hint" in r.stderr


def test_a_long_level_keeps_no_records_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request is stored as it ends and the level's figures are read back from the history, so a
    level holds only the requests in flight: when it kept every record until its end, the 30-minute
    soak at 256 streams (benchmarks/bench_soak.py) grew by about 38 KB a request, 4 GiB an hour."""
    import weakref

    from moetune.bench.serve import load
    from moetune.bench.serve.request import RequestRecord
    from moetune.bench.serve.run import ServeBenchSpec, serve_bench

    live: weakref.WeakSet[RequestRecord] = weakref.WeakSet()

    class Tracked(RequestRecord):
        __hash__ = object.__hash__  # for the weak set (a dataclass with eq has none)

        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, **kw)  # type: ignore[arg-type]
            live.add(self)

    monkeypatch.setattr(load, "RequestRecord", Tracked)
    monkeypatch.setenv("MOETUNE_METRICS_INTERVAL", "0.1")
    held: list[int] = []
    with mock_server(MockConfig(ttft_ms=(5.0,), itl_ms=(2.0,))) as url, ResultsDB.open() as db:
        doc = serve_bench(
            ServeBenchSpec(url=url, concurrency=(4,), duration_s=2.0, input_len=40, output_len=4, warmup=0),
            db,
            on_snapshot=lambda s: held.append(len(live)),
        )
        samples = db.samples(doc["run"]["id"])
    (lv,) = doc["levels"]
    assert lv["requests"] == lv["ok"] == len(samples) > 100  # figures from every stored request
    assert lv["output_tokens"] == 4 * len(samples)
    assert len(held) >= 10 and max(held) <= 2 * 4, held  # the 4 in flight, not the hundreds done
