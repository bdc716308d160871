"""ik_llama.cpp's graph split (``-sm graph``) in the plan: refused where the engine has none or the
architecture falls back, each offloaded layer's tensors and KV divided across the GPUs by the
rendered ``-ts`` (norms and routers whole on each), experts the placement keeps on the CPU left
there. No GPU here: the ledger is checked on a two-GPU hardware file, the rendered flags against
the built binaries' parsers, and the division against ik_llama.cpp's own estimate per device
(``Estimated model buffer size per device``, printed after it splits the tensors; the CPU build
then aborts, having no split buffer, which is why only the estimate is read)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from moetune.engine.command import service_argv, service_notes
from moetune.errors import InputError
from moetune.hardware.inventory import from_dict
from moetune.kinds import EngineKind
from moetune.model.archs import small_dims
from moetune.model.kv import kv_shape
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan import graph_split
from moetune.plan.ledger import MIB
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from tests.engine_harness import free_port, rpc_workers
from tests.helpers import engine_bin_dir, loopback_hw, run_cli

IK = Settings(engine=EngineKind.IK, split_mode="graph", ctx=4096)


def two_gpus(mem: tuple[float, float] = (24000, 24000)) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "name": "local",
                "cpu": {"cores": 16, "ram_mib": 256000, "ram_bw_gbs": 200},
                "devices": [
                    {"name": f"CUDA{i}", "kind": "gpu", "mem_mib": m, "bw_gbs": 900} for i, m in enumerate(mem)
                ],
            }
        ]
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelProfile]:
    d = tmp_path_factory.mktemp("graph")
    return {
        a: load_profile(generate(d / f"{a}.gguf", a, small_dims(a), "f16").files[0])
        for a in ("qwen3moe", "qwen35moe", "glm-dsa", "gpt-oss")
    }


def _items(sp: Any, what: str) -> dict[str, float]:
    return {d: sum(i.mib for i in its if i.what == what) for d, its in sp.memory.items.items()}


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe", "gpt-oss"])
@pytest.mark.parametrize(("mem", "pct"), [((24000, 24000), (50, 50)), ((24000, 16000), (60, 40))])
def test_graph_split_divides_layers_and_kv_by_the_rendered_shares(
    models: dict[str, ModelProfile], arch: str, mem: tuple[float, float], pct: tuple[int, int]
) -> None:
    p = models[arch]
    sp = make_plan([ServiceSpec(name="t", model=p, settings=IK, strategy="all-gpu")], from_dict(two_gpus(mem))).main
    argv = service_argv(sp)
    assert argv[argv.index("-sm") + 1] == "graph"
    assert argv[argv.index("-ts") + 1] == f"{pct[0]},{pct[1]}"
    trunk = [t for t in p.loaded_tensors() if t.layer is not None and t.layer < p.n_layer]
    whole = sum(t.nbytes for t in trunk if graph_split.mirrored(t)) / MIB
    cut = sum(t.nbytes for t in trunk if not graph_split.mirrored(t)) / MIB
    assert whole > 0 and cut > 10 * whole
    split = _items(sp, "weights (split)")
    for g, f in zip(("CUDA0", "CUDA1"), pct, strict=True):
        assert split[g] == pytest.approx(cut * f / 100 + whole)
    # the layers' KV (and recurrent state) goes with the heads: the same shares
    kv = _items(sp, "kv")
    assert kv["CUDA0"] / kv["CUDA1"] == pytest.approx(pct[0] / pct[1])
    assert "CPU" not in kv or kv["CPU"] == 0
    # nothing of the trunk is left unsplit on a GPU: only the output layer, on its device
    plain = sum(_items(sp, "weights").get(g, 0.0) for g in ("CUDA0", "CUDA1"))
    out = sum(t.nbytes for t in p.loaded_tensors() if t.kind in ("output", "output_norm")) / MIB
    assert plain == pytest.approx(out)
    assert any("-sm graph" in n for n in service_notes(sp))


def test_experts_on_the_cpu_stay_there(models: dict[str, ModelProfile]) -> None:
    p = models["qwen3moe"]
    sp = make_plan([ServiceSpec(name="t", model=p, settings=IK, strategy="cpu-moe")], from_dict(two_gpus())).main
    experts = sum(t.nbytes for t in p.loaded_tensors() if t.is_expert) / MIB
    cpu = _items(sp, "weights (pinned)")["CPU"] + _items(sp, "weights").get("CPU", 0.0)
    assert cpu >= experts
    split = _items(sp, "weights (split)")
    assert split["CUDA0"] == pytest.approx(split["CUDA1"]) and split["CUDA0"] < (
        sum(t.nbytes for t in p.loaded_tensors() if t.layer is not None and not t.is_expert) / MIB
    )


@pytest.mark.parametrize(
    ("args", "hw", "said"),
    [
        (("--engine", "llama.cpp"), two_gpus(), "has no graph split"),
        (
            ("--engine", "ik_llama.cpp"),
            {
                "nodes": [
                    {
                        "name": "local",
                        "cpu": {"cores": 2, "ram_mib": 64000, "ram_bw_gbs": 20},
                        "devices": [{"name": "CUDA0", "kind": "gpu", "mem_mib": 24000, "bw_gbs": 900}],
                    }
                ]
            },
            "two or more GPUs",
        ),
        (("--engine", "ik_llama.cpp"), loopback_hw([]), "two or more GPUs"),
    ],
)
def test_graph_split_refused_with_the_reason(
    models: dict[str, ModelProfile], tmp_path: Path, args: tuple[str, ...], hw: dict[str, Any], said: str
) -> None:
    f = tmp_path / "hw.json"
    f.write_text(json.dumps(hw))
    r = run_cli("plan", str(models["qwen3moe"].files[0]), "--hw", str(f), "--split-mode", "graph", *args)
    assert r.exit_code == 2, r.stdout
    assert said in r.stderr


def test_graph_split_refused_where_ik_falls_back(models: dict[str, ModelProfile], tmp_path: Path) -> None:
    """GLM-DSA: the fallback reference 000 saw (doctor's split_mode_fallback)."""
    f = tmp_path / "hw.json"
    f.write_text(json.dumps(two_gpus()))
    r = run_cli(
        "plan", str(models["glm-dsa"].files[0]), "--hw", str(f), "--engine", "ik_llama.cpp", "--split-mode", "graph"
    )
    assert r.exit_code == 2
    assert "does not split glm-dsa" in r.stderr and "falls back to layer" in r.stderr
    r = run_cli(
        "plan", str(models["glm-dsa"].files[0]), "--hw", str(f), "--engine", "ik_llama.cpp", "--split-mode", "row"
    )
    assert r.exit_code == 2


def test_graph_split_refused_with_rpc_devices(models: dict[str, ModelProfile]) -> None:
    hw = two_gpus()
    hw["nodes"].append(
        {
            "name": "w",
            "link_addr": "127.0.0.1",
            "rpc_port": 50052,
            "cpu": {"cores": 2, "ram_mib": 24000, "ram_bw_gbs": 20},
            "devices": [{"name": "CUDA0", "kind": "gpu", "mem_mib": 24000, "bw_gbs": 900}],
        }
    )
    with pytest.raises(InputError, match="RPC devices"):
        make_plan([ServiceSpec(name="t", model=models["qwen3moe"], settings=IK, strategy="all-gpu")], from_dict(hw))


def test_split_mode_as_an_extra_flag_names_the_option(models: dict[str, ModelProfile], tmp_path: Path) -> None:
    f = tmp_path / "hw.json"
    f.write_text(json.dumps(two_gpus()))
    r = run_cli("plan", str(models["qwen3moe"].files[0]), "--hw", str(f), "--engine-arg=-sm", "--engine-arg=graph")
    assert r.exit_code == 2 and "--split-mode layer|graph" in r.stderr


def test_the_engines_parsers_on_the_rendered_split_mode() -> None:
    from moetune.engine.install import IK as IK_RECIPE
    from moetune.engine.install import MAINLINE

    ik, main = engine_bin_dir(IK_RECIPE), engine_bin_dir(MAINLINE)
    if ik is None or main is None:
        pytest.skip("both engines must be built")

    def code(b: Path, *a: str) -> int:
        return subprocess.run([str(b / "llama-server"), *a, "--version"], capture_output=True, timeout=60).returncode

    assert code(ik, "-sm", "graph", "-ts", "50,50") == 0
    assert code(main, "-sm", "graph") != 0  # mainline: none, layer, row, tensor
    assert code(main, "-sm", "layer") == 0


_ESTIMATE = re.compile(r"^\s+Device (\d+):\s+([\d.]+) MiB$", re.M)


@pytest.mark.server
@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
@pytest.mark.parametrize("pct", [(50, 50), (75, 25)])
def test_split_against_ik_llama_cpps_own_estimate(
    ik_bin_dir: Path, models: dict[str, ModelProfile], arch: str, pct: tuple[int, int]
) -> None:
    """ik over two loopback RPC devices stands in for two GPUs: its devices are the local CPU (share
    0) and the two workers, which it splits between as -ts says. The mirrored tensors go to every
    device, the CPU with share 0 too: its estimate is the norms and routers alone."""
    p = models[arch]
    hw = from_dict(two_gpus((24000 * pct[0] / 50, 24000 * pct[1] / 50)))
    if arch == "qwen35moe" and pct[1] == 25:  # 2 key heads: a quarter of them is none
        with pytest.raises(InputError, match="key heads"):
            make_plan([ServiceSpec(name="t", model=p, settings=IK, strategy="all-gpu")], hw)
        return
    sp = make_plan([ServiceSpec(name="t", model=p, settings=IK, strategy="all-gpu")], hw).main
    argv = service_argv(sp)
    ts = argv[argv.index("-ts") + 1]
    assert ts == f"{pct[0]},{pct[1]}"
    with rpc_workers(ik_bin_dir, 2, binary="rpc-server") as ends:
        cmd = [
            str(ik_bin_dir / "llama-server"),
            "-m",
            str(p.files[0]),
            "-sm",
            "graph",
            "--rpc",
            ",".join(ends),
            "-ngl",
            "999",
            "-ts",
            f"0,{ts}",
            "-c",
            "4096",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--log-disable",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    est = {int(d): float(m) for d, m in _ESTIMATE.findall(out.split("Estimated model buffer size per device", 1)[-1])}
    assert set(est) >= {0, 1, 2}, out[-3000:]
    split = _items(sp, "weights (split)")
    trunk = [t for t in p.loaded_tensors() if t.layer is not None and t.layer < p.n_layer]
    whole = sum(t.nbytes for t in trunk if graph_split.mirrored(t)) / MIB
    for dev, g in ((1, "CUDA0"), (2, "CUDA1")):
        assert est[dev] == pytest.approx(split[g], rel=0.01, abs=0.01), (dev, est, split)
    assert est[0] == pytest.approx(whole, abs=0.01)
    assert kv_shape(p, EngineKind.IK).layers
