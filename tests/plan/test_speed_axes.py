"""The speed model's engine axes: flash attention on the CPU, the KV cache type, weight repacking,
threads for batches and the ubatch each move the prediction in the direction, and roughly by the
size, the engine moves on the testbed (issue #25: at depth 512 FA on with an f16 cache 354 tok/s,
FA off 455, a q8_0 cache 510; repacking 591 -> 681 where the engine repacks; -ub 128 cost prefill)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from moetune.hardware.inventory import Inventory, from_dict, load
from moetune.kinds import EngineKind
from moetune.model.profile import ModelProfile, load_profile
from moetune.plan.calibrate import FITTED, Observation, fit, predict_tg
from moetune.plan.placement import cpu_moe
from moetune.plan.settings import Settings
from moetune.plan.speed import (
    SpeedConstants,
    Work,
    at_depth,
    decode_context,
    decode_seconds,
    from_work,
    predict,
    prefill_tok_s,
)


@pytest.fixture(scope="module")
def testbed(axes_bed: tuple[Path, Path]) -> tuple[ModelProfile, Inventory]:
    model, hw = axes_bed
    return load_profile(model), load(hw)


def tg(tb: tuple[ModelProfile, Inventory], depth: int = 512, **kw: object) -> float:
    p, hw = tb
    return predict(p, hw, cpu_moe(p, hw), replace(Settings(threads=2), **kw), depth=depth).tg_tok_s


def test_flash_attention_on_the_cpu_decodes_slower_at_depth(testbed: tuple[ModelProfile, Inventory]) -> None:
    on, off = tg(testbed, flash_attn=True), tg(testbed, flash_attn=False)
    assert 1.03 < off / on < 1.8  # the engine: 455 / 354 = 1.29 (the AMX Xeon), 610 / 550 = 1.11 (the EPYC)
    # with no context the non-FA path's extra graph nodes cost a fixed time a layer: slower
    # (the EPYC: 700 / 900; the built-in constants' slower level, 320 tok/s here, dilutes the cost)
    assert 0.7 < tg(testbed, 0, flash_attn=False) / tg(testbed, 0, flash_attn=True) < 0.98
    k = replace(SpeedConstants(), cpu_noflash_layer_us=0.0)
    p, hw = testbed
    alike = [predict(p, hw, cpu_moe(p, hw), Settings(threads=2, flash_attn=fa), k=k).tg_tok_s for fa in (True, False)]
    assert alike[0] == pytest.approx(alike[1])  # without that cost, no context: alike


def test_a_quantized_cache_decodes_faster_at_depth(testbed: tuple[ModelProfile, Inventory]) -> None:
    f16 = tg(testbed)
    q8 = tg(testbed, ctk="q8_0", ctv="q8_0")
    q4 = tg(testbed, ctk="q4_0", ctv="q4_0")
    assert 1.2 < q8 / f16 < 2.0  # the engine: 510 / 354 = 1.44
    assert q4 >= q8  # fewer bytes a cached token, the same int8 dots
    assert f16 < tg(testbed, ctk="q8_0") < q8  # a quantized K alone: half the attention at the fast rate
    # with no context only the quantized cache's fixed cost a layer shows: slower (the EPYC: 910 / 1184)
    assert tg(testbed, 0, ctk="q8_0", ctv="q8_0") < tg(testbed, 0)


def test_only_the_weights_the_engine_repacks_multiply_faster(testbed: tuple[ModelProfile, Inventory]) -> None:
    # q8_0 on an x86 CPU: mainline has no interleaved Q8_0 kernel there and repacks nothing (its log:
    # "cannot be used with preferred buffer type CPU_REPACK"), so --repack changes no prediction;
    # on an Arm CPU with dot products the same weights repack and multiply faster
    p, hw = testbed
    plain, packed = tg(testbed, 0, repack=False), tg(testbed, 0, repack=True)
    assert packed == pytest.approx(plain)
    arm = Inventory((replace(hw.local, cpu_isa=("dotprod",)),), name=hw.name)
    plain, packed = (tg((p, arm), 0, repack=r) for r in (False, True))
    assert 1.02 < packed / plain < 1.3  # the gain the model was built with: 1.15
    pp = [predict(p, arm, cpu_moe(p, arm), Settings(threads=2, repack=r)).pp_tok_s for r in (False, True)]
    assert pp[1] > pp[0]
    (d,) = predict(p, arm, cpu_moe(p, arm), Settings(threads=2, repack=True)).work.devices
    assert d.repacked_share > 0.95  # every matmul weight but the embedding's rows, read one a token


def test_a_mixed_cpu_share_repacks_in_proportion(testbed: tuple[ModelProfile, Inventory]) -> None:
    """Half of a device's bytes repacked saves about half of what repacking them all saves."""
    p, hw = testbed
    (d,) = predict(p, hw, cpu_moe(p, hw), Settings(threads=2)).work.devices
    k = SpeedConstants()
    t = {
        s: decode_seconds(Work(devices=(replace(d, repacked_share=s),), graph_splits=1, rpc_hops=0), 0, k)
        for s in (0.0, 0.5, 1.0)
    }
    assert t[1.0] < t[0.5] < t[0.0]
    assert t[0.0] - t[0.5] == pytest.approx((t[0.0] - t[1.0]) / 2, rel=0.05)


