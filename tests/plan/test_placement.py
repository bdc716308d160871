"""Placement functions, table-tested: model + hardware + strategy in, layer and expert devices out."""

from __future__ import annotations

import pytest

from moetune.errors import InputError
from moetune.hardware.inventory import from_dict
from moetune.model.profile import ModelProfile
from moetune.plan import placement as plc


def _hw(*gpus_mib: float) -> object:
    return from_dict(
        {
            "nodes": [
                {
                    "name": "local",
                    "cpu": {"cores": 16, "ram_mib": 786432, "ram_bw_gbs": 460},
                    "devices": [
                        {"name": f"CUDA{i}", "kind": "gpu", "mem_mib": m, "bw_gbs": 1790}
                        for i, m in enumerate(gpus_mib)
                    ],
                }
            ]
        }
    )


@pytest.mark.parametrize(
    ("n_blocks", "counts", "expect_first", "expect_out"),
    [
        (79, [80], {0: "A", 78: "A"}, "A"),
        (79, [40, 40], {0: "A", 39: "A", 40: "B", 78: "B"}, "B"),
        (79, [20, 60], {19: "A", 20: "B"}, "B"),
        (4, [1, 4], {0: "A", 1: "B", 3: "B"}, "B"),
    ],
)
def test_layer_split_follows_llama_cpp(
    n_blocks: int, counts: list[int], expect_first: dict[int, str], expect_out: str
) -> None:
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


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("auto", plc.Strategy(kind="auto")),
        (" cpu-moe ", plc.Strategy(kind="cpu-moe")),
        ("all-gpu", plc.Strategy(kind="all-gpu")),
        ("n-cpu-moe:64", plc.Strategy(kind="n-cpu-moe", n=64)),
        ("layers:CUDA0=3-14,CUDA1=68-77", plc.Strategy(kind="layers", spec="CUDA0=3-14,CUDA1=68-77")),
        ("head-tail:12+10", plc.Strategy(kind="head-tail", head=12, tail=10)),
        ("head-tail:8 + 8 + 4", plc.Strategy(kind="head-tail", head=8, tail=8, middle=4)),
        ("head-tail:0+14", plc.Strategy(kind="head-tail", tail=14)),
    ],
)
def test_parse_strategy(text: str, expect: plc.Strategy) -> None:
    assert plc.parse_strategy(text) == expect


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("auto", "auto"),
        (" cpu-moe ", "cpu-moe"),
        ("all-gpu", "all-gpu"),
        ("n-cpu-moe: 64", "n-cpu-moe:64"),
        ("layers: CUDA0=3-14,CUDA1=68-77 ", "layers:CUDA0=3-14,CUDA1=68-77"),
        ("head-tail:8 + 8 + 4", "head-tail:8+8+4"),
        ("head-tail:12+10+0", "head-tail:12+10"),
    ],
)
def test_strategy_written_back(text: str, canonical: str) -> None:
    """The parsed strategy writes itself back in the form the placements carry as their name."""
    st = plc.parse_strategy(text)
    assert str(st) == canonical
    assert plc.parse_strategy(canonical) == st


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus", "--strategy 'bogus': choose auto, cpu-moe"),
        ("n-cpu-moe:x", "N must be an integer"),
        ("layers:", "choose auto"),
        ("CUDA1=68-77", "'CUDA1=68-77': choose"),
        ("head-tail:12", "expected head-tail:H+T"),
        ("head-tail:12+x", "expected head-tail:H+T"),
        ("head-tail:1+2+3+4", "expected head-tail:H+T"),
    ],
)
def test_bad_strategies(text: str, message: str) -> None:
    with pytest.raises(InputError) as e:
        plc.parse_strategy(text)
    assert message in str(e.value)


def _expert_layers(pl: plc.Placement) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for name, dev in pl.experts().items():
        out.setdefault(dev, set()).add(int(name.split(".")[1]))
    return out


@pytest.mark.parametrize(
    ("gpus", "head", "tail", "middle", "expect"),
    [
        # reference 000's winner: head 12 on the first GPU, tail 10 on the second (layers:CUDA0=3-14,CUDA1=68-77)
        ((97887, 97887), 12, 10, 0, {"CUDA0": set(range(3, 15)), "CUDA1": set(range(68, 78))}),
        # its 20-layer set: head 8, tail 8 and 4 of the middle, each with its layer's GPU
        ((97887, 97887), 8, 8, 4, {"CUDA0": {*range(3, 11), 18, 33}, "CUDA1": {47, 62, *range(70, 78)}}),
        ((97887,), 12, 10, 0, {"CUDA0": {*range(3, 15), *range(68, 78)}}),  # one GPU holds both ends
        ((97887, 97887), 0, 14, 0, {"CUDA1": set(range(64, 78))}),  # tail only: n-cpu-moe:64's set
        ((97887, 97887), 75, 0, 0, {"CUDA0": set(range(3, 40)), "CUDA1": set(range(40, 78))}),  # every MoE layer
    ],
)
def test_head_tail_on_glm51(
    glm51: ModelProfile, gpus: tuple[float, ...], head: int, tail: int, middle: int, expect: dict[str, set[int]]
) -> None:
    pl = plc.head_tail(glm51, _hw(*gpus), head, tail, middle=middle)
    got = _expert_layers(pl)
    assert set(range(3, 78)) - set().union(*expect.values()) == got.pop("CPU", set())
    assert got == expect
    assert pl.strategy == plc.head_tail_name(head, tail, middle)
    assert plc.accelerator_expert_layers(glm51, pl) == head + tail + middle


def test_head_tail_12_10_is_the_reference_layer_set(glm51: ModelProfile) -> None:
    hw = _hw(97887, 97887)
    assert plc.head_tail(glm51, hw, 12, 10).experts() == plc.layer_sets(glm51, hw, "CUDA0=3-14,CUDA1=68-77").experts()


def test_head_tail_larger_than_the_model(glm51: ModelProfile) -> None:
    with pytest.raises(InputError, match="76 layers, the model has 75 MoE layers"):
        plc.head_tail(glm51, _hw(97887), 40, 36)


@pytest.mark.parametrize(
    ("layers", "n", "expect"),
    [(list(range(10)), 2, [2, 7]), (list(range(11, 70)), 4, [18, 33, 47, 62]), ([5], 1, [5]), ([1, 2], 0, [])],
)
def test_spread(layers: list[int], n: int, expect: list[int]) -> None:
    assert plc.spread(layers, n) == expect
