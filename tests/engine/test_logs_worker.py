"""RPC worker logs: the real ggml-rpc-server's, and an RDMA build's (synthetic, from its source)."""

from __future__ import annotations

from pathlib import Path

from moetune.engine.logs import is_worker_log, parse_worker_log, split_lines
from moetune.engine.logs.types import BIND_FAILED

FIX = Path(__file__).parents[1] / "fixtures" / "logs"


def test_real_worker() -> None:
    w = parse_worker_log((FIX / "real_rpc_worker.log").read_text())
    assert w.version == "7.0.0"
    assert w.endpoint is not None and w.endpoint.startswith("127.0.0.1:")
    assert w.transport == "TCP"
    assert [(d.name, d.total_mib, d.free_mib) for d in w.devices] == [("CPU", 24105, 24105)]
    assert w.connections >= 3  # llama-server connects once per device query and once to load
    assert not w.rdma_in_use and w.rdma_probed == () and w.failures == ()


def test_worker_on_a_taken_port() -> None:
    w = parse_worker_log((FIX / "real_rpc_worker_port_busy.log").read_text())
    (f,) = w.failures
    assert f.kind == BIND_FAILED and f.subject == w.endpoint
    assert w.evidence(f.line).text == "Failed to create server socket"


def test_rdma_negotiated() -> None:
    w = parse_worker_log((FIX / "synthetic_rpc_worker_rdma.log").read_text())
    assert w.transport == "TCP (RDMA auto-negotiate enabled)"
    assert w.rdma_in_use
    assert [e.line for e in w.rdma_probed] == [8] and [e.line for e in w.rdma_activated] == [9]
    assert w.devices[0].name == "CUDA0" and w.devices[0].total_mib == 124546


def test_worker_logs_are_told_apart() -> None:
    for name in ("real_rpc_worker.log", "synthetic_rpc_worker_rdma.log", "real_rpc_worker_port_busy.log"):
        assert is_worker_log(split_lines((FIX / name).read_text()))
    for name in ("real_rpc_client.mainline.log", "ref000_glm51_1gpu_cpu_moe.legacy.log"):
        assert not is_worker_log(split_lines((FIX / name).read_text(errors="replace")))
