"""The live line under a long command's progress, from one snapshot."""

from __future__ import annotations

from moetune.monitor.snapshot import GpuSample, HostSample, ProcSample, Snapshot
from moetune.report.live_view import live_line

GIB = 1 << 30


def test_the_load_the_engine_the_host_and_each_gpu() -> None:
    snap = Snapshot(
        t=0.0,
        phase="c=4",
        host=HostSample(cpu_pct=(100.0, 90.0), mem_total_bytes=24 * GIB, mem_used_bytes=12 * GIB),
        procs=(
            ProcSample(name="main", role="server", node="local", pid=1, cpu_pct=150.0, rss_bytes=2 * GIB),
            ProcSample(name="rpc0", role="rpc", node="local", pid=2, cpu_pct=37.0, rss_bytes=GIB),
            ProcSample(name="old", role="server", node="local", pid=3, cpu_pct=None, rss_bytes=None, alive=False),
        ),
        gpus=(
            GpuSample(
                index=0, name="H200", util_pct=87.0, mem_used_bytes=20 * GIB, mem_total_bytes=96 * GIB, power_w=215.4
            ),
        ),
        load={
            "requests_in_flight": 4,
            "requests_done_total": 37,
            "errors_total": 2,
            "ttft_recent_median_seconds": 0.12,
            "itl_recent_median_seconds": 0.035,
        },
    )
    line = live_line(snap)
    assert line == (
        "c=4 · 4 in flight · 37 done · 2 errors · TTFT p50 120 ms · ITL p50 35 ms"
        " · engine CPU 187% RSS 3.0 GiB · host CPU 95% RAM 12.0/24.0 GiB · GPU0 87% 20.0/96.0 GiB 215 W"
    )


def test_a_bench_without_load_or_gpus_says_less() -> None:
    line = live_line(
        Snapshot(t=0.0, phase="d0 measure", host=HostSample(cpu_pct=None, mem_total_bytes=GIB, mem_used_bytes=GIB // 2))
    )
    assert line == "d0 measure · host RAM 0.5/1.0 GiB"
    assert "errors" not in live_line(Snapshot(t=0.0, load={"requests_in_flight": 1, "errors_total": 0}))
