"""The reserve graph (plan/graph.py) replayed (plan/galloc.py) at the published models' full size.

Pure: sparse header-exact replicas are planned, nothing runs. The first table holds figures the
engine printed for these very plans (llama-fit-params' breakdown, llama-server's log; from
benchmarks/results/fullscale.md), one row per mechanism the replay follows; the others check the
graph's facts one by one.
"""

from __future__ import annotations

import pytest

from moetune.hardware.inventory import from_dict
from moetune.model.archs import PRESETS, mainline_recipe
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.compute import ComputeInputs
from moetune.plan.galloc import CPU, buffer_sizes
from moetune.plan.graph import Shape, Sites, build
from moetune.plan.ledger import mainline_compute
from moetune.plan.placement import cpu_moe
from tests.helpers import loopback_hw

MIB = 1 << 20


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelProfile]:
    d = tmp_path_factory.mktemp("reserve")
    out = {}
    for name in ("qwen3-coder-next", "qwen3.5-397b-a17b", "qwen3-coder-480b-a35b", "glm-4.6", "deepseek-v3", "glm-5.1"):
        arch, dims = PRESETS[name]
        out[name] = load_profile(generate(d / f"{name}.gguf", arch, dims, mainline_recipe(name), sparse=True).files[0])
    return out


def compute_mib(p: ModelProfile, n_rpc: int, ctx: int, ub: int, cache: str, fa: bool, outputs: int) -> list[float]:
    """Compute buffers (accelerators in the engine's order, then the CPU) of the cpu-moe plan."""
    hw = from_dict(loopback_hw([f"127.0.0.1:{50000 + i}" for i in range(n_rpc)], mem_mib=1e7, cpu_ram_mib=1e8))
    inp = ComputeInputs(
        ubatch=ub, ctx=ctx, slots=1, flash_attn=fa, ctk=cache, ctv=cache if fa else "f16", n_outputs=outputs
    )
    got = mainline_compute(p, hw, cpu_moe(p, hw), inp)
    return [got[d.name] / MIB for d in hw.devices()]


# (mechanism, preset, rpc devices, ctx, ubatch, cache, flash attention, output rows (0: every token,
# as llama-fit-params reserves; 1: one slot, as llama-server), the engine's MiB per device)
ENGINE = [
    (
        "CPU only: the logits above the never-freed input branch, the mask below it",
        "qwen3-coder-next",
        0,
        131072,
        2048,
        "f16",
        True,
        0,
        [1779.0],
    ),
    (
        "the same plan as llama-server reserves it: one output row",
        "qwen3-coder-next",
        0,
        131072,
        2048,
        "f16",
        True,
        1,
        [872.09],
    ),
    (
        "host: the experts' down projection above the mask's hole (out_ids pins it)",
        "glm-4.6",
        1,
        131072,
        8192,
        "q8_0",
        True,
        0,
        [7424.0, 3648.0],
    ),
    (
        "first device: input copies, the pinned copy, the experts' outputs; the next device starts with "
        "the previous layer's expert outputs and the mask",
        "qwen3-coder-480b-a35b",
        2,
        131072,
        2048,
        "f16",
        True,
        0,
        [1088.0, 1328.0, 1473.0],
    ),
    (
        "the output after the shared expert, in place on the last hidden state",
        "glm-4.6",
        2,
        131072,
        2048,
        "f16",
        True,
        0,
        [992.0, 1585.0, 1201.0],
    ),
    ("MLA: Q through the LoRA, absorbed, concatenated", "deepseek-v3", 0, 4096, 512, "f16", True, 0, [410.0]),
    (
        "DSA: every layer's top-k leaf, the indexer's scores and masks",
        "glm-5.1",
        1,
        32768,
        8192,
        "f16",
        True,
        0,
        [10496.0, 3968.0],
    ),
    (
        "hybrid: delta-net layers, the mask first read by the fourth layer",
        "qwen3.5-397b-a17b",
        1,
        131072,
        8192,
        "q8_0",
        True,
        0,
        [8272.0, 4560.0],
    ),
    (
        "hybrid, no flash attention, quantized cache: Hadamard rotations, the gate in place",
        "qwen3.5-397b-a17b",
        2,
        4096,
        2048,
        "q8_0",
        False,
        0,
        [1536.0, 2004.0, 668.0],
    ),
    (
        "llama-server, one device, a quantized cache",
        "qwen3-coder-next",
        1,
        131072,
        8192,
        "q8_0",
        True,
        1,
        [3008.1, 3312.6],
    ),
]


@pytest.mark.parametrize(
    ("preset", "n_rpc", "ctx", "ub", "cache", "fa", "outputs", "engine"),
    [c[1:] for c in ENGINE],
    ids=[c[0][:60] for c in ENGINE],
)
def test_replay_matches_the_engine(
    replicas: dict[str, ModelProfile],
    preset: str,
    n_rpc: int,
    ctx: int,
    ub: int,
    cache: str,
    fa: bool,
    outputs: int,
    engine: list[float],
) -> None:
    got = compute_mib(replicas[preset], n_rpc, ctx, ub, cache, fa, outputs)
    assert got == pytest.approx(engine, rel=0.025)


def nodes_of(p: ModelProfile, sh: Shape) -> dict[str, int]:
    sites = Sites(tuple(["RPC0"] * p.n_layer), {}, "RPC0")
    return {n.name: n.nbytes for n in build(p, sh, sites)}


