"""serve-bench against a real llama-server on a generated model: a sweep within the slots, the
queueing warning with one slot, exact prompt lengths, storage and comparison, a real HTTP 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from benchmarks.http_adapters import make_client

from moetune.bench.http.clock import run
from moetune.bench.serve.load import Prompt, RequestOptions, request_body
from moetune.bench.serve.request import RequestRecord, stream_chat
from moetune.store.db import ResultsDB
from tests.bench import servers
from tests.helpers import Server, llama_server, run_cli

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def model(models: Path) -> Path:
    return servers.model(models, "serve-qwen3moe", n_layer=2)


@pytest.fixture(scope="module")
def four_slots(bin_dir: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve") / "p4.log"
    with llama_server(bin_dir, model, log, "-nr", "--parallel", "4", "-c", "2048") as s:
        yield s


def bench(url: str, *args: str) -> dict:  # type: ignore[type-arg]
    r = run_cli("serve-bench", url, "--json", "--input-len", "64", "--output-len", "16", *args)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_sweep_within_the_slots_then_queueing_with_one_slot(
    four_slots: Server, bin_dir: Path, model: Path, tmp_path: Path
) -> None:
    doc = bench(four_slots.url, "--concurrency", "1,2,4", "--requests", "8", "--label", "p4")
    run = doc["run"]
    assert run["server"]["slots"] == 4 and run["server"]["n_ctx_slot"] == 512
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2, 4]
    for lv in doc["levels"]:
        assert lv["ok"] == 8 and lv["errors"] == {}, lv
        assert lv["output_tokens"] == 8 * 16  # ignore_eos: exactly what was asked
        assert lv["prompt_token_mismatches"] == 0 and lv["prompt_tokens_mean"] == 64
        assert lv["cached_tokens"] == 0  # unique prompts, cache_prompt off
        # on a quiet machine a tiny model's tokens may come several to a read (gaps of 0): the mean is > 0
        assert lv["ttft_ms"]["p50"] > 0 and lv["itl_ms"]["mean"] > 0
        assert not any("queue" in w for w in lv["warnings"]), lv["warnings"]
    with ResultsDB.open() as db:
        samples = db.samples(run["id"])
    assert len(samples) == 24
    assert all(s["usage"]["prompt_tokens"] == 64 for s in samples)  # the server agrees with /tokenize
    assert all(s["count_source"] == "timings" for s in samples)

    with llama_server(bin_dir, model, tmp_path / "p1.log", "-nr", "--parallel", "1", "-c", "1024") as one:
        doc1 = bench(one.url, "--concurrency", "2", "--requests", "6", "--label", "p1")
    lv = doc1["levels"][0]
    assert lv["ok"] == 6
    queue = [w for w in lv["warnings"] if "queue" in w]
    assert queue, lv["warnings"]
    assert "1 slot" in queue[0]
    # one request at a time: the one that waits spends longer before its prompt starts
    assert lv["server_wait_ms"]["p90"] > lv["server_wait_ms"]["p50"] or lv["server_wait_ms"]["p90"] > 5

    r = run_cli("compare", str(run["id"]), str(doc1["run"]["id"]), "--json")
    assert r.exit_code == 0, r.stderr
    assert "ttft:c=2" in r.stdout


def test_a_plan_with_match_slots(bin_dir: Path, model: Path, tmp_path: Path) -> None:
    from moetune.engine import registry
    from moetune.engine.launchspec import LaunchSpec, ProcessSpec
    from tests.helpers import free_port

    main = ProcessSpec(
        name="main",
        role="server",
        engine=registry.get().name,
        host="127.0.0.1",
        port=free_port(),
        argv=("-m", str(model), "-nr", "--parallel", "1", "-c", "1024"),
    )
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"launch": LaunchSpec((main,)).to_json()}))
    doc = bench(
        str(plan), "--concurrency", "1,2", "--requests", "4", "--match-slots", "--thinking", "off", "--transport", "tcp"
    )
    assert [lv["server"]["slots"] for lv in doc["levels"]] == [1, 2]
    # a launch per level, each with its load time; no RPC worker: transport none, whatever was asked
    launches = [lv["server"]["launch"] for lv in doc["levels"]]
    assert all(x["transport"] == "none" and x["confirmed"] == "none" and x["load_s"] > 0 for x in launches)
    assert doc["run"]["launch"] == launches[0]
    assert [lv["server"]["n_ctx_slot"] for lv in doc["levels"]] == [1024, 1024]  # the plan's share kept
    assert doc["levels"][1]["server"]["argv"][-4:] == ["--parallel", "2", "--ctx-size", "2048"]
    # a slot per stream: no queue (other warnings judge timings, which a loaded machine may upset)
    assert all(lv["ok"] == 4 and not any("queue" in w for w in lv["warnings"]) for lv in doc["levels"]), [
        lv["warnings"] for lv in doc["levels"]
    ]
    # without --match-slots the plan's one slot serves c=2: the queue warning
    doc = bench(str(plan), "--concurrency", "2", "--requests", "4")
    assert any("queue" in w for w in doc["levels"][0]["warnings"])
    r = run_cli("serve-bench", str(plan), "--json", "--server", "nope")
    assert r.exit_code == 2 and "no such server" in r.stderr


def test_context_is_checked_before_sending(four_slots: Server) -> None:
    r = run_cli("serve-bench", four_slots.url, "--input-len", "400", "--output-len", "200")
    assert r.exit_code == 2
    assert "per-slot context of 512 tokens" in r.stderr and "-c 2400" in r.stderr


def test_a_real_http_400_is_recorded(four_slots: Server) -> None:
    async def go() -> RequestRecord:
        http = make_client(four_slots.url)
        try:
            rec = RequestRecord(index=0, concurrency=1, rate=None, prompt_tokens=0, max_tokens=4, t_sched=0.0)
            await stream_chat(http, request_body(Prompt("word " * 700, 0, 4), RequestOptions()), rec)
            return rec
        finally:
            await http.aclose()

    rec = run(go())
    assert rec.status == 400
    assert rec.error == "http_400:exceed_context_size_error"
    assert rec.detail and "context" in rec.detail


def test_a_server_killed_mid_level_stops_the_run_with_what_was_measured(
    bin_dir: Path, model: Path, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys
    import time

    db = tmp_path / "r.db"
    with llama_server(bin_dir, model, tmp_path / "s.log", "-nr", "--parallel", "4", "-c", "2048") as s:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "moetune",
                "serve-bench",
                s.url,
                "-C",
                "4",
                "--requests",
                "400",
                "--input-len",
                "64",
                "--output-len",
                "32",
                "--warmup",
                "0",
                "--db",
                str(db),
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a few requests measured, then the server dies
            time.sleep(0.5)
            if db.exists():
                with ResultsDB.open(db) as h:
                    runs = h.runs()
                    if runs and len(h.samples(runs[0].id)) >= 8:
                        break
        s.proc.kill()
        s.proc.wait(10)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "the server stopped answering" in err and "level c=4" in err
    with ResultsDB.open(db) as h:
        (run,) = h.runs()
        samples = h.samples(run.id)
        assert run.status == "failed" and "stopped answering" in (run.summary or {}).get("error", "")
        ok = [x for x in samples if not x.get("error")]
        assert len(ok) >= 8  # what was measured before the kill is kept
        assert len(samples) < 100  # and the other ~300 requests were not sent to a dead port
