"""The tuner's pure core: the candidate space, the belief corrected by measurements, the expected
gain and the stopping rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moetune.plan.settings import Settings
from moetune.plan.tune import (
    BIAS_SD,
    LOCAL_SD,
    Candidate,
    Measured,
    belief,
    choose,
    default_axes,
    expected_gain,
    features,
    space,
)


def test_the_axes_try_every_placement_family_only_where_there_is_an_accelerator() -> None:
    base = Settings(threads=None, ubatch=512, batch=2048)
    cpu_only = default_axes(base, "auto", cores=16, moe_layers=40, accelerators=0)
    assert cpu_only.strategies == ("auto",)
    gpu = default_axes(base, "auto", cores=16, moe_layers=40, accelerators=2)
    assert gpu.strategies == ("auto", "cpu-moe", "n-cpu-moe:10", "n-cpu-moe:20", "n-cpu-moe:30")
    assert gpu.threads == (None, 8, 12)  # the engine's default (every core) is not tried twice
    assert gpu.ubatches == (512, 128, 2048) and gpu.flash_attn == (True, False)
    assert gpu.cache_types == (("f16", "f16"), ("q8_0", "q8_0")) and gpu.repack == (False, True)
    assert default_axes(base, "auto", cores=2, moe_layers=8, accelerators=1).threads == (None, 1)


def test_the_space_leaves_out_what_the_engine_refuses() -> None:
    base = Settings()
    cands = space(default_axes(base, "auto", 4, 8, 1), base)
    assert not [c for c in cands if c.ctv != "f16" and not c.flash_attn]  # a quantized V cache needs FA
    assert len(cands) == len(set(cands))
    big = next(c for c in cands if c.ubatch == 2048 and not c.repack)
    assert big.settings(base).batch >= 2048 and big.label.endswith("ub2048 fa")
    assert next(c for c in cands if c.repack).settings(base).repack  # labelled "... repack"
    assert len({c.label for c in cands}) == len(cands)


def _feats(n: int) -> np.ndarray:
    return np.array([features(Candidate("auto", t, 512), share, 8) for share, t in
                     [(i / max(1, n - 1), 8) for i in range(n)]])


def test_with_nothing_measured_the_belief_is_the_model_with_its_prior_spread() -> None:
    b = belief([100.0, 200.0], _feats(2), [])
    assert b.value(1) == pytest.approx(200.0)
    assert b.sd[0] == pytest.approx(math.hypot(BIAS_SD, LOCAL_SD))


def test_a_measurement_corrects_its_neighbours_more_than_distant_candidates() -> None:
    feats = _feats(5)  # expert share on the CPU from 0 to 1
    pred = [100.0] * 5
    b = belief(pred, feats, [Measured(0, 70.0, 0.01)])  # the model promised 100, the run gave 70
    assert b.value(0) == pytest.approx(70.0, rel=0.03)
    assert b.value(1) < b.value(4) < 100.0  # everyone is corrected down, the nearest most
    assert b.sd[0] < b.sd[1] < b.sd[4]


def test_expected_gain_is_zero_far_below_the_best_and_grows_with_spread() -> None:
    from moetune.plan.tune import Belief

    b = Belief(np.log(np.array([50.0, 100.0, 100.0])), np.array([0.01, 0.01, 0.3]))
    g = expected_gain(b, best=100.0)
    assert g[0] == pytest.approx(0.0, abs=1e-9)
    assert 0.0 < g[1] < g[2]
    i, gain = choose(b, 100.0, [0, 1, 2], noise=0.01)
    assert i == 2 and gain == pytest.approx(g[2])
    assert choose(b, 100.0, [0, 1], noise=0.05) == (None, pytest.approx(g[1]))  # nothing worth a launch
