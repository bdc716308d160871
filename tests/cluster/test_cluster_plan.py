"""Planning across nodes: the reference rig (two DGX Sparks, a 228 GB MoE) and three nodes; the
rendered --rpc / -ts / -ot and the launch section's workers (pure: sparse models, no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moetune.errors import InputError
from moetune.hardware.inventory import from_dict
from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from tests.helpers import run_cli

SPARK_CPU = {"cores": 20, "ram_mib": 16384, "ram_bw_gbs": 273}


@pytest.fixture(scope="module")
def big_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 232 GB of f16 weights in a sparse file: too big for one 112 GiB Spark, fits on two."""
    path = tmp_path_factory.mktemp("big") / "big-moe.gguf"
    generate(
        path, "qwen3moe", Dims(n_layer=48, n_embd=4096, n_ff_exp=1536, n_expert=128, head_dim=128), "f16", sparse=True
    )
    return path


def plan(model: Path, hw: str, *args: str) -> dict[str, object]:
    r = run_cli("plan", str(model), "--hw", hw, "--ctx", "8192", *args, "--json")
    assert r.exit_code == 0, r.stderr
    doc: dict[str, object] = json.loads(r.stdout)
    return doc


def test_reference_rig_two_sparks(big_moe: Path) -> None:
    doc = plan(big_moe, "dgx-spark-x2")
    assert doc["fits"] is True
    used = {d["name"]: d["used_mib"] for d in doc["devices"]}  # type: ignore[attr-defined]
    # reference 004: about 110 GB on each node
    assert 100_000 < used["RPC0[192.168.100.2:50052]"] < 114_688 and 100_000 < used["CUDA0"] < 114_688
    argv = doc["argv"]
    assert isinstance(argv, list)
    assert argv[argv.index("--rpc") + 1] == "192.168.100.2:50052"
    assert argv.index("--rpc") < argv.index("-ts")  # an RPC device exists only once --rpc is parsed
    procs = doc["launch"]["processes"]  # type: ignore[index]
    worker, server = procs
    assert worker == {
        "name": "rpc0",
        "role": "rpc",
        "engine": worker["engine"],
        "argv": ["-H", "192.168.100.2", "-p", "50052"],
        "host": "192.168.100.2",
        "port": 50052,
        "node": "spark2",
        "ssh": "spark2",
        "bin_dir": None,
        "env": {},
        "after": [],
        "allow_public_bind": False,
        "gpus": [],
    }
    assert server["after"] == ["rpc0"] and server["node"] == "local" and server["gpus"] == ["CUDA0"]


def test_three_nodes(big_moe: Path, tmp_path: Path) -> None:
    hw = tmp_path / "hw.yaml"
    nodes = [
        {
            "name": "s1",
            "cpu": {**SPARK_CPU, "reserved_mib": 4096},
            "devices": [{"name": "CUDA0", "mem_mib": 114688, "bw_gbs": 273}],
        }
    ]
    for i in (2, 3):
        nodes.append(
            {
                "name": f"s{i}",
                "ssh": f"admin@s{i}.lab",
                "link_addr": f"192.168.100.{i}",
                "link_gbs": 13,
                "bin_dir": "/opt/llama.cpp/bin",
                "cpu": SPARK_CPU,
                "devices": [{"name": "CUDA0", "mem_mib": 60000, "bw_gbs": 273}],
            }
        )
    hw.write_text(yaml.safe_dump({"nodes": nodes}))
    inv = from_dict(yaml.safe_load(hw.read_text()))
    assert inv.engine_names() == {
        "RPC0[192.168.100.2:50052]": "RPC0",
        "RPC0[192.168.100.3:50052]": "RPC1",
        "CUDA0": "CUDA0",
    }
    doc = plan(big_moe, str(hw), "--strategy", "layers:CUDA0=0-23,RPC0=24-35,RPC1=36-47")
    argv = " ".join(doc["argv"])  # type: ignore[arg-type]
    assert "--rpc 192.168.100.2:50052,192.168.100.3:50052 -ts " in argv
    assert r"blk\.(3[6-9]|4[0-7])\.ffn_(down|gate|up)_exps=RPC0[192.168.100.3:50052]" in argv
    workers = [p for p in doc["launch"]["processes"] if p["role"] == "rpc"]  # type: ignore[index]
    assert [(w["name"], w["node"], w["ssh"], w["host"], w["bin_dir"]) for w in workers] == [
        ("rpc0", "s2", "admin@s2.lab", "192.168.100.2", "/opt/llama.cpp/bin"),
        ("rpc1", "s3", "admin@s3.lab", "192.168.100.3", "/opt/llama.cpp/bin"),
    ]


@pytest.mark.parametrize("target", ["-oProxyCommand=touch /tmp/x", "two words", ""])
def test_ssh_target_is_a_destination(target: str) -> None:
    with pytest.raises(InputError, match="is not an ssh destination"):
        from_dict(
            {
                "nodes": [
                    {"name": "a", "cpu": SPARK_CPU},
                    {"name": "b", "ssh": target, "link_addr": "10.0.0.2", "cpu": SPARK_CPU},
                ]
            }
        )
