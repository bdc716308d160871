"""Calibration of the decode speed model: the fit recovers the constants that produced the
measurements, says its held-out error, and `plan` uses it for that hardware afterwards."""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from moetune.plan.calibrate import Observation, calibrate, fit, predict_tg
from moetune.plan.speed import SpeedConstants
from tests.helpers import free_port, run_cli

TRUE = SpeedConstants(cpu_bw_eff=0.31, gpu_bw_eff=0.62, token_overhead_us=900.0, split_us=60.0, rpc_hop_us=420.0,
                      cpu_ctx_gflops_per_core=2.6, gpu_ctx_tflops=9.0)


def t_tok(k: SpeedConstants, per: list[dict], splits: int, hops: int) -> float:
    """Seconds per token under constants k, as the speed model adds them up."""
    t = k.token_overhead_us * 1e-6 + splits * k.split_us * 1e-6 + hops * k.rpc_hop_us * 1e-6
    for d in per:
        eff = k.cpu_bw_eff if d["device"] == "CPU" else k.gpu_bw_eff
        t += d["read_mib_per_token"] * (1 << 20) / (d["bw_gbs"] * 1e9 * eff)
        rate = k.cpu_ctx_gflops_per_core * d["cores"] if d["device"] == "CPU" else k.gpu_ctx_tflops * 1000
        t += d["ctx_gflop_per_token"] / rate
    return t


def observations(n_runs: int, seed: int = 0) -> list[Observation]:
    """Workloads of plans with different reads per device, splits and hops, 'measured' under TRUE;
    each plan's stored prediction was made with the defaults plus 0.2 ms of RPC activations."""
    rng = random.Random(seed)
    obs = []
    for run in range(n_runs):
        depth = rng.choice([0, 1000, 8000, 32000])
        per = [{"device": "CPU", "read_mib_per_token": rng.uniform(50, 4000), "bw_gbs": 200.0, "cores": 16,
                "ctx_gflop_per_token": rng.uniform(0.0, 0.02) * depth / 1000},
               {"device": "CUDA0", "read_mib_per_token": rng.uniform(100, 9000), "bw_gbs": 1790.0, "cores": 0,
                "ctx_gflop_per_token": rng.uniform(0.0, 0.2) * depth / 1000},
               {"device": "RPC0[10.0.0.2:50052]", "read_mib_per_token": rng.uniform(0, 3000), "bw_gbs": 900.0,
                "cores": 0, "ctx_gflop_per_token": 0.0}]
        splits, hops = rng.randint(2, 160), rng.randint(0, 40)
        expect = {"per_device": per, "graph_splits": splits, "rpc_hops": hops, "constants": asdict(SpeedConstants()),
                  "tg_tok_s": 1.0 / (t_tok(SpeedConstants(), per, splits, hops) + 2e-4)}
        obs.append(Observation(run, 1.0 / (t_tok(TRUE, per, splits, hops) + 2e-4), expect))
    return obs


def test_the_fit_recovers_the_constants_from_enough_runs() -> None:
    k = fit(observations(16))
    assert k.cpu_bw_eff == pytest.approx(TRUE.cpu_bw_eff, rel=0.05)
    assert k.gpu_bw_eff == pytest.approx(TRUE.gpu_bw_eff, rel=0.05)
    assert k.token_overhead_us == pytest.approx(TRUE.token_overhead_us, rel=0.15)
    assert k.cpu_ctx_gflops_per_core == pytest.approx(TRUE.cpu_ctx_gflops_per_core, rel=0.1)
    cal = calibrate(observations(16))
    assert cal.loo_tg_median_abs_pct is not None and cal.loo_tg_median_abs_pct < 2.0
    assert cal.before_tg_median_abs_pct > 20.0  # the defaults were far off


def test_two_runs_move_what_they_see_and_keep_the_rest() -> None:
    obs = observations(2)
    k = fit(obs)
    before = [abs(predict_tg(o, SpeedConstants()) - o.measured_tg) / o.measured_tg for o in obs]
    after = [abs(predict_tg(o, k) - o.measured_tg) / o.measured_tg for o in obs]
    assert max(after) < min(before)
    assert 0.02 <= k.cpu_bw_eff <= 1.0 and 0.02 <= k.gpu_bw_eff <= 1.0


@pytest.mark.server
def test_calibrate_then_plan_uses_it(bin_dir: Path, tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump({"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}]}))

    def plan(ctx: int) -> Path:
        out = tmp_path / f"p{ctx}.json"
        r = run_cli("plan", str(model), "--hw", str(hw), "--ctx", str(ctx), "--port", str(free_port()), "-o", str(out))
        assert r.exit_code == 0, r.stderr
        return out

    r = run_cli("calibrate")
    assert r.exit_code == 2 and "no benchmark of a plan" in r.stderr
    for ctx in (2048, 4096):
        r = run_cli("bench", str(plan(ctx)), "--depth", f"0,{ctx // 2}", "-r", "2", "--warmup", "0",
                    "--tg-tokens", "16", "--pp-tokens", "64", "--json")
        assert r.exit_code == 0, r.stderr
    r = run_cli("calibrate", "--json")
    assert r.exit_code == 0, r.stderr
    cal = json.loads(r.stdout)
    assert cal["runs"] == 2 and cal["observations"] == 4 and cal["error"]["tg_median_abs_pct"] is not None
    assert cal["hardware"] == str(hw) and cal["engine"] == "llama.cpp"
    doc = json.loads(run_cli("plan", str(model), "--hw", str(hw), "--ctx", "8192", "--json").stdout)
    assert doc["speed_calibration"]["runs"] == 2
    assert doc["speed_constants"]["cpu_bw_eff"] == pytest.approx(cal["constants"]["cpu_bw_eff"])
    assert "calibrated on 2 runs" in run_cli("plan", str(model), "--hw", str(hw)).stdout
