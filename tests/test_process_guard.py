"""The guard that keeps the tests from leaving processes behind finds what a test leaves."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from moetune.run.process import RUN_ENV, pid_alive
from tests.process_guard import SESSION_ENV, find_strays, kill, report, run_ids


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:  # the guard under test should have killed them; never leave one anyway
        p.kill()
        p.wait()


def sleeper(procs: list[subprocess.Popen[bytes]], **env: str) -> subprocess.Popen[bytes]:
    """A ``sleep 300`` with ``env``, returned once it runs: until its exec, /proc shows the forked
    test's command and environment (a guard reading it then found nothing, once in CI)."""
    p = subprocess.Popen(["sleep", "300"], env={**os.environ, **env})
    procs.append(p)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{p.pid}/cmdline").read_bytes() != b"sleep\x00300\x00":
        assert time.monotonic() < deadline, "the sleeper did not start"
        time.sleep(0.01)
    return p


def test_a_process_left_with_the_session_token_is_found_and_killed(sleepers: list[subprocess.Popen[bytes]]) -> None:
    token = f"self-test-{secrets.token_hex(4)}"  # not the session's: the real guard must not see it
    p = sleeper(sleepers, **{SESSION_ENV: token})
    (s,) = find_strays(token)
    assert (s.pid, s.cmdline, s.marker) == (p.pid, "sleep 300", f"{SESSION_ENV}={token}")
    assert (
        report([s], "this test") == f"this test left 1 process(es) running (now killed):\n  pid {p.pid} "
        f"({SESSION_ENV}={token}): sleep 300"
    )
    kill([s])
    assert p.wait(5) == -9 or p.returncode is not None
    assert not pid_alive(p.pid) and find_strays(token) == []


def test_every_process_the_tests_start_carries_the_session_token(sleepers: list[subprocess.Popen[bytes]]) -> None:
    p = sleeper(sleepers)  # a plain Popen, as a careless test would leave it
    assert p.pid in [s.pid for s in find_strays(os.environ[SESSION_ENV])]
    kill(find_strays(os.environ[SESSION_ENV]))
    assert p.wait(5) is not None


def test_a_launch_s_processes_are_found_by_the_run_ids_under_a_home(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    run_id = f"20990101-000000-{secrets.token_hex(3)}"
    (tmp_path / "moetune-data0" / "runs" / run_id).mkdir(parents=True)
    (tmp_path / "moetune-data0" / "runs" / run_id / "run.json").write_text("{}")
    assert run_ids(tmp_path) == [run_id] and run_ids(tmp_path / "moetune-data0") == [run_id]
    env = {k: v for k, v in os.environ.items() if k != SESSION_ENV}  # a worker started over ssh has no token
    p = subprocess.Popen(["sleep", "300"], env={**env, RUN_ENV: run_id})
    sleepers.append(p)
    (s,) = find_strays(None, run_ids(tmp_path))
    assert (s.pid, s.marker) == (p.pid, f"{RUN_ENV}={run_id}")
    kill([s])
    assert p.wait(5) is not None and find_strays(None, [run_id]) == []


LEAKY = """
import os, subprocess
from pathlib import Path

def test_leaves_a_launch(moetune_home):
    run = moetune_home / "runs" / "20990101-000000-abcdef"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    subprocess.Popen(["sleep", "301"], env={**os.environ, "MOETUNE_RUN": run.name})

def test_leaves_a_plain_process():
    subprocess.Popen(["sleep", "302"])
    assert False, "failed with a process running"
"""


def test_a_session_that_leaves_processes_fails_naming_them(tmp_path: Path) -> None:
    """The real wiring (tests/conftest.py) in a session of its own."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_leaky.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "this test left 1 process(es) running (now killed)" in out and "sleep 301" in out
    assert "the test session left 1 process(es) running (now killed)" in out and "sleep 302" in out
    assert "1 failed, 1 passed, 2 errors" in out
    assert subprocess.run(["pgrep", "-f", "sleep 30[12]"], capture_output=True).returncode == 1  # none left
