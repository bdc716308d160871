"""The machine sampled during real runs: a plan's bench (server and RPC worker, from their launch
on), serve-bench against a server moetune did not start (found by its port), and `moetune launch`
(the start-up, in the run directory)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from moetune.monitor.snapshot import Snapshot
from moetune.paths import runs_dir
from moetune.store.db import ResultsDB
from tests.bench.servers import model, write_plan
from tests.helpers import free_port, llama_server, run_cli

pytestmark = pytest.mark.server


@pytest.fixture(autouse=True)
def fast_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOETUNE_METRICS_INTERVAL", "0.1")


def _series(run_id: int) -> list[Snapshot]:
    with ResultsDB.open() as db:
        return [Snapshot.from_json(d) for d in db.metrics(run_id)]


def test_a_plans_bench_is_sampled_from_its_launch(models: Path, tmp_path: Path) -> None:
    m = model(models, "mon-qwen3moe", n_layer=2)
    plan = write_plan(tmp_path / "plan.json", m, "-ngl", "99", label="mon", rpc=True)
    r = run_cli(
        "bench", str(plan), "--json", "--repeats", "3", "--depth", "0", "--pp-tokens", "256", "--tg-tokens", "128"
    )
    assert r.exit_code == 0, r.stderr
    run_id = json.loads(r.stdout)["run"]["id"]
    snaps = _series(run_id)
    assert len(snaps) >= 5
    phases = [s.phase for s in snaps]
    assert phases[0] == "launch"  # sampled while the server loaded, before the run existed
    assert "d0 measure" in phases
    names = {p.name for s in snaps for p in s.procs}
    assert names == {"main", "rpc0"}
    # the server's memory grows as it loads; it holds at least the model while it serves
    rss = [p.rss_bytes for s in snaps for p in s.procs if p.name == "main" and p.rss_bytes]
    assert max(rss) > m.stat().st_size * 0.5
    # it works while measured: some sample sees the engine busy
    assert max(p.cpu_pct or 0 for s in snaps for p in s.procs) > 20
    # llama-server's own counters, started with --metrics by the launch
    served = [s.servers["main"] for s in snaps if "main" in s.servers]
    assert served, "no /metrics scraped"
    assert max(d.get("llamacpp:tokens_predicted_total", 0) for d in served) >= 128


def test_serve_bench_records_its_load_and_finds_the_server_by_its_port(
    bin_dir: Path, models: Path, tmp_path: Path
) -> None:
    m = model(models, "mon-qwen3moe", n_layer=2)
    with llama_server(bin_dir, m, tmp_path / "s.log", "-nr", "--parallel", "2", "-c", "1024", "--metrics") as srv:
        r = run_cli(
            "serve-bench",
            srv.url,
            "--json",
            "--concurrency",
            "2",
            "--requests",
            "40",
            "--input-len",
            "64",
            "--output-len",
            "128",
        )
        assert r.exit_code == 0, r.stderr
        pid = srv.proc.pid
    run_id = json.loads(r.stdout)["run"]["id"]
    snaps = _series(run_id)
    assert {p.pid for s in snaps for p in s.procs} == {pid}  # not launched by moetune: found by its port
    measured = [s for s in snaps if s.phase == "c=2"]
    assert measured
    assert max(s.load["requests_in_flight"] for s in measured) == 2
    done = [s.load["requests_done_total"] for s in snaps if s.load]
    assert done == sorted(done) and done[-1] == 40  # the measured requests (warm-up ones are not load)
    assert any("itl_recent_median_seconds" in s.load for s in measured)
    assert any(s.servers.get("server", {}).get("llamacpp:requests_processing", 0) >= 1 for s in measured)


def test_launch_records_the_start_up_in_its_run_directory(models: Path, tmp_path: Path) -> None:
    m = model(models, "mon-qwen3moe", n_layer=2)
    plan = write_plan(tmp_path / "plan.json", m, label="mon")
    r = run_cli("launch", str(plan), "--detach", "--json")
    assert r.exit_code == 0, r.stderr
    launch = json.loads(r.stdout)["run"]
    try:
        lines = (runs_dir() / launch / "metrics.jsonl").read_text().splitlines()
        snaps = [Snapshot.from_json(json.loads(x)) for x in lines]
        assert snaps and all(s.procs for s in snaps[-1:])
        assert {p.name for s in snaps for p in s.procs} == {"main"}
    finally:
        assert run_cli("stop", launch).exit_code == 0


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(url, timeout=5).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_a_live_launch_on_prometheus_and_the_load_of_a_serve_bench(models: Path, tmp_path: Path) -> None:
    """`launch --metrics-port`: the launch's processes and the host parse as Prometheus series (GPU
    series need a GPU: tests/monitor/test_exposition.py renders them from the NVML stand-in);
    while a serve-bench runs, the launch's endpoint shows the server busy and `metrics serve`
    shows the benchmark's requests in flight; the endpoint ends with its launch."""
    m = model(models, "mon-qwen3moe", n_layer=2)
    plan = write_plan(tmp_path / "plan.json", m, "--parallel", "2", label="mon")
    port, all_port = free_port(), free_port()
    r = run_cli("launch", str(plan), "--detach", "--json", "--metrics-port", str(port))
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    launch, url = doc["run"], doc["url"]
    env = {**os.environ, "MOETUNE_METRICS_INTERVAL": "0.1"}
    everything = subprocess.Popen(
        [sys.executable, "-m", "moetune", "metrics", "serve", "--listen", f"127.0.0.1:{all_port}"],
        env=env,
        stderr=subprocess.PIPE,
    )
    try:
        first = _scrape(f"http://127.0.0.1:{port}/metrics")
        main = [lab for lab, _ in first["moetune_process_resident_memory_bytes"] if lab["process"] == "main"]
        assert main and main[0]["launch"] == launch and main[0]["role"] == "server"
        assert len(first["moetune_host_cpu_busy_ratio"]) == os.cpu_count()
        bench = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "moetune",
                "serve-bench",
                url,
                "--concurrency",
                "2",
                "--requests",
                "40",
                "--input-len",
                "64",
                "--output-len",
                "64",
                "--json",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        busy, in_flight = 0.0, 0.0
        while bench.poll() is None:
            got = _scrape(f"http://127.0.0.1:{port}/metrics")
            busy = max([busy, *(v for _, v in got.get("moetune_server_requests_processing", []))])
            with contextlib.suppress(httpx.HTTPError):
                allm = _scrape(f"http://127.0.0.1:{all_port}/metrics")
                in_flight = max([in_flight, *(v for _, v in allm.get("moetune_load_requests_in_flight", []))])
            time.sleep(0.1)
        assert bench.returncode == 0, bench.stderr.read() if bench.stderr else ""
        assert busy >= 1, "the launch's endpoint never saw the server busy"
        assert in_flight >= 1, "metrics serve never saw the benchmark's requests in flight"
    finally:
        everything.terminate()
        everything.wait(10)
        assert run_cli("stop", launch).exit_code == 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the launch's endpoint ends with it, its process too
        if not any(f"--launch\0{launch}".encode() in c for c in _cmdlines()):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the launch's metrics endpoint outlived its launch")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)


def _cmdlines() -> list[bytes]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                out.append((d / "cmdline").read_bytes())
    return out
