"""Faults at the worst moment, on a generated model and the real engine: each case checks what the
user sees (one error line, the exit code), what is kept (every sample measured before the fault,
the run marked with the cause) and what is left (no engine process, no listening port).

moetune runs as a separate process here (`python -m moetune`), as a user runs it, so that it can
be killed too. The model is small but the workloads long enough (hundreds of tokens, dozens of
repeats) that a fault lands mid-run; each case stops waiting as soon as its fault is injected.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from moetune.paths import runs_dir
from moetune.store.db import ResultsDB
from tests.bench.servers import model, write_plan
from tests.helpers import llama_server, run_cli

pytestmark = pytest.mark.server
LONG = ("-r", "200", "--warmup", "0", "--max-tokens", "256", "--ignore-eos")


@pytest.fixture(scope="module")
def m(models: Path, bin_dir: Path) -> Path:
    return model(models, "faults", n_layer=4)


def moetune(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "moetune", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_samples(db: Path, n: int, proc: subprocess.Popen[str], timeout_s: float = 60) -> int:
    """The id of the first run in ``db`` once it has ``n`` samples (the process still running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        if db.exists():
            with ResultsDB.open(db) as h:
                runs = h.runs()
                if runs and len(h.samples(runs[-1].id)) >= n:
                    return runs[-1].id
        time.sleep(0.1)
    raise AssertionError(f"no run with {n} samples in {timeout_s} s")


def launch_pids() -> dict[str, int]:
    """The processes of the newest launch, by name (their pids on this machine)."""
    newest = sorted(runs_dir().iterdir())[-1]
    return {
        p.stem: json.loads(p.read_text())["pid"]
        for p in newest.glob("*.json")
        if p.name not in ("run.json", "plan.json")
    }


def plan_ports(plan: Path) -> list[int]:
    return [p["port"] for p in json.loads(plan.read_text())["launch"]["processes"]]


def nothing_left(ports: list[int], pids: dict[str, int]) -> None:
    for name, pid in pids.items():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        stat = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
        assert stat in "ZX", f"{name} (pid {pid}) is still running"
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still listens"


def error_lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("Error: ")]


