"""ik_llama.cpp for real: the ik build moetune makes accepts every command moetune renders for it,
and places tensors where the plan says.

Each case plans a generated model for ik_llama.cpp (in the dialect of the build's own --help),
starts the real ik llama-server with that exact argv (loopback ik rpc-servers as the plan's
devices) until it has reserved its compute buffers, and checks its log: each expert tensor the plan
moves is overridden to the plan's device, and each device's model buffer holds the bytes the plan
puts there. The --n-cpu-moe rule the plan notes is checked against the server on one device and on
two, and a random-vocabulary reply comes back whole, streamed or not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from moetune.engine import ik_split
from moetune.engine.command import service_argv, service_notes
from moetune.engine.dialect import dialect, engine_devices, n_cpu_moe_note
from moetune.engine.facts import EngineFacts, n_cpu_moe_layers, probe
from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict
from moetune.kinds import DeviceKind, EngineKind
from moetune.model.archs import small_dims
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import Plan, ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.run.verify import IK_RESERVED
from tests.engine_harness import reserve_log, strip_endpoint
from tests.helpers import llama_server, loopback_hw, rpc_workers

pytestmark = pytest.mark.server

ENGINE = "ik-test"  # the engine name the facts are filed under


@pytest.fixture(scope="module")
def facts(ik_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, EngineFacts]:
    return {ENGINE: probe(ik_bin_dir / "llama-server", EngineKind.IK, tmp_path_factory.mktemp("facts"))}


@pytest.fixture
def workers(ik_bin_dir: Path) -> Iterator[list[str]]:
    with rpc_workers(ik_bin_dir, 2, binary="rpc-server") as ends:
        yield ends


@pytest.fixture(scope="module")
def ik_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelProfile]:
    d = tmp_path_factory.mktemp("ik-models")
    out = {}
    for arch in ("qwen3moe", "glm4moe", "deepseek2", "qwen35moe", "glm-dsa"):
        g = generate(d / f"{arch}.gguf", arch, small_dims(arch, True), "f16")
        out[arch] = load_profile(g.files[0])
    return out


def ik_plan(p: ModelProfile, hw_doc: dict[str, object], strategy: str, ctx: int = 4096) -> Plan:
    s = replace(Settings(ctx=ctx, ubatch=512, batch=2048, ctk="f16", ctv="f16"), engine=EngineKind.IK)
    return make_plan([ServiceSpec(name="t", model=p, settings=s, strategy=strategy, engine=ENGINE)], from_dict(hw_doc))


def service_notes_for(plan: Plan, n: int) -> list[str]:
    """The notes `plan --strategy n-cpu-moe:N` prints for the same hardware."""
    sp = plan.services[0]
    return service_notes(replace(sp, spec=replace(sp.spec, strategy=f"n-cpu-moe:{n}")))


_OVERRIDE = re.compile(r"Tensor (\S+) \(size = .*\) buffer type overriden to (\S+)")


def overrides_in(log: str) -> dict[str, str]:
    return {m[1]: m[2] for m in _OVERRIDE.finditer(log)}


# (arch, strategy, rpc devices)
CASES = [
    ("qwen3moe", "cpu-moe", 1),
    ("qwen3moe", "n-cpu-moe:2", 2),
    ("glm4moe", "all-gpu", 1),
    ("glm4moe", "layers:RPC0=1-2", 1),
    ("glm4moe", "auto", 2),
    ("glm4moe", "all-gpu", 2),
    ("deepseek2", "cpu-moe", 1),
    ("deepseek2", "n-cpu-moe:3", 1),
    ("deepseek2", "all-gpu", 2),
    ("qwen3moe", "cpu-moe", 0),
    ("qwen35moe", "cpu-moe", 1),
    ("qwen35moe", "all-gpu", 2),
    ("glm-dsa", "n-cpu-moe:2", 1),
    ("glm-dsa", "all-gpu", 2),
]
# weights ik loads beyond the plan's ledger, as a share of a device's weights, measured: on the GLM-5
# replica ik 0.1.5 loads 2.52 MiB more than mainline (+4.8%; +8.8% on the device holding the NextN
# block): 1 MiB is the NextN block's attn_k_b/attn_v_b, which it loads to rebuild attn_kv_b; the
# rest (about 0.38 MiB per block) is not explained yet, so the ledger does not model it
KNOWN_GAPS = {"glm-dsa": 0.10}
_LAYER_SIZE = re.compile(r"^Layer +(\d+): +[\d.]+, +[\d.]+, +([\d.]+)(?: +([\d.]+))?", re.M)
# compute within 10% on one device, except MLA (DeepSeek-2, GLM-5) on the CPU alone, where the
# latent cache's dequantization is over-predicted by up to 18% with a q8_0 cache (ledger-ik.md)
COMPUTE_GAPS = {"deepseek2": 0.15, "glm-dsa": 0.15}
_DEFAULT_DEVICE = re.compile(r"Setting default device in layer +(\d+) to (\d+)")


def ik_order(plan: Plan) -> list[str]:
    """ik's device numbering for the plan's hardware: local GPUs (or, in a build without a GPU
    backend, the CPU as one device) then the RPC devices."""
    accs = plan.hw.accelerators()
    local = [d.name for d in accs if d.kind != DeviceKind.RPC]
    return [*(local or ["CPU"]), *(d.name for d in accs if d.kind == DeviceKind.RPC)]


@pytest.mark.parametrize(("arch", "strategy", "n_rpc"), CASES, ids=[f"{a}-{s}-rpc{n}" for a, s, n in CASES])
def test_ik_accepts_the_plan_and_places_it(
    ik_bin_dir: Path,
    workers: list[str],
    ik_models: dict[str, ModelProfile],
    facts: dict[str, EngineFacts],
    arch: str,
    strategy: str,
    n_rpc: int,
) -> None:
    plan = ik_plan(ik_models[arch], loopback_hw(workers[:n_rpc]), strategy)
    sp = plan.main
    argv = service_argv(sp, facts)
    assert argv[argv.index("-fa") + 1] == "on"  # the build's -fa takes a value
    assert "--log-disable" in argv  # else ik writes llama.log into whatever directory it starts in
    ok, log = reserve_log(ik_bin_dir / "llama-server", strip_endpoint(argv), timeout=300, marker=IK_RESERVED)
    assert ok, log[-3000:]
    assert "invalid parameter" not in log and "error:" not in log.lower(), log[-3000:]
    # every expert the plan moves off its layer's device is overridden there, and no other
    got = overrides_in(log)
    want = {}
    for name, dev in sp.placement.experts().items():
        if dev != sp.placement.layer_device[int(name.split(".")[1])]:
            want[name] = dev  # the plan names devices as the engine's buffers do: CPU, RPC0[127.0.0.1:port]
    assert {k: v for k, v in got.items() if not v.startswith("CPU")} == {
        k: v for k, v in want.items() if not v.startswith("CPU")
    }
    assert {k for k, v in got.items() if v.startswith("CPU")} == {k for k, v in want.items() if v == "CPU"}
    # ik's layer sizes (the table it prints) are the ones moetune computes to set -ts
    table = [(int(m[1]), float(m[2]), float(m[3]) if m[3] else None) for m in _LAYER_SIZE.finditer(log)]
    if n_rpc:
        sizes, mc = ik_split.layer_sizes(sp.spec.model, sp.spec.settings, 3 if sp.spec.model.is_mla else 0)
        assert [il for il, _, _ in table] == list(range(len(sizes)))
        assert [round(x / (1 << 20), 2) for x in sizes] == pytest.approx([t for _, t, _ in table], abs=0.011)
        assert mc / (1 << 20) == pytest.approx(max(c for _, _, c in table if c is not None), abs=0.011)
    # ik's own layer map (it prints it when the layers fit) is the plan's
    logged = {int(m[1]): int(m[2]) for m in _DEFAULT_DEVICE.finditer(log)}
    if n_rpc:
        assert logged, log[-3000:]
        order = ik_order(plan)
        want_map = {
            il: order.index(dev) for il, dev in enumerate([*sp.placement.layer_device, sp.placement.output_device])
        }
        assert logged == want_map
    # each device holds the plan's weights
    bufs = parse_log(log).device_buffers()
    items = {(d, i.what): i.mib for d, its in sp.memory.items.items() for i in its}
    for dev in [d.name for d in plan.hw.accelerators()]:
        rel = KNOWN_GAPS.get(arch, 0.005)
        assert bufs[dev].model_mib == pytest.approx(items.get((dev, "weights"), 0.0), rel=rel, abs=0.02), dev
        assert bufs[dev].kv_mib == pytest.approx(items.get((dev, "kv"), 0.0), rel=0.01, abs=0.02), dev
    assert bufs["CPU"].model_mib == pytest.approx(items[("CPU", "weights")], rel=0.005, abs=0.02)
    # compute buffers (plan/compute.py's ik model) on one device; with two the split moves them
    if n_rpc <= 1:
        dev = next((d.name for d in plan.hw.accelerators()), "CPU")
        tol = COMPUTE_GAPS.get(arch, 0.10)
        assert bufs[dev].compute_mib == pytest.approx(items[(dev, "compute")], rel=tol, abs=0.05), dev


@pytest.mark.parametrize("n_rpc", [1, 2])
def test_the_n_cpu_moe_note_is_the_builds_rule(
    ik_bin_dir: Path, workers: list[str], ik_models: dict[str, ModelProfile], facts: dict[str, EngineFacts], n_rpc: int
) -> None:
    """Start ik with --n-cpu-moe itself on one and on two devices: the layers it keeps on the CPU are
    the ones the plan's note names for this build."""
    p = ik_models["qwen3moe"]
    n = 3
    plan = ik_plan(p, loopback_hw(workers[:n_rpc]), "all-gpu")
    sp = plan.main
    argv = [*strip_endpoint(service_argv(sp, facts)), "--n-cpu-moe", str(n)]
    ok, log = reserve_log(ik_bin_dir / "llama-server", argv, timeout=300, marker=IK_RESERVED)
    assert ok, log[-3000:]
    on_cpu = sorted({int(k.split(".")[1]) for k, v in overrides_in(log).items() if v.startswith("CPU")})
    d = dialect(EngineKind.IK, facts[ENGINE])
    n_dev = len(engine_devices(d, [(a.name, True) for a in plan.hw.accelerators()]))
    assert on_cpu == n_cpu_moe_layers(d.n_cpu_moe, n, p.n_layer, list(sp.placement.layer_device), n_devices=n_dev)
    # a build without a GPU backend counts the CPU as a device beside the RPC servers: with one RPC
    # device that is two devices already, and N is taken from the end of each one's layers
    assert n_dev == n_rpc + 1 and on_cpu != list(range(n))
    assert n_cpu_moe_note(d, n, p.n_layer, list(sp.placement.layer_device), n_devices=n_dev) in service_notes_for(
        plan, n
    )


