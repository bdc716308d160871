"""Where a worker may listen, and which transport it uses: refused before anything starts, with a
message that says why; confirmed from the worker's log once it serves."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from moetune.engine.logs import parse_worker_log
from moetune.errors import InputError
from moetune.hardware.inventory import bind_problem, from_dict, public_binds
from moetune.kinds import Transport
from moetune.paths import runs_dir
from moetune.run.doctor import examine
from moetune.run.sources import file_source
from moetune.run.transport import env_for, mismatch, observed, rdma_capable
from tests.helpers import run_cli
from tests.run.conftest import server, worker

PlanFile = Callable[..., Path]
CPU = {"cores": 2, "ram_mib": 4000, "ram_bw_gbs": 20}


def two_nodes(addr: str, **extra: Any) -> dict[str, Any]:
    return {
        "nodes": [
            {"name": "a", "cpu": CPU},
            {
                "name": "b",
                "ssh": "b",
                "link_addr": addr,
                "cpu": CPU,
                **extra,
                "devices": [{"name": "CUDA0", "mem_mib": 24000, "bw_gbs": 900}],
            },
        ]
    }


def test_documentation_addresses_are_named_as_such() -> None:
    assert bind_problem("203.0.113.5") == (
        "203.0.113.5, which is in 203.0.113.0/24, a range reserved for documentation, not a private network"
    )


@pytest.mark.parametrize(
    ("addr", "ok"),
    [
        ("127.0.0.1", True),
        ("10.213.7.2", True),
        ("172.16.0.9", True),
        ("192.168.100.2", True),
        ("169.254.12.7", True),  # link-local: DGX Spark's CX7 direct link (reference 004)
        ("fd00::2", True),
        ("fe80::1", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("8.8.8.8", False),
        ("100.64.0.1", False),
        ("2001:4860::8888", False),
        # documentation ranges (TEST-NET-1..3, 2001:db8::/32) and other special-purpose blocks are no private link
        ("192.0.2.1", False),
        ("198.51.100.7", False),
        ("203.0.113.5", False),
        ("2001:db8::1", False),
        ("198.18.0.1", False),
        ("240.0.0.1", False),
        ("255.255.255.255", False),
        ("::ffff:10.0.0.1", True),
        ("::ffff:203.0.113.5", False),  # IPv4-mapped: as the IPv4 address
    ],
)
def test_bind_addresses(addr: str, ok: bool) -> None:
    assert (bind_problem(addr) is None) is ok
    if ok:
        from_dict(two_nodes(addr))
    else:
        with pytest.raises(InputError) as e:
            from_dict(two_nodes(addr))
        assert f"node b: refusing to bind its RPC worker to {addr}, which " in str(e.value)
        assert "no authentication" in str(e.value) and "allow_public_bind: true" in str(e.value.hint)


def test_public_bind_allowed_explicitly(tmp_path: Path, split_model: Path) -> None:
    inv = from_dict(two_nodes("0.0.0.0", allow_public_bind=True))
    assert [(n.name, why) for n, why in public_binds(inv)] == [
        ("b", "0.0.0.0, which means every interface, public ones included")
    ]
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump(two_nodes("8.8.8.8", allow_public_bind=True)))
    r = run_cli("plan", str(split_model), "--hw", str(hw), "--json")
    assert r.exit_code == 0, r.stderr
    assert "warning: node b: its RPC worker will listen on 8.8.8.8, which is not a loopback" in r.stderr
    assert "no authentication" in r.stderr
    (w,) = [p for p in json.loads(r.stdout)["launch"]["processes"] if p["role"] == "rpc"]
    assert w["allow_public_bind"] is True and w["host"] == "8.8.8.8"

    hw.write_text(yaml.safe_dump(two_nodes("8.8.8.8")))
    r = run_cli("plan", str(split_model), "--hw", str(hw))
    assert r.exit_code == 2
    assert (
        "refusing to bind its RPC worker to 8.8.8.8, which is not a loopback, private or link-local address" in r.stderr
    )


def test_launch_refuses_a_public_worker(tiny_model: Path, plan_file: PlanFile) -> None:
    """A plan edited by hand is checked again at launch: nothing starts."""
    w = replace(worker(), host="0.0.0.0")
    r = run_cli("launch", str(plan_file(w, server(tiny_model, workers=[w]))))
    assert r.exit_code == 2
    assert (
        f"Error: refusing to start RPC worker rpc0 on port {w.port} of 0.0.0.0, which means every interface, "
        "public ones included; the RPC protocol has no authentication"
    ) in r.stderr
    assert "no authentication" in r.stderr and "allow_public_bind" in r.stderr
    w = replace(worker(), argv=("-H", "0.0.0.0"))  # the address in its arguments counts, not only the plan's host
    r = run_cli("launch", str(plan_file(w, server(tiny_model, workers=[w]))))
    assert r.exit_code == 2 and "refusing to start RPC worker rpc0" in r.stderr
    assert not runs_dir().exists() or not any(runs_dir().iterdir())


def test_rdma_refused_on_a_build_without_it(tiny_model: Path, plan_file: PlanFile) -> None:
    w = worker()
    r = run_cli("launch", str(plan_file(w, server(tiny_model, workers=[w]))), "--transport", "rdma")
    assert r.exit_code == 2
    assert "Error: --transport rdma: no RDMA transport in the engine build of rpc0 (" in r.stderr
    assert "-DGGML_RPC_RDMA=ON" in r.stderr
    assert not runs_dir().exists() or not any(runs_dir().iterdir())
    r = run_cli("launch", str(plan_file(server(tiny_model))), "--transport", "rdma")
    assert r.exit_code == 2 and "the plan uses no RPC worker" in r.stderr


# -- the transport, from logs ----------------------------------------------------------------

BANNER = """Starting RPC server v7.0.0
  endpoint       : 10.0.0.2:50052
  local cache    : n/a