def test_server_killed_during_bench(m: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "p.json", m, "-ngl", "0", label="p", rpc=True)
    db = tmp_path / "r.db"
    proc = moetune("bench", str(plan), *LONG, "--db", str(db))
    run_id = wait_samples(db, 3, proc)
    pids = launch_pids()
    os.kill(pids["main"], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    (line,) = error_lines(err)
    assert "main is gone" in line and "killed or stopped from outside" in line
    with ResultsDB.open(db) as h:
        run = h.run(run_id)
        kept = h.samples(run_id)
    assert run.status == "failed" and "main is gone" in (run.summary or {})["error"]
    assert len(kept) >= 3 and not run.abandoned
    nothing_left(plan_ports(plan), pids)  # the worker was stopped by the launcher


def test_rpc_worker_killed_while_the_server_serves(m: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "p.json", m, "-ngl", "99", label="p", rpc=True)
    db = tmp_path / "r.db"
    proc = moetune("bench", str(plan), *LONG, "--db", str(db))
    run_id = wait_samples(db, 3, proc)
    pids = launch_pids()
    os.kill(pids["rpc0"], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert len(error_lines(err)) == 1, err
    with ResultsDB.open(db) as h:
        assert h.run(run_id).status == "failed" and len(h.samples(run_id)) >= 3
    nothing_left(plan_ports(plan), pids)


def test_moetune_killed_during_bench_leaves_orphans_that_ps_names_and_stop_removes(m: Path, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "p.json", m, "-ngl", "0", label="p", rpc=True)
    db = tmp_path / "r.db"
    proc = moetune("bench", str(plan), *LONG, "--db", str(db))
    run_id = wait_samples(db, 3, proc)
    pids = launch_pids()
    proc.kill()
    proc.communicate(timeout=30)
    ps = run_cli("ps", "--json")
    (row,) = json.loads(ps.stdout)
    assert row["orphaned"] and all(row["alive"].values())
    r = run_cli("ps")
    assert "orphaned" in r.stdout and f"moetune stop {row['run']}" in r.stderr
    with ResultsDB.open(db) as h:
        run = h.run(run_id)
        assert run.status == "running" and run.abandoned and len(h.samples(run_id)) >= 3
    listed = run_cli("results", "list", "--db", str(db))
    assert "abandoned" in listed.stdout
    assert run_cli("stop", row["run"]).exit_code == 0
    nothing_left(plan_ports(plan), pids)


def test_a_hung_server_times_out_and_the_run_ends_cleanly(bin_dir: Path, m: Path, tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with llama_server(bin_dir, m, tmp_path / "s.log", "-nr", "-c", "2048") as srv:
        # 10 s: long enough that a loaded machine does not time out before the server is stopped
        # (5 s timed out at load average 12)
        proc = moetune("bench", srv.url, *LONG, "--timeout", "10", "--db", str(db))
        run_id = wait_samples(db, 3, proc)
        os.kill(srv.proc.pid, signal.SIGSTOP)  # mid-stream: it stops answering, the connection stays open
        try:
            t0 = time.monotonic()
            _, err = proc.communicate(timeout=60)
            waited = time.monotonic() - t0
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
    assert proc.returncode == 1, err
    (line,) = error_lines(err)
    assert "no answer within 10 s" in line
    assert waited < 25  # the client's timeout fired; it did not wait for the server
    with ResultsDB.open(db) as h:
        run = h.run(run_id)
        assert run.status == "failed" and len(h.samples(run_id)) >= 3


def test_a_hung_server_stops_a_serve_bench_level(bin_dir: Path, m: Path, tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with llama_server(bin_dir, m, tmp_path / "s.log", "-nr", "--parallel", "4", "-c", "4096") as srv:
        proc = moetune(
            "serve-bench",
            srv.url,
            "-C",
            "4",
            "--requests",
            "400",
            "--input-len",
            "64",
            "--output-len",
            "128",
            "--warmup",
            "0",
            "--timeout",
            "5",
            "--db",
            str(db),
        )
        run_id = wait_samples(db, 8, proc)
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
    assert proc.returncode == 1, err
    assert "stopped answering" in err and "timeout" in err
    with ResultsDB.open(db) as h:
        samples = h.samples(run_id)
        assert h.run(run_id).status == "failed"
    timed_out = [s for s in samples if s.get("error") == "timeout"]
    assert 4 <= len(timed_out) <= 12 and len(samples) < 100  # the rest were not sent


def test_a_server_killed_during_a_sweep_fails_that_plan_and_the_sweep_resumes(m: Path, tmp_path: Path) -> None:
    a = write_plan(tmp_path / "a.json", m, "-ngl", "0", label="a")
    b = write_plan(tmp_path / "b.json", m, "-ngl", "0", "-ub", "128", label="b")
    db = tmp_path / "r.db"
    proc = moetune("sweep", str(a), str(b), *LONG[:1], "8", *LONG[2:], "--db", str(db))
    wait_samples(db, 2, proc)
    os.kill(launch_pids()["main"], signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert "a: failed" in err and "main is gone" in err
    with ResultsDB.open(db) as h:
        by = {r.label: r for r in h.runs()}
    assert by["a"].status == "failed" and by["b"].status == "done"
    proc = moetune("sweep", str(a), str(b), *LONG[:1], "8", *LONG[2:], "--db", str(db))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "b: complete in run" in err  # only the failed plan ran again


def test_two_benches_into_one_history_both_land_and_a_lock_is_waited_for(
    bin_dir: Path, m: Path, tmp_path: Path
) -> None:
    db = tmp_path / "r.db"
    ResultsDB.open(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another writer holds the history for 3 s
    with llama_server(bin_dir, m, tmp_path / "s.log", "-nr", "--parallel", "2", "-c", "2048") as srv:
        procs = [
            moetune(
                "bench",
                srv.url,
                "-r",
                "6",
                "--warmup",
                "0",
                "--max-tokens",
                "16",
                "--ignore-eos",
                "--label",
                f"b{i}",
                "--db",
                str(db),
                "--json",
            )
            for i in range(2)
        ]
        time.sleep(3)
        holder.execute("COMMIT")
        holder.close()
        outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    with ResultsDB.open(db) as h:
        runs = {r.label: r for r in h.runs()}
        assert set(runs) == {"b0", "b1"} and all(r.status == "done" for r in runs.values())
        assert all(len(h.samples(r.id)) == 6 for r in runs.values())


def test_a_history_locked_past_the_timeout_is_one_clear_error(tmp_path: Path) -> None:
    from moetune.errors import RuntimeFailure
    from moetune.kinds import RunKind
    from moetune.store.record import RunMeta

    db = tmp_path / "r.db"
    with ResultsDB.open(db) as h:
        run_id = h.create_run(RunMeta(kind=RunKind.BENCH), label="x", target="y")
        h.add_sample(run_id, {"n": 1})
        h._conn.execute("PRAGMA busy_timeout = 200")  # the 30 s a user gets, shortened for the test
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(RuntimeFailure) as e:
                h.add_sample(run_id, {"n": 2})
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert "database is locked" in str(e.value) and "another process" in (e.value.hint or "")
        assert h.samples(run_id) == [{"n": 1}]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (root only): the history's disk, nearly full."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_the_historys_disk_full_is_one_clear_error_and_nothing_stored_is_lost(
    bin_dir: Path, m: Path, small_disk: Path, tmp_path: Path
) -> None:
    db = small_disk / "r.db"
    with llama_server(bin_dir, m, tmp_path / "s.log", "-nr", "-c", "2048") as srv:
        first = run_cli(
            "bench", srv.url, "-r", "3", "--warmup", "0", "--max-tokens", "8", "--label", "before", "--db", str(db)
        )
        assert first.exit_code == 0, first.stderr
        filler = small_disk / "filler"
        # fill the disk, then free a little: the next run starts and then runs out. Unbuffered: a
        # buffered file keeps what the full disk refused and raises it again when it closes
        with open(filler, "wb", buffering=0) as f:
            try:
                while f.write(b"\0" * 65536):
                    pass
            except OSError:
                pass
        filler.write_bytes(b"\0" * (filler.stat().st_size - 96 * 1024))
        r = run_cli("bench", srv.url, *LONG[:1], "400", *LONG[2:], "--db", str(db))
    assert r.exit_code == 1, r.stderr
    (line,) = error_lines(r.stderr)
    assert "database or disk is full" in line and "free space" in r.stderr
    filler.unlink()
    with ResultsDB.open(db) as h:
        assert h._conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        before = next(x for x in h.runs() if x.label == "before")
        assert before.status == "done" and len(h.samples(before.id)) == 3
