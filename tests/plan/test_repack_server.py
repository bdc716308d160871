"""The ledger's repack line against the real llama-server: with repacking on (mainline's default),
the CPU-resident weights of the types this CPU has interleaved kernels for move into the
CPU_REPACK (and, on a CPU with AMX, AMX) buffer, and the rest stay in the mapped file. Both
buffers are logged before the weights are read, so the check holds even where the engine then
crashes while repacking (an AVX-512 CPU with AMX: tests/run/test_repack_crash.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.engine.command import service_argv
from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict
from moetune.hardware.probe import parse_isa
from moetune.model.archs import small_dims
from moetune.model.profile import load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.repack import Repacked
from moetune.plan.settings import Settings
from tests.engine_harness import reserve_log, strip_endpoint

ISA = parse_isa(Path("/proc/cpuinfo").read_text()) or ()
# (type recipe, wide: rows of 512 for the k-quants)
CASES = [("q4_0", False), ("mxfp4", False), ("ffn_up_exps=q4_0,ffn_down_exps=q4_k,other=q8_0", True)]


@pytest.mark.parametrize(("types", "wide"), CASES, ids=[c[0].split(",")[0] for c in CASES])
def test_repack_buffer_matches_llama_server(bin_dir: Path, tmp_path: Path, types: str, wide: bool) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", wide), types).files[0]
    p = load_profile(model)
    hw = from_dict(
        {"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20, "isa": list(ISA)}}]}
    )
    sp = make_plan([ServiceSpec(name="t", model=p, settings=Settings(ctx=1024, repack=None), strategy="auto")], hw).main
    argv = strip_endpoint(service_argv(sp))
    assert "-nr" not in argv  # the engine's default, said by saying nothing
    _, log = reserve_log(bin_dir / "llama-server", [*argv, "-lv", "4"], timeout=60)
    buffers = parse_log(log).device_buffers()
    logged = sum(b.model_mib for d, b in buffers.items() if d in ("CPU_REPACK", "AMX"))
    items = {i.what: i.mib for i in sp.memory.items["CPU"]}
    assert logged > 0, log[-2000:]
    assert items["repack"] == pytest.approx(logged, rel=0.005, abs=0.01)
    mapped = buffers["CPU_Mapped"].model_mib
    assert sum(sp.memory.mapped_span_mib.values()) == pytest.approx(mapped, rel=0.005, abs=0.01)
    assert items["weights"] < mapped  # the repacked weights left the plain weights' line


def test_nothing_is_repacked_off_or_beside_a_cuda_gpu(tmp_path: Path) -> None:
    p = load_profile(
        generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "q4_0", sparse=True).files[0]
    )
    cpu = {"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}}
    gpu = {**cpu, "devices": [{"name": "CUDA0", "mem_mib": 24000, "bw_gbs": 900}]}

    def repack_mib(node: dict[str, object], s: Settings) -> float:
        sp = make_plan(
            [ServiceSpec(name="t", model=p, settings=s, strategy="cpu-moe")], from_dict({"nodes": [node]})
        ).main
        return sum(i.mib for i in sp.memory.items["CPU"] if i.what == "repack")

    assert repack_mib(cpu, Settings()) > 0  # mainline's default, AVX2 assumed
    assert repack_mib(cpu, Settings(repack=False)) == 0
    assert repack_mib(gpu, Settings()) == 0  # CUDA_Host comes before the repack buffers
    assert Repacked().nbytes == 0
