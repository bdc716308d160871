"""Calibration of the decode speed model: the fit recovers the constants that produced the
measurements, says its held-out error, and `plan` uses it for that hardware afterwards."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from moetune.plan.calibrate import (
    NOISE_FLOOR_PCT,
    UNCALIBRATED_PCT,
    Observation,
    calibrate,
    fit,
    predict_pp,
    predict_tg,
)
from moetune.plan.speed import DeviceWork, SpeedConstants, Work, decode_seconds, device_decode_seconds
from tests.helpers import free_port, run_cli

MIB = 1 << 20

TRUE = SpeedConstants(
    cpu_bw_eff=0.31,
    gpu_bw_eff=0.62,
    cpu_core_gbs=4.0,
    token_overhead_us=900.0,
    split_us=60.0,
    rpc_hop_us=420.0,
    cpu_ctx_gflops_per_core=2.6,
    gpu_ctx_tflops=9.0,
    cpu_gflops_per_core=25.0,
    gpu_tflops=140.0,
    ubatch_overhead_us=5000.0,
)


def observations(n_runs: int, seed: int = 0) -> list[Observation]:
    """Workloads of plans with different reads per device, threads, splits, hops and ubatches,
    'measured' under TRUE (through the model's own functions, as a real machine would not)."""
    rng = random.Random(seed)
    obs = []
    for run in range(n_runs):
        threads = rng.choice([4, 8, 16])
        devs = (
            DeviceWork(
                device="CPU",
                cpu=True,
                bw_gbs=200.0,
                threads=threads,
                cores=16,
                tflops=None,
                read_bytes=rng.uniform(50, 4000) * MIB,
                kv_bytes_per_ctx=rng.uniform(0, 40) * 1e3,
                ctx_flop_per_ctx=rng.uniform(0.0, 2e4),
                active_params=rng.uniform(1e8, 3e9),
                held_expert_bytes=1e11,
            ),
            DeviceWork(
                device="CUDA0",
                cpu=False,
                bw_gbs=1790.0,
                threads=0,
                cores=0,
                tflops=None,
                read_bytes=rng.uniform(100, 9000) * MIB,
                kv_bytes_per_ctx=rng.uniform(0, 4e5),
                ctx_flop_per_ctx=rng.uniform(0.0, 2e5),
                active_params=rng.uniform(1e8, 8e9),
            ),
            DeviceWork(
                device="RPC0[10.0.0.2:50052]",
                cpu=False,
                bw_gbs=900.0,
                threads=0,
                cores=0,
                tflops=60.0,
                read_bytes=rng.uniform(0, 3000) * MIB,
                kv_bytes_per_ctx=0.0,
                ctx_flop_per_ctx=0.0,
                active_params=rng.uniform(0, 3e9),
            ),
        )
        w = Work(
            devices=devs,
            graph_splits=rng.randint(2, 160),
            rpc_hops=rng.randint(0, 40),
            rpc_activation_s=2e-4,
            ubatch=rng.choice([256, 512, 2048]),
            expert_share=8 / 256,
            offload=True,
            offload_tflops=None,
            offload_link_gbs=25.0,
        )
        for depth in (0, rng.choice([1000, 8000, 32000])):
            o = Observation(
                run=run,
                work=w,
                depth=depth,
                measured_tg=None,
                measured_pp=None,
                prompt_tokens=rng.choice([None, 300, 4096]),
            )
            obs.append(replace(o, measured_tg=predict_tg(o, TRUE), measured_pp=predict_pp(o, TRUE)))
    return obs


def test_the_fit_recovers_the_constants_from_enough_runs() -> None:
    k = fit(observations(16), noise_pct=0.1)  # 'measured' exactly: the prior barely pulls
    assert k.cpu_bw_eff == pytest.approx(TRUE.cpu_bw_eff, rel=0.1)
    assert k.gpu_bw_eff == pytest.approx(TRUE.gpu_bw_eff, rel=0.1)
    assert k.token_overhead_us == pytest.approx(TRUE.token_overhead_us, rel=0.2)
    assert k.gpu_tflops == pytest.approx(TRUE.gpu_tflops, rel=0.1)  # the CPU experts' prefill, offloaded
    assert k.ubatch_overhead_us == pytest.approx(TRUE.ubatch_overhead_us, rel=0.5)  # a small share: weakly seen
    cal = calibrate(observations(16))
    assert cal.loo_tg_median_abs_pct is not None and cal.loo_tg_median_abs_pct < 2.0
    assert cal.loo_pp_median_abs_pct is not None and cal.loo_pp_median_abs_pct < 2.0
    assert cal.before_tg_median_abs_pct is not None and cal.before_tg_median_abs_pct > 20.0  # the defaults were off
    assert cal.uncertainty_tg_pct == 3.0  # nothing claims better than the noise floor


def test_two_runs_move_what_they_see_and_keep_the_rest() -> None:
    obs = observations(2)
    k = fit(obs)
    floor = NOISE_FLOOR_PCT / 100
    for pred, measured in ((predict_tg, "measured_tg"), (predict_pp, "measured_pp")):
        for o in obs:
            m = getattr(o, measured)
            before, after = abs(pred(o, SpeedConstants()) / m - 1), abs(pred(o, k) / m - 1)
            # a miss beyond the runs' noise is halved at least; one within it is not chased
            assert after < (0.5 * before if before > floor else floor), (pred.__name__, before, after)
    # these runs record no host threads: nothing in them depends on the wake-up of a sleeping host
    assert k.rpc_wake_us == pytest.approx(SpeedConstants().rpc_wake_us)
    assert 0.0 < k.cpu_bw_eff <= 1.0 and 0.0 < k.gpu_bw_eff <= 1.0
    assert k.offload_min_batch == SpeedConstants().offload_min_batch  # not a fitted constant


def test_one_run_states_the_uncalibrated_uncertainty() -> None:
    cal = calibrate(observations(1))
    assert cal.loo_tg_median_abs_pct is None and cal.uncertainty_tg_pct == UNCALIBRATED_PCT


def test_held_constants_stay_at_the_prior_and_the_rest_still_move() -> None:
    """A plan puts the hardware file's measured CPU terms over any calibration, so a calibration
    holds them: fitted, it would store values no plan uses (issue #25)."""
    obs = observations(4)
    prior = SpeedConstants(cpu_ctx_gflops_per_core=7.0, cpu_bw_eff=0.5)
    free = calibrate(obs, prior)
    held = calibrate(obs, prior, held=("cpu_ctx_gflops_per_core", "not_a_constant"))
    assert free.constants.cpu_ctx_gflops_per_core != pytest.approx(7.0, rel=0.01)  # the data pull it
    assert held.constants.cpu_ctx_gflops_per_core == 7.0
    assert held.constants.cpu_bw_eff != pytest.approx(0.5, rel=0.01)  # what is not held still moves
    assert held.held == ("cpu_ctx_gflops_per_core",) and held.to_json()["held"] == ["cpu_ctx_gflops_per_core"]
    assert free.held == () and free.to_json()["held"] == []


@pytest.mark.server
def test_calibrate_then_plan_uses_it(bin_dir: Path, tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    measured = {"cpu_ctx_gflops_per_core": 6.5, "cpu_pp_ctx_gflops_per_core": 30.0}  # as `hw attention` writes
    hw.write_text(
        yaml.safe_dump(
            {"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20, "speed": measured}}]}
        )
    )

    def plan(ctx: int) -> Path:
        out = tmp_path / f"p{ctx}.json"
        r = run_cli("plan", str(model), "--hw", str(hw), "--ctx", str(ctx), "--port", str(free_port()), "-o", str(out))
        assert r.exit_code == 0, r.stderr
        return out

    r = run_cli("calibrate")
    assert r.exit_code == 2 and "no benchmark of a plan" in r.stderr
    for ctx in (2048, 4096):
        r = run_cli(
            "bench",
            str(plan(ctx)),
            "--depth",
            f"0,{ctx // 2}",
            "-r",
            "2",
            "--warmup",
            "0",
            "--tg-tokens",
            "16",
            "--pp-tokens",
            "64",
            "--json",
        )
        assert r.exit_code == 0, r.stderr
    # --force: what is tested here is that plan uses a stored calibration; whether a noisy one is
    # stored at all (the apply rule) is tests/test_contention.py's, and on a loaded machine two
    # short benches can state an uncertainty past the built-in one
    r = run_cli("calibrate", "--json", "--force")
    assert r.exit_code == 0, r.stderr
    cal = json.loads(r.stdout)
    assert cal["runs"] == 2 and cal["observations"] == 4 and cal["error"]["tg_median_abs_pct"] is not None
    assert cal["hardware"] == str(hw) and cal["engine"] == "llama.cpp"
    # the hardware file's measured terms are held: the stored fit is what a plan uses
    assert cal["held"] == sorted(measured) and {n: cal["constants"][n] for n in measured} == measured
    doc = json.loads(run_cli("plan", str(model), "--hw", str(hw), "--ctx", "8192", "--json").stdout)
    assert doc["speed_calibration"]["runs"] == 2
    assert doc["speed_constants"]["cpu_bw_eff"] == pytest.approx(cal["constants"]["cpu_bw_eff"])
    assert "from 2 runs" in run_cli("plan", str(model), "--hw", str(hw)).stdout


def test_a_host_on_one_thread_pays_a_wake_up_per_rpc_hop() -> None:
    """With one host thread no thread of ggml's pool polls while the host waits for an RPC reply,
    and waking its sleeping core costs (measured: cpu-moe on one thread, 17 hops a token, ran 1.7x
    faster beside a spinning process that kept the cores awake)."""
    cpu = DeviceWork(device="CPU", cpu=True, bw_gbs=20.0, threads=1, cores=2, tflops=None, read_bytes=12 * MIB)
    rpc = DeviceWork(
        device="RPC0[127.0.0.1:50052]", cpu=True, bw_gbs=20.0, threads=1, cores=2, tflops=None, read_bytes=7 * MIB
    )
    k = SpeedConstants()
    one, two = (
        Work(devices=(replace(cpu, threads=t), rpc), graph_splits=18, rpc_hops=17, host_threads=t) for t in (1, 2)
    )
    gap = decode_seconds(one, 0, k) - decode_seconds(two, 0, k)
    host_read = device_decode_seconds(replace(cpu, threads=1), 0, k) - device_decode_seconds(
        replace(cpu, threads=2), 0, k
    )
    assert gap == pytest.approx(17 * k.rpc_wake_us * 1e-6 + host_read)
    # an earlier moetune recorded no host threads: its runs are read as before, without the term
    assert decode_seconds(replace(one, host_threads=0), 0, k) == pytest.approx(
        decode_seconds(one, 0, k) - 17 * k.rpc_wake_us * 1e-6
    )
    # runs of one and two threads, with one hop and with seventeen: the fit finds the wake-up
    obs = [
        Observation(run=i, work=w, depth=0, measured_tg=None)
        for i, w in enumerate(
            (one, two, replace(one, graph_splits=2, rpc_hops=1), replace(two, graph_splits=2, rpc_hops=1))
        )
    ]
    truth = replace(k, rpc_wake_us=400.0, cpu_core_gbs=14.0)
    obs = [replace(o, measured_tg=predict_tg(o, truth)) for o in obs]
    fitted = fit(obs, noise_pct=0.1)
    assert fitted.rpc_wake_us == pytest.approx(400.0, rel=0.25)
