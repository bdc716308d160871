"""A layout service with ``devices: []`` runs on the CPU alone: no GPU, no RPC worker (an
rpc-server serves one client at a time, so two services cannot share one)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from tests.helpers import run_cli


def test_an_empty_device_list_keeps_a_service_off_every_accelerator(tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", Dims(n_layer=2), "f16").files[0]
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {
                        "name": "local",
                        "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20},
                        "devices": [{"name": "CUDA0", "kind": "gpu", "mem_mib": 8000, "bw_gbs": 400}],
                    },
                    {
                        "name": "w0",
                        "link_addr": "127.0.0.1",
                        "rpc_port": 50999,
                        "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20},
                        "devices": [{"name": "CPU", "kind": "cpu", "mem_mib": 16000, "bw_gbs": 20}],
                    },
                ]
            }
        )
    )
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        yaml.safe_dump(
            {
                "services": [
                    {"name": "main", "model": str(model), "devices": []},
                    {"name": "worker", "model": str(model), "devices": ["RPC0"], "strategy": "all-gpu", "port": 9101},
                    {"name": "any", "model": str(model), "port": 9102},
                ]
            }
        )
    )
    r = run_cli("plan", "--layout", str(layout), "--hw", str(hw), "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    argv = {s["name"]: s["argv"] for s in doc["services"]}
    assert "--rpc" not in argv["main"] and "--device" not in argv["main"]
    assert "--rpc" in argv["worker"] and argv["worker"][argv["worker"].index("--device") + 1] == "RPC0"
    assert "--rpc" in argv["any"]  # no list at all: every device
    # worker and any both use the one rpc-server: the plan says only one of them would start
    shared = [w["message"] for w in doc["warnings"] if "all use the RPC worker" in w["message"]]
    assert len(shared) == 1 and shared[0].startswith("services worker, any all use the RPC worker 127.0.0.1:50999")
