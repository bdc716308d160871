"""This CPU's attention kernels (`moetune hw attention`): llama-bench's rows read, the speed model's
eight attention constants fitted to them, stored in the hardware file's cpu.speed and used by every
plan on it, over a stored calibration's values; and prefill attention over the context in the
speed model (issue #25: on this project's EPYC a q8_0 cache prefills at about 0.2-0.25 the rate
of f16 at depth 2048, and decodes slower too, where the AMX Xeon decoded it faster)."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest
import yaml

from moetune.errors import InputError
from moetune.hardware import CPU_SPEED_KEYS
from moetune.hardware.inventory import from_dict, load, to_dict
from moetune.model.profile import ModelProfile, load_profile
from moetune.plan.calibrate import predict_pp, predict_tg
from moetune.plan.placement import cpu_moe
from moetune.plan.settings import Settings
from moetune.plan.speed import SpeedConstants, base_constants, predict, prefill_tok_s, work
from moetune.store import calibrations
from moetune.tune.cpu_attention import VARIANTS, Row, best_rows, fit_attention, observations, parse_bench
from tests.helpers import run_cli

HW = {"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}]}
TRUE = {  # an EPYC-like CPU: q8_0 slower than f16, FA off slower with no context, faster deep
    "cpu_ctx_gflops_per_core": 9.0,
    "cpu_noflash_ctx_factor": 3.0,
    "cpu_noflash_layer_us": 40.0,
    "cpu_ctx_quant_factor": 0.4,
    "cpu_ctx_quant_layer_us": 30.0,
    "cpu_pp_ctx_gflops_per_core": 35.0,
    "cpu_pp_noflash_ctx_factor": 0.7,
    "cpu_pp_ctx_quant_factor": 0.2,
}


@pytest.fixture(scope="module")
def bed(axes_bed: tuple[Path, Path]) -> ModelProfile:
    return load_profile(axes_bed[0])


def synthetic_rows(p: ModelProfile, k: SpeedConstants) -> list[Row]:
    node = from_dict(HW).local
    skeleton = [
        Row(flash_attn=fa, cache=c, depth=d, tg_tok_s=1.0, pp_tok_s=1.0) for fa, c in VARIANTS for d in (0, 1024, 2048)
    ]
    obs = observations(p, node, 2, skeleton)
    return [
        replace(r, tg_tok_s=predict_tg(o, k), pp_tok_s=predict_pp(o, k)) for r, o in zip(skeleton, obs, strict=True)
    ]


def test_the_keys_a_cpu_carries_are_speed_constants() -> None:
    names = {f.name for f in fields(SpeedConstants)}
    assert set(CPU_SPEED_KEYS) <= names


def test_the_fit_recovers_the_kernels_rates_from_rows_the_model_made(bed: ModelProfile) -> None:
    rows = synthetic_rows(bed, replace(SpeedConstants(), **TRUE))
    got = fit_attention(bed, from_dict(HW).local, 2, rows).constants
    for k, v in TRUE.items():
        assert got[k] == pytest.approx(v, rel=0.15), k
    # the built-in constants (measured on an AMX Xeon) say the opposite about a q8_0 cache
    assert SpeedConstants().cpu_ctx_quant_factor > 1 > got["cpu_ctx_quant_factor"]


def test_the_fit_needs_every_variant_at_two_depths(bed: ModelProfile) -> None:
    rows = synthetic_rows(bed, SpeedConstants())
    with pytest.raises(InputError, match="every variant"):
        fit_attention(bed, from_dict(HW).local, 2, [r for r in rows if r.cache == "f16"])
    with pytest.raises(InputError, match="two depths"):
        fit_attention(bed, from_dict(HW).local, 2, [r for r in rows if r.depth == 0])


def test_llama_bench_json_gives_a_row_per_depth_with_the_best_sample() -> None:
    tests = [
        {"n_prompt": 256, "n_gen": 0, "n_depth": 0, "avg_ts": 900.0, "samples_ts": [800.0, 1000.0, 900.0]},
        {"n_prompt": 0, "n_gen": 64, "n_depth": 0, "avg_ts": 300.0, "samples_ts": [310.0, 290.0]},
        {"n_prompt": 256, "n_gen": 0, "n_depth": 2048, "avg_ts": 400.0, "samples_ts": [400.0]},
        {"n_prompt": 0, "n_gen": 64, "n_depth": 2048, "avg_ts": 100.0},
    ]
    rows = parse_bench(json.dumps(tests), True, "q8_0")
    assert [(r.depth, r.pp_tok_s, r.tg_tok_s) for r in rows] == [(0, 1000.0, 310.0), (2048, 400.0, 100.0)]
    assert rows[0].label == "fa q8_0"
    with pytest.raises(InputError, match="no JSON"):
        parse_bench("error: failed to load model", True, "f16")


def test_each_test_keeps_its_best_over_the_launches() -> None:
    def row(fa: bool, depth: int, tg: float, pp: float) -> Row:
        return Row(flash_attn=fa, cache="f16", depth=depth, tg_tok_s=tg, pp_tok_s=pp)

    # a slow launch and a fast one of the same variant; a variant measured once stays as it was
    got = best_rows([row(True, 0, 500.0, 2000.0), row(False, 0, 700.0, 1900.0), row(True, 0, 900.0, 1500.0)])
    assert got == [row(True, 0, 900.0, 2000.0), row(False, 0, 700.0, 1900.0)]


def test_cpu_speed_in_the_hardware_file_is_checked_and_kept(tmp_path: Path) -> None:
    doc = json.loads(json.dumps(HW))
    doc["nodes"][0]["cpu"]["speed"] = dict(TRUE)
    inv = from_dict(doc)
    assert dict(inv.local.cpu_speed) == TRUE
    assert to_dict(inv)["nodes"][0]["cpu"]["speed"] == TRUE
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump(to_dict(inv)))
    assert load(f) == inv and load(f) == inv  # the second read comes from the inventory cache
    for bad, why in (({"gpu_bw_eff": 0.5}, "not one a CPU can carry"), ({"cpu_ctx_quant_factor": 0}, "positive")):
        doc["nodes"][0]["cpu"]["speed"] = bad
        with pytest.raises(InputError, match=why):
            from_dict(doc)


def test_plans_start_from_the_measured_terms_over_a_calibration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, axes_bed: tuple[Path, Path]
) -> None:
    monkeypatch.setenv("MOETUNE_DATA_DIR", str(tmp_path / "data"))
    doc = json.loads(json.dumps(HW))
    doc["name"] = "probed-box"
    doc["nodes"][0]["cpu"]["speed"] = dict(TRUE)
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump(doc))
    k = base_constants(load(f))
    assert all(getattr(k, n) == v for n, v in TRUE.items())
    assert base_constants(from_dict(HW)) == SpeedConstants()
    calibrations.save(
        "probed-box",
        "llama.cpp",
        {"constants": {"cpu_ctx_quant_factor": 3.0, "split_us": 40.0}, "runs": [1, 2], "error": {}},
    )
    r = run_cli("plan", str(axes_bed[0]), "--hw", str(f), "--strategy", "cpu-moe", "--json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["speed_cpu_measured"] == TRUE and plan["speed_calibration"]["runs"] == [1, 2]
    used = plan["services"][0]["predicted"]["constants"]
    assert used["cpu_ctx_quant_factor"] == TRUE["cpu_ctx_quant_factor"]  # measured alone: wins
    assert used["split_us"] == 40.0  # the calibration's own


def test_prefill_attends_over_the_context(bed: ModelProfile) -> None:
    hw = from_dict(HW)
    k = replace(SpeedConstants(), **TRUE)
    w = work(bed, hw, cpu_moe(bed, hw), Settings(threads=2))
    wq = work(bed, hw, cpu_moe(bed, hw), Settings(threads=2, ctk="q8_0", ctv="q8_0"))
    shallow, deep = prefill_tok_s(w, k, 256, 0), prefill_tok_s(w, k, 256, 2048)
    assert deep < 0.9 * shallow
    assert prefill_tok_s(wq, k, 256, 2048) < 0.6 * deep  # the quantized rows at a fifth of the rate
    # a plan's PP (one ubatch from empty) is what the prefill of that ubatch at depth 0 is
    pl = cpu_moe(bed, hw)
    assert predict(bed, hw, pl, Settings(threads=2), k=k).pp_tok_s == pytest.approx(prefill_tok_s(w, k, None, 0))


@pytest.mark.server
def test_hw_attention_measures_this_cpu_and_writes_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOETUNE_DATA_DIR", str(tmp_path / "data"))
    f = tmp_path / "hw.yaml"
    f.write_text(yaml.safe_dump(HW))
    r = run_cli("hw", "attention", str(f), "--depth", "256", "-r", "1", "--rounds", "2", "--write", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc["constants"]) == set(CPU_SPEED_KEYS)
    assert {(x["variant"], x["depth"]) for x in doc["rows"]} == {
        (v, d) for v in ("fa f16", "no-fa f16", "fa q8_0") for d in (0, 128, 256)
    }
    assert all(x["tg_tok_s"] > 0 and x["pp_tok_s"] > 0 for x in doc["rows"])
    assert dict(load(f).local.cpu_speed) == doc["constants"]
    r = run_cli("hw", "attention", str(f), "--engine", "ik_llama.cpp")
    assert r.exit_code == 2 and "mainline" in r.stderr
