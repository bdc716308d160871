"""Sliding-window attention in the KV formula and the ledger's cells: which layers are windowed,
read from the GGUF's keys as llama.cpp reads them (``llama_hparams::set_swa_pattern``), and how many
cells ``llama_kv_cache_iswa`` gives each cache (numbers below are the real llama-server's, measured
on generated gpt-oss models: ``tests/plan/test_swa_server.py`` checks them live)."""

from __future__ import annotations

from typing import Any

import pytest

from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.kv import kv_shape, swa_layers
from moetune.model.profile import ModelProfile
from moetune.plan.ledger import kv_cells, swa_cells
from moetune.plan.settings import Settings


def _profile(arch: str, n_layer: int = 8, **hp: Any) -> ModelProfile:
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": n_layer,
        f"{arch}.embedding_length": 256,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.key_length": 64,
        f"{arch}.attention.value_length": 64,
    }
    meta.update({f"{arch}.{k}": v for k, v in hp.items()})
    return ModelProfile(arch=arch, files=("m.gguf",), metadata=meta, tensors=())


@pytest.mark.parametrize(
    ("arch", "hp", "want"),
    [
        ("gpt-oss", {"attention.sliding_window": 128}, {0, 2, 4, 6}),  # the default period 2, full layer last
        ("gemma3", {"attention.sliding_window": 1024}, {0, 1, 2, 3, 4, 6, 7}),  # period 6: five windowed, one full
        ("cohere2moe", {"attention.sliding_window": 4096}, {1, 2, 3, 5, 6, 7}),  # the full layer opens each period
        ("gpt-oss", {"attention.sliding_window": 128, "attention.sliding_window_pattern": 4}, {0, 1, 2, 4, 5, 6}),
        ("gpt-oss", {"attention.sliding_window": 128, "attention.sliding_window_pattern": 0}, set(range(8))),
        (
            "qwen3moe",
            {
                "attention.sliding_window": 128,
                "attention.sliding_window_pattern": [True, False, False, True, False, False, False, True],
            },
            {0, 3, 7},
        ),
        ("qwen3moe", {"attention.sliding_window": 128}, set()),  # no pattern llama.cpp knows of: every layer full
        ("gpt-oss", {}, set()),  # no window declared
    ],
)
def test_windowed_layers_from_the_keys(arch: str, hp: dict[str, Any], want: set[int]) -> None:
    p = _profile(arch, **hp)
    n_swa, layers = swa_layers(p)
    assert layers == want and (n_swa > 0) == bool(want)
    kv = kv_shape(p)
    assert {lk.layer for lk in kv.layers if lk.swa} == want
    full, windowed = kv.bytes_per_token_split()
    assert windowed == len(want) * 2 * 2 * 64 * 2 and full + windowed == kv.bytes_per_token()
    # ik_llama.cpp keeps every layer's cache for the context
    assert not any(lk.swa for lk in kv_shape(p, EngineKind.IK).layers)


def test_damaged_pattern_is_an_input_error() -> None:
    with pytest.raises(InputError, match="sliding_window_pattern"):
        swa_layers(_profile("gpt-oss", **{"attention.sliding_window": 128, "attention.sliding_window_pattern": "x"}))


# (ctx, parallel, ubatch, unified, swa_full) -> full cells, windowed cells (window 128), as llama-server logs them
@pytest.mark.parametrize(
    ("ctx", "par", "ub", "unified", "full", "want_full", "want_swa"),
    [
        (4096, 1, 512, False, False, 4096, 768),  # 128 + 512 padded to 256
        (256, 1, 512, False, False, 256, 256),  # context below window + ubatch: the full size
        (8192, 4, 256, False, False, 8192, 4 * 512),  # per stream 128 + 256 -> 512, four streams
        (1024, 4, 512, False, False, 1024, 1024),  # per stream capped at the stream's 256
        (2048, 1, 128, False, False, 2048, 256),
        (8192, 4, 512, True, False, 8192, 1024),  # unified: one stream, the window of every sequence
        (8192, 1, 512, False, True, 8192, 8192),  # --swa-full
    ],
)
def test_cells_per_cache(ctx: int, par: int, ub: int, unified: bool, full: bool, want_full: int, want_swa: int) -> None:
    s = Settings(ctx=ctx, slots=par, ubatch=ub, batch=max(ub, 2048), kv_unified=unified, swa_full=full)
    assert (kv_cells(s), swa_cells(s, 128)) == (want_full, want_swa)
    assert swa_cells(s, 0) == kv_cells(s)