def test_beside_a_local_gpu_mainline_does_not_repack_so_neither_does_the_prediction(
    testbed: tuple[ModelProfile, Inventory],
) -> None:
    # the CUDA host buffer type comes before the repack buffers (the ledger's repack line is empty
    # there too); ik's -rtr repacks in place all the same
    p, _ = testbed
    hw = from_dict(
        {
            "nodes": [
                {
                    "name": "local",
                    "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20},
                    "devices": [{"name": "CUDA0", "kind": "gpu", "mem_mib": 24000, "bw_gbs": 900}],
                }
            ]
        }
    )
    for engine, gains in ((EngineKind.MAINLINE, False), (EngineKind.IK, True)):
        tg = [
            predict(p, hw, cpu_moe(p, hw), Settings(threads=2, repack=r, engine=engine)).tg_tok_s for r in (False, True)
        ]
        assert (tg[1] > tg[0] * 1.02) is gains, (engine, tg)


def test_a_small_ubatch_rereads_the_weights_and_costs_prefill(testbed: tuple[ModelProfile, Inventory]) -> None:
    p, hw = testbed
    w128, w512 = (predict(p, hw, cpu_moe(p, hw), Settings(threads=2, ubatch=ub)).work for ub in (128, 512))
    k = SpeedConstants()
    assert prefill_tok_s(w512, k, 512) > prefill_tok_s(w128, k, 512)
    # the re-read alone, without the fixed cost per ubatch
    k0 = replace(k, ubatch_overhead_us=1e-9)
    assert prefill_tok_s(w512, k0, 512) > prefill_tok_s(w128, k0, 512)


def test_threads_for_batches_move_prefill_not_decode(testbed: tuple[ModelProfile, Inventory]) -> None:
    p, hw = testbed
    one, two = (predict(p, hw, cpu_moe(p, hw), Settings(threads=2, threads_batch=tb)) for tb in (1, 2))
    assert two.pp_tok_s > 1.5 * one.pp_tok_s
    assert two.tg_tok_s == pytest.approx(one.tg_tok_s)


