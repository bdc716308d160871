"""The machine during each run, from the snapshots the sampler stored (``metrics`` rows): host
CPU, each engine process's CPU and memory, each GPU's utilisation and memory, the benchmark's
load; the run's phases shaded behind every chart."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from moetune.monitor.snapshot import Snapshot
from moetune.report.html.data import PhaseBand, RunReport
from moetune.report.html.markup import MIB, esc, note
from moetune.report.html.svg import PALETTE, Band, Series, figure, legend, line_chart

GIB = 1 << 30
WIDTH = 560


def _clock(snaps: Sequence[Snapshot], phases: Sequence[PhaseBand]) -> tuple[float, float, str]:
    """(origin, divisor, unit) of the time axis: seconds, or minutes for a long run."""
    t0 = min([s.t for s in snaps] + [p.t0 for p in phases])
    t1 = max([s.t for s in snaps] + [p.t1 for p in phases])
    return (t0, 60.0, "min") if t1 - t0 > 900 else (t0, 1.0, "s")


def _bands(phases: Sequence[PhaseBand], t0: float, div: float, *, lo: float, hi: float) -> list[Band]:
    out = []
    for p in phases:
        a, b = (p.t0 - t0) / div, (p.t1 - t0) / div
        if b >= lo and a <= hi:
            out.append(Band(max(a, lo), min(b, hi), p.label))
    return out


def _series(
    snaps: Sequence[Snapshot],
    t0: float,
    div: float,
    keys: Sequence[str],
    *,
    value: Callable[[Snapshot, str], float | None],
    unit: str,
    dashed: Sequence[str] = (),
    color_of: Callable[[int, str], str] | None = None,
) -> list[Series]:
    out = []
    for i, k in enumerate(keys):
        pts = tuple(((s.t - t0) / div, value(s, k)) for s in snaps)
        if any(y is not None for _, y in pts):
            color = color_of(i, k) if color_of else PALETTE[i % len(PALETTE)]
            out.append(Series(name=k, points=pts, color=color, dash=k in dashed, unit=unit))
    return out


def _proc_key(p: object) -> str:
    name, node = getattr(p, "name", "?"), getattr(p, "node", "local")
    return str(name) if node == "local" else f"{name}@{node}"


def _mem_unit(values: Sequence[float]) -> tuple[float, str]:
    return (GIB, "GiB") if max(values, default=0.0) >= 2 * GIB else (MIB, "MiB")


def run_charts(rr: RunReport) -> str:
    snaps = rr.snapshots
    if not snaps:
        return note(f"run {rr.run.id}: no machine metrics were recorded for it")
    t0, div, tu = _clock(snaps, rr.phases)
    lo, hi = 0.0, (max(s.t for s in snaps) - t0) / div
    bands = _bands(rr.phases, t0, div, lo=lo, hi=hi)
    x_label = f"time since the first snapshot ({tu})"
    charts: list[str] = []

    def chart(caption: str, series: list[Series], y_label: str, y_max: float | None = None) -> None:
        if series:
            charts.append(
                figure(
                    caption,
                    line_chart(
                        series,
                        x_label=x_label,
                        y_label=y_label,
                        bands=bands,
                        width=WIDTH,
                        x_range=(lo, hi),
                        y_max=y_max,
                    ),
                    legend(series),
                )
            )

    chart(
        "Host CPU",
        _series(snaps, t0, div, ["host, all cores"], value=lambda s, _: s.host.cpu_total_pct, unit="%"),
        "CPU (% of all cores)",
        100.0,
    )
    procs = list(dict.fromkeys(_proc_key(p) for s in snaps for p in s.procs))

    def proc(s: Snapshot, k: str, attr: str) -> float | None:
        v = next((getattr(p, attr) for p in s.procs if _proc_key(p) == k and p.alive), None)
        return None if v is None else float(v)

    chart(
        "Engine processes: CPU",
        _series(snaps, t0, div, procs, value=lambda s, k: proc(s, k, "cpu_pct"), unit="%"),
        "CPU (% of one core)",
    )
    mem_values = [float(p.rss_bytes) for s in snaps for p in s.procs if p.rss_bytes is not None] + [
        float(s.host.mem_used_bytes) for s in snaps if s.host.mem_used_bytes is not None
    ]
    scale, mu = _mem_unit(mem_values)
    host_mem = "host memory used"

    def mem(s: Snapshot, k: str) -> float | None:
        v = s.host.mem_used_bytes if k == host_mem else proc(s, k, "rss_bytes")
        return None if v is None else v / scale

    chart(
        "Memory: engine processes' RSS and the host's use",
        _series(snaps, t0, div, [*procs, host_mem], value=mem, unit=mu, dashed=[host_mem]),
        f"memory ({mu})",
    )
    gpus = list(dict.fromkeys(f"GPU{g.index} {g.name}".strip() for s in snaps for g in s.gpus))

    def gpu(s: Snapshot, k: str, attr: str) -> float | None:
        v = next((getattr(g, attr) for g in s.gpus if f"GPU{g.index} {g.name}".strip() == k), None)
        return None if v is None else float(v)

    chart(
        "GPU utilisation",
        _series(snaps, t0, div, gpus, value=lambda s, k: gpu(s, k, "util_pct"), unit="%"),
        "utilisation (%)",
        100.0,
    )
    totals = [f"{k} total" for k in gpus]

    def gmem(s: Snapshot, k: str) -> float | None:
        v = gpu(s, k.removesuffix(" total"), "mem_total_bytes" if k.endswith(" total") else "mem_used_bytes")
        return None if v is None else v / GIB

    chart(
        "GPU memory used",
        _series(
            snaps,
            t0,
            div,
            [*gpus, *totals],
            value=gmem,
            unit="GiB",
            dashed=totals,
            color_of=lambda i, k: PALETTE[i % len(gpus)] if gpus else PALETTE[0],
        ),
        "memory (GiB)",
    )
    load_keys = list(dict.fromkeys(k for s in snaps for k in s.load))
    served = list(
        dict.fromkeys(
            f"{name}: requests processing"
            for s in snaps
            for name, m in s.servers.items()
            if "llamacpp:requests_processing" in m
        )
    )

    def load(s: Snapshot, k: str) -> float | None:
        if k in s.load:
            return s.load[k]
        name = k.removesuffix(": requests processing")
        return s.servers.get(name, {}).get("llamacpp:requests_processing")

    in_flight = [k for k in load_keys if k == "requests_in_flight"]  # bench.serve.load.LoadMeter's
    chart("Load", _series(snaps, t0, div, [*in_flight, *served], value=load, unit="requests"), "requests")
    phases = ", ".join(p.label for p in rr.phases)
    return (
        '<div class="charts">'
        + "".join(charts)
        + "</div>"
        + (f'<p class="dim">phases (shaded): {esc(phases)}</p>' if phases else "")
    )


def timeseries_section(runs: Sequence[RunReport]) -> str:
    if not runs:
        return note("no runs given, so no machine metrics")
    if not any(rr.snapshots for rr in runs):
        return note("no machine metrics were recorded for these runs (the sampler stores them while a run measures)")
    return "".join(
        f'<div class="ts" id="ts-{rr.run.id}"><h3>Run {rr.run.id} · {esc(rr.run.label)}</h3>{run_charts(rr)}</div>'
        for rr in runs
    )
