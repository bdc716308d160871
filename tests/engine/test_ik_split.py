"""ik_llama.cpp's byte-based layer split: the -ts moetune computes gives back the plan's layers
under ik's own walk (replicated in ik_split.split; test_ik_server checks both against the real
server's "Layer sizes" table and "Setting default device" lines)."""

from __future__ import annotations

import random

import pytest

from moetune.engine.ik_split import split, tensor_split

MIB = 1 << 20


@pytest.mark.parametrize("seed", range(40))
def test_the_split_gives_back_the_layer_map(seed: int) -> None:
    rng = random.Random(seed)
    n_layers = rng.randint(4, 94)
    sizes = [rng.uniform(0.2, 1.0) * rng.choice([1, 100, 5000]) * MIB for _ in range(n_layers)]
    sizes[0] *= rng.choice([0.3, 1.0])  # a lighter dense lead layer
    sizes.append(rng.uniform(0.1, 3.0) * MIB)  # the output layer
    mc = rng.uniform(0.0, 2.0) * max(sizes)
    n_dev = rng.randint(2, 5)
    phantom = rng.random() < 0.5  # a CPU build's local device, which gets no layer
    first = 1 if phantom else 0
    cuts = sorted(rng.sample(range(1, len(sizes)), n_dev - first - 1))
    index, dev, bounds = [], first, [*cuts, len(sizes)]
    for il in range(len(sizes)):
        while il >= bounds[dev - first]:
            dev += 1
        index.append(dev)
    ts = tensor_split(sizes, mc, index, n_dev)
    assert split(sizes, mc, ts) == index


def test_a_layer_map_against_the_device_order_is_refused() -> None:
    with pytest.raises(ValueError, match="device order"):
        tensor_split([MIB] * 4, MIB, [1, 1, 0, 0], 2)
