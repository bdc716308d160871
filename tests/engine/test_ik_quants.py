"""Real ik_llama.cpp quant types: generated models quantized by ik's own llama-quantize to IQ3_KS,
IQ4_KS, IQ4_K and the trellis IQ4_KT; `inspect` reads every tensor's type and size from the file,
and the plan's weights per device equal the ik server's model buffers (to the 0.01 MiB it prints).
Generated replicas written directly in ik types (`testmodel` with an ik recipe) load in ik too."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from moetune.engine.command import service_argv
from moetune.engine.facts import EngineFacts, probe
from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict
from moetune.kinds import EngineKind
from moetune.model.archs import Dims, small_dims
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.run.verify import IK_RESERVED
from tests.engine_harness import reserve_log, strip_endpoint
from tests.helpers import loopback_hw, rpc_workers

pytestmark = pytest.mark.server

ENGINE = "ik-test"
# the quantizer's per-tensor line: "[   5/  51]  blk.0.ffn_up_exps.weight - [  512,   256,    16,     1], type =    f16,
# converting to iq3_ks .. size =     4.00 MiB ->     0.86 MiB"
_QLINE = re.compile(r"\]\s+(\S+) - \[.*type = +(\w+),(?: converting to (\w+))?")


@pytest.fixture(scope="module")
def quantized(ik_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    d = tmp_path_factory.mktemp("ik-quants")
    src = generate(d / "f16.gguf", "glm4moe", small_dims("glm4moe", True), "f16").files[0]
    small = generate(
        d / "f16-small.gguf",
        "qwen3moe",
        Dims(n_layer=2, n_embd=256, n_ff_exp=256, n_ff=512, n_expert=4, n_expert_used=2),
        "f16",
    ).files[0]
    out = {}
    for qt in ("IQ3_KS", "IQ4_KS", "IQ4_K", "IQ4_KT"):
        dst = d / f"{qt}.gguf"
        r = subprocess.run(
            [str(ik_bin_dir / "llama-quantize"), str(small if qt == "IQ4_KT" else src), str(dst), qt],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        out[qt] = (dst, r.stdout + r.stderr)
    return out


@pytest.fixture(scope="module")
def facts(ik_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, EngineFacts]:
    return {ENGINE: probe(ik_bin_dir / "llama-server", EngineKind.IK, tmp_path_factory.mktemp("facts"))}


def check_placement(
    ik_bin_dir: Path, p: ModelProfile, facts: dict[str, EngineFacts], workers: list[str], strategy: str
) -> None:
    s = replace(Settings(ctx=2048, ubatch=256, batch=2048, ctk="q8_0", ctv="q8_0"), engine=EngineKind.IK)
    plan = make_plan(
        [ServiceSpec(name="t", model=p, settings=s, strategy=strategy, engine=ENGINE)], from_dict(loopback_hw(workers))
    )
    sp = plan.main
    ok, log = reserve_log(
        ik_bin_dir / "llama-server", strip_endpoint(service_argv(sp, facts)), timeout=120, marker=IK_RESERVED
    )
    assert ok, log[-3000:]
    bufs = parse_log(log).device_buffers()
    items = {(dev, i.what): i.mib for dev, its in sp.memory.items.items() for i in its}
    for dev in ["CPU", *(d.name for d in plan.hw.accelerators())]:
        assert bufs[dev].model_mib == pytest.approx(items.get((dev, "weights"), 0.0), abs=0.011), dev


@pytest.mark.parametrize("qt", ["IQ3_KS", "IQ4_KS", "IQ4_K", "IQ4_KT"])
def test_ik_quantized_files(
    ik_bin_dir: Path, quantized: dict[str, tuple[Path, str]], facts: dict[str, EngineFacts], qt: str
) -> None:
    path, qlog = quantized[qt]
    p = load_profile(path)
    # inspect reads the type the quantizer wrote for every tensor
    written = {m[1]: (m[3] or m[2]).upper() for m in _QLINE.finditer(qlog)}
    assert written, qlog[-2000:]
    types = {t.name: t.type_name.upper() for t in p.tensors}
    assert {n: types[n] for n in written} == written
    assert any(v == qt for v in written.values())
    with rpc_workers(ik_bin_dir, 1, binary="rpc-server") as ends:
        check_placement(ik_bin_dir, p, facts, ends, "cpu-moe")


def test_a_generated_ik_typed_replica_loads_in_ik(
    ik_bin_dir: Path, facts: dict[str, EngineFacts], tmp_path: Path
) -> None:
    """`testmodel` writes ik types itself (zero-filled blocks of the right size): ik loads the file
    and places it as the plan says."""
    g = generate(
        tmp_path / "rep.gguf",
        "glm4moe",
        small_dims("glm4moe", True),
        "ffn_gate_exps=iq3_ks,ffn_up_exps=iq3_ks,ffn_down_exps=iq4_ks,attn_output=iq5_ks,other=q8_0",
        sparse=True,
    )
    p = load_profile(g.files[0])
    assert {"IQ3_KS", "IQ4_KS", "IQ5_KS"} <= {t.type_name.upper() for t in p.tensors}
    with rpc_workers(ik_bin_dir, 1, binary="rpc-server") as ends:
        check_placement(ik_bin_dir, p, facts, ends, "cpu-moe")
