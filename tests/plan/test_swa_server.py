"""Sliding-window KV in the ledger against the real llama-server, on generated gpt-oss models
(even layers on a 128-token window): the two caches ``llama_kv_cache_iswa`` logs (full-attention
layers, then windowed ones: cells and MiB), the KV buffer on every device, and the model buffers,
at contexts below and above window + ubatch, --parallel 1 and 4, CPU only and with a loopback RPC
device, and with --swa-full."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from moetune.engine.command import service_argv
from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict
from moetune.model.archs import small_dims
from moetune.model.kv import kv_shape
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from tests.engine_harness import reserve_log, strip_endpoint
from tests.helpers import loopback_hw, rpc_workers

pytestmark = pytest.mark.server

MIB = 1 << 20
_CACHE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\)")

# (wide, ctx, ubatch, parallel, cache type, strategy, rpc devices, swa_full)
CASES = [
    (False, 4096, 512, 1, "f16", "cpu-moe", 0, False),
    (False, 256, 512, 1, "f16", "cpu-moe", 0, False),  # below window + ubatch: both caches the context's
    (True, 8192, 256, 4, "q8_0", "cpu-moe", 1, False),
    (False, 4096, 512, 4, "f16", "all-gpu", 1, False),
    (False, 1024, 512, 4, "q8_0", "all-gpu", 1, False),  # per slot 256 cells: below the window's 640
    (True, 2048, 128, 1, "q8_0", "n-cpu-moe:2", 1, False),
    (False, 4096, 512, 1, "f16", "all-gpu", 1, True),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, ModelProfile]:
    d = tmp_path_factory.mktemp("swa-models")
    return {wide: load_profile(generate(d / f"gpt-oss-{int(wide)}.gguf", "gpt-oss", small_dims("gpt-oss", wide),
                                        "f16").files[0]) for wide in (False, True)}


@pytest.fixture
def workers(bin_dir: Path) -> Iterator[list[str]]:
    with rpc_workers(bin_dir, 1) as ends:
        yield ends


@pytest.mark.parametrize(("wide", "ctx", "ub", "par", "ct", "strategy", "n_rpc", "swa_full"), CASES,
                         ids=[f"{'w-' if c[0] else ''}c{c[1]}-ub{c[2]}-np{c[3]}-{c[4]}-{c[5]}-rpc{c[6]}"
                              f"{'-swafull' if c[7] else ''}" for c in CASES])
def test_swa_kv_matches_llama_server(bin_dir: Path, workers: list[str], models: dict[bool, ModelProfile], wide: bool,
                                     ctx: int, ub: int, par: int, ct: str, strategy: str, n_rpc: int,
                                     swa_full: bool) -> None:
    p = models[wide]
    hw = from_dict(loopback_hw(workers[:n_rpc]))
    s = Settings(ctx=ctx, ubatch=ub, batch=max(ub, 2048), ctk=ct, ctv=ct, slots=par, swa_full=swa_full)
    sp = make_plan([ServiceSpec("t", p, s, strategy)], hw).main
    argv = strip_endpoint(service_argv(sp))
    assert ("--swa-full" in argv) == swa_full
    ok, log = reserve_log(bin_dir / "llama-server", [*argv, "-lv", "4"], timeout=60)
    assert ok, log[-2000:]
    caches = _CACHE.findall(log)
    assert len(caches) == 2, log[-2000:]
    kv = kv_shape(p)
    n_layer = len(kv.layers)
    full_b, swa_b = kv.bytes_per_token_split(ct, ct)
    streams = int(caches[0][4])
    for (size_mib, cells, layers, _, _), want_cells, per_tok in zip(
            caches, (sp.memory.kv_cells, sp.memory.swa_cells), (full_b, swa_b), strict=True):
        assert int(cells) * streams == want_cells and int(layers) == n_layer // 2
        assert float(size_mib) == pytest.approx(per_tok * want_cells / MIB, abs=0.01)
    if not swa_full and ctx // par > 128 + ub:
        assert sp.memory.swa_cells < sp.memory.kv_cells
    parsed = parse_log(log).device_buffers()
    items = {(d, i.what): i.mib for d, its in sp.memory.items.items() for i in its}
    for dev in [d.name for d in hw.accelerators()] + ["CPU"]:
        got = parsed.get(dev)
        assert (got.kv_mib if got else 0.0) == pytest.approx(items.get((dev, "kv"), 0.0), rel=0.01, abs=0.01), dev
        if dev != "CPU":
            assert got is not None
            assert got.model_mib == pytest.approx(items.get((dev, "weights"), 0.0), rel=0.005, abs=0.02), dev
