"""`moetune quality` with the real llama-perplexity on generated models: a pure placement change
(the same f16 GGUF and cache, CPU only vs everything on a loopback RPC device) against a q8_0 KV
cache and a q4_0 quant of the same model, ordered as they should be.

Measured (llama.cpp build 11434, qwen3moe small f16, -c 128, 8 chunks, 504 scored tokens): the
placement change gives KLD 0.000000 and top-1 agreement 100 %; q8_0 KV 0.000006 and 99.8 %; q4_0
0.0018 and 92 %. The tolerances below leave a factor of ten around those."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from tests.engine_harness import free_port, loopback_hw
from tests.helpers import run_cli

pytestmark = pytest.mark.server


def _plan(tmp_path: Path, model: Path, hw: dict[str, object], name: str, *extra: str) -> Path:
    hw_path = tmp_path / f"hw-{name}.yaml"
    hw_path.write_text(yaml.safe_dump(hw))
    out = tmp_path / f"{name}.json"
    r = run_cli(
        "plan", str(model), "--hw", str(hw_path), "--strategy", "all-gpu", "--ctx", "1024", "-o", str(out), *extra
    )
    assert r.exit_code == 0, r.stderr
    return out


def test_placement_cache_and_quant_ordered(bin_dir: Path, tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0]
    q4 = tmp_path / "m-q4.gguf"
    subprocess.run([str(bin_dir / "llama-quantize"), str(model), str(q4), "q4_0"], check=True, capture_output=True)
    cpu = loopback_hw([])
    f16 = ("--ctk", "f16", "--ctv", "f16")  # given: left open, a CPU plan may pick a q8_0 cache
    plans = [
        _plan(tmp_path, model, cpu, "ref", *f16),
        _plan(tmp_path, model, loopback_hw([f"127.0.0.1:{free_port()}"]), "rpc", *f16),
        _plan(tmp_path, model, cpu, "kv8", "--ctk", "q8_0", "--ctv", "q8_0"),
        _plan(tmp_path, q4, cpu, "q4", *f16),
    ]
    args = ["quality", *map(str, plans), "--ctx", "128", "--chunks", "8", "--json"]
    r = run_cli(*args)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "reference logits: at most" in r.stderr and "RPC workers up: rpc0" in r.stderr
    assert doc["reference"]["logits"]["reused"] is False and doc["reference"]["ppl"]["mean"] > 1
    c = {Path(x["plan"]).stem: x for x in doc["candidates"]}
    assert set(c["rpc"]) >= {"plan", "kld", "top1_agree", "ppl", "tokens", "verdict"}
    assert set(c["rpc"]["kld"]) >= {"mean", "ci_low", "ci_high", "p99"}
    assert c["rpc"]["tokens"] == 8 * 63
    # a pure placement change: the same numbers
    assert abs(c["rpc"]["kld"]["mean"]) <= 1e-5 and c["rpc"]["top1_agree"]["mean"] >= 0.999
    assert c["rpc"]["verdict"] == "same"
    # a q8_0 KV cache: small; a 4-bit quant: clearly larger
    assert c["kv8"]["kld"]["mean"] < 1e-4 and c["kv8"]["top1_agree"]["mean"] > 0.98
    assert c["q4"]["kld"]["mean"] > 5e-4 and c["q4"]["kld"]["mean"] > 20 * max(c["kv8"]["kld"]["mean"], 1e-6)
    assert c["q4"]["kld"]["ci_low"] > c["kv8"]["kld"]["ci_high"]
    assert c["rpc"]["top1_agree"]["mean"] >= c["kv8"]["top1_agree"]["mean"] > c["q4"]["top1_agree"]["mean"]
    # the reference's logits are reused by the next command
    r2 = run_cli("quality", str(plans[0]), str(plans[3]), "--ctx", "128", "--chunks", "8", "--json")
    assert r2.exit_code == 0, r2.stderr
    doc2 = json.loads(r2.stdout)
    assert doc2["reference"]["logits"]["reused"] is True
    assert doc2["candidates"][0]["kld"]["mean"] == pytest.approx(c["q4"]["kld"]["mean"], rel=0.05)
    # compare reads the runs' per-chunk metrics
    r3 = run_cli("compare", str(c["kv8"]["run"]), str(c["q4"]["run"]), "--json")
    assert r3.exit_code == 0, r3.stderr
    assert {row["metric"] for row in json.loads(r3.stdout)["rows"]} >= {"kld", "top1_agree", "ppl"}
    # and so does the HTML report
    page = tmp_path / "r.html"
    r4 = run_cli("report", str(c["kv8"]["run"]), str(c["q4"]["run"]), "-o", str(page))
    assert r4.exit_code == 0, r4.stderr
    assert "top1_agree" in page.read_text() and "kld" in page.read_text()


def test_text_too_short_is_an_input_error(bin_dir: Path, tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0]
    p = _plan(tmp_path, model, loopback_hw([]), "a")
    text = tmp_path / "t.txt"
    text.write_text("short text")
    r = run_cli("quality", str(p), str(p), "--text", str(text))
    assert r.exit_code == 2 and "--ctx" in r.stderr


def test_ik_llama_cpp_plans(ik_bin_dir: Path, bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0]
    q4 = tmp_path / "m-q4.gguf"
    subprocess.run([str(ik_bin_dir / "llama-quantize"), str(model), str(q4), "q4_0"], check=True, capture_output=True)
    cpu = loopback_hw([])
    ref = _plan(tmp_path, model, cpu, "ref", "--engine", "ik_llama.cpp")
    cand = _plan(tmp_path, q4, cpu, "q4", "--engine", "ik_llama.cpp")
    # a relative --db (as `make demo` gives it): the logits file beside it, though the engine runs
    # in a scratch directory
    monkeypatch.chdir(tmp_path)
    r = run_cli("quality", str(ref), str(cand), "--ctx", "128", "--chunks", "6", "--json", "--db", "history.db")
    assert r.exit_code == 0, r.stderr
    assert len(list((tmp_path / "quality-logits").glob("*.kld"))) == 1
    (c,) = json.loads(r.stdout)["candidates"]
    assert c["complete"] and c["kld"]["mean"] > 5e-4 and c["kld"]["p99"] > c["kld"]["mean"]
    assert 0.5 < c["top1_agree"]["mean"] < 0.999 and c["tokens"] == 6 * 63
