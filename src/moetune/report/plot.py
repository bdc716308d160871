"""Plots of compared runs: bars with their confidence intervals per metric family (TG, PP…), and
for metrics placed on an axis (context depth), lines against it; and a serving run's latency and
throughput by concurrency."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune.bench.analysis.level_summary import LevelSummary, Percentiles
from moetune.bench.analysis.stats import DEFAULT_CONF, summarize
from moetune.errors import InputError
from moetune.report.compare import RunMetrics


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend, imported when a plot is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _families(runs: list[RunMetrics], on_axis: bool) -> dict[str, list[str]]:
    fams: dict[str, list[str]] = {}
    for r in runs:
        for name, ms in r.metrics.items():
            if (ms.x is not None) != on_axis:
                continue
            names = fams.setdefault(ms.family or name.split(":")[0], [])
            if name not in names:
                names.append(name)
    return fams


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    """One panel of a comparison plot: bars per metric, or lines over the metrics' axis."""

    style: str  # bar | line
    family: str
    names: tuple[str, ...]
    title: str
    xlabel: str | None = None  # lines: the axis (depth, concurrency, streams)
    xticks: tuple[float, ...] = ()  # lines: a tick at every level measured

    @property
    def xticklabels(self) -> tuple[str, ...]:
        return tuple(f"{x:g}" for x in self.xticks)

    @property
    def log_x(self) -> bool:
        """Levels that double (concurrency 1, 2, 4 … 64) spread evenly on a log axis."""
        return bool(self.xticks) and self.xticks[0] > 0 and self.xticks[-1] / self.xticks[0] >= 8


def panels(runs: list[RunMetrics]) -> list[Panel]:
    """The panels of :func:`plot_runs`, titled by the axis their metrics are placed on."""
    out = [Panel(style="bar", family=f, names=tuple(n), title=f.upper()) for f, n in _families(runs, False).items()]
    for fam, names in _families(runs, True).items():
        placed = [ms for r in runs for n in names if (ms := r.metrics.get(n)) is not None]
        axis = next((ms.x_label for ms in placed if ms.x_label), None) or "x"
        xs = tuple(sorted({ms.x for ms in placed if ms.x is not None}))
        out.append(
            Panel(
                style="line",
                family=fam,
                names=tuple(names),
                title=f"{fam.upper()} vs {axis.split(' (')[0]}",
                xlabel=axis,
                xticks=xs,
            )
        )
    return out


def plot_runs(
    runs: list[RunMetrics], path: Path, *, conf: float = DEFAULT_CONF, seed: int = 0, title: str | None = None
) -> Path:
    """Write a PNG: one panel per metric family, bars (or lines over depth or concurrency) with CI whiskers."""
    plt = _pyplot()

    layout = panels(runs)
    if not layout:
        raise InputError("nothing to plot: the runs have no metrics")
    ncols = min(2, len(layout))
    nrows = (len(layout) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.5 * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(layout) :]:
        ax.set_visible(False)
    width = 0.8 / max(1, len(runs))
    for ax, p in zip(flat, layout, strict=False):
        style, names = p.style, p.names
        unit = ""
        for j, r in enumerate(runs):
            xs, meds, los, his = [], [], [], []
            for i, name in enumerate(names):
                ms = r.metrics.get(name)
                if ms is None:
                    continue
                s = summarize(ms.values, conf=conf, seed=seed)
                unit = ms.unit
                xs.append(ms.x if style == "line" and ms.x is not None else i + (j - (len(runs) - 1) / 2) * width)
                meds.append(s.median)
                los.append(s.median - s.ci_low)
                his.append(s.ci_high - s.median)
            lab = f"{r.label} (run {r.run})"
            if style == "bar":
                ax.bar(xs, meds, width, yerr=[los, his], capsize=3, label=lab)
            else:
                order = sorted(range(len(xs)), key=lambda k: xs[k])
                ax.errorbar(
                    [xs[k] for k in order],
                    [meds[k] for k in order],
                    yerr=[[los[k] for k in order], [his[k] for k in order]],
                    marker="o",
                    capsize=3,
                    label=lab,
                )
        if style == "bar":
            ax.set_xticks(range(len(names)), [n.split(":", 1)[-1] for n in names], rotation=20, ha="right")
        else:
            if p.log_x:
                ax.set_xscale("log", base=2)
            ax.set_xticks(p.xticks, p.xticklabels)
            ax.minorticks_off()
            ax.set_xlabel(p.xlabel)
        ax.set_title(p.title)
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    flat[0].legend(fontsize=8)
    fig.suptitle(title or f"median with {conf * 100:.0f}% confidence interval")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- serving runs: latency and throughput by concurrency ----------------------------------------

LATENCY_PNG = "serve-latency.png"
THROUGHPUT_PNG = "serve-throughput.png"


def plot_sweep(docs: Sequence[Mapping[str, Any]], out_dir: Path, *, title: str = "") -> list[Path]:
    """Write serve-latency.png (TTFT and ITL p50/p90/p99 by concurrency) and serve-throughput.png
    (output tokens/s and requests/s by concurrency) into ``out_dir``; return their paths."""
    plt = _pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    levels = sorted((LevelSummary.from_json(d) for d in docs), key=lambda lv: lv.concurrency)
    cs = [lv.concurrency for lv in levels]

    def series(of: Callable[[LevelSummary], Percentiles], q: str) -> list[float]:
        vs = [of(lv).to_json()[q] for lv in levels]
        return [float("nan") if v is None else v for v in vs]

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    panels: tuple[tuple[Any, Callable[[LevelSummary], Percentiles], str], ...] = (
        (axes[0], lambda lv: lv.ttft_ms, "TTFT"),
        (axes[1], lambda lv: lv.itl_ms, "ITL"),
    )
    for ax, metric, name in panels:
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
    ax.plot(cs, [lv.output_tok_s or 0 for lv in levels], "o-", color="tab:blue", label="output tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tokens/s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(cs, [lv.request_s or 0 for lv in levels], "s--", color="tab:orange", label="requests/s")
    ax2.set_ylabel("requests/s", color="tab:orange")
    ax.grid(alpha=0.3)
    ax.set_title(title or "serve-bench: throughput by concurrency")
    fig.tight_layout()
    tput = out_dir / THROUGHPUT_PNG
    fig.savefig(tput, dpi=110)
    plt.close(fig)
    return [lat, tput]
