"""The HTML report on hand-built data: SVG primitives, the plan's bars and layer map, phases,
escaping, every section present, nothing loaded from the network; the command's exit codes."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from moetune.kinds import RunKind
from moetune.monitor.snapshot import Snapshot
from moetune.report.html.data import PhaseBand, PlanSource, ReportData, sample_phases, snapshot_phases
from moetune.report.html.gather import gather, is_plan_arg
from moetune.report.html.page import SECTIONS, render_page
from moetune.report.html.plan_section import layer_map, memory_bars
from moetune.report.html.svg import Band, Linear, Segment, Series, line_chart, nice_ticks, stacked_bar
from moetune.store.db import ResultsDB, SampleRow
from moetune.store.record import RunMeta
from tests.bench.synth import run_samples
from tests.helpers import run_cli
from tests.report.reportdata import T0, fill_history, plan_doc, snapshot

# an attribute that makes a browser fetch: src, href, srcset, poster, action, xlink:href, or CSS url()
EXTERNAL = re.compile(
    r"""(?:\b(?:src|href|srcset|poster|action|data)\s*=\s*["']?\s*(?://|[a-z][a-z0-9+.-]*:))"""
    r"""|url\(\s*["']?\s*(?://|[a-z][a-z0-9+.-]*:)|@import""",
    re.I,
)


class Elements(HTMLParser):
    """Every start tag with its attributes, in document order."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.items: list[tuple[str, dict[str, str]]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.items.append((tag, {k: v or "" for k, v in attrs}))

    def find(self, tag: str, **want: str) -> list[dict[str, str]]:
        return [a for t, a in self.items if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in want.items())]


def external_refs(page: str) -> list[str]:
    return [m.group(0) for m in EXTERNAL.finditer(page)]


# -- SVG primitives -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lo", "hi", "ticks"),
    [
        (0, 97, [0, 20, 40, 60, 80, 100]),
        (0, 1, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),
        (0, 7.3, [0, 2, 4, 6, 8]),
        (3, 3, [3, 4, 5, 6]),
        (0, 0.0042, [0, 0.001, 0.002, 0.003, 0.004, 0.005]),
    ],
)
def test_nice_ticks_cover_the_range_with_round_steps(lo: float, hi: float, ticks: list[float]) -> None:
    assert nice_ticks(lo, hi) == pytest.approx(ticks)


def test_linear_scale() -> None:
    s = Linear(0, 10, 100, 200)
    assert (s(0), s(5), s(10)) == (100, 150, 200)
    assert Linear(0, 10, 200, 100)(2) == 180  # a y axis runs upward


def test_stacked_bar_widths_are_proportional_to_the_bytes() -> None:
    segs = [
        Segment("weights", 12000, "#111", "w"),
        Segment("kv", 6000, "#222", "k"),
        Segment("compute", 2000, "#333", "c"),
    ]
    bar = stacked_bar(segs, 24000, width=480)
    els = Elements(bar)
    segments = [r for r in els.find("rect") if "class" not in r]  # one per segment, in order
    widths = {g["data-what"]: float(r["width"]) for g, r in zip(els.find("g"), segments, strict=True)}
    assert widths == pytest.approx({"weights": 240.0, "kv": 120.0, "compute": 40.0})
    free = Elements(bar).find("rect", **{"class": "free"})
    assert float(free[0]["width"]) == pytest.approx(80.0)  # 4000 MiB of 24000 left
    over = stacked_bar([Segment("weights", 30000, "#111", "w")], 24000, width=300)
    assert Elements(over).find("line", **{"class": "over"})[0]["x1"] == "240.000"  # the capacity, marked in red
    assert not Elements(over).find("rect", **{"class": "free"})


def test_line_chart_draws_bands_breaks_and_escapes() -> None:
    chart = line_chart(
        [Series(name="a<b>", points=((0, 1.0), (1, 2.0), (2, None), (3, 4.0)), color="#000", unit="%")],
        x_label="time (s)",
        y_label="CPU (%)",
        bands=[Band(0, 1.5, "pp512"), Band(1.5, 3, "tg<128>")],
    )
    els = Elements(chart)
    assert len(els.find("rect", **{"class": "band"})) == 2
    assert len(els.find("polyline")) == 2  # the None breaks the line
    assert "a&lt;b&gt;" in chart and "tg&lt;128&gt;" in chart and "<b>" not in chart
    assert "time (s)" in chart and "CPU (%)" in chart


# -- the plan -----------------------------------------------------------------------------------


def test_memory_bars_per_device_against_capacity() -> None:
    doc = plan_doc()
    out = Elements(memory_bars(doc["devices"], width=600))
    gpu = [float(r["width"]) for r in out.find("rect") if r.get("fill") not in ("#fff",)][:3]
    assert gpu == pytest.approx([300.0, 150.0, 50.0])  # 12000, 6000, 2000 of 24000 MiB on 600 px
    assert [d["data-device"] for d in out.find("div", **{"class": "device"})] == ["CUDA0", "CPU"]


def test_a_plan_that_does_not_fit_says_where_and_by_how_much() -> None:
    doc = plan_doc()
    gpu = doc["devices"][0]
    gpu["items"].append({"what": "weights", "mib": 10000.0, "service": "main"})
    gpu.update(used_mib=30000.0, free_mib=-6000.0)
    doc.update(fits=False, shortfalls=[{"device": "CUDA0", "message": "CUDA0 is short by 6,000 MiB"}])
    page = render_page(ReportData(plans=(PlanSource("p.json", doc),)))
    assert "does not fit" in page and "CUDA0 is short by 6,000 MiB" in page
    els = Elements(page)
    assert els.find("div", **{"class": "dev-sum over"})  # the device's line in red: 5.9 GiB over
    assert "5.9 GiB over" in page
    assert len(els.find("line", **{"class": "over"})) == 1  # the capacity marked inside the overflowing bar


def test_layer_map_puts_layer_3s_experts_on_the_cpu() -> None:
    doc = plan_doc(cpu_layers=(3,))
    sj = doc["services"][0]
    out = Elements(layer_map(sj["layers"], {"CUDA0": "#00f", "CPU": "#999"}))
    cells = {(c["data-layer"], c["data-tensor"]): c["data-device"] for c in out.find("rect", **{"class": "cell"})}
    for kind in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        assert cells["3", kind] == "CPU"
        assert cells["2", kind] == cells["4", kind] == "CUDA0"
        assert cells["0", kind] == ""  # layer 0 is dense: no expert tensor
    assert all(cells[str(i), "layer"] == "CUDA0" for i in range(6))
    fills = {c["data-device"]: c["fill"] for c in out.find("rect", **{"class": "cell"})}
    assert fills["CPU"] == "#999" and fills["CUDA0"] == "#00f"


# -- phases -------------------------------------------------------------------------------------


def test_phases_from_snapshots_last_until_the_next_snapshot() -> None:
    snaps = [
        Snapshot(t=t, phase=p)
        for t, p in ((0, None), (1, "pp512"), (2, "pp512"), (3, "tg128"), (4, None), (5, "tg128"))
    ]
    assert snapshot_phases(snaps) == [PhaseBand("pp512", 1, 3), PhaseBand("tg128", 3, 4), PhaseBand("tg128", 5, 5)]


def test_phases_from_samples_when_no_snapshot_names_one() -> None:
    def row(i: int, data: dict[str, object], at: str) -> SampleRow:
        return SampleRow(id=i, run_id=1, phase="measure", seq=i, created_at=at, data=dict(data))

    rows = [
        row(0, {"workload": "short", "t_unix_s": 100.0, "end_s": 2.0}, ""),
        row(1, {"workload": "short", "t_unix_s": 103.0, "end_s": 1.0}, ""),
        row(2, {"workload": "d4096", "t_unix_s": 105.0, "end_s": 4.0}, ""),
        row(3, {"concurrency": 4, "t_sched": 50.0, "t_end": 52.5}, "2027-01-15T08:00:10.000+00:00"),
    ]
    got = sample_phases(rows)
    assert got[:2] == [PhaseBand("short", 100.0, 104.0), PhaseBand("d4096", 105.0, 109.0)]
    assert got[2].label == "c=4" and got[2].t1 - got[2].t0 == pytest.approx(2.5)


# -- the page -----------------------------------------------------------------------------------


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    path = tmp_path / "r.sqlite"
    return path, fill_history(path, label_a="<script>alert('a')</script>")


def test_page_of_runs_has_every_section_escapes_and_loads_nothing(history: tuple[Path, dict[str, int]]) -> None:
    path, ids = history
    data = gather([str(i) for i in ids.values()], path, generated_at="2027-01-01T00:00:00+00:00", version="0")
    page = render_page(data)
    els = Elements(page)
    assert [s["id"] for s in els.find("section")] == [sid for sid, _ in SECTIONS]
    assert "<script" not in page  # the label is text, escaped
    assert "&lt;script&gt;alert(&#x27;a&#x27;)&lt;/script&gt;" in page
    assert not external_refs(page), external_refs(page)
    # the plan the bench runs recorded, once for both
    assert len(data.plans) == 1 and data.plans[0].title.startswith("plan of run 1")
    # runs: intervals; the comparison: B faster than A, the serve run left out with the reason
    assert "18.84" in page and "[18.80, 18.88]" in page
    assert data.comparison is not None
    verdicts = {(r.label, r.metric): r.verdict for r in data.comparison.rows}
    assert verdicts["head+tail", "tg:short-json"] == "faster"
    assert "+15.4% faster" in page
    assert any("serve-bench run" in n for n in data.compare_notes)
    # time series of run A with its phases shaded; run B had no sampler
    ts = page[page.index('id="timeseries"') : page.index('id="serve"')]
    assert len(Elements(ts).find("rect", **{"class": "band"})) >= 2 * 5  # two phases on each chart
    assert "short-json" in ts and "d4096" in ts and "GPU0 RTX" in ts and "run 2: no machine metrics" in ts
    # serve-bench: a chart per figure, the x axis at the levels measured, the table per level
    serve = page[page.index('id="serve"') : page.index('id="compare"')]
    assert "Time to first token" in serve and "Inter-token latency" in serve and "output tokens/s" in serve
    assert "c=4" in serve and "concurrency (streams)" in serve


def test_a_plan_alone_keeps_every_section_with_a_note() -> None:
    page = render_page(ReportData(plans=(PlanSource("p.json", plan_doc()),)))
    els = Elements(page)
    assert [s["id"] for s in els.find("section")] == [sid for sid, _ in SECTIONS]
    assert "no serve-bench runs" in page and "no comparison" in page
    assert not external_refs(page)


def test_static_check_finds_what_a_browser_would_fetch() -> None:
    bad = [
        '<img src="https://x/y.png">',
        "<link href='http://cdn/x.css'>",
        '<div style="background:url(//x/y)">',
        "<style>@import 'a.css'</style>",
        '<script src="data:text/javascript,1">',
    ]
    assert all(external_refs(b) for b in bad)
    assert not external_refs('<a href="#plan">plan</a><p>http://127.0.0.1:8080</p>')


# -- the command --------------------------------------------------------------------------------


def test_report_command_plan_runs_and_errors(history: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    path, ids = history
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_doc(cpu_layers=(1, 2))))
    out = tmp_path / "out" / "r.html"
    r = run_cli("report", str(plan), "head+tail", "latest", "--db", str(path), "-o", str(out))
    assert r.exit_code == 0, r.stderr
    page = out.read_text()
    assert "plan.json" in page and "Run 2 · head+tail" in page and f"Run {ids['serve']} · serve" in page
    alone = run_cli("report", str(plan), "-o", "-")
    assert alone.exit_code == 0 and alone.stdout.startswith("<!DOCTYPE html>")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    for args, says in (
        ([str(tmp_path / "bad.json")], "not JSON"),
        ([str(tmp_path / "other.json")], "not a plan"),
        ([str(tmp_path / "missing.json")], "no such file"),
        (["no-such-label"], "no run with id or label"),
        (["99"], "no run 99"),
    ):
        r = run_cli("report", *args, "--db", str(path), "-o", str(tmp_path / "x.html"))
        assert r.exit_code == 2 and says in r.stderr, (args, r.stderr)
    assert run_cli("report", str(plan)).exit_code == 2  # -o is required
    assert not (tmp_path / "x.html").exists()


def test_plan_args_and_run_refs() -> None:
    assert is_plan_arg("p.json") and is_plan_arg("dir/plan.json")
    assert not is_plan_arg("latest") and not is_plan_arg("12") and not is_plan_arg("cpu-moe")


def test_a_run_without_samples_is_shown_and_left_out_of_the_comparison(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    with ResultsDB.open(path) as db:
        a = db.create_run(RunMeta(kind=RunKind.BENCH), label="a", target="u")
        for s in run_samples([10.0, 10.1, 9.9]):
            db.add_sample(a, {**s, "t_unix_s": T0})
        db.finish_run(a)
        b = db.create_run(RunMeta(kind=RunKind.BENCH), label="b", target="u")  # interrupted before its first sample
        db.add_metrics(a, T0, {"t": T0, "schema": 99, "host": {"cpu_pct": [10.0]}, "novel": {"x": 1}})
        db.add_metrics(a, T0 + 1, {"no": "t"})  # a row this moetune cannot read: left out
        db.add_metrics(a, T0 + 2, snapshot(T0 + 2, None, gpu=False).to_json())
    data = gather([str(a), str(b)], path, generated_at="now")
    assert data.comparison is None and any("run 2 (b) has no measured samples" in n for n in data.compare_notes)
    assert [s.t for s in data.runs[0].snapshots] == [T0, T0 + 2]
    (phase,) = data.runs[0].phases  # the sample's workload: no snapshot named a phase
    assert phase.label == "short-json" and phase.t0 == T0 and phase.t1 > T0
    page = render_page(data)
    assert "GPU utilisation" not in page  # no GPU in the snapshots: no GPU chart
    assert "Host CPU" in page and "no measured samples" in page


def test_agent_sessions_are_drawn_turn_by_turn() -> None:
    from moetune.report.html.serve_section import session_charts

    def f(v: float) -> dict[str, float]:
        return {"p50": v, "p90": v, "p99": v, "mean": v}

    doc = {
        "spec": {"sessions": 4, "turns": 3, "strip_thinking": True},
        "turns": [
            {
                "turn": n,
                "context_tokens": f(600 + 200 * n),
                "prompt_tokens_processed": f(p),
                "prompt_tokens_reused": f(r),
                "ttft_ms": f(20 + n),
                "tg_tok_s": f(50 - n),
            }
            for n, p, r in ((1, 640, 0), (2, 250, 600), (3, 248, 810))
        ],
    }
    html = session_charts(doc)
    assert html.count("<figure") == 3 and "4 sessions x 3 turns, thinking stripped" in html
    assert "reused from the cache" in html and "processed" in html
    assert session_charts({"turns": []}) == ""
