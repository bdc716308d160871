"""Context checkpoints in the ledger against the real llama-server: a generated hybrid model
(qwen35moe, with a delta-net state of about 1 MiB per sequence) and a sliding-window one (gpt-oss),
served with the plan's own command; a prompt longer than a ubatch makes the server checkpoint it
("created context checkpoint N of M (... size = X MiB)"), and the ledger's size of one checkpoint
is that within 1%. On the hybrid model a second request that extends the first restores one (its
delta-net state has moved on by the generated tokens), which `doctor` counts."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from moetune.engine.command import service_argv
from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict
from moetune.model.archs import small_dims, with_overrides
from moetune.model.kv import checkpoint_bytes, kv_shape
from moetune.model.profile import load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from tests.engine_harness import strip_endpoint
from tests.helpers import llama_server, loopback_hw, run_cli

pytestmark = pytest.mark.server

MIB = 1 << 20
PROMPT = "hello world " * 250  # 4,000 tokens of the byte vocabulary: past a ubatch and the window


def _complete(url: str, prompt: str) -> None:
    r = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": 2, "cache_prompt": True}, timeout=120)
    assert r.status_code == 200, r.text[:500]


@pytest.mark.parametrize(("arch", "par"), [("qwen35moe", 1), ("qwen35moe", 2), ("gpt-oss", 1), ("gpt-oss", 2)])
def test_checkpoint_size_matches_llama_server(bin_dir: Path, tmp_path: Path, arch: str, par: int) -> None:
    dims = small_dims(arch)
    if arch == "qwen35moe":
        dims = with_overrides(dims, ssm_dt_rank=8)  # 8 value heads: a state large against the log's 0.001 MiB
    p = load_profile(generate(tmp_path / f"{arch}.gguf", arch, dims, "f16").files[0])
    s = Settings(ctx=8192 * par, slots=par, ubatch=256, ctx_checkpoints=4)
    sp = make_plan([ServiceSpec(name="t", model=p, settings=s, strategy="cpu-moe")], from_dict(loopback_hw([]))).main
    ckpt = next(i for i in sp.memory.items["CPU"] if i.what == "checkpoints")
    each = checkpoint_bytes(kv_shape(p), s.engine, tokens_per_slot=s.ctx // par, streams=par) / MIB
    assert ckpt.mib == pytest.approx(par * 4 * each)
    argv = strip_endpoint(service_argv(sp))
    assert argv[argv.index("--ctx-checkpoints") + 1] == "4"
    log = tmp_path / "server.log"
    with llama_server(bin_dir, p.files[0], log, *argv[2:], "-lv", "4") as srv:
        _complete(srv.url, PROMPT)
        _complete(srv.url, PROMPT + " and then some more words")
    parsed = parse_log(log.read_text())
    assert parsed.checkpoints_created, log.read_text()[-3000:]
    for c in parsed.checkpoints_created:
        assert c.size_mib == pytest.approx(each, rel=0.01), (c, each)
        assert c.index is not None and c.index <= 4
    if arch == "gpt-oss":  # the window's cells are still cached past the first prompt: nothing to restore
        return
    assert parsed.checkpoint_restores and parsed.checkpoint_restores[0].n_past
    r = run_cli("doctor", str(log), "--json")
    assert r.exit_code == 0, r.stderr
    found = {f["code"]: f for f in json.loads(r.stdout)}
    data = found["checkpoint_restores"]["data"]
    assert data["restores"] == len(parsed.checkpoint_restores) and data["tokens_kept"] >= 3000
    assert data["checkpoint_mib"] == pytest.approx(each, rel=0.01)