def test_decode_reads_at_most_a_window_of_the_windowed_layers(tmp_path: Any) -> None:
    """The speed model: the full-attention layers' KV read grows with the depth, the sliding-window
    layers' stops at the window (with --swa-full their cache spans the context, and is read as such)."""
    from moetune.hardware.inventory import from_dict
    from moetune.model.archs import small_dims
    from moetune.model.profile import load_profile
    from moetune.model.testmodel import generate
    from moetune.plan.plan import ServiceSpec, make_plan
    from tests.helpers import loopback_hw

    p = load_profile(generate(tmp_path / "g.gguf", "gpt-oss", small_dims("gpt-oss"), "f16").files[0])
    sp = make_plan(
        [ServiceSpec(name="t", model=p, settings=Settings(ctx=8192), strategy="cpu-moe")], from_dict(loopback_hw([]))
    ).main
    d = next(x for x in sp.prediction.work.devices if x.kv_bytes_windowed)
    full, windowed = kv_shape(p).bytes_per_token_split()
    assert (d.kv_bytes_per_ctx, d.kv_bytes_windowed, d.window) == (full, windowed, 128)
    assert d.kv_read(100)[0] == 100 * (full + windowed)
    assert d.kv_read(4096)[0] == 4096 * full + 128 * windowed
    sp = make_plan(
        [ServiceSpec(name="t", model=p, settings=Settings(ctx=8192, swa_full=True), strategy="cpu-moe")],
        from_dict(loopback_hw([])),
    ).main
    assert all(x.window == 0 for x in sp.prediction.work.devices)


def test_gpt_oss_placement_moves_expert_biases_with_their_weights(tmp_path: Any) -> None:
    """gpt-oss's expert tensors have biases (``blk.N.ffn_up_exps.bias``): they are expert tensors of
    the same kind, follow their weights under every strategy's -ot rules, and count k/E of their
    bytes per decoded token like the MXFP4 weights (17 bytes per 32 weights)."""
    from moetune.engine.render import check_rules, override_rules
    from moetune.hardware.inventory import from_dict
    from moetune.model.archs import PRESET_RECIPES, PRESETS
    from moetune.model.profile import load_profile
    from moetune.model.testmodel import generate
    from moetune.plan.plan import ServiceSpec, make_plan
    from tests.helpers import loopback_hw

    arch, dims = PRESETS["gpt-oss-120b"]
    p = load_profile(generate(tmp_path / "g.gguf", arch, dims, PRESET_RECIPES["gpt-oss-120b"], sparse=True).files[0])
    up = next(t for t in p.tensors if t.name == "blk.0.ffn_up_exps.weight")
    assert up.type_name == "MXFP4" and up.nbytes == 2880 * 2880 * 128 // 32 * 17
    assert next(t for t in p.tensors if t.name == "blk.0.ffn_up_exps.bias").is_expert
    assert p.layers[0].experts["ffn_up_exps"] == ("MXFP4", up.nbytes + 2880 * 128 * 4)
    hw = from_dict(loopback_hw([], mem_mib=1e7, cpu_ram_mib=1e8))
    for strategy in ("cpu-moe", "n-cpu-moe:10"):
        sp = make_plan([ServiceSpec(name="t", model=p, settings=Settings(ctx=8192), strategy=strategy)], hw).main
        rules = override_rules(p, sp.placement)
        check_rules(p, sp.placement, rules)  # every expert tensor, biases included, where the plan says
        ex = sp.placement.experts()
        assert ex["blk.0.ffn_down_exps.bias"] == ex["blk.0.ffn_down_exps.weight"]
    read = sum(d.read_bytes for d in sp.prediction.work.devices)
    experts = sum(t.nbytes for t in p.tensors if t.is_expert)
    embd = next(t.nbytes for t in p.tensors if t.name == "token_embd.weight")  # one row per token: not counted
    assert read == pytest.approx(p.loaded_bytes() - embd - experts + experts * 4 / 128, rel=1e-6)


def test_testmodel_window_option(tmp_path: Any) -> None:
    import json

    from tests.helpers import run_cli

    r = run_cli("testmodel", str(tmp_path / "g.gguf"), "--arch", "gpt-oss", "--window", "1024", "--layers", "2")
    assert r.exit_code == 0, r.stderr
    r = run_cli("inspect", str(tmp_path / "g.gguf"), "--json", "--ctx", "4096", "-ub", "512")
    doc = json.loads(r.stdout)
    assert doc["sliding_window"] == 1024 and doc["swa_layers"] == [0]
    assert doc["kv_at"]["swa_cells"] == 1536 and doc["kv_at"]["full_cells"] == 4096
