"""A real Prometheus scrapes `moetune metrics serve`'s endpoint and answers a query with the value
the results database holds (everything on 127.0.0.1). Skips where Prometheus is not installed
(Debian: `apt-get install prometheus`; .ci/run installs it)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from moetune.kinds import RunKind
from moetune.monitor.serve import DbSource, bind, serve_until_stopped
from moetune.monitor.snapshot import GpuSample, HostSample, Snapshot
from moetune.run.process import end
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from tests.helpers import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(PROMETHEUS).exists(), reason="Prometheus is not installed (apt-get install prometheus)"
    ),
]

CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: moetune
    static_configs:
      - targets: ["{target}"]
"""


def query(base: str, q: str) -> list[dict[str, Any]]:
    r = httpx.get(base + "/api/v1/query", params={"query": q}, timeout=5)
    r.raise_for_status()
    doc = r.json()
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def test_prometheus_scrapes_the_endpoint_and_answers_queries(tmp_path: Path) -> None:
    db_path = tmp_path / "results.sqlite"
    label = 'glm "q4"\nrun'
    with ResultsDB.open(db_path) as db:
        rid = db.create_run(RunMeta(kind=RunKind.SERVE_BENCH), label=label, target="http://127.0.0.1:1")
        db.add_metrics(
            rid,
            time.time(),
            Snapshot(
                t=time.time(),
                host=HostSample(mem_used_bytes=123_456_789, mem_total_bytes=1 << 34),
                gpus=(GpuSample(index=0, name="NVIDIA H200", util_pct=42.0),),
                servers={"main": {"llamacpp:tokens_predicted_total": 640.0}},
                load={"requests_in_flight": 3.0},
                phase="c=4",
            ).to_json(),
        )

    source = DbSource(db_path, max_age_s=3600)
    server = bind("127.0.0.1", 0, source)
    stop = threading.Event()
    serving = threading.Thread(target=serve_until_stopped, args=(server, stop), daemon=True)
    serving.start()

    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(CONFIG.format(target=server.url.removeprefix("http://")))
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as f:
        prom = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        result: list[dict[str, Any]] = []
        while not result:
            assert prom.poll() is None, f"prometheus exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no scrape in 60 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
            try:
                result = query(base, "moetune_host_memory_used_bytes")
            except httpx.HTTPError:
                continue
        (series,) = result
        assert float(series["value"][1]) == 123_456_789
        assert series["metric"]["run"] == str(rid) and series["metric"]["job"] == "moetune"

        (info,) = query(base, "moetune_run_info")
        assert info["metric"]["label"] == label and info["metric"]["kind"] == "serve-bench"
        assert info["metric"]["phase"] == "c=4"
        (gpu,) = query(base, 'moetune_gpu_utilization_ratio{device_name="NVIDIA H200"}')
        assert float(gpu["value"][1]) == pytest.approx(0.42)
        (tokens,) = query(base, 'moetune_server_tokens_predicted_total{service="main"}')
        assert float(tokens["value"][1]) == 640
        (up,) = query(base, 'up{job="moetune"}')
        assert up["value"][1] == "1"
    finally:
        end(prom, 20)
        stop.set()
        serving.join(10)
        source.close()
