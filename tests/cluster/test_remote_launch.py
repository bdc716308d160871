"""`moetune launch` with a worker on a 'remote' node, on loopback through the fake ssh (no root):
the record, the ordered stop by remote pid, and the failures found before anything starts."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from moetune.engine.logs import parse_log
from moetune.paths import runs_dir
from tests.helpers import run_cli
from tests.run.conftest import (
    assert_nothing_left,
    assert_stopped_in_order,
    record,
    server,
    worker,
)

pytestmark = pytest.mark.server
PlanFile = Callable[..., Path]


def remote_worker(bin_dir: Path, target: str = "node-b") -> object:
    return replace(worker(), node="w0", ssh=target, bin_dir=str(bin_dir))


def test_remote_worker_launch_and_stop(fake_ssh: Path, tiny_model: Path, plan_file: PlanFile, bin_dir: Path) -> None:
    w = remote_worker(bin_dir)
    plan = plan_file(
        w,
        server(
            tiny_model,
            "-ot",
            rf"blk\.1\.ffn_.*_exps=RPC0[127.0.0.1:{w.port}]",  # type: ignore[attr-defined]
            workers=[w],
        ),
    )  # type: ignore[list-item]
    r = run_cli("launch", str(plan), "--detach", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    run_id = doc["run"]
    rec = record(run_id, "rpc0")
    assert rec["ssh_target"] == "node-b" and rec["remote_pid"] and rec["remote_pid"] != rec["pid"]
    assert doc["pids"]["rpc0"] == rec["remote_pid"] and doc["nodes"] == {"rpc0": "w0", "main": "local"}
    assert doc["transports"] == {"rpc0": "TCP"}
    assert rec["argv"] == [f"{bin_dir}/ggml-rpc-server", "-H", "127.0.0.1", "-p", str(w.port)]  # type: ignore[attr-defined]
    assert rec["env"] == {"MOETUNE_TRANSPORT": "tcp", "MOETUNE_RUN": run_id, "MOETUNE_PROCESS": "rpc0"}
    info = json.loads((runs_dir() / run_id / "run.json").read_text())
    assert info["transport"] == "tcp" and any("on " in v for v in info["engines"].values())
    ps = json.loads(run_cli("ps", "--json").stdout)
    assert ps[0]["pids"]["rpc0"] == rec["remote_pid"] and ps[0]["transports"] == {"rpc0": "TCP"}

    stop = run_cli("stop", run_id)
    assert stop.exit_code == 0, stop.stderr
    assert f"rpc0 (rpc, pid {rec['remote_pid']} on w0): gone" in stop.stdout
    assert_stopped_in_order(run_id, ["main"], ["rpc0"])
    assert record(run_id, "rpc0")["exit_code"] == -15
    assert_nothing_left(run_id)  # the worker carries the run id in its environment, as locally
    log = parse_log((runs_dir() / run_id / "main.log").read_text(errors="replace"))
    assert next(v for k, v in log.device_buffers().items() if k.startswith("RPC0[")).model_mib > 0


def test_ssh_unreachable(fake_ssh: Path, tiny_model: Path, plan_file: PlanFile, bin_dir: Path) -> None:
    w = remote_worker(bin_dir, "unreachable")
    r = run_cli("launch", str(plan_file(w, server(tiny_model, workers=[w]))))  # type: ignore[list-item]
    assert r.exit_code == 1
    assert (
        "Error: rpc0: cannot start it on node w0 over ssh (ssh unreachable failed: ssh: Could not resolve" in r.stderr
    )
    assert "ssh -o BatchMode=yes unreachable true" in r.stderr
    assert not runs_dir().exists() or not any(runs_dir().iterdir())  # checked before anything started


def test_no_worker_binary_on_the_node(fake_ssh: Path, tiny_model: Path, plan_file: PlanFile, tmp_path: Path) -> None:
    w = remote_worker(tmp_path / "nowhere")
    r = run_cli("launch", str(plan_file(w, server(tiny_model, workers=[w]))))  # type: ignore[list-item]
    assert r.exit_code == 1
    assert f"Error: rpc0: no ggml-rpc-server or rpc-server in {tmp_path / 'nowhere'} on node w0 (" in r.stderr


def test_only_workers_run_on_other_nodes(fake_ssh: Path, tiny_model: Path, plan_file: PlanFile) -> None:
    r = run_cli("launch", str(plan_file(replace(server(tiny_model), ssh="node-b", node="w0"))))
    assert r.exit_code == 2
    assert "only RPC workers run on other nodes" in r.stderr
