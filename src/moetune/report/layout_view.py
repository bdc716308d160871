"""A layout run as tables (`serve-bench LAYOUT_PLAN --load ...`, `serve-report`, `results show`):
each service's levels alone and under the shared load, its slowdown with the interval, the
throughput beside, and what the sampler saw busy phase by phase."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich import box
from rich.table import Table

from moetune.bench.analysis.level_summary import LevelSummary
from moetune.report.compare_view import fmt


def _f(x: float | None) -> str:
    return "-" if x is None else fmt(x)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def levels_table(levels: Sequence[Mapping[str, Any]]) -> Table:
    t = Table(
        title="per service, times in ms (alone: the others idle; shared: every loaded service at once)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in (
        "service",
        "load",
        "c",
        "ok",
        "errors",
        "TTFT\np50",
        "TTFT\np99",
        "ITL\np50",
        "ITL\np99",
        "TPOT\np50",
        "E2E\np50",
        "req/s",
        "out\ntok/s",
    ):
        t.add_column(col, justify="left" if col in ("service", "load") else "right", no_wrap=True)
    for lv in map(LevelSummary.from_json, levels):
        errs = lv.error_count
        t.add_row(
            str(lv.service),
            str(lv.load),
            str(lv.concurrency) + (f"@{lv.rate}/s" if lv.rate else ""),
            str(lv.ok),
            f"[red]{errs}[/]" if errs else "0",
            _ms(lv.ttft_ms.p50),
            _ms(lv.ttft_ms.p99),
            _ms(lv.itl_ms.p50),
            _ms(lv.itl_ms.p99),
            _ms(lv.tpot_ms.p50),
            _ms(lv.e2e_ms.p50),
            "-" if lv.request_s is None else f"{lv.request_s:.2f}",
            "-" if lv.output_tok_s is None else f"{lv.output_tok_s:.1f}",
        )
    return t


def slowdown_text(row: Mapping[str, Any]) -> str:
    """``1.42x [1.10, 1.80]``; an unbounded ratio (null in the document) reads inf."""

    def x(v: float | None) -> str:
        return "inf" if v is None else f"{v:.2f}"

    lo, hi = row["slowdown_ci"]
    ratio = row["slowdown"]
    return ("inf" if ratio is None else f"{ratio:.2f}x") + f" [{x(lo)}, {x(hi)}]"


def contention_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(
        title="contention: each service under the shared load against alone (median, 95% CI of the "
        "slowdown; > 1x is slower)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in ("service", "metric", "alone", "shared", "unit", "slowdown [CI]", "verdict", "n alone/shared"):
        t.add_column(col, justify="left" if col in ("service", "metric", "unit", "verdict") else "right", no_wrap=True)
    for r in rows:
        v = r["verdict"]
        style = {"slower": "red", "faster": "green"}.get(v, "")
        t.add_row(
            r["service"],
            r["metric"],
            _f(r["alone_median"]),
            _f(r["shared_median"]),
            r["unit"],
            slowdown_text(r),
            f"[{style}]{v}[/]" if style else v,
            f"{r['n_alone']}/{r['n_shared']}",
        )
    return t


def throughput_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(
        title="throughput per service (one figure per level)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for col in ("service", "out tok/s alone", "shared", "shared/alone", "req/s alone", "shared"):
        t.add_column(col, justify="left" if col == "service" else "right", no_wrap=True)
    for r in rows:
        t.add_row(
            r["service"],
            _f(r["alone_output_tok_s"]),
            _f(r["shared_output_tok_s"]),
            "-" if r["ratio"] is None else f"{r['ratio']:.2f}",
            _f(r["alone_request_s"]),
            _f(r["shared_request_s"]),
        )
    return t


def busy_table(rows: list[dict[str, Any]]) -> Table:
    procs = list(dict.fromkeys(p for r in rows for p in r.get("cpu_cores") or {}))
    gpus = list(dict.fromkeys(g for r in rows for g in r.get("gpu_util_pct") or {}))
    t = Table(
        title="busy while measuring (the sampler): CPU cores per engine process, GPU utilisation",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for col in ("phase", "samples", "host CPU %", *procs, *(f"{g} %" for g in gpus)):
        t.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    for r in rows:
        cpu, gpu = r.get("cpu_cores") or {}, r.get("gpu_util_pct") or {}
        t.add_row(
            r["phase"],
            str(r["snapshots"]),
            "-" if r.get("host_cpu_pct") is None else f"{r['host_cpu_pct']:.0f}",
            *("-" if p not in cpu else f"{cpu[p]:.2f}" for p in procs),
            *("-" if g not in gpu else f"{gpu[g]:.0f}" for g in gpus),
        )
    return t


def service_lines(services: list[dict[str, Any]]) -> list[str]:
    """One line per service of a layout run (its ``run_services`` record)."""
    out = []
    for s in services:
        srv, launch = s.get("server") or {}, s.get("launch") or {}
        slots = f", {srv['slots']} slots" if srv.get("slots") else ""
        model = (s.get("model") or {}).get("path") or srv.get("model_path") or "-"
        rpc = f", transport {launch.get('confirmed')}" if launch.get("transport") not in (None, "none") else ""
        load = f", loaded in {launch['load_s']:.1f} s" if launch.get("load_s") is not None else ""
        out.append(
            f"service {s['name']}: {srv.get('url') or '-'} ({srv.get('dialect', '?')}{slots}), model {model}"
            f"{rpc}{load}; workload: {(s.get('workload') or {}).get('describe', '-')}"
        )
    return out


def layout_tables(doc: Mapping[str, Any]) -> list[Table]:
    """The tables of a layout run's document (:func:`moetune.bench.serve.layout_run.layout_doc`)."""
    lay = doc.get("layout") or {}
    out = [levels_table(list(doc.get("levels") or []))]
    if lay.get("contention"):
        out.append(contention_table(lay["contention"]))
    if lay.get("throughput"):
        out.append(throughput_table(lay["throughput"]))
    if any(r.get("snapshots") for r in lay.get("busy") or []):
        out.append(busy_table(lay["busy"]))
    return out
