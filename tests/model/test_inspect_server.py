"""The inspector against what the real llama-server allocates, for every generated architecture:
total tensor bytes vs the model buffer it logs (with -lm none, so the CPU buffer holds exactly the
loaded tensors), and KV bytes at a context (full and sliding-window layers' caches; plus recurrent
state per sequence) vs its KV and RS buffers, for f16 and q8_0 caches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.engine.logs import parse_log
from moetune.model.archs import ARCHS as ARCHS_ALL
from moetune.model.archs import small_dims
from moetune.model.testmodel import generate
from tests.engine_harness import reserve_log
from tests.helpers import run_cli

pytestmark = pytest.mark.server

ARCHS = {arch: small_dims(arch) for arch in ARCHS_ALL}
CTX = 4096


@pytest.mark.parametrize("arch", list(ARCHS))
def test_inspector_matches_llama_server(arch: str, bin_dir: Path, tmp_path: Path) -> None:
    g = generate(tmp_path / f"{arch}.gguf", arch, ARCHS[arch], "f16")
    for ct in ("f16", "q8_0"):
        r = run_cli("inspect", str(g.files[0]), "--json", "--ctx", str(CTX), "--ctk", ct)
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        # -nr: CPU weight repacking crashes on this machine's CPU (DESIGN.md section 5)
        ok, log = reserve_log(
            bin_dir / "llama-server",
            [
                "-m",
                str(g.files[0]),
                "-nr",
                "-lm",
                "none",
                "-c",
                str(CTX),
                "--parallel",
                "1",
                "-ctk",
                ct,
                "-ctv",
                ct,
                "-lv",
                "4",
                "-fit",
                "off",
            ],
        )
        assert ok, log[-2000:]
        bufs = parse_log(log).device_buffers()["CPU"]
        # mainline loads everything but the NextN blocks (and, for glm-dsa, their expert bias)
        assert bufs.model_mib * (1 << 20) == pytest.approx(doc["loaded_bytes"], rel=0.001, abs=4096)
        # sliding-window layers (gpt-oss) keep a cache of about a window, the others one of the context
        at = doc["kv_at"]
        assert bufs.kv_mib * (1 << 20) == pytest.approx(at["total_bytes"], rel=0.01)
        assert at["full_bytes"] == doc["kv_bytes_per_token_full"][ct] * CTX
        if doc["sliding_window"]:
            assert at["swa_cells"] < CTX and at["swa_bytes"] == doc["kv_bytes_per_token_swa"][ct] * at["swa_cells"]
        else:
            assert at["total_bytes"] == doc["kv_bytes_per_token"][ct] * CTX
        if doc["rs_bytes_per_seq"]:
            assert bufs.rs_mib * (1 << 20) == pytest.approx(doc["rs_bytes_per_seq"], rel=0.01)
    assert doc["n_layer"] == len(doc["layers"])
    assert {layer["kind"] for layer in doc["layers"]} <= {"dense", "moe", "nextn"}
    assert doc["expert_bytes"] + doc["other_bytes"] == doc["total_bytes"]


def test_glm51_replica_inspect(tmp_path: Path) -> None:
    """The 8-shard sparse GLM-5.1-sized replica: 75 MoE layers with the writer's expert sizes."""
    r = run_cli(
        "testmodel", str(tmp_path / "GLM-5.1.gguf"), "--preset", "glm-5.1", "--shards", "8", "--sparse", "--json"
    )
    assert r.exit_code == 0, r.stderr
    made = json.loads(r.stdout)
    assert len(made["files"]) == 8 and made["disk_bytes"] < 64 << 20
    r = run_cli("inspect", made["files"][5], "--json")
    doc = json.loads(r.stdout)
    assert len(doc["files"]) == 8
    moe = [layer for layer in doc["layers"] if layer["kind"] == "moe"]
    assert len(moe) == 75 and doc["n_expert"] == 256 and doc["n_expert_used"] == 8
    for layer in moe:
        assert layer["experts"]["ffn_gate_exps"] == {"type": "IQ3_KS", "bytes": 1225 << 20}
        assert layer["experts"]["ffn_up_exps"] == {"type": "IQ3_KS", "bytes": 1225 << 20}
        assert layer["experts"]["ffn_down_exps"] == {"type": "IQ4_KS", "bytes": 1638 << 20}
    assert doc["total_bytes"] == made["tensor_bytes"]
    # ik_llama.cpp's KV for the reference's 32k q8_0 cache: 1491.79 MiB (reference 000)
    assert doc["kv_bytes_per_token_by_engine"]["ik_llama.cpp"]["q8_0"] * 32768 / (1 << 20) == pytest.approx(
        1491.79, rel=1e-3
    )


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_architecture_generates_with_thinking_on_and_off(arch: str, bin_dir: Path, tmp_path: Path) -> None:
    import httpx

    from tests.helpers import llama_server

    g = generate(tmp_path / f"{arch}.gguf", arch, ARCHS[arch], "q8_0" if arch == "qwen3moe" else "f16")
    # -nr: CPU weight repacking crashes on this machine's CPU (DESIGN.md section 5)
    with llama_server(bin_dir, g.files[0], tmp_path / "server.log", "-nr", "-c", "512", "--parallel", "1") as srv:
        got = {}
        for thinking in (True, False):
            # ignore_eos: exactly 8 tokens whatever the random weights say (one could be end of text);
            # greedy sampling: the same tokens every run
            body = {
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
                "ignore_eos": True,
                "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": thinking},
            }
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()
            assert r["usage"]["completion_tokens"] == 8 and r["timings"]["predicted_n"] == 8
            got[thinking] = r["choices"][0]["message"]
    # random weights never close the <think> block: with thinking on everything is reasoning
    assert got[True].get("reasoning_content") and not got[True].get("content")
    assert got[False].get("content") and not got[False].get("reasoning_content")
