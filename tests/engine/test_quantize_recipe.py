"""`moetune quantize` with the real llama-quantize of both engines: a generated f16 model, a recipe
that mixes types per layer (and types that fall back on rows of 128), the predicted type and bytes
of every tensor equal to what the written file holds, as moetune's reader and the file's own layout
say; `plan --recipe` of the source plans exactly what `plan` of the written file does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.model.archs import Dims
from moetune.model.gguf_read import read_gguf
from moetune.model.testmodel import generate
from tests.helpers import run_cli

pytestmark = pytest.mark.slow

RECIPES = {
    "llama.cpp": """
default: q8_0
rules:
  - {role: expert, layers: 0-1, type: q6_k}          # q6_k falls back to q8_0 on ffn_down_exps' rows of 128
  - {kind: ffn_down_exps, layers: 2-, type: q4_0}
  - {role: expert, layers: 2-, type: q4_k}
  - {kind: [token_embd, output], type: q5_k}
""",
    "ik_llama.cpp": """
default: iq4_ks
rules:
  - {role: expert, layers: 0-1, type: iq6_k}         # the hot layers' experts
  - {kind: ffn_down_exps, layers: 2-, type: iq4_ks}
  - {role: expert, layers: 2-, type: iq3_ks}         # the CPU layers' experts
  - {role: attention, type: q8_0}
  - {kind: output, type: q8_0_r8}                    # 259 rows: not interleaved, plain q8_0
""",
}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("quantize")
    return generate(d / "src.gguf", "qwen3moe", Dims(n_layer=4, n_ff_exp=128), "f16").files[0]


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_the_prediction_is_the_written_file_to_the_byte(
    source: Path, tmp_path: Path, engine: str, bin_dir: Path, ik_bin_dir: Path
) -> None:
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(RECIPES[engine])
    out = tmp_path / "out.gguf"
    dry = run_cli("quantize", str(source), "--recipe", str(recipe), "-o", str(out), "--engine", engine, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert "llama-quantize" in dry.stdout and not out.exists()
    r = run_cli(
        "quantize", str(source), "--recipe", str(recipe), "-o", str(out), "--engine", engine, "--threads", "1", "--json"
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["written"]["matches_prediction"], doc["written"]["mismatches"]
    predicted = {t["name"]: (t["type"], t["bytes"]) for t in doc["tensors"]}
    f = read_gguf(out)
    assert {t.name: (t.qtype.name, t.nbytes) for t in f.tensors} == predicted
    assert len({ty for ty, _ in predicted.values()}) >= 5  # the recipe did mix types
    assert any(t["fallback"] for t in doc["tensors"])
    # the data region holds exactly the predicted tensors, each padded to the alignment
    assert f.file_size - f.data_offset == sum(-(-n // f.alignment) * f.alignment for _, n in predicted.values())
    assert doc["bytes"] == sum(n for _, n in predicted.values())


def test_plan_recipe_plans_what_the_written_file_plans(source: Path, tmp_path: Path, bin_dir: Path) -> None:
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(RECIPES["llama.cpp"])
    src = tmp_path / "src.gguf"
    src.symlink_to(source)
    before = run_cli("plan", str(src), "--recipe", str(recipe), "--hw", "rtx-pro-6000", "--json")
    assert before.exit_code == 0, before.stderr
    assert "not written yet" in before.stderr
    q = run_cli("quantize", str(src), "--recipe", str(recipe), "--threads", "1")  # the default output name
    assert q.exit_code == 0, q.stderr
    after = run_cli("plan", str(tmp_path / "src-mix.gguf"), "--hw", "rtx-pro-6000", "--json")
    a, b = json.loads(before.stdout), json.loads(after.stdout)
    assert a["devices"] == b["devices"] and a["argv"] == b["argv"] and a["predicted"] == b["predicted"]


def test_a_type_the_engine_lacks_exits_2_with_the_fix(source: Path, tmp_path: Path) -> None:
    recipe = tmp_path / "ik.yaml"
    recipe.write_text(RECIPES["ik_llama.cpp"])
    r = run_cli("quantize", str(source), "--recipe", str(recipe), "--engine", "llama.cpp", "--dry-run")
    assert r.exit_code == 2
    assert "iq4_ks is not one llama.cpp has" in r.stderr and "--engine ik_llama.cpp" in r.stderr


def test_progress_follows_the_quantizers_tensor_lines(source: Path, tmp_path: Path, bin_dir: Path) -> None:
    from moetune.run.quantize import run_quantize

    recipe = tmp_path / "mix.yaml"
    recipe.write_text(RECIPES["llama.cpp"])
    dry = run_cli(
        "quantize", str(source), "--recipe", str(recipe), "-o", str(tmp_path / "o.gguf"), "--dry-run", "--json"
    )
    doc = json.loads(dry.stdout)
    seen: list[tuple[int, int, str]] = []
    run_quantize(doc["command"], tmp_path / "q.log", lambda i, n, name: seen.append((i, n, name)))
    assert [i for i, _, _ in seen] == list(range(1, len(doc["tensors"]) + 1))
    assert {name for _, _, name in seen} == {t["name"] for t in doc["tensors"]}


def test_an_imatrix_lets_the_2_bit_types_through(source: Path, tmp_path: Path, bin_dir: Path) -> None:
    import subprocess

    recipe = tmp_path / "two-bit.yaml"
    recipe.write_text("default: q8_0\nrules:\n  - {kind: [ffn_up_exps, ffn_gate_exps], type: iq2_xxs}\n")
    out = tmp_path / "o.gguf"
    refused = run_cli("quantize", str(source), "--recipe", str(recipe), "-o", str(out))
    assert refused.exit_code == 2 and "--imatrix" in refused.stderr and not out.exists()
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 60)
    imatrix = tmp_path / "imatrix.gguf"
    subprocess.run(
        [
            str(bin_dir / "llama-imatrix"),
            "-m",
            str(source),
            "-f",
            str(text),
            "-c",
            "128",
            "--chunks",
            "2",
            "-o",
            str(imatrix),
            "-t",
            "1",
            "-nr",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    r = run_cli(
        "quantize",
        str(source),
        "--recipe",
        str(recipe),
        "-o",
        str(out),
        "--imatrix",
        str(imatrix),
        "--threads",
        "1",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["written"]["matches_prediction"] and "--imatrix" in doc["command"]
    assert {t.qtype.name for t in read_gguf(out).tensors if "_exps" in t.name and "down" not in t.name} == {"IQ2_XXS"}
