"""A model split over two hosts: llama-server in namespace a, a real ggml-rpc-server in namespace b
started over ssh; planned, launched, asked one request, stopped in order; a worker killed while
serving; link-test between the two. Afterwards nothing runs in either namespace but its sshd.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from moetune.engine.logs import parse_log, parse_worker_log
from moetune.paths import runs_dir
from moetune.store.db import ResultsDB
from tests.cluster.conftest import TwoHosts, cmdline
from tests.helpers import run_cli
from tests.run.conftest import assert_stopped_in_order, only_run, record, run_state, wait_for

pytestmark = [pytest.mark.netns, pytest.mark.server]


def hardware(c: TwoHosts, path: Path, bin_dir: Path, rpc_port: int) -> Path:
    """Node a runs moetune and llama-server; node b the worker, reached over ssh on the veth link."""
    cpu = {"cores": 2, "ram_mib": 4000, "ram_bw_gbs": 20}
    doc = {
        "name": "two-netns",
        "nodes": [
            {"name": "a", "ssh": c.a.alias, "link_addr": c.a.addr, "cpu": cpu},
            {
                "name": "b",
                "ssh": c.b.alias,
                "link_addr": c.b.addr,
                "rpc_port": rpc_port,
                "link_gbs": 10,
                "bin_dir": str(bin_dir),
                "cpu": cpu,
                "devices": [{"name": "CPU", "kind": "cpu", "mem_mib": 2000, "bw_gbs": 20}],
            },
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def make_plan(c: TwoHosts, tmp_path: Path, model: Path, bin_dir: Path) -> tuple[Path, int, int]:
    """`moetune plan`: layers 2-3 and all attention on the worker, the experts of layers 0-1 here."""
    rpc_port, port = 20000 + secrets.randbelow(20000), 40000 + secrets.randbelow(20000)
    hw = hardware(c, tmp_path / "hw.yaml", bin_dir, rpc_port)
    plan = tmp_path / "plan.json"
    r = run_cli(
        "plan",
        str(model),
        "--hw",
        str(hw),
        "--ctx",
        "512",
        "--strategy",
        "layers:RPC0=2-3",
        "--port",
        str(port),
        "-o",
        str(plan),
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    return plan, rpc_port, port


def launch_foreground(c: TwoHosts, plan: Path) -> tuple[object, str]:
    launcher = c.moetune(c.a, "launch", str(plan))
    wait_for(
        lambda: (runs_dir().exists() and any(runs_dir().iterdir())) or launcher.poll() is not None,
        what="the run directory",
    )
    run_id = only_run()
    wait_for(
        lambda: run_state(run_id) in ("healthy", "failed", "stopped") or launcher.poll() is not None,
        what="a healthy launch",
    )
    assert run_state(run_id) == "healthy", launcher.communicate()[1]
    return launcher, run_id


def chat(c: TwoHosts, port: int) -> dict[str, object]:
    """Exactly 8 tokens (ignore_eos): a random model may end its answer after one."""
    r = c.http(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "ignore_eos": True},
    )
    assert r["status"] == 200, r
    body = r["body"]
    assert isinstance(body, dict)
    return body


def scrape_worker(c: TwoHosts, url: str) -> dict[str, float]:
    """rpc0's series (labelled node b) from a scrape inside namespace a; the first scrape starts the
    ssh session to b, a later one reads what it sent."""
    code = "import httpx, sys; print(httpx.get(sys.argv[1], timeout=10).text)"
    got: dict[str, float] = {}
    for _ in range(20):
        r = c.run(c.a, sys.executable, "-c", code, url)
        assert r.returncode == 0, r.stderr
        got = {
            s.name: s.value
            for f in text_string_to_metric_families(r.stdout)
            for s in f.samples
            if s.labels.get("process") == "rpc0" and s.labels.get("node") == "b"
        }
        if "moetune_process_resident_memory_bytes" in got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"no reading of rpc0 on node b: {got}")


def test_plan_launch_request_stop(cluster: TwoHosts, tmp_path: Path, split_model: Path, bin_dir: Path) -> None:
    c = cluster
    plan, rpc_port, port = make_plan(c, tmp_path, split_model, bin_dir)
    endpoint = f"{c.b.addr}:{rpc_port}"
    doc = json.loads(plan.read_text())
    worker, server = doc["launch"]["processes"]
    assert (worker["name"], worker["node"], worker["ssh"], worker["host"]) == ("rpc0", "b", c.b.alias, c.b.addr)
    assert server["after"] == ["rpc0"] and f"--rpc {endpoint}" in " ".join(server["argv"])

    launcher, run_id = launch_foreground(c, plan)
    rpc0, main = record(run_id, "rpc0"), record(run_id, "main")
    # ordered start: the worker listened before the server started
    assert rpc0["ready_at"] <= main["started_at"]  # type: ignore[operator]
    # the worker runs in namespace b, under the pid moetune recorded, bound to the link address
    assert rpc0["remote_pid"] in c.pids(c.b)
    assert f"ggml-rpc-server -H {c.b.addr} -p {rpc_port}" in cmdline(int(rpc0["remote_pid"]))  # type: ignore[arg-type]
    assert main["pid"] in c.pids(c.a)
    assert rpc0["ssh_target"] == c.b.alias and rpc0["transport"] == "TCP"
    assert rpc0["env"]["MOETUNE_TRANSPORT"] == "tcp"  # type: ignore[index]

    timings = chat(c, port)["timings"]
    assert isinstance(timings, dict) and timings["predicted_n"] == 8
    # part of the model on the worker's node, part here
    log = parse_log((runs_dir() / run_id / "main.log").read_text(errors="replace"))
    bufs = log.device_buffers()
    assert bufs[f"RPC0[{endpoint}]"].model_mib > 0 and bufs["CPU_Mapped"].model_mib > 0
    (t,) = log.timings
    assert t.eval_tokens == 8

    # the worker on node b, watched over ssh by the launch's metrics endpoint (in namespace a)
    metrics = c.moetune(c.a, "metrics", "serve", "--listen", "127.0.0.1:9101", "--launch", run_id)
    assert metrics.stderr is not None and metrics.stderr.readline().startswith("serving ")
    worker = scrape_worker(c, "http://127.0.0.1:9101/metrics")
    assert worker["moetune_process_up"] == 1 and worker["moetune_process_resident_memory_bytes"] > 1 << 20
    assert worker["moetune_process_threads"] >= 1

    stop = c.moetune(c.a, "stop", run_id, "--json")
    out, err = stop.communicate(timeout=60)
    assert stop.returncode == 0, err
    assert metrics.wait(15) == 0  # the endpoint ends with its launch, its ssh session with it
    stopped = {p["name"]: p for p in json.loads(out)[0]["processes"]}
    assert stopped["rpc0"]["node"] == "b" and stopped["rpc0"]["pid"] == rpc0["remote_pid"]
    _, err = launcher.communicate(timeout=60)  # type: ignore[attr-defined]
    assert launcher.returncode == 0, err  # type: ignore[attr-defined]
    assert "was stopped" in err
    # ordered stop, from the recorded times: the worker was told only after the server's pid was gone
    assert_stopped_in_order(run_id, ["main"], ["rpc0"])
    assert record(run_id, "rpc0")["exit_code"] == -15  # it ended on our SIGTERM, logged by its wrapper
    assert run_state(run_id) == "stopped"
    assert c.leftovers() == {}

    wlog = parse_worker_log((runs_dir() / run_id / "rpc0.log").read_text())
    assert wlog.transport == "TCP" and wlog.connections >= 1 and not wlog.rdma_activated
    info = json.loads((runs_dir() / run_id / "run.json").read_text())
    assert info["transport"] == "tcp"


def test_worker_killed_while_serving(cluster: TwoHosts, tmp_path: Path, split_model: Path, bin_dir: Path) -> None:
    c = cluster
    plan, rpc_port, port = make_plan(c, tmp_path, split_model, bin_dir)
    launcher, run_id = launch_foreground(c, plan)
    chat(c, port)
    remote_pid = record(run_id, "rpc0")["remote_pid"]
    assert c.ssh(c.b, f"kill -9 {remote_pid}").returncode == 0
    _, err = launcher.communicate(timeout=60)  # type: ignore[attr-defined]
    assert launcher.returncode == 1, err  # type: ignore[attr-defined]
    assert f"Error: rpc0: RPC worker {c.b.addr}:{rpc_port} on b exited (exit -9)" in err
    assert "its servers lost their device" in err
    assert run_state(run_id) == "failed"
    info = json.loads((runs_dir() / run_id / "run.json").read_text())
    assert info["diagnosis"]["process"] == "rpc0" and info["diagnosis"]["cause"] == "exited"
    main = record(run_id, "main")
    assert main["stop_sent_at"] is not None and main["exited_at"] is not None
    assert c.leftovers() == {}


def test_ssh_session_lost_ends_the_worker(cluster: TwoHosts, tmp_path: Path, split_model: Path, bin_dir: Path) -> None:
    """The ssh client carrying the worker dies (the launching machine's side of the session is
    gone): the hangup ends the worker on its node too, and the launcher says what happened."""
    c = cluster
    plan, _, port = make_plan(c, tmp_path, split_model, bin_dir)
    launcher, run_id = launch_foreground(c, plan)
    chat(c, port)
    rpc0 = record(run_id, "rpc0")
    assert rpc0["pid"] in c.pids(c.a) and rpc0["remote_pid"] in c.pids(c.b)
    os.kill(int(rpc0["pid"]), signal.SIGKILL)  # type: ignore[arg-type]
    _, err = launcher.communicate(timeout=60)  # type: ignore[attr-defined]
    assert launcher.returncode == 1, err  # type: ignore[attr-defined]
    assert "Error: rpc0: the ssh session to node b ended (ssh exit -9); the RPC worker" in err
    wait_for(lambda: rpc0["remote_pid"] not in c.pids(c.b), 10, "the worker to end with its session")
    assert run_state(run_id) == "failed"
    assert c.leftovers() == {}


def test_link_test_between_namespaces(cluster: TwoHosts, tmp_path: Path, bin_dir: Path) -> None:
    c = cluster
    hw = hardware(c, tmp_path / "hw.yaml", bin_dir, 50052)
    tools = ["builtin", "iperf3"] if c.run(c.a, "sh", "-c", "command -v iperf3").returncode == 0 else ["builtin"]
    for tool in tools:
        p = c.moetune(
            c.a,
            "link-test",
            "a",
            "b",
            "--hw",
            str(hw),
            "--duration",
            "0.5",
            "--streams",
            "4",
            "--pings",
            "100",
            "--tool",
            tool,
            "--json",
        )
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        doc = json.loads(out)
        assert doc["tool"] == tool and doc["addr"] == c.b.addr
        assert doc["single_bits_per_s"] > 1e6 and doc["parallel_bits_per_s"] > 1e6
        assert doc["parallel_streams"] == 4
        assert 0 < doc["rtt_min_s"] <= doc["rtt_median_s"] < 0.1 and doc["round_trips"] == 100
    with ResultsDB.open() as db:
        runs = db.runs(kind="link-test")
        assert [r.meta.details["tool"] for r in reversed(runs)] == tools
        assert [s["test"] for s in db.samples(runs[0].id)] == ["latency", "throughput", "throughput"]
        assert runs[0].summary is not None and runs[0].summary["single_bits_per_s"] > 0
    assert c.leftovers() == {}


def link(c: TwoHosts, up: bool) -> None:
    """The veth link between the hosts, cut (down) or restored (up), on a's side."""
    out = c.run(c.a, "ip", "-o", "link", "show", "type", "veth").stdout
    dev = out.split(":")[1].strip().split("@")[0]
    assert c.run(c.a, "ip", "link", "set", dev, "up" if up else "down").returncode == 0


