"""The ledger against llama-fit-params on sparse replicas of the published models, at full size.

A few points of benchmarks/bench_fullscale.py's grid (which writes the whole table): the layers on
one loopback RPC device with every expert on the CPU, at the ubatch and context sizes where the
compute buffer is several GiB and decides the fit. Model within 0.5%, KV within 1%, the device's
compute within 10%, the host's within 10% here (the GQA, hybrid and DSA families).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from moetune.engine.argv import strip_flags
from moetune.engine.command import service_argv
from moetune.hardware.inventory import from_dict
from moetune.model.archs import PRESETS, mainline_recipe
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.run.verify import ledger_figures, mainline_figures
from tests.helpers import loopback_hw, rpc_workers

pytestmark = pytest.mark.server

# (preset, ctx, ubatch, cache, flash attention)
CASES = [
    ("qwen3-235b-a22b", 32768, 8192, "f16", True),
    ("qwen3-coder-480b-a35b", 131072, 2048, "q8_0", True),
    ("glm-4.6", 32768, 2048, "f16", False),
    ("qwen3.5-397b-a17b", 131072, 8192, "q8_0", True),
    ("qwen3-coder-next", 32768, 512, "f16", True),
    ("glm-5.1", 131072, 2048, "f16", True),  # DSA indexer: its scores and every layer's top-k scratch
    ("glm-5.1", 4096, 512, "q8_0", True),  # the logits on top of that scratch
]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelProfile]:
    d = tmp_path_factory.mktemp("fullscale")
    out = {}
    for name in dict.fromkeys(c[0] for c in CASES):
        arch, dims = PRESETS[name]
        out[name] = load_profile(generate(d / f"{name}.gguf", arch, dims, mainline_recipe(name), shards=2, sparse=True).files[0])
    return out


@pytest.fixture(scope="module")
def worker(bin_dir: Path) -> Iterator[list[str]]:
    with rpc_workers(bin_dir, 1) as ends:
        yield ends


@pytest.mark.parametrize(("preset", "ctx", "ub", "cache", "fa"), CASES, ids=[f"{c[0]}-c{c[1]}-ub{c[2]}-{c[3]}-fa{int(c[4])}" for c in CASES])
def test_ledger_matches_llama_fit_params_at_full_scale(bin_dir: Path, worker: list[str], replicas: dict[str, ModelProfile],
                                                        preset: str, ctx: int, ub: int, cache: str, fa: bool) -> None:
    hw = from_dict(loopback_hw(worker, mem_mib=1e7, cpu_ram_mib=1e8))
    s = Settings(ctx=ctx, ubatch=ub, batch=max(ub, 2048), ctk=cache, ctv=cache if fa else "f16", flash_attn=fa)
    sp = make_plan([ServiceSpec("t", replicas[preset], s, "cpu-moe")], hw).main
    r = subprocess.run([str(bin_dir / "llama-fit-params"), *strip_flags(service_argv(sp)), "-lv", "4"],
                       capture_output=True, text=True, timeout=120)
    theirs = {f.device: f for f in mainline_figures(r.stdout + r.stderr, {v: k for k, v in sp.hw.engine_names().items()})}
    assert theirs, (r.stdout + r.stderr)[-2000:]
    for ours in ledger_figures(sp):
        e = theirs[ours.device]
        assert ours.model_mib == pytest.approx(e.model_mib, rel=0.005, abs=1), ours.device
        assert ours.context_mib == pytest.approx(e.context_mib, rel=0.01, abs=1), ours.device
        assert ours.compute_mib == pytest.approx(e.compute_mib, rel=0.10, abs=1), ours.device
