"""The /metrics endpoint: a source served over HTTP on an ephemeral loopback port, the results
database as a source, `moetune metrics serve` and its errors, and its stop on SIGTERM and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from moetune.errors import InputError, RuntimeFailure
from moetune.kinds import RunKind, RunStatus
from moetune.monitor.exposition import CONTENT_TYPE, LabelledSnapshot
from moetune.monitor.serve import (
    DbSource,
    MetricsServer,
    Source,
    bind,
    combine,
    is_loopback,
    parse_listen,
    serve_until_stopped,
)
from moetune.monitor.snapshot import HostSample, ProcSample, Snapshot
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from tests.helpers import run_cli


def snap(t: float, used: int = 1 << 30, **kw: object) -> Snapshot:
    return Snapshot(t=t, host=HostSample(mem_used_bytes=used, mem_total_bytes=8 << 30), **kw)  # type: ignore[arg-type]


@contextmanager
def serving(source: Source) -> Iterator[MetricsServer]:
    server = bind("127.0.0.1", 0, source)
    stop = threading.Event()
    t = threading.Thread(target=serve_until_stopped, args=(server, stop), daemon=True)
    t.start()
    try:
        yield server
    finally:
        stop.set()
        t.join(10)
        assert not t.is_alive()


def series(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    }


def test_the_server_serves_its_source_at_each_scrape() -> None:
    calls: list[float] = []

    def source() -> list[LabelledSnapshot]:
        calls.append(time.time())
        return [LabelledSnapshot(snapshot=snap(100.0 + len(calls), used=len(calls)), run=4, kind="bench", label="x")]

    with serving(source) as server:
        for n in (1, 2):
            r = httpx.get(server.url + "/metrics", timeout=5)
            assert r.status_code == 200
            assert r.headers["content-type"] == CONTENT_TYPE
            assert series(r.text, "moetune_host_memory_used_bytes") == {(("node", "local"), ("run", "4")): n}
        assert httpx.head(server.url + "/metrics", timeout=5).content == b""
        index = httpx.get(server.url + "/", timeout=5)
        assert index.status_code == 200 and 'href="/metrics"' in index.text
        assert httpx.get(server.url + "/metrics?x=1", timeout=5).status_code == 200
        for path in ("/nope", "/metrics/extra", "/favicon.ico"):
            assert httpx.get(server.url + path, timeout=5).status_code == 404
    with pytest.raises(httpx.ConnectError):  # stopped: the socket is closed
        httpx.get(server.url + "/metrics", timeout=2)


def test_a_failing_source_fails_the_scrape_not_the_server(capsys: pytest.CaptureFixture[str]) -> None:
    state = {"fail": True}

    def source() -> list[LabelledSnapshot]:
        if state["fail"]:
            raise RuntimeError("database is locked")
        return [LabelledSnapshot(snapshot=snap(1.0))]

    with serving(source) as server:
        r = httpx.get(server.url + "/metrics", timeout=5)
        assert r.status_code == 500 and "database is locked" in r.text
        state["fail"] = False
        assert httpx.get(server.url + "/metrics", timeout=5).status_code == 200
    assert "scrape failed: RuntimeError: database is locked" in capsys.readouterr().err


def test_sources_combine_in_order() -> None:
    a = combine(
        lambda: [LabelledSnapshot(snapshot=snap(1.0), run=1)],
        lambda: [],
        lambda: [LabelledSnapshot(snapshot=snap(2.0), run=2)],
    )
    assert [i.run for i in a()] == [1, 2]


def make_run(db: ResultsDB, label: str, launch: str | None = None) -> int:
    return db.create_run(RunMeta(kind=RunKind.SERVE_BENCH, launch_run=launch), label=label, target="http://127.0.0.1:1")


def test_the_db_source_exports_the_newest_snapshot_of_each_running_run(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    now = 1_000_000.0
    with ResultsDB.open(path) as db:
        live = make_run(db, "live", launch="L7")
        db.add_metrics(live, now - 3, snap(now - 3, used=1).to_json())
        db.add_metrics(
            live,
            now - 1,
            snap(
                now - 1, used=2, procs=(ProcSample(name="main", role="server", node="local", pid=9, threads=4),)
            ).to_json(),
        )
        stale = make_run(db, "killed")  # its writer died: still running, no fresh snapshot
        db.add_metrics(stale, now - 60, snap(now - 60).to_json())
        make_run(db, "no-snapshots")
        done = make_run(db, "done")
        db.add_metrics(done, now - 1, snap(now - 1).to_json())
        db.finish_run(done, RunStatus.DONE)

    clock = [now]
    source = DbSource(path, clock=lambda: clock[0])
    try:
        items = source()
        assert [(i.run, i.kind, i.label, i.launch, i.snapshot.host.mem_used_bytes) for i in items] == [
            (live, "serve-bench", "live", "L7", 2)
        ]
        with serving(source) as server:
            text = httpx.get(server.url + "/metrics", timeout=5).text
            assert series(text, "moetune_host_memory_used_bytes") == {
                (("launch", "L7"), ("node", "local"), ("run", str(live))): 2
            }
            assert series(text, "moetune_run_info") == {
                (("kind", "serve-bench"), ("label", "live"), ("launch", "L7"), ("run", str(live))): 1
            }
            assert series(text, "moetune_process_threads") == {
                (("launch", "L7"), ("node", "local"), ("process", "main"), ("role", "server"), ("run", str(live))): 4
            }
            # no newer snapshot for more than 10 s: its writer is taken for dead
            clock[0] = now + 8.5  # its newest snapshot is 9.5 s old
            assert [i.run for i in source()] == [live]
            clock[0] = now + 9.5
            assert httpx.get(server.url + "/metrics", timeout=5).text == ""
            # the run finishes: its series go
            clock[0] = now
            with ResultsDB.open(path) as db:
                db.finish_run(live, RunStatus.DONE)
            assert httpx.get(server.url + "/metrics", timeout=5).text == ""
    finally:
        source.close()
    with ResultsDB.open(path) as db:
        assert [r.label for r in db.runs(status=RunStatus.RUNNING)] == ["no-snapshots", "killed"]


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9101", ("127.0.0.1", 9101)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("localhost:80", ("localhost", 80)),
        ("[::1]:9101", ("::1", 9101)),
    ],
)
def test_listen_addresses(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize(
    "listen", ["127.0.0.1", "9101", ":9101", "127.0.0.1:", "127.0.0.1:http", "h:70000", "::1:9101"]
)
def test_bad_listen_addresses_are_input_errors(listen: str) -> None:
    with pytest.raises(InputError) as e:
        parse_listen(listen)
    assert e.value.hint


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
        ("example.org", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_port_in_use_is_a_runtime_failure() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(RuntimeFailure, match="in use") as e:
            bind("127.0.0.1", s.getsockname()[1], lambda: [])
        assert e.value.hint


def test_cli_errors_for_a_bad_listen_address(tmp_path: Path) -> None:
    db = str(tmp_path / "r.sqlite")
    r = run_cli("metrics", "serve", "--listen", "127.0.0.1", "--db", db)
    assert r.exit_code == 2 and "no port" in r.stderr and "--listen 127.0.0.1:9101" in r.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = run_cli("metrics", "serve", "--listen", f"127.0.0.1:{s.getsockname()[1]}", "--db", db)
    assert r.exit_code == 1 and "in use" in r.stderr and "hint" in r.stderr
    r = run_cli("metrics", "serve", "--listen", "192.0.2.1:0", "--db", db)  # TEST-NET: not this machine
    assert r.exit_code == 2 and "not an address of this machine" in r.stderr
    assert "no authentication" in r.stderr  # warned before it tried


def test_cli_dashboard_writes_the_package_json(tmp_path: Path) -> None:
    r = run_cli("metrics", "dashboard")
    assert r.exit_code == 0 and json.loads(r.stdout)["uid"] == "moetune"
    out = tmp_path / "d.json"
    r = run_cli("metrics", "dashboard", "-o", str(out))
    assert r.exit_code == 0 and json.loads(out.read_text()) == json.loads(run_cli("metrics", "dashboard").stdout)
    r = run_cli("metrics", "dashboard", "-o", str(tmp_path / "missing" / "d.json"))
    assert r.exit_code == 2 and "cannot write" in r.stderr


def start_cli(db: Path) -> tuple[subprocess.Popen[str], str]:
    """`moetune metrics serve` on a free port, and its URL once it serves."""
    p = subprocess.Popen(
        [sys.executable, "-m", "moetune", "metrics", "serve", "--listen", "127.0.0.1:0", "--db", str(db)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stderr is not None
    line = p.stderr.readline()
    assert line.startswith("serving http://127.0.0.1:"), line
    return p, line.split()[1].removesuffix("/metrics")


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGTERM, 0, "stopped"), (signal.SIGINT, 130, "interrupted")])
def test_cli_serves_until_sigterm_or_ctrl_c(tmp_path: Path, sig: signal.Signals, code: int, said: str) -> None:
    db = tmp_path / "r.sqlite"
    with ResultsDB.open(db) as d:
        rid = make_run(d, "x")
        d.add_metrics(rid, time.time(), snap(time.time(), used=12345).to_json())
    p, url = start_cli(db)
    try:
        r = httpx.get(url + "/metrics", timeout=5)
        used = series(r.text, "moetune_host_memory_used_bytes")
        assert used[(("node", "local"), ("run", str(rid)))] == 12345  # the running run's snapshot
        assert used[(("node", "local"),)] > 0  # and this host, read at the scrape
        os.kill(p.pid, sig)
        assert p.wait(10) == code
        assert p.stderr is not None and said in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/metrics", timeout=2)
