"""The plan's prediction beside the measurement: stored with every benchmark of a plan, for exactly
the workloads measured (TG at their depth), with each device's share of its bandwidth reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moetune.bench.analysis.predicted import efficiency, expected, report, versus
from moetune.hardware.inventory import load
from moetune.model.archs import small_dims
from moetune.model.profile import load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.plan.speed import at_depth, predict
from moetune.report.results_view import prediction_lines
from moetune.store.db import ResultsDB
from tests.helpers import free_port, run_cli


def test_a_prediction_moves_with_the_context_as_the_model_does(tmp_path: Path) -> None:
    p = load_profile(generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0])
    sp = make_plan(
        [ServiceSpec(name="t", model=p, settings=Settings(ctx=65536), strategy="cpu-moe")], load("rtx-pro-6000")
    ).main
    stored = sp.prediction.to_json()
    for depth in (0, 4096, 65536):
        direct = predict(p, sp.hw, sp.placement, sp.spec.settings, depth=depth)
        assert at_depth(stored, depth)["tg_tok_s"] == pytest.approx(direct.tg_tok_s, rel=1e-4)
        moved = {d["device"]: d["read_mib_per_token"] for d in at_depth(stored, depth)["per_device"]}
        assert moved == pytest.approx({d.device: d.read_mib_per_token for d in direct.per_device}, rel=1e-3)


def test_versus_and_efficiency(tmp_path: Path) -> None:
    p = load_profile(generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0])
    stored = make_plan(
        [ServiceSpec(name="t", model=p, settings=Settings(ctx=8192), strategy="cpu-moe")], load("rtx-pro-6000")
    ).main.prediction.to_json()
    exp = expected(stored, [("short", 0, None, None), ("d4096", 4096, 300, None)])
    assert exp["d4096"]["tg_tok_s"] < exp["short"]["tg_tok_s"]
    pred_tg, pred_pp = exp["short"]["tg_tok_s"], exp["short"]["pp_tok_s"]
    summary = {
        "workloads": {
            "short": {"tg": {"median": pred_tg / 1.25}, "pp": {"median": pred_pp * 4 / 3}},
            "d4096": {"tg": {"median": 12.0}, "pp": None},
        }
    }
    vs = versus(summary, exp)
    assert vs["short"]["tg"]["error_pct"] == pytest.approx(25.0, abs=0.01)  # promised 25% more than it got
    assert vs["short"]["pp"]["error_pct"] == pytest.approx(-25.0, abs=0.01)
    assert vs["d4096"]["pp"]["measured"] is None and vs["d4096"]["pp"]["error_pct"] is None
    eff = {e["device"]: e for e in efficiency(exp["short"], 16.0)}
    cpu_read = next(d["read_mib_per_token"] for d in exp["short"]["per_device"] if d["device"] == "CPU")
    assert eff["CPU"]["bytes_per_s"] == round(cpu_read * (1 << 20) * 16)
    assert eff["CPU"]["limit_bytes_per_s"] == load("rtx-pro-6000").cpu().bw_gbs * 1e9
    rep = report(summary, {"predicted": exp})
    assert rep is not None and rep["predicted"] == {"tg_tok_s": round(pred_tg, 3), "pp_tok_s": round(pred_pp, 3)}
    assert report(summary, {}) is None  # a bare URL's run: nothing to compare with
    # a run beyond the prediction's stated uncertainty is flagged, in the JSON and in the text
    # 25% is inside the uncalibrated model's +/-50%; d4096's measurement (12 tokens/s) is far outside
    assert [(m["workload"], m["family"]) for m in rep["mispredicted"]] == [("d4096", "tg")]
    tight = report(summary, {"predicted": exp, "prediction_uncertainty": {"tg_pct": 10.0, "pp_pct": 40.0}})
    assert tight is not None
    assert tight["mispredicted"][0] == {"workload": "short", "family": "tg", "error_pct": 25.0, "band_pct": 10.0}
    lines = prediction_lines(tight)
    assert any(ln.startswith("  ! short TG: off by +25%, beyond the model's stated +/-10%") for ln in lines)
    assert "(+25% !)" in lines[1] and "(-25%)" in lines[1]
    workless = {"tg_tok_s": 1.0, "ms_per_token": 1000.0}  # stored without its work
    assert expected(workless, [("short", 0, None, None)]) == {}


@pytest.mark.server
def test_bench_of_a_plan_stores_and_prints_the_prediction(bin_dir: Path, tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}]})
    )
    plan = tmp_path / "p.json"
    assert (
        run_cli(
            "plan", str(model), "--hw", str(hw), "--ctx", "2048", "--port", str(free_port()), "-o", str(plan)
        ).exit_code
        == 0
    )
    r = run_cli(
        "bench",
        str(plan),
        "--depth",
        "0,512",
        "-r",
        "2",
        "--warmup",
        "0",
        "--tg-tokens",
        "8",
        "--pp-tokens",
        "64",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["predicted"]["tg_tok_s"] > 0
    errs = doc["prediction_error"]
    assert set(errs) == {"d0", "d512"} and errs["d512"]["tg"]["predicted"] < errs["d0"]["tg"]["predicted"]
    assert errs["d0"]["tg"]["error_pct"] is not None
    (cpu,) = doc["efficiency"]
    # the hardware file says 20 GB/s; a machine with more can read above it (the percentage then says so)
    assert cpu["device"] == "CPU" and cpu["limit_bytes_per_s"] == 20e9 and cpu["pct"] > 0
    assert cpu["pct"] == pytest.approx(100 * cpu["bytes_per_s"] / 20e9, rel=0.01)
    with ResultsDB.open() as db:
        run = db.run(doc["run"]["id"])
        assert set(run.meta.details["predicted"]) == {"d0", "d512"}
    shown = run_cli("results", "show", str(doc["run"]["id"])).stdout
    assert "predicted vs measured" in shown and "decode bandwidth reached" in shown
    again = json.loads(
        run_cli(
            "bench",
            str(plan),
            "--depth",
            "0",
            "-r",
            "2",
            "--warmup",
            "0",
            "--tg-tokens",
            "8",
            "--pp-tokens",
            "64",
            "--json",
        ).stdout
    )
    ids = [str(doc["run"]["id"]), str(again["run"]["id"])]
    cmp_doc = json.loads(run_cli("compare", *ids, "--json").stdout)
    assert set(cmp_doc["prediction_error"]) == set(ids)
    assert "predicted vs measured" in run_cli("compare", *ids).stdout