def test_a_partition_while_serving(
    cluster: TwoHosts, tmp_path: Path, split_model: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link to the worker's node is cut while the model is served: ssh's keepalive ends the
    session (shortened here from moetune's 3 x 10 s), the launcher says so, stops the server and
    leaves the worker it cannot reach, saying so instead of waiting on it; once the link is back,
    `ps` shows the worker alive on its node and `stop` removes it: nothing is left on either host."""
    c = cluster
    monkeypatch.setenv("MOETUNE_SSH_COMMAND", c.ssh_command + " -o ServerAliveInterval=1 -o ServerAliveCountMax=2")
    plan, _, port = make_plan(c, tmp_path, split_model, bin_dir)
    launcher, run_id = launch_foreground(c, plan)
    chat(c, port)
    link(c, up=False)
    t0 = time.monotonic()
    try:
        _, err = launcher.communicate(timeout=120)  # type: ignore[attr-defined]
    finally:
        link(c, up=True)
    took = time.monotonic() - t0
    assert launcher.returncode == 1, err  # type: ignore[attr-defined]
    assert "Error: rpc0: the ssh session to node b ended" in err
    assert "rpc0: left running: its node cannot be reached" in err and f"moetune stop {run_id}" in err
    # the server's 30 s grace (it hangs on its lost device), not a wait on the unreachable worker
    assert took < 50, took
    # back on the link, the worker may end with its session's hangup or still run: stop ends it either way
    stop = c.moetune(c.a, "stop", run_id)
    _, err = stop.communicate(timeout=60)
    assert stop.returncode == 0, err
    assert c.leftovers() == {}
