"""The sampler against real processes on this machine: what it reads of them, where its snapshots
go, and how it follows a process on another node (here through a stand-in ssh that runs the
node's script locally, as the netns tests' real ssh would)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from moetune.kinds import RunKind
from moetune.monitor.gpu import NvmlProbe
from moetune.monitor.sampler import NoMetrics, RunMonitor, Sampler, Watch
from moetune.monitor.snapshot import Snapshot
from moetune.procfs import read_proc_stat
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta


def _child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.fixture
def busy_and_idle() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    busy = _child("while True: pass")
    idle = _child("import time; b = bytearray(64 << 20); time.sleep(60)")  # 64 MiB resident, asleep
    time.sleep(0.3)
    try:
        yield busy, idle
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


def _watch(name: str, p: subprocess.Popen[bytes]) -> Watch:
    st = read_proc_stat(p.pid)
    return Watch(name=name, role="server", pid=p.pid, start_ticks=st.start_ticks if st else None)


def test_a_busy_process_reads_busy_and_an_idle_one_idle(busy_and_idle: Any) -> None:
    busy, idle = busy_and_idle
    s = Sampler(watches=lambda: [_watch("busy", busy), _watch("idle", idle)], gpus=False)
    first = s.tick()
    assert all(p.cpu_pct is None for p in first.procs)  # no rate from one reading
    time.sleep(1.0)
    snap = s.tick()
    by = {p.name: p for p in snap.procs}
    busy_pct, idle_pct = by["busy"].cpu_pct, by["idle"].cpu_pct
    assert busy_pct is not None and idle_pct is not None
    # ~100 and ~0 on an idle machine; on a loaded one the busy loop gets less, the sleeper still none
    assert busy_pct >= 5 and idle_pct < 2 and busy_pct > 5 * idle_pct
    assert by["idle"].rss_bytes is not None and by["idle"].rss_bytes > 64 << 20
    assert by["busy"].threads == 1 and by["busy"].alive
    assert snap.host.cpu_pct is not None and len(snap.host.cpu_pct) == os.cpu_count()
    assert snap.host.mem_used_bytes is not None and 0 < snap.host.mem_used_bytes < (snap.host.mem_total_bytes or 0)


def test_a_process_that_exits_reads_gone() -> None:
    p = _child("import time; time.sleep(0.2)")
    w = _watch("short", p)
    s = Sampler(watches=lambda: [w], gpus=False)
    assert s.tick().procs[0].alive
    p.wait()
    gone = s.tick().procs[0]
    assert not gone.alive and gone.rss_bytes is None and gone.cpu_pct is None


def test_snapshots_wait_for_the_run_then_go_to_the_history(tmp_path: Path) -> None:
    loads = iter(range(100))
    mon = RunMonitor(list, load=lambda: {"requests_in_flight": float(next(loads))}, interval_s=0.05, phase="launch")
    with ResultsDB.open(tmp_path / "r.db") as db, mon:
        time.sleep(0.3)  # the server loads: no run yet
        run_id = db.create_run(RunMeta(kind=RunKind.BENCH), label="x", target="y")
        mon.attach(db, run_id)
        mon.phase("pp512 measure")
        time.sleep(0.3)
    with ResultsDB.open(tmp_path / "r.db") as db:
        rows = [Snapshot.from_json(d) for d in db.metrics(run_id)]
    assert len(rows) >= 6
    assert [r.t for r in rows] == sorted(r.t for r in rows)
    phases = [r.phase for r in rows]
    assert phases[0] == "launch" and phases[-1] == "pp512 measure"
    assert phases.index("pp512 measure") > 1  # the held ones came first
    assert [r.load["requests_in_flight"] for r in rows] == sorted(r.load["requests_in_flight"] for r in rows)


def test_a_sampler_error_never_stops_the_run() -> None:
    calls = []

    def bad() -> list[Watch]:
        calls.append(1)
        raise OSError("boom")

    with Sampler(watches=bad, interval_s=0.05, gpus=False) as s:
        time.sleep(0.3)
    assert len(calls) >= 3 and s.errors and "boom" in s.errors[0]


def test_server_metrics_are_scraped_and_a_server_without_them_is_not_asked_again() -> None:
    asked: list[str] = []

    def scraper(url: str) -> dict[str, float] | None:
        asked.append(url)
        if "bad" in url:
            raise NoMetrics(url)
        if "loading" in url and asked.count(url) < 3:
            return None  # not answering yet
        return {"llamacpp:requests_processing": 2.0}

    ws = [
        Watch(name="a", role="server", pid=os.getpid(), metrics_url="http://good/metrics"),
        Watch(name="b", role="server", pid=os.getpid(), metrics_url="http://bad/metrics"),
        Watch(name="c", role="server", pid=os.getpid(), metrics_url="http://loading/metrics"),
    ]
    s = Sampler(watches=lambda: ws, gpus=False, scraper=scraper)
    snaps = [s.tick() for _ in range(4)]
    assert set(snaps[0].servers) == {"a"} and set(snaps[-1].servers) == {"a", "c"}
    assert asked.count("http://bad/metrics") == 1 and asked.count("http://good/metrics") == 4
    assert asked.count("http://loading/metrics") == 4  # asked again until it answers


def _fake_nvml(power_refused: bool) -> Any:
    """A stand-in for nvidia-ml-py (no GPU here): the calls and units NVML has."""

    class Refused(Exception):
        pass

    def power(h: int) -> int:
        if power_refused:
            raise Refused
        return 215_500  # milliwatts

    return SimpleNamespace(
        NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA RTX PRO 6000" if h == 0 else "NVIDIA H200",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=87 if h == 0 else 3),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=(20 + h) << 30, total=96 << 30),
        nvmlDeviceGetPowerUsage=power,
        nvmlDeviceGetPcieThroughput=lambda h, counter: 1000 if counter == 1 else 10,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=42, usedGpuMemory=(5 + h) << 30)],
    )


def test_gpus_through_nvml_in_its_units() -> None:
    g0, g1 = NvmlProbe(_fake_nvml(power_refused=False)).sample()
    assert (g0.name, g1.name) == ("NVIDIA RTX PRO 6000", "NVIDIA H200")
    assert g0.util_pct == 87 and g0.mem_used_bytes == 20 << 30 and g0.mem_total_bytes == 96 << 30
    assert g0.power_w == pytest.approx(215.5)
    assert g0.pcie_rx_bytes_per_s == 1000 * 1024 and g0.pcie_tx_bytes_per_s == 10 * 1024
    refused = NvmlProbe(_fake_nvml(power_refused=True))
    assert refused.sample()[0].power_w is None  # a reading NVML refuses is unknown, the rest still read
    assert refused.process_memory() == {42: (5 << 30) + (6 << 30)}


def test_engine_processes_get_their_gpu_memory(busy_and_idle: Any) -> None:
    busy, _ = busy_and_idle
    nvml = _fake_nvml(power_refused=False)
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [SimpleNamespace(pid=busy.pid, usedGpuMemory=1 << 30)]
    s = Sampler(watches=lambda: [_watch("srv", busy)], gpus=NvmlProbe(nvml))
    snap = s.tick()
    assert snap.procs[0].gpu_mem_bytes == 2 << 30 and len(snap.gpus) == 2


def test_a_process_on_another_node_is_read_over_one_ssh_session(tmp_path: Path, busy_and_idle: Any) -> None:
    """The node's script runs under a stand-in ssh (it drops the options and target and runs the
    command here); the sampler reads its lines as it would a real node's."""
    fake = tmp_path / "ssh"
    log = tmp_path / "ssh.log"
    fake.write_text(f'#!/bin/sh\necho start >> {log}\nfor a; do last="$a"; done\nexec /bin/sh -c "$last"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    busy, _ = busy_and_idle
    st = read_proc_stat(busy.pid)
    w = Watch(
        name="rpc0",
        role="rpc",
        node="node-b",
        pid=busy.pid,
        start_ticks=st.start_ticks if st else None,
        ssh=(str(fake),),
        ssh_target="node-b",
    )
    with Sampler(watches=lambda: [w], interval_s=0.2, gpus=False) as s:
        time.sleep(1.5)
        snap = s.latest
    assert snap is not None
    p = snap.procs[0]
    assert p.node == "node-b" and p.alive and p.cpu_pct is not None and p.cpu_pct >= 5  # a busy loop
    assert p.gpu_mem_bytes is None
    assert log.read_text().count("start") == 1  # one session for every sample
