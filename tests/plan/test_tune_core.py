"""The tuner's pure core: the candidate space, the belief corrected by measurements, the expected
gain and the stopping rule."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.plan.settings import Settings
from moetune.plan.tune import (
    AMB_TRY_MIB,
    BIAS_SD,
    LOCAL_SD,
    Candidate,
    EngineOptions,
    Measured,
    belief,
    choose,
    default_axes,
    expected_gain,
    features,
    head_tail_splits,
    space,
    split_strategies,
)


def test_the_axes_try_every_placement_family_only_where_there_is_an_accelerator() -> None:
    base = Settings(threads=None, ubatch=512, batch=2048)
    cpu_only = default_axes(base, "auto", cores=16, moe_layers=40, accelerators=0)
    assert cpu_only.strategies == ("auto",)
    gpu = default_axes(base, "auto", cores=16, moe_layers=40, accelerators=2)
    assert gpu.strategies == ("auto", "cpu-moe", "n-cpu-moe:10", "n-cpu-moe:20", "n-cpu-moe:30")
    assert gpu.threads == (None, 8, 12)  # the engine's default (every core) is not tried twice
    assert gpu.ubatches == (512, 128, 2048) and gpu.flash_attn == (True, False)
    assert gpu.cache_types == (("f16", "f16"), ("q8_0", "q8_0"))
    assert gpu.repack == (True, False)  # mainline repacks by default: the base's own value first
    ik = Settings(engine=EngineKind.IK)
    assert default_axes(ik, "auto", cores=16, moe_layers=40, accelerators=2).repack == (False, True)
    assert default_axes(base, "auto", cores=2, moe_layers=8, accelerators=1).threads == (None, 1)


def test_the_space_leaves_out_what_the_engine_refuses() -> None:
    base = Settings()
    cands = space(default_axes(base, "auto", 4, 8, accelerators=1), base)
    assert not [c for c in cands if c.ctv != "f16" and not c.flash_attn]  # a quantized V cache needs FA
    assert len(cands) == len(set(cands))
    big = next(c for c in cands if c.ubatch == 2048 and not c.repack)
    assert big.settings(base).batch >= 2048 and big.label.endswith("ub2048 fa")
    on = next(c for c in cands if c.repack)  # labelled "... repack"
    assert on.settings(base).repacks and on.settings(base).repack is None  # the engine's default, kept as auto
    assert next(c for c in cands if not c.repack).settings(base).repack is False  # rendered -nr
    assert len({c.label for c in cands}) == len(cands)


def _feats(n: int) -> np.ndarray:
    return np.array(
        [
            features(Candidate(strategy="auto", threads=t, ubatch=512), share, 8)
            for share, t in [(i / max(1, n - 1), 8) for i in range(n)]
        ]
    )


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


# --- ik_llama.cpp's own options -------------------------------------------------------------

IK_ALL = EngineOptions(amb=True, mla_model=False, mla=False, fused_moe=True, merge_up_gate=True)
IK_MLA = EngineOptions(amb=True, mla_model=True, mla=True, fused_moe=True, merge_up_gate=True)


@pytest.mark.parametrize(
    ("engine", "amb", "mla", "fmoe", "muge"),
    [
        (EngineOptions(), (0,), (3,), (True,), (False,)),  # mainline: none of them
        (IK_ALL, (0, AMB_TRY_MIB), (3,), (True, False), (False, True)),  # no MLA: the mode is not tried
        (IK_MLA, (0, AMB_TRY_MIB), (3, 2), (True, False), (False, True)),
        (EngineOptions(amb=True), (0, AMB_TRY_MIB), (3,), (True,), (False,)),  # a build without fused-MoE switches
    ],
)
def test_the_engine_axes_follow_what_the_build_renders_and_the_model_has(
    engine: EngineOptions, amb: tuple[int, ...], mla: tuple[int, ...], fmoe: tuple[bool, ...], muge: tuple[bool, ...]
) -> None:
    axes = default_axes(Settings(), "auto", 4, 8, accelerators=1, engine=engine)
    assert (axes.amb_mib, axes.mla, axes.fused_moe, axes.merge_up_gate) == (amb, mla, fmoe, muge)
    # the user's own values come first (the baseline's), the alternative second
    ax = default_axes(
        Settings(amb_mib=256, mla=2, fused_moe=False, merge_up_gate=True), "auto", 4, 8, accelerators=1, engine=IK_MLA
    )
    assert (ax.amb_mib, ax.mla, ax.fused_moe, ax.merge_up_gate) == ((256, 0), (2, 3), (False, True), (True, False))


def test_mainline_spaces_and_labels_are_unchanged_by_the_engine_axes() -> None:
    base = Settings()
    cands = space(default_axes(base, "auto", 4, 8, accelerators=1), base)
    assert all((c.amb_mib, c.mla, c.fused_moe, c.merge_up_gate) == (0, 3, True, False) for c in cands)
    assert (
        Candidate(strategy="auto", threads=2, ubatch=128, batch=2048, flash_attn=False).label == "auto t2 ub128 no-fa"
    )
    assert all(not f[6:].any() for f in (features(c, 0.5, 4) for c in cands))  # the distances stay as they were


def test_amb_only_where_it_bounds_something_and_the_mla_mode_only_on_an_mla_model() -> None:
    base = Settings()
    axes = default_axes(base, "auto", 4, 8, accelerators=1, engine=IK_ALL)
    plain = space(axes, base)
    assert {c.amb_mib for c in plain if c.flash_attn} == {0}  # flash attention on a GQA model: nothing to bound
    assert {c.amb_mib for c in plain if not c.flash_attn} == {0, AMB_TRY_MIB}
    forced = space(replace(axes, mla=(3, 2)), base)  # --try-mla on a model without MLA changes nothing
    assert {c.mla for c in forced} == {3} and len(forced) == len(plain)
    mla = space(default_axes(base, "auto", 4, 8, accelerators=1, engine=IK_MLA), base, mla_model=True)
    assert {(c.amb_mib, c.mla) for c in mla if c.flash_attn} == {(0, 3), (0, 2), (AMB_TRY_MIB, 3), (AMB_TRY_MIB, 2)}
    # with flash attention both -amb values and both modes; without it, the same, where plain had -amb alone
    assert len(mla) == 2 * len(plain) + len([c for c in plain if c.flash_attn]) * 2
    assert len({c.label for c in mla}) == len(mla)


@pytest.mark.parametrize(
    ("cand", "label", "settings"),
    [
        (Candidate(strategy="auto", threads=2, ubatch=512, amb_mib=512), "auto t2 ub512 fa amb512", {"amb_mib": 512}),
        (Candidate(strategy="auto", threads=2, ubatch=512, mla=2), "auto t2 ub512 fa mla2", {"mla": 2}),
        (
            Candidate(strategy="cpu-moe", threads=None, ubatch=128, fused_moe=False),
            "cpu-moe t-default ub128 fa no-fmoe",
            {"fused_moe": False},
        ),
        (
            Candidate(strategy="auto", threads=2, ubatch=512, merge_up_gate=True),
            "auto t2 ub512 fa muge",
            {"merge_up_gate": True},
        ),
        (
            Candidate(
                strategy="auto",
                threads=1,
                ubatch=512,
                batch=2048,
                flash_attn=False,
                repack=True,
                amb_mib=256,
                mla=2,
                fused_moe=False,
                merge_up_gate=True,
            ),
            "auto t1 ub512 no-fa repack amb256 mla2 no-fmoe muge",
            {"amb_mib": 256, "mla": 2, "fused_moe": False, "merge_up_gate": True, "repack": True},
        ),
    ],
)
def test_a_candidate_carries_the_ik_options_into_its_label_and_settings(
    cand: Candidate, label: str, settings: dict[str, object]
) -> None:
    assert cand.label == label
    s = cand.settings(Settings(engine=EngineKind.IK))
    assert all(getattr(s, k) == v for k, v in settings.items())
    assert Candidate.of(cand.strategy, s) == cand  # and back


def test_the_ik_options_place_a_candidate_apart_from_its_neighbours() -> None:
    a = features(Candidate(strategy="auto", threads=4, ubatch=512), 0.5, 4)
    for other in (
        Candidate(strategy="auto", threads=4, ubatch=512, amb_mib=512),
        Candidate(strategy="auto", threads=4, ubatch=512, mla=2),
        Candidate(strategy="auto", threads=4, ubatch=512, fused_moe=False),
        Candidate(strategy="auto", threads=4, ubatch=512, merge_up_gate=True),
    ):
        d = features(other, 0.5, 4) - a
        assert np.count_nonzero(d) == 1 and float(np.abs(d).sum()) == pytest.approx(0.5)
    # a looser -amb bound sits closer to none
    assert features(Candidate(strategy="auto", threads=4, ubatch=512, amb_mib=2048), 0.5, 4)[6] == pytest.approx(0.125)


@pytest.mark.parametrize(
    ("values", "expect"),
    [
        (["cpu-moe,layers:CUDA0=3-14,CUDA1=68-77"], ("cpu-moe", "layers:CUDA0=3-14,CUDA1=68-77")),
        (["auto,cpu-moe"], ("auto", "cpu-moe")),
        (["layers:CUDA0=3-14,CUDA1=68-77,auto"], ("layers:CUDA0=3-14,CUDA1=68-77", "auto")),
        (["layers:RPC0=0-3,RPC1=4-7;cpu-moe"], ("layers:RPC0=0-3,RPC1=4-7", "cpu-moe")),
        (
            ["layers:CUDA0=3-8+70-77,CUDA1=9", "head-tail:12+10", "auto"],
            ("layers:CUDA0=3-8+70-77,CUDA1=9", "head-tail:12+10", "auto"),
        ),
        (["n-cpu-moe:64, head-tail:8+8+4 ,all-gpu"], ("n-cpu-moe:64", "head-tail:8+8+4", "all-gpu")),
        (["auto;auto", "auto"], ("auto",)),  # once each
        (["cpu-moe;"], ("cpu-moe",)),
    ],
)
def test_split_strategies(values: list[str], expect: tuple[str, ...]) -> None:
    assert split_strategies(values) == expect


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["cpu-moe,CUDA1=68-77"], "--try-strategy 'cpu-moe,CUDA1=68-77'"),  # not split: no strategy starts there
        (["auto;bogus"], "--try-strategy 'bogus'"),
        (["head-tail:12"], "--try-strategy 'head-tail:12'"),
        ([";"], "no strategy given"),
    ],
)
def test_a_bad_strategy_is_one_error_naming_it(values: list[str], message: str) -> None:
    with pytest.raises(InputError) as e:
        split_strategies(values)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("budget", "moe_layers", "expect"),
    [
        (22, 75, ["head-tail:11+11", "head-tail:8+8+6"]),
        (20, 75, ["head-tail:10+10", "head-tail:8+8+4"]),  # reference 000's 20-layer set
        (3, 8, ["head-tail:2+1"]),
        (1, 8, []),
        (8, 8, []),  # every MoE layer: nothing to choose
    ],
)
def test_head_tail_splits_of_the_expert_budget(budget: int, moe_layers: int, expect: list[str]) -> None:
    assert head_tail_splits(budget, moe_layers) == expect


def test_the_default_axes_split_autos_expert_budget_between_head_and_tail() -> None:
    base = Settings()
    gpu = default_axes(base, "auto", cores=16, moe_layers=40, accelerators=2, expert_budget=10)
    assert gpu.strategies == (
        "auto",
        "cpu-moe",
        "n-cpu-moe:10",
        "n-cpu-moe:20",
        "n-cpu-moe:30",
        "head-tail:5+5",
        "head-tail:4+4+2",
    )
    assert default_axes(base, "auto", 16, 40, accelerators=0, expert_budget=10).strategies == ("auto",)
    # a head/tail split sits apart from auto's layers of the same bytes, not far
    d = features(Candidate(strategy="head-tail:5+5", threads=4), 0.75, 4) - features(
        Candidate(strategy="auto", threads=4), 0.75, 4
    )
    assert float(np.linalg.norm(d)) == pytest.approx(0.5)