def test_a_work_stored_before_these_axes_predicts_as_it_did() -> None:
    """A stored work without the new fields reads as flash attention on, f16 cache, no repack: the
    rate the model had for it."""
    doc = {
        "devices": [
            {
                "device": "CPU",
                "cpu": True,
                "bw_gbs": 20.0,
                "threads": 2,
                "cores": 2,
                "read_bytes": 4e7,
                "kv_bytes_per_ctx": 8192.0,
                "ctx_flop_per_ctx": 16384.0,
            }
        ],
        "graph_splits": 1,
        "rpc_hops": 0,
    }
    w = Work.from_json(doc)
    assert w.devices[0].flash_attn and w.devices[0].ctx_quant_share == 0.0 and not w.devices[0].repacked
    # stored while repacking was all or nothing: all
    doc["devices"][0]["repacked"] = True
    assert Work.from_json(doc).devices[0].repacked_share == 1.0


def test_calibration_fits_the_attention_factors_from_runs_that_vary_them(
    testbed: tuple[ModelProfile, Inventory],
) -> None:
    """Runs measured under a machine whose FA penalty and cache gain differ from the prior: the
    fit moves both constants toward the truth."""
    assert {"cpu_noflash_ctx_factor", "cpu_ctx_quant_factor", "cpu_repack_gain"} <= set(FITTED)
    p, hw = testbed
    true = replace(SpeedConstants(), cpu_noflash_ctx_factor=4.0, cpu_ctx_quant_factor=5.0)
    obs = []
    for i, kw in enumerate(({}, {"flash_attn": False}, {"ctk": "q8_0", "ctv": "q8_0"})):
        w = predict(p, hw, cpu_moe(p, hw), replace(Settings(threads=2), **kw)).work
        for depth in (0, 512, 2048):
            o = Observation(run=i, work=w, depth=depth, measured_tg=None)
            obs.append(replace(o, measured_tg=1.0 / decode_seconds(w, depth, true)))
    k = fit(obs, noise_pct=1.0)
    prior = SpeedConstants()
    assert abs(k.cpu_noflash_ctx_factor - 4.0) < abs(prior.cpu_noflash_ctx_factor - 4.0)
    assert abs(k.cpu_ctx_quant_factor - 5.0) < abs(prior.cpu_ctx_quant_factor - 5.0)


def test_an_old_calibration_without_the_new_constants_reads() -> None:
    k = SpeedConstants.from_json({"cpu_bw_eff": 0.3, "cpu_ctx_gflops_per_core": 2.0})
    assert k.cpu_bw_eff == 0.3 and k.cpu_noflash_ctx_factor == SpeedConstants().cpu_noflash_ctx_factor


def test_tg_is_predicted_at_the_mean_context_of_its_generated_tokens(testbed: tuple[ModelProfile, Inventory]) -> None:
    # a bench at depth 512 with a 256-token prompt and 128 generated tokens decodes its tokens at
    # contexts 768..895: the measured TG is the one at their mean, 831.5, not at 512
    assert decode_context(512, 256, 128) == 831.5
    assert decode_context(512) == 512 and decode_context(0, 0, 0) == 0
    p, hw = testbed
    s, pl = Settings(threads=2, flash_attn=True), cpu_moe(p, hw)
    w, k = predict(p, hw, pl, s).work, SpeedConstants()
    bench = from_work(w, k, 512, 256, tg_depth=decode_context(512, 256, 128))
    assert bench.tg_tok_s == pytest.approx(from_work(w, k, 832).tg_tok_s, rel=1e-3)
    assert bench.tg_tok_s < from_work(w, k, 512).tg_tok_s
    assert bench.pp_tok_s == from_work(w, k, 512, 256).pp_tok_s  # the prompt still starts at the depth
    again = at_depth(bench.to_json(), 512, 256, tg_depth=831.5)
    assert (
        again is not None
        and again["tg_tok_s"] == pytest.approx(bench.tg_tok_s, abs=1e-3)
        and again["tg_depth"] == 831.5
    )
    o = Observation(run=1, work=bench.work, depth=512, measured_tg=1.0, prompt_tokens=256, tg_depth=831.5)
    assert predict_tg(o, SpeedConstants()) == pytest.approx(bench.tg_tok_s)
    assert replace(o, tg_depth=None).decode_depth == 512  # stored by an earlier moetune: TG at the depth
