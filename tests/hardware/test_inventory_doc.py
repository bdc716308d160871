"""The hardware file's document as ``to_dict`` writes it (``hw probe`` YAML and ``--json``): its
keys, their order and their values, pinned so that a typed rewrite cannot change what users see."""

from __future__ import annotations

import yaml

from moetune.hardware.inventory import Device, Inventory, Node, from_dict, to_dict
from moetune.kinds import DeviceKind

GPU = Device(
    name="CUDA0",
    kind=DeviceKind.GPU,
    mem_mib=97887.0,
    bw_gbs=1790.0,
    node="box",
    link_gbs=50.4,
    reserved_mib=512.0,
    tflops=120.0,
)
BOX = Node(
    name="box",
    cores=32,
    ram_mib=257000.0,
    ram_bw_gbs=273.0,
    devices=(GPU,),
    ram_reserved_mib=4096.0,
    cpu_isa=("avx2", "avx512"),
    cpu_speed=(("cpu_ctx_gflops_per_core", 12.5),),
)
PEER = Node(
    name="peer",
    cores=16,
    ram_mib=128000.0,
    ram_bw_gbs=120.0,
    devices=(Device(name="CUDA0", kind=DeviceKind.GPU, mem_mib=24000.0, bw_gbs=900.0, node="peer"),),
    ssh="me@peer",
    link_addr="10.0.0.2",
    rpc_port=50053,
    link_gbs=12.5,
    bin_dir="/opt/llama/bin",
    allow_public_bind=True,
    rdma=True,
)

GOLDEN = {
    "nodes": [
        {
            "name": "box",
            "cpu": {
                "cores": 32,
                "ram_mib": 257000.0,
                "ram_bw_gbs": 273.0,
                "reserved_mib": 4096.0,
                "isa": ["avx2", "avx512"],
                "speed": {"cpu_ctx_gflops_per_core": 12.5},
            },
            "devices": [
                {
                    "name": "CUDA0",
                    "kind": "gpu",
                    "mem_mib": 97887.0,
                    "bw_gbs": 1790.0,
                    "link_gbs": 50.4,
                    "reserved_mib": 512.0,
                    "tflops": 120.0,
                }
            ],
        },
        {
            "name": "peer",
            "cpu": {"cores": 16, "ram_mib": 128000.0, "ram_bw_gbs": 120.0},
            "devices": [{"name": "CUDA0", "kind": "gpu", "mem_mib": 24000.0, "bw_gbs": 900.0, "link_gbs": 25.0}],
            "ssh": "me@peer",
            "link_addr": "10.0.0.2",
            "bin_dir": "/opt/llama/bin",
            "link_gbs": 12.5,
            "rpc_port": 50053,
            "allow_public_bind": True,
            "rdma": True,
        },
    ],
    "name": "pair",
}


def _keys(x: object) -> object:
    """Every key of a document in order, nested: what a comparison of dicts alone does not check."""
    if isinstance(x, dict):
        return [(k, _keys(v)) for k, v in x.items()]
    if isinstance(x, list):
        return [_keys(v) for v in x]
    return None


def test_the_document_of_two_nodes_is_the_golden_one_key_by_key() -> None:
    doc = to_dict(Inventory((BOX, PEER), name="pair"))
    assert doc == GOLDEN
    assert _keys(doc) == _keys(GOLDEN)


def test_a_bare_node_writes_only_what_it_has() -> None:
    doc = to_dict(Inventory((Node(name="solo", cores=8, ram_mib=64000.0, ram_bw_gbs=80.0),)))
    assert doc == {
        "nodes": [{"name": "solo", "cpu": {"cores": 8, "ram_mib": 64000.0, "ram_bw_gbs": 80.0}, "devices": []}]
    }


def test_the_document_reads_back_as_the_same_inventory() -> None:
    inv = Inventory((BOX, PEER), name="pair")
    assert from_dict(yaml.safe_load(yaml.safe_dump(to_dict(inv), sort_keys=False))).nodes == inv.nodes
