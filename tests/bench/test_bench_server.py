"""`moetune bench` against a real llama-server on a generated model: the JSON contract, repeats,
thinking on and off, depth with the cache confirmed by the server, history, interruption."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from moetune.bench.analysis import single as m
from moetune.hardware.fingerprint import fingerprint as hw_fingerprint
from moetune.model.profile import fingerprint, load_profile
from moetune.paths import default_db
from moetune.store.db import ResultsDB
from tests.bench.servers import SERVER_ARGS, model
from tests.bench.vllm_mock import vllm_mock
from tests.helpers import Server, json_shape, llama_server, run_cli

pytestmark = pytest.mark.server
FAST = ("--max-tokens", "8", "--ignore-eos")


@pytest.fixture(scope="module")
def tiny(models: Path) -> Path:
    return model(models, "bench-tiny", n_layer=2)


@pytest.fixture(scope="module")
def server(bin_dir: Path, tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("bench-server") / "server.log"
    with llama_server(bin_dir, tiny, log, *SERVER_ARGS) as s:
        yield s


def bench_json(*args: str) -> dict[str, Any]:
    r = run_cli("bench", *args, "--json")
    assert r.exit_code == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def test_json_contract_and_history(server: Server, tiny: Path) -> None:
    doc = bench_json(server.url, "--workload", "short-json", "--repeats", "3", *FAST)
    for key in ("tg", "pp"):
        fig = doc[key]
        assert fig["n"] == 3 and 0 < fig["ci_low"] <= fig["median"] <= fig["ci_high"]
    assert isinstance(doc["overhead_ms"], float) and doc["overhead_ms"] >= 0
    with ResultsDB.open() as db:  # the default database, in the user data directory
        assert db.path == default_db()
        run = db.run(int(doc["run"]["id"]))
        assert run.status == "done" and run.kind == "bench"
        assert db.sample_counts(run.id) == {"warmup": 1, "measure": 3}
        meta = run.meta
        assert meta.model.fingerprint == fingerprint(load_profile(tiny))
        assert meta.host.fingerprint == hw_fingerprint()
        assert meta.server is not None and meta.server.dialect == "llama.cpp" and meta.server.slots
        assert meta.engine_build == meta.server.build and meta.engine_build
        assert meta.argv[0:2] == ("moetune", "bench")
        assert [w["name"] for w in meta.details["workloads"]] == ["short-json"]
        for s in db.samples(run.id):
            t = s["timings"]
            assert (t["predicted_n"], t["cache_n"]) == (8, 0)  # exact length, cache busted
            assert m.overhead_ms(s) >= 0 and len(s["content_chunk_s"]) >= 1


def test_thinking_on_and_off(server: Server, tmp_path: Path) -> None:
    doc = bench_json(server.url, "--thinking", "both", "-r", "2", *FAST, "--db", str(tmp_path / "t.sqlite"))
    with ResultsDB.open(tmp_path / "t.sqlite") as db:
        samples = db.samples(int(doc["run"]["id"]))
    off = [s for s in samples if s["workload"] == "short-json"]
    on = [s for s in samples if s["workload"] == "short-json+think"]
    assert len(off) == len(on) == 2
    # thinking off: the template closes the <think> block in the prompt; nothing is reasoning
    assert all(s["reasoning_chars"] == 0 and s["content_chars"] > 0 for s in off)
    assert all(s["thinking"] is False for s in off) and all(s["thinking"] is True for s in on)
    assert off[0]["timings"]["prompt_n"] == on[0]["timings"]["prompt_n"] + len("</think>")
    assert set(doc["workloads"]) == {"short-json", "short-json+think"}


def test_depth_with_cache_confirmed_by_the_server(server: Server) -> None:
    doc = bench_json(server.url, "--depth", "0,256", "--pp-tokens", "32", "--tg-tokens", "8", "-r", "2")
    w = doc["workloads"]
    assert (w["d0"]["cached_n"], w["d0"]["prompt_n"], w["d0"]["cache_confirmed"]) == (0, 32, 1.0)
    assert (w["d256"]["cached_n"], w["d256"]["prompt_n"], w["d256"]["cache_confirmed"]) == (256, 32, 1.0)
    assert w["d256"]["predicted_n"] == 8
    assert not [x for x in doc["warnings"] if "cache" in x["code"]]
    with ResultsDB.open() as db:
        rid = int(doc["run"]["id"])
        assert db.sample_counts(rid) == {"warmup": 2, "measure": 4, "fill": 3}  # fills precede d256's requests
        fills = db.samples(rid, "fill")
        assert fills[0]["timings"]["prompt_n"] == 256  # the first fill processes the whole context
        assert all(f["fill_tokens"] == 256 for f in fills)


def test_too_deep_for_the_context_is_an_input_error(server: Server) -> None:
    r = run_cli("bench", server.url, "--depth", "1000", "--pp-tokens", "64", "--tg-tokens", "8")
    assert r.exit_code == 2 and "context" in r.stderr and "-c" in r.stderr


def test_prompt_file_and_cache_kept_on_request(server: Server, tmp_path: Path) -> None:
    p = tmp_path / "review.txt"
    p.write_text("Review this change and answer in one word.")
    doc = bench_json(server.url + "/v1/", "--prompt-file", str(p), "--no-cache-bust", "-r", "2", *FAST)  # base URL
    w = doc["workloads"]["review"]
    assert w["cached_n"] > 0  # the same prompt again: the server reused it, and says so
    assert w["cache_confirmed"] is None


def test_unreachable_and_unknown_targets(tmp_path: Path) -> None:
    r = run_cli("bench", "http://127.0.0.1:9", "-r", "1")
    assert r.exit_code == 1 and "cannot reach" in r.stderr and "hint" in r.stderr
    r = run_cli("bench", "no-such-thing", "-r", "1")
    assert r.exit_code == 2 and "neither a server URL nor a plan file" in r.stderr


def test_interrupted_run_keeps_every_completed_sample(server: Server, tmp_path: Path) -> None:
    db_path = tmp_path / "i.sqlite"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moetune",
            "bench",
            server.url,
            "-r",
            "200",
            "--max-tokens",
            "16",
            "--ignore-eos",
            "--db",
            str(db_path),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        n = 0
        while n < 3:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
            if db_path.exists():
                with sqlite3.connect(db_path) as c:
                    try:
                        n = c.execute("SELECT COUNT(*) FROM samples WHERE phase = 'measure'").fetchone()[0]
                    except sqlite3.OperationalError:
                        n = 0
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err.decode()
    assert b"interrupted" in err and b"samples kept" in err
    with ResultsDB.open(db_path) as db:
        (run,) = db.runs()
        kept = db.samples(run.id)
        assert run.status == "interrupted" and len(kept) >= 3
        assert run.summary and run.summary["tg"]["n"] == len(kept)
    r = run_cli("results", "show", str(run.id), "--json", "--db", str(db_path))
    assert json.loads(r.stdout)["status"] == "interrupted"


def test_every_export_format_of_a_real_run(server: Server, tmp_path: Path) -> None:
    db = str(tmp_path / "e.sqlite")
    doc = bench_json(
        server.url,
        "-w",
        "short-json",
        "--thinking",
        "both",
        "--depth",
        "128",
        "--pp-tokens",
        "16",
        "--tg-tokens",
        "4",
        "-r",
        "2",
        *FAST,
        "--db",
        db,
    )
    rid = str(doc["run"]["id"])
    js = json.loads(run_cli("results", "export", rid, "--format", "json", "--db", db).stdout)
    (run,) = js["runs"]
    phases = [s["phase"] for s in run["samples"]]
    assert phases.count("measure") == 6 and phases.count("warmup") == 3 and phases.count("fill") == 3
    assert all("timings" in s["data"] and "content_chunk_s" in s["data"] for s in run["samples"])
    csv_text = run_cli("results", "export", rid, "--format", "csv", "--db", db).stdout
    rows = csv_text.strip().splitlines()
    assert len(rows) == 1 + 12 and rows[0].startswith("run,label,kind,phase,seq,workload")
    md = run_cli("results", "export", rid, "--format", "md", "--db", db).stdout
    assert "| short-json+think |" in md and "| d128 |" in md and "| 128 |" in md


def test_json_has_one_shape_for_every_server(server: Server, tmp_path: Path) -> None:
    """llama-server's figures and another OpenAI server's (the vLLM mock's): the same document,
    server figures null there, and every figure labelled with its source."""
    args = ("-w", "short-json", "-r", "2", *FAST, "--db", str(tmp_path / "s.sqlite"))
    llama = bench_json(server.url, *args)
    with vllm_mock() as url:
        other = bench_json(url, *args)
    assert json_shape(llama) == json_shape(other)
    assert (llama["tg"]["source"], other["tg"]["source"]) == ("server", "client")
    assert llama["overhead_ms"] is not None and other["overhead_ms"] is None
    lw, ow = llama["workloads"]["short-json"], other["workloads"]["short-json"]
    assert lw["prompt_n"] == lw["prompt_tokens"] and ow["prompt_n"] is None and ow["prompt_tokens"]
    assert lw["predicted_n"] == ow["predicted_n"] == 8
    assert lw["client"]["pp"] and lw["client"]["tg"]  # the client's figures are there for llama-server too
    assert "client_figures" not in {w["code"] for w in llama["warnings"]}
