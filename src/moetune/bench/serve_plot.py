"""Plots of a serving sweep: TTFT and ITL against concurrency, and throughput against concurrency."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LATENCY_PNG = "serve-latency.png"
THROUGHPUT_PNG = "serve-throughput.png"


def plot_sweep(levels: list[dict[str, Any]], out_dir: Path, *, title: str = "") -> list[Path]:
    """Write serve-latency.png (TTFT and ITL p50/p90/p99 by concurrency) and serve-throughput.png
    (output tokens/s and requests/s by concurrency) into ``out_dir``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    levels = sorted(levels, key=lambda lv: lv["concurrency"])
    cs = [lv["concurrency"] for lv in levels]

    def series(metric: str, q: str) -> list[float]:
        return [float("nan") if lv[metric][q] is None else lv[metric][q] for lv in levels]

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, metric, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
        for q, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
            ax.plot(cs, series(metric, q), style, label=q)
        ax.set_xscale("log", base=2)
        ax.set_xticks(cs, [str(c) for c in cs])
        ax.set_yscale("log")  # p99 tails are often 10-100x the median
        ax.set_xlabel("concurrency")
        ax.set_ylabel(f"{name} (ms, log scale)")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title or "serve-bench: latency by concurrency")
    fig.tight_layout()
    lat = out_dir / LATENCY_PNG
    fig.savefig(lat, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(cs, [lv["output_tok_s"] or 0 for lv in levels], "o-", color="tab:blue", label="output tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tokens/s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(cs, [lv["request_s"] or 0 for lv in levels], "s--", color="tab:orange", label="requests/s")
    ax2.set_ylabel("requests/s", color="tab:orange")
    ax.grid(alpha=0.3)
    ax.set_title(title or "serve-bench: throughput by concurrency")
    fig.tight_layout()
    tput = out_dir / THROUGHPUT_PNG
    fig.savefig(tput, dpi=110)
    plt.close(fig)
    return [lat, tput]
