"""Quant recipes, pure: the YAML's rules, the regular expressions they become, and the engines'
llama-quantize modelled tensor by tensor (fallbacks, interleaving, imatrix and type checks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moetune.engine.dialect import quantize_argv
from moetune.engine.quantize import plan_quantize, progress_of, quantizable
from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.archs import Dims
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.recipe import Recipe, parse_layers, recipe_from_doc, rule_pattern
from moetune.model.testmodel import generate

MAIN, IK = EngineKind.MAINLINE, EngineKind.IK


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelProfile:
    # rows of 128 in ffn_down_exps: 256-block types fall back there
    d = tmp_path_factory.mktemp("recipe")
    return load_profile(generate(d / "m.gguf", "qwen3moe", Dims(n_layer=4, n_ff_exp=128), "f16").files[0])


def recipe(*rules: dict[str, object], default: str = "q8_0") -> Recipe:
    return recipe_from_doc({"default": default, "rules": list(rules)}, "r.yaml")


@pytest.mark.parametrize(("text", "want"), [(7, (7, 7)), ("0-39", (0, 39)), ("40-", (40, None)), (" 3 - 5 ", (3, 5))])
def test_layer_ranges(text: object, want: tuple[int, int | None]) -> None:
    assert parse_layers(text, "r") == want


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"rules": []}, "no `default`"),
        ({"default": "q9_9"}, "unknown tensor type 'q9_9'"),
        ({"default": "q8_0", "rules": [{"role": "experts", "type": "q4_0"}]}, "unknown role 'experts'"),
        ({"default": "q8_0", "rules": [{"layers": "9-3", "type": "q4_0"}]}, "end before they start"),
        ({"default": "q8_0", "rules": [{"pattern": "a{1,2}", "type": "q4_0"}]}, "has ',' or '='"),
        ({"default": "q8_0", "rules": [{"pattern": "x", "role": "expert", "type": "q4_0"}]}, "takes no role"),
        ({"default": "q8_0", "rules": [{"role": "expert"}]}, "rule 1: no type"),
        ({"default": "q8_0", "colour": 1}, "unknown key 'colour'"),
    ],
)
def test_bad_recipes_are_named(doc: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        recipe_from_doc(doc, "r.yaml")


def test_a_rule_selects_exactly_its_tensors(model: ModelProfile) -> None:
    r = recipe({"role": "expert", "layers": "2-", "type": "q4_0"}, {"kind": ["token_embd", "attn_q"], "type": "q6_k"})
    exp, mixed = (re.compile(rule_pattern(x, model) or "") for x in r.rules)
    assert {t.name for t in model.tensors if exp.search(t.name)} == {
        f"blk.{i}.ffn_{k}_exps.weight" for i in (2, 3) for k in ("gate", "up", "down")
    }
    assert {t.name for t in model.tensors if mixed.search(t.name)} == {
        "token_embd.weight",
        *(f"blk.{i}.attn_q.weight" for i in range(4)),
    }  # attn_q_norm is not attn_q


def types(model: ModelProfile, kind: EngineKind, *rules: dict[str, object], default: str = "q8_0") -> dict[str, str]:
    return {t.name: t.type for t in plan_quantize(model, recipe(*rules, default=default), kind).tensors}


def test_the_first_matching_rule_wins_and_the_default_takes_the_rest(model: ModelProfile) -> None:
    got = types(
        model,
        MAIN,
        {"kind": "ffn_up_exps", "layers": 0, "type": "q4_0"},
        {"role": "expert", "type": "q5_0"},
        default="q6_k",
    )
    assert got["blk.0.ffn_up_exps.weight"] == "Q4_0"
    assert got["blk.1.ffn_up_exps.weight"] == "Q5_0"
    assert got["blk.0.attn_k.weight"] == "Q6_K"
    assert got["blk.0.attn_norm.weight"] == "F32"  # norms and the router are never quantized
    assert got["blk.0.ffn_gate_inp.weight"] == "F32"


@pytest.mark.parametrize(
    ("kind", "asked", "written"),
    [
        (MAIN, "q6_k", "Q8_0"),
        (MAIN, "q4_k", "Q5_0"),
        (MAIN, "q5_k", "Q5_1"),
        (MAIN, "iq4_xs", "IQ4_NL"),
        (MAIN, "q4_0", "Q4_0"),
        (IK, "iq6_k", "Q8_0"),
        (IK, "iq5_ks", "Q5_0"),
        (IK, "iq5_k", "Q6_0"),
        (IK, "iq4_ks", "IQ4_NL"),
        (IK, "iq3_ks", "IQ4_NL"),
        (IK, "q8_0", "Q8_0"),
    ],
)
def test_a_type_whose_block_does_not_divide_the_row_falls_back_as_the_engine_does(
    model: ModelProfile, kind: EngineKind, asked: str, written: str
) -> None:
    qp = plan_quantize(model, recipe({"role": "expert", "type": asked}), kind)
    down = next(t for t in qp.tensors if t.name == "blk.0.ffn_down_exps.weight")
    up = next(t for t in qp.tensors if t.name == "blk.0.ffn_up_exps.weight")
    assert (down.type, up.type) == (written, asked.upper())
    assert bool(down.fallback) == (written != asked.upper())
    assert (
        down.nbytes
        == 8 * 256 * {"Q8_0": 34, "Q5_0": 22, "Q5_1": 24, "Q6_0": 26, "IQ4_NL": 18, "Q4_0": 18}[written] * 128 // 32
    )


def test_interleaved_types_fall_back_to_their_base_where_ik_cannot_interleave(model: ModelProfile) -> None:
    got = types(model, IK, {"kind": ["token_embd", "output", "attn_q"], "type": "q8_0_r8"})
    # the embeddings never; the output's 259 rows are not a multiple of 8; attn_q's 256 are
    assert (got["token_embd.weight"], got["output.weight"], got["blk.0.attn_q.weight"]) == ("Q8_0", "Q8_0", "Q8_0_R8")


@pytest.mark.parametrize(
    ("kind", "ty", "message"),
    [
        (MAIN, "iq4_ks", "not one llama.cpp has (ik_llama.cpp only)"),
        (IK, "nvfp4", "not one ik_llama.cpp has (llama.cpp only)"),
        (MAIN, "q8_k", "not a type llama-quantize writes"),
        (MAIN, "iq2_xxs", "only with an importance matrix"),
        (IK, "iq2_kt", "only with an importance matrix"),
    ],
)
def test_a_type_the_engine_cannot_write_is_refused_before_it_runs(
    model: ModelProfile, kind: EngineKind, ty: str, message: str
) -> None:
    with pytest.raises(InputError, match=re.escape(message)) as e:
        plan_quantize(model, recipe({"role": "expert", "type": ty}), kind)
    assert e.value.exit_code == 2 and e.value.hint


def test_an_imatrix_lets_a_2_bit_type_through(model: ModelProfile) -> None:
    qp = plan_quantize(model, recipe({"kind": "ffn_up_exps", "type": "iq2_xxs"}), MAIN, imatrix=True)
    assert {t.type for t in qp.tensors if t.kind == "ffn_up_exps"} == {"IQ2_XXS"}


def test_rules_that_take_nothing_are_warned_about(model: ModelProfile) -> None:
    qp = plan_quantize(
        model,
        recipe(
            {"role": "expert", "type": "q4_0"},
            {"kind": "ffn_up_exps", "type": "q5_0"},
            {"role": "norm", "type": "q4_0"},
            {"layers": "10-", "type": "q4_0"},
        ),
        MAIN,
    )
    said = " | ".join(m for m, _ in qp.warnings)
    assert "rule 2 (kind ffn_up_exps) matches only tensors an earlier rule took" in said
    assert "rule 3 (role norm) matches only tensors llama.cpp's llama-quantize never quantizes" in said
    assert "rule 4 (layers 10-) matches no tensor" in said


def test_the_requantize_of_a_quantized_source_needs_consent(tmp_path: Path) -> None:
    p = load_profile(generate(tmp_path / "q.gguf", "qwen3moe", Dims(n_layer=1), "q8_0").files[0])
    with pytest.raises(InputError, match="refuses to requantize") as e:
        plan_quantize(p, recipe({"role": "expert", "type": "q4_0"}), MAIN)
    assert "--allow-requantize" in (e.value.hint or "")
    assert plan_quantize(p, recipe({"role": "expert", "type": "q4_0"}), MAIN, allow_requantize=True).requantize


def test_each_dialect_spells_the_rules_its_way() -> None:
    rules = [(r"^blk\.([0-3])\.ffn_up_exps\.weight$", "IQ4_KS"), (".", "Q8_0")]
    assert quantize_argv(IK, "q", "in.gguf", "out.gguf", ftype="IQ4_KS", rules=rules, imatrix="m.dat", threads=2) == [
        "q",
        "--imatrix",
        "m.dat",
        "--custom-q",
        r"^blk\.([0-3])\.ffn_up_exps\.weight$=iq4_ks,.=q8_0",
        "in.gguf",
        "out.gguf",
        "IQ4_KS",
        "2",
    ]
    assert quantize_argv(MAIN, "q", "in.gguf", "out.gguf", ftype="Q8_0", rules=rules[1:], allow_requantize=True) == [
        "q",
        "--allow-requantize",
        "--tensor-type",
        ".=q8_0",
        "in.gguf",
        "out.gguf",
        "Q8_0",
    ]


@pytest.mark.parametrize(
    ("name", "shape", "main", "ik"),
    [
        ("blk.0.attn_q.weight", (256, 256), True, True),
        ("blk.0.attn_norm.weight", (256,), False, False),
        ("blk.0.ffn_gate_inp.weight", (256, 8), False, False),
        ("blk.0.attn_q.bias", (256, 4), False, False),
        ("blk.0.ssm_conv1d.weight", (4, 256), False, False),
        ("blk.0.attn_q.weight", (256, 1, 1), False, False),
        ("blk.0.indexer.k_proj.weight", (256, 128), False, True),
    ],
)
def test_which_tensors_each_engine_quantizes(name: str, shape: tuple[int, ...], main: bool, ik: bool) -> None:
    assert (quantizable(MAIN, name, shape), quantizable(IK, name, shape)) == (main, ik)


@pytest.mark.parametrize(
    "line",
    [
        "[   7/  51] blk.0.ffn_up_exps.weight             - [   256,    128,      8,      1], type =    f16, ",  # mainline
        "[   7/  51]             blk.0.ffn_up_exps.weight - [  256,   128,     8,     1], type =    f16, ",  # ik
    ],
)
def test_the_quantizers_tensor_lines_are_progress(line: str) -> None:
    assert progress_of(line) == (7, 51, "blk.0.ffn_up_exps.weight")
    assert progress_of("llama_model_quantize_impl: quant size  =     3.14 MiB") is None


def test_quantize_plans_its_output_on_the_hardware_before_it_runs(model: ModelProfile, tmp_path: Path) -> None:
    import json

    from tests.helpers import run_cli

    r = tmp_path / "r.yaml"
    r.write_text("default: q8_0\nrules:\n  - {role: expert, layers: 2-, type: q4_0}\n")
    out = run_cli(
        "quantize",
        str(model.files[0]),
        "--recipe",
        str(r),
        "--hw",
        "rtx-pro-6000",
        "--dry-run",
        "--json",
        "-o",
        str(tmp_path / "o.gguf"),
    )
    assert out.exit_code == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["plan"]["fits"] and not (tmp_path / "o.gguf").exists()
    weights = sum(d["weights_mib"] for d in doc["plan"]["devices"])
    assert weights == pytest.approx(doc["bytes"] / 2**20, abs=0.05)  # the plan holds the predicted tensors
    assert doc["command"][-3:] == [str(model.files[0]), str(tmp_path / "o.gguf"), "Q8_0"]