Devices:
  CUDA0: NVIDIA GB10 (122000 MiB, 120000 MiB free)
  transport      : {transport}
"""
TCP_LOG = BANNER.format(transport="TCP") + "Accepted client connection\n"
RDMA_BUILD_TCP = BANNER.format(transport="TCP (RDMA auto-negotiate enabled)") + "Accepted client connection\n"
RDMA_LOG = (
    RDMA_BUILD_TCP + "RDMA probed: dev=rocep1s0f1 gid=3 (RoCEv2) qpn=123 inline=220\n"
    "RDMA activated: qpn=123->456 mtu=4096 rx_depth=24\n"
)


@pytest.mark.parametrize(
    ("log", "seen", "ok"),
    [
        (TCP_LOG, "TCP", {Transport.TCP: True, Transport.RDMA: False, Transport.AUTO: True}),
        (RDMA_BUILD_TCP, "TCP", {Transport.TCP: True, Transport.RDMA: False, Transport.AUTO: True}),
        (
            RDMA_LOG,
            "RDMA",
            {Transport.TCP: False, Transport.RDMA: True, Transport.AUTO: True},
        ),  # the silent switch an A/B must catch
        ("", None, {Transport.TCP: True, Transport.RDMA: False, Transport.AUTO: True}),
    ],
)
def test_observed_transport(log: str, seen: str | None, ok: dict[str, bool]) -> None:
    wlog = parse_worker_log(log)
    assert observed(wlog) == seen
    for asked, fine in ok.items():
        d = mismatch("rpc0", asked, seen, wlog)
        assert (d is None) is fine, (asked, d)
        if d is not None:
            assert d.cause == "transport_mismatch" and d.message.startswith(f"rpc0: asked for {asked.upper()}")


def test_transport_env() -> None:
    assert env_for(Transport.TCP, capable=False) == {"MOETUNE_TRANSPORT": "tcp"}
    assert env_for(Transport.TCP, capable=True) == {
        "MOETUNE_TRANSPORT": "tcp",
        "GGML_RPC_NO_RDMA": "1",
        "GGML_RDMA_DEV": "disabled",
    }
    assert env_for(Transport.RDMA, capable=True, rdma_dev="rocep1s0f1") == {
        "MOETUNE_TRANSPORT": "rdma",
        "GGML_RDMA_DEV": "rocep1s0f1",
    }
    assert env_for(Transport.AUTO, capable=True) == {"MOETUNE_TRANSPORT": "auto"}


def test_rdma_capable(tmp_path: Path, bin_dir: Path) -> None:
    assert not rdma_capable([bin_dir / "ggml-rpc-server", bin_dir / "llama-server"])  # this machine's build
    lib = tmp_path / "libggml-rpc.so"
    lib.write_bytes(b"\0" * 4096 + b"RDMA activated: qpn=%u->%u" + b"\0" * 10)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert rdma_capable([tmp_path / "missing", empty, lib])


def test_doctor_knows_rdma_was_asked_for(tmp_path: Path) -> None:
    log = tmp_path / "rpc0.log"
    log.write_text(RDMA_LOG)
    unasked = examine([file_source(log, env={})])
    assert [f.code for f in unasked] == ["rdma_unrequested"]
    assert examine([file_source(log, env={"MOETUNE_TRANSPORT": "rdma"})]) == []