def test_logits_are_for_the_output_rows_only(replicas: dict[str, ModelProfile]) -> None:
    p = replicas["glm-4.6"]
    every, one = (
        nodes_of(p, Shape(n_tok=2048, n_kv=4096, flash_attn=True)),
        nodes_of(p, Shape(n_tok=2048, n_kv=4096, flash_attn=True, n_out=4)),
    )
    assert every["result_output"] == 4 * p.n_vocab * 2048
    assert one["result_output"] == 4 * p.n_vocab * 4
    last = p.n_layer - 1  # the last layer's FFN runs on the output rows too
    assert one[f"ffn_moe_down-{last}"] * 512 == every[f"ffn_moe_down-{last}"]


@pytest.mark.parametrize(
    ("cache", "rotations"), [("f16", set()), ("q8_0", {"Q_rot-0", "K_rot-0", "V_rot-0", "out_rot-0"})]
)
def test_a_quantized_cache_rotates_q_k_and_v(
    replicas: dict[str, ModelProfile], cache: str, rotations: set[str]
) -> None:
    quant = cache != "f16"
    names = nodes_of(replicas["glm-4.6"], Shape(n_tok=512, n_kv=4096, flash_attn=True, k_quant=quant, v_quant=quant))
    assert {n for n in names if n.endswith("_rot-0")} == rotations


def test_hybrid_layers_read_the_mask_only_where_they_attend(replicas: dict[str, ModelProfile]) -> None:
    p = replicas["qwen3-coder-next"]
    nodes = build(p, Shape(n_tok=512, n_kv=4096, flash_attn=True), Sites(tuple(["RPC0"] * p.n_layer), {}, "RPC0"))
    readers = sorted({int(n.name.rsplit("-", 1)[1]) for n in nodes if "kq_mask" in n.srcs})
    assert readers[0] == 3 and all((il + 1) % 4 == 0 for il in readers)


@pytest.mark.parametrize(
    ("preset", "n_rpc", "ub", "fa"),
    [
        ("glm-5.1", 1, 2048, True),
        ("qwen3.5-397b-a17b", 2, 2048, False),
        ("glm-4.6", 2, 8192, True),
        ("deepseek-v3", 0, 512, True),
    ],
)
def test_leaving_out_repeated_layers_changes_no_buffer(
    replicas: dict[str, ModelProfile], preset: str, n_rpc: int, ub: int, fa: bool
) -> None:
    p = replicas[preset]
    hw = from_dict(loopback_hw([f"127.0.0.1:{50000 + i}" for i in range(n_rpc)], mem_mib=1e7, cpu_ram_mib=1e8))
    pl = cpu_moe(p, hw)
    sites = Sites(tuple(pl.layer_device[: p.n_layer]), pl.experts(), pl.output_device)
    sh, devs = Shape(n_tok=ub, n_kv=32768, flash_attn=fa), [d.name for d in hw.devices()]
    short, full = build(p, sh, sites), build(p, sh, sites, every_layer=True)
    assert len(short) < len(full) / 2
    assert buffer_sizes(short, devs) == buffer_sizes(full, devs)


def test_dsa_has_a_top_k_leaf_per_layer(replicas: dict[str, ModelProfile]) -> None:
    p = replicas["glm-5.1"]
    nodes = build(p, Shape(n_tok=512, n_kv=32768, flash_attn=True), Sites(tuple(["RPC0"] * p.n_layer), {}, "RPC0"))
    fills = [n for n in nodes if n.name.startswith("topk_fill-")]
    assert len(fills) == p.n_layer and all(n.leaf and n.nbytes == 4 * 2048 * 512 for n in fills)


def test_the_input_branch_is_pinned(replicas: dict[str, ModelProfile]) -> None:
    nodes = {
        n.name: n
        for n in build(
            replicas["glm-4.6"], Shape(n_tok=512, n_kv=4096, flash_attn=True), Sites(("RPC0",) * 92, {}, "RPC0")
        )
    }
    assert nodes["mixed_copy"].pinned and nodes["inp_embd"].is_input
    assert nodes["embd"].weight == CPU  # the token embedding stays on the CPU


def test_cuda_offload_moves_the_host_experts_and_copies_their_weights(replicas: dict[str, ModelProfile]) -> None:
    """A CUDA GPU computes the CPU-resident experts of a large batch itself, a weight copy at a time."""
    p = replicas["qwen3-coder-next"]
    doc = loopback_hw([], cpu_ram_mib=1e8)
    doc["nodes"][0]["devices"] = [{"name": "CUDA0", "kind": "gpu", "mem_mib": 1e6, "bw_gbs": 1000}]
    hw = from_dict(doc)
    pl = cpu_moe(p, hw)
    big = mainline_compute(p, hw, pl, ComputeInputs(ubatch=2048, ctx=8192, slots=1, n_outputs=1))
    small = mainline_compute(p, hw, pl, ComputeInputs(ubatch=16, ctx=8192, slots=1, n_outputs=1))
    largest = max(t.nbytes for t in p.tensors if t.is_expert)
    assert big["CUDA0"] > largest > big[CPU]  # the experts' weights pass through the GPU's buffer
    assert small["CUDA0"] < largest  # under 32 tokens the CPU computes them