def test_a_random_vocabulary_reply_comes_back_whole(
    ik_bin_dir: Path, ik_models: dict[str, ModelProfile], tmp_path: Path
) -> None:
    """The generated vocabulary's byte tokens form invalid UTF-8 at random; moetune's requests stream
    (ik answers a non-streamed reply with an error then), and the stream carries every token."""
    p = ik_models["qwen3moe"]
    with llama_server(ik_bin_dir, p.files[0], tmp_path / "ik.log", "-c", "1024", "--jinja", "--log-disable") as srv:
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 24,
            "stream": True,
            "n_predict": 24,
            "ignore_eos": True,
        }
        n = 0
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    doc = json.loads(line[6:])
                    if doc.get("choices") and doc["choices"][0].get("delta", {}).get("content"):
                        n += 1
        assert n > 0


def test_a_layout_of_two_services_on_ik(
    ik_bin_dir: Path, workers: list[str], ik_models: dict[str, ModelProfile], facts: dict[str, EngineFacts]
) -> None:
    """Two services planned together on one RPC device: each one's command starts ik with the
    weights the shared plan gives it."""
    s = replace(Settings(ctx=2048, ubatch=256, batch=2048, ctk="q8_0", ctv="q8_0"), engine=EngineKind.IK)
    services = [
        ServiceSpec(name="big", model=ik_models["glm4moe"], settings=s, strategy="auto", port=9100, engine=ENGINE),
        ServiceSpec(
            name="small", model=ik_models["qwen3moe"], settings=s, strategy="cpu-moe", port=9101, engine=ENGINE
        ),
    ]
    plan = make_plan(services, from_dict(loopback_hw(workers[:1])))
    for sp in plan.services:
        argv = service_argv(sp, facts)
        ok, log = reserve_log(ik_bin_dir / "llama-server", strip_endpoint(argv), timeout=300, marker=IK_RESERVED)
        assert ok, (sp.spec.name, log[-3000:])
        bufs = parse_log(log).device_buffers()
        items = {(d, i.what): i.mib for d, its in sp.memory.items.items() for i in its}
        for dev in (d.name for d in plan.hw.accelerators()):
            assert bufs[dev].model_mib == pytest.approx(items.get((dev, "weights"), 0.0), rel=0.005, abs=0.02)
