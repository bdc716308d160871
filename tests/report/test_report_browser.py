"""`moetune report` end to end: two plans of a generated model benchmarked on a real llama-server
(with a loopback RPC worker as a second device), a serve-bench run, machine snapshots for each
run; the page opened in headless Chromium loads nothing, logs no error, has every section, and
is kept as a screenshot (report.png in the test's tmp directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from moetune.report.html.page import SECTIONS
from moetune.store.db import ResultsDB
from tests.helpers import free_port, loopback_hw, run_cli
from tests.report.browser import find_chromium, visit

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

PROBE = """JSON.stringify({
  sections: [...document.querySelectorAll('main > section')].map(s => s.id),
  svgs: Object.fromEntries([...document.querySelectorAll('main > section')].map(
    s => [s.id, s.querySelectorAll('svg[role=img]').length])),
  layerMaps: document.querySelectorAll('svg.layer-map').length,
  layer0up: [...document.querySelectorAll('svg.layer-map')].map(m =>
    (m.querySelector('rect[data-layer="0"][data-tensor="ffn_up_exps"]') || {}).dataset?.device),
  scripts: document.scripts.length,
  title: document.title,
  width: document.documentElement.scrollWidth,
})"""


@needs_chromium
def test_the_browser_check_sees_errors_and_requests(tmp_path: Path) -> None:
    """The check can fail: a page that fetches and throws is caught."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<!DOCTYPE html><img src="http://127.0.0.1:9/x.png"><script>console.error("boom"); nope();</script><p>x</p>'
    )
    assert CHROMIUM is not None
    v = visit(page, tmp_path / "bad.png", "JSON.stringify(1)", chromium=CHROMIUM, profile=tmp_path / "profile")
    assert "http://127.0.0.1:9/x.png" in v.requests
    assert any("boom" in e for e in v.console_errors) and any("nope" in e for e in v.console_errors)


@pytest.mark.server
@needs_chromium
def test_report_of_plans_benches_and_a_serve_bench_in_chromium(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOETUNE_METRICS_INTERVAL", "0.1")  # runs of a second or two: enough points to draw
    model = generate(tmp_path / "m.gguf", "qwen3moe", Dims(n_layer=4), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump(loopback_hw([f"127.0.0.1:{free_port()}"])))
    plans = {}
    for name, strategy in (("ncm2", "n-cpu-moe:2"), ("cpumoe", "cpu-moe")):
        plans[name] = tmp_path / f"{name}.json"
        r = run_cli(
            "plan",
            str(model),
            "--hw",
            str(hw),
            "--strategy",
            strategy,
            "--ctx",
            "1024",
            "-t",
            "1",
            "--port",
            str(free_port()),
            "-o",
            str(plans[name]),
        )
        assert r.exit_code == 0, r.stderr
    ids = []
    for name, label in (("ncm2", "n-cpu-moe 2"), ("cpumoe", "cpu-moe <script>alert(1)</script>")):
        r = run_cli(
            "bench",
            str(plans[name]),
            "-r",
            "4",
            "--warmup",
            "1",
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--label",
            label,
            "--json",
        )
        assert r.exit_code == 0, r.stderr
        ids.append(str(json.loads(r.stdout)["run"]["id"]))
    r = run_cli(
        "serve-bench",
        str(plans["ncm2"]),
        "--concurrency",
        "1,2",
        "--requests",
        "4",
        "--input-len",
        "64",
        "--output-len",
        "8",
        "--label",
        "serve",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    ids.append(str(json.loads(r.stdout)["run"]["id"]))
    with ResultsDB.open() as db:  # the sampler's series, drawn below
        assert all(len(db.metrics(int(rid))) >= 3 for rid in ids)
    cmp = run_cli("compare", ids[0], ids[1], "--json")
    assert cmp.exit_code == 0, cmp.stderr

    out = tmp_path / "report.html"
    r = run_cli("report", *ids, str(plans["ncm2"]), "-o", str(out))
    assert r.exit_code == 0, r.stderr
    page = out.read_text()
    for row in json.loads(cmp.stdout)["rows"]:  # the verdicts `moetune compare` gives, on the page
        assert f"{row['change_pct']:+.1f}% {row['verdict']}{' (noisy)' if row['noisy'] else ''}" in page

    assert CHROMIUM is not None
    png = tmp_path / "report.png"
    v = visit(out, png, PROBE, chromium=CHROMIUM, profile=tmp_path / "profile")
    assert v.requests == [out.resolve().as_uri()], v.requests  # the page itself, nothing else
    assert not v.console_errors, v.console_errors
    dom = v.dom
    assert dom["sections"] == [sid for sid, _ in SECTIONS]
    assert all(dom["svgs"][s] >= 1 for s in ("plan", "runs", "timeseries", "serve", "compare")), dom["svgs"]
    assert dom["scripts"] == 0  # the label with a script tag stayed text
    # the plan file and the plans the runs recorded: n-cpu-moe 2 keeps layer 0's experts on the CPU,
    # cpu-moe all of them; both put the layers themselves on the RPC worker
    assert dom["layerMaps"] == 2 and dom["layer0up"] == ["CPU", "CPU"]
    assert dom["width"] <= 1400  # nothing wider than the window
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
