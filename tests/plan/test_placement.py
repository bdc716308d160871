"""Placement functions, table-tested: model + hardware + strategy in, layer and expert devices out."""

from __future__ import annotations

import pytest

from moetune.errors import InputError
from moetune.hardware.inventory import from_dict
from moetune.model.profile import ModelProfile
from moetune.plan import placement as plc


def _hw(*gpus_mib: float) -> object:
    return from_dict({"nodes": [{"name": "local", "cpu": {"cores": 16, "ram_mib": 786432, "ram_bw_gbs": 460},
                                 "devices": [{"name": f"CUDA{i}", "kind": "gpu", "mem_mib": m, "bw_gbs": 1790}
                                             for i, m in enumerate(gpus_mib)]}]})


@pytest.mark.parametrize(
    ("n_blocks", "counts", "expect_first", "expect_out"),
    [
        (79, [80], {0: "A", 78: "A"}, "A"),
        (79, [40, 40], {0: "A", 39: "A", 40: "B", 78: "B"}, "B"),
        (79, [20, 60], {19: "A", 20: "B"}, "B"),
        (4, [1, 4], {0: "A", 1: "B", 3: "B"}, "B"),
    ],
)
def test_layer_split_follows_llama_cpp(n_blocks: int, counts: list[int], expect_first: dict[int, str], expect_out: str) -> None:
    names = ["A", "B"][: len(counts)]
    layers, out = plc.layer_split(n_blocks, counts, names)
    for il, dev in expect_first.items():
        assert layers[il] == dev, (il, layers)
    assert out == expect_out
    assert layers == sorted(layers)  # contiguous runs in device order


@pytest.mark.parametrize(
    ("weights", "n_blocks", "expect"),
    [([1.0], 79, [80]), ([1.0, 1.0], 79, [40, 40]), ([3.0, 1.0], 79, [60, 20]), ([1.0, 0.001], 9, [9, 1])],
)
def test_split_counts(weights: list[float], n_blocks: int, expect: list[int]) -> None:
    assert plc.split_counts(n_blocks, weights) == expect


def test_strategies_on_glm51(glm51: ModelProfile) -> None:
    hw = _hw(97887)
    cm = plc.cpu_moe(glm51, hw)
    assert set(cm.experts().values()) == {"CPU"}
    assert set(cm.layer_device) == {"CUDA0"} and cm.output_device == "CUDA0"
    n64 = plc.n_cpu_moe(glm51, hw, 64)
    on_gpu = {int(n.split(".")[1]) for n, d in n64.experts().items() if d == "CUDA0"}
    assert on_gpu == set(range(64, 78))  # 14 MoE layers, as in reference 000
    ls = plc.layer_sets(glm51, _hw(97887, 97887), "CUDA0=3-14,CUDA1=68-77")
    ex = ls.experts()
    assert ex["blk.3.ffn_up_exps.weight"] == "CUDA0" and ex["blk.77.ffn_down_exps.weight"] == "CUDA1"
    assert ex["blk.40.ffn_gate_exps.weight"] == "CPU"


@pytest.mark.parametrize("spec", ["CUDA9=3-4", "CUDA0=3-x", "CUDA0=70-90", "CUDA0"])
def test_bad_layer_sets(glm51: ModelProfile, spec: str) -> None:
    with pytest.raises(InputError):
        plc.layer_sets(glm51, _hw(97887), spec)
