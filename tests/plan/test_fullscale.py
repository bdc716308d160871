"""The ledger against llama-fit-params on sparse replicas of the published models, at full size.

A few points of benchmarks/bench_fullscale.py's grid (which writes the whole table): the layers on
one loopback RPC device with every expert on the CPU, at the ubatch and context sizes where the
compute buffer is several GiB and decides the fit. Model within 0.5%, KV within 1%, every device's
compute within 10% (the replay is within 2.5% on the whole grid). llama-fit-params reserves the
logits of every ubatch token, so the plan's dry-run compute figures are compared; llama-server
reserves one per slot, and one full-size point checks the plan's own figures against it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from moetune.engine.argv import strip_flags
from moetune.engine.command import service_argv
from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict
from moetune.model.archs import PRESETS, mainline_recipe
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.run.verify import ledger_figures, mainline_figures
from tests.engine_harness import reserve_log, strip_endpoint
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
    ("gpt-oss-120b", 32768, 512, "f16", True),  # sliding window: 18 layers' cache of 768 cells
    ("gpt-oss-120b", 131072, 2048, "q8_0", True),
    ("gpt-oss-120b", 8192, 512, "f16", False),  # without flash attention: the windowed layers' own scores
]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelProfile]:
    d = tmp_path_factory.mktemp("fullscale")
    out = {}
    for name in dict.fromkeys(c[0] for c in CASES):
        arch, dims = PRESETS[name]
        out[name] = load_profile(
            generate(d / f"{name}.gguf", arch, dims, mainline_recipe(name), shards=2, sparse=True).files[0]
        )
    return out


@pytest.fixture(scope="module")
def worker(bin_dir: Path) -> Iterator[list[str]]:
    with rpc_workers(bin_dir, 1) as ends:
        yield ends


@pytest.mark.parametrize(
    ("preset", "ctx", "ub", "cache", "fa"), CASES, ids=[f"{c[0]}-c{c[1]}-ub{c[2]}-{c[3]}-fa{int(c[4])}" for c in CASES]
)
def test_ledger_matches_llama_fit_params_at_full_scale(
    bin_dir: Path,
    worker: list[str],
    replicas: dict[str, ModelProfile],
    preset: str,
    ctx: int,
    ub: int,
    cache: str,
    fa: bool,
) -> None:
    hw = from_dict(loopback_hw(worker, mem_mib=1e7, cpu_ram_mib=1e8))
    # repack=False: mainline's default would copy the CPU experts into a CPU_REPACK buffer (41 GiB
    # here, refused: the sparse replica's weights only fit as a mapping)
    s = Settings(
        ctx=ctx, ubatch=ub, batch=max(ub, 2048), ctk=cache, ctv=cache if fa else "f16", flash_attn=fa, repack=False
    )
    sp = make_plan([ServiceSpec(name="t", model=replicas[preset], settings=s, strategy="cpu-moe")], hw).main
    r = subprocess.run(
        [str(bin_dir / "llama-fit-params"), *strip_flags(service_argv(sp)), "-lv", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    theirs = {
        f.device: f for f in mainline_figures(r.stdout + r.stderr, {v: k for k, v in sp.hw.engine_names().items()})
    }
    assert theirs, (r.stdout + r.stderr)[-2000:]
    for ours in ledger_figures(sp, dry_run=True):
        e = theirs[ours.device]
        assert ours.model_mib == pytest.approx(e.model_mib, rel=0.005, abs=1), ours.device
        assert ours.context_mib == pytest.approx(e.context_mib, rel=0.01, abs=1), ours.device
        assert ours.compute_mib == pytest.approx(e.compute_mib, rel=0.10, abs=1), ours.device


def test_ledger_matches_llama_servers_own_reserve_at_full_scale(bin_dir: Path, tmp_path: Path) -> None:
    """Two devices, four slots: the output rows of the server's reserve (one per slot, not the
    ubatch's 2048) decide the last device's buffer."""
    arch, dims = PRESETS["qwen3-coder-next"]
    p = load_profile(
        generate(tmp_path / "next.gguf", arch, dims, mainline_recipe("qwen3-coder-next"), shards=2, sparse=True).files[
            0
        ]
    )
    with rpc_workers(bin_dir, 2) as ends:
        s = Settings(ctx=65536, ubatch=2048, ctk="f16", ctv="f16", slots=4, repack=False)
        sp = make_plan(
            [ServiceSpec(name="t", model=p, settings=s, strategy="cpu-moe")],
            from_dict(loopback_hw(ends, mem_mib=1e7, cpu_ram_mib=1e8)),
        ).main
        ok, log = reserve_log(bin_dir / "llama-server", [*strip_endpoint(service_argv(sp)), "-lv", "4"], timeout=300)
    assert ok, log[-2000:]
    theirs = parse_log(log).device_buffers()
    ours = {dev: sum(i.mib for i in items if i.what == "compute") for dev, items in sp.memory.items.items()}
    for dev, mib in ours.items():
        assert mib == pytest.approx(theirs[dev].compute_mib, rel=0.10), dev
    out = sp.placement.output_device  # the logits of 4 tokens, not of 2048 as llama-fit-params reserves
    assert ours[out] < 0.5 * sp.memory.dry_run_compute_mib[out]
