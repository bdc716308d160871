"""The one line a long command shows under its progress while it runs (serve-bench, sweep, tune,
bench): what the load generator is doing and what the machine does, from the sampler's latest
snapshot. Pure: a snapshot in, text out."""

from __future__ import annotations

from moetune.monitor.snapshot import Snapshot

GIB = 1 << 30


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def live_line(snap: Snapshot) -> str:
    """``c=4 · 4 in flight · 37 done · TTFT p50 120 ms · ITL p50 35 ms · engine CPU 187% RSS 2.1 GiB
    · host CPU 95% RAM 12.0/23.4 GiB · GPU0 87% 20.1/96.0 GiB 215 W``; parts without data left out."""
    parts: list[str] = []
    if snap.phase:
        parts.append(snap.phase)
    ld = snap.load
    if ld:
        parts.append(f"{ld.get('requests_in_flight', 0):.0f} in flight")
        parts.append(f"{ld.get('requests_done_total', 0):.0f} done")
        if ld.get("errors_total"):
            parts.append(f"{ld['errors_total']:.0f} errors")
        if "ttft_recent_median_seconds" in ld:
            parts.append(f"TTFT p50 {_ms(ld['ttft_recent_median_seconds'])}")
        if "itl_recent_median_seconds" in ld:
            parts.append(f"ITL p50 {_ms(ld['itl_recent_median_seconds'])}")
    alive = [p for p in snap.procs if p.alive]
    if alive:
        cpu = sum(p.cpu_pct or 0.0 for p in alive)
        rss = sum(p.rss_bytes or 0 for p in alive)
        parts.append(f"engine CPU {cpu:.0f}% RSS {rss / GIB:.1f} GiB")
    h = snap.host
    host = []
    if h.cpu_total_pct is not None:
        host.append(f"CPU {h.cpu_total_pct:.0f}%")
    if h.mem_used_bytes is not None and h.mem_total_bytes:
        host.append(f"RAM {h.mem_used_bytes / GIB:.1f}/{h.mem_total_bytes / GIB:.1f} GiB")
    if host:
        parts.append("host " + " ".join(host))
    for g in snap.gpus:
        gp = [f"GPU{g.index}"]
        if g.util_pct is not None:
            gp.append(f"{g.util_pct:.0f}%")
        if g.mem_used_bytes is not None and g.mem_total_bytes:
            gp.append(f"{g.mem_used_bytes / GIB:.1f}/{g.mem_total_bytes / GIB:.1f} GiB")
        if g.power_w is not None:
            gp.append(f"{g.power_w:.0f} W")
        parts.append(" ".join(gp))
    return " · ".join(parts)
