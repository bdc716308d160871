"""RemoteProcess and its scripts, through a fake ssh that runs the 'remote' command on this machine
(no root, no sshd): pid and start time reported by the wrapper, exit status logged by it, stop by
pid, attach from a record, ssh failures."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from moetune.run.remote import (
    RemoteError,
    RemoteProcess,
    exit_status,
    kill_script,
    parse_state,
    pid_line,
    probe_node,
    run_remote,
    ssh_argv,
    ssh_base,
    state_script,
    worker_script,
)
from tests.run.conftest import wait_for


def proc_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


# -- pure ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("moetune-pid 4725 422632\nStarting RPC server", (4725, 422632)),
        ("banner first\nmoetune-pid 17 \n", (17, None)),  # no /proc on the node: no start time
        ("Starting RPC server v7.0.0\n", None),
    ],
)
def test_pid_line(text: str, expected: tuple[int, int | None] | None) -> None:
    assert pid_line(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Accepted client connection\nmoetune-exit 143\nTerminated\n", -15),
        ("moetune-exit 137\n", -9),
        ("Failed to create server socket\nmoetune-exit 1\n", 1),
        ("partial line without newlinemoetune-exit 0\n", 0),
        ("still running\n", None),
    ],
)
def test_exit_status(text: str, expected: int | None) -> None:
    assert exit_status(text) == expected


@pytest.mark.parametrize(
    ("out", "ticks", "alive"),
    [
        ("S 4242\n", 4242, True),
        ("S 4242\n", 4243, False),  # the pid was reused
        ("Z 4242\n", 4242, False),
        ("R 99\n", None, True),
        ("alive\n", 4242, True),  # a node without /proc: kill -0 said so
        ("", 4242, False),
    ],
)
def test_parse_state(out: str, ticks: int | None, alive: bool) -> None:
    assert parse_state(out, ticks) is alive


def test_ssh_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOETUNE_SSH_COMMAND", "ssh -F '/tmp/my lab/config'")
    base = ssh_base()
    assert base[:3] == ["ssh", "-F", "/tmp/my lab/config"]  # the user's options first: ssh keeps the first value
    assert "BatchMode=yes" in base
    argv = ssh_argv(base, "spark2", "echo 'hi there'")
    assert argv[-3:] == ["-T", "spark2", "exec /bin/sh -c 'echo '\"'\"'hi there'\"'\"''"]
    monkeypatch.delenv("MOETUNE_SSH_COMMAND")
    assert ssh_base()[0] == "ssh"


def test_scripts_quote_everything() -> None:
    s = worker_script(
        ["/opt/llama.cpp/bin/ggml-rpc-server", "-H", "10.0.0.2", "-p", "50052"], {"MOETUNE_RUN": "r1", "ODD": "a b;c"}
    )
    assert "export MOETUNE_RUN=r1\nexport ODD='a b;c'\n" in s
    assert "$sb /opt/llama.cpp/bin/ggml-rpc-server -H 10.0.0.2 -p 50052 </dev/null &" in s
    assert kill_script(42, signal.SIGTERM, None) == "kill -s TERM 42 2>/dev/null; true"
    assert "kill -s KILL 42" in kill_script(42, signal.SIGKILL, 7) and "= 7 ]" in kill_script(42, signal.SIGKILL, 7)
    assert "/proc/42/stat" in state_script(42)


# -- through the fake ssh ---------------------------------------------------------------------


def test_start_stop_by_remote_pid(fake_ssh: Path, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    p = RemoteProcess.start("w", "node-b", ["sleep", "30"], {"MOETUNE_RUN": "t1"}, log=log)
    try:
        assert p.started and p.remote_pid is not None
        assert Path(f"/proc/{p.remote_pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
        assert p.remote_start_ticks == proc_ticks(p.remote_pid)
        assert b"MOETUNE_RUN=t1" in Path(f"/proc/{p.remote_pid}/environ").read_bytes().split(b"\0")
        assert p.pid != p.remote_pid and p.alive() and p.group_alive() and p.remote_alive()
        assert p.returncode is None
        p.signal(signal.SIGTERM)
        wait_for(lambda: not p.group_alive(), 10, "the worker to go")
        assert p.returncode == -15
        assert "moetune-exit 143" in log.read_text()
    finally:
        if p.remote_pid and p.remote_alive():
            os.kill(p.remote_pid, signal.SIGKILL)


def test_attached_without_session_asks_the_node(fake_ssh: Path, tmp_path: Path) -> None:
    """From another process, once the ssh session is gone: alive and stop go over ssh."""
    started = RemoteProcess.start("w", "node-b", ["sleep", "30"], {}, log=tmp_path / "w.log")
    assert started.remote_pid is not None and started.local is not None
    os.kill(started.local.pid, signal.SIGKILL)  # the session dies; the worker lives on
    wait_for(lambda: not started.local.alive(), 10, "the ssh client to go")  # type: ignore[union-attr]
    try:
        p = RemoteProcess.attach(
            "w",
            ssh_base(),
            "node-b",
            started.remote_pid,
            remote_start_ticks=started.remote_start_ticks,
            local=None,
            log=tmp_path / "w.log",
        )
        assert not started.alive()  # its session is gone: a watcher counts the worker as lost
        assert p.alive() and p.group_alive()  # but it still runs there: a stop must still stop it
        wrong = RemoteProcess.attach(
            "w", ssh_base(), "node-b", started.remote_pid, remote_start_ticks=1, local=None, log=None
        )
        assert not wrong.remote_alive()  # same pid, another start time: not ours
        wrong.signal(signal.SIGKILL)
        assert p.remote_alive()  # and not signalled
        p.signal(signal.SIGKILL)
        wait_for(lambda: not p.group_alive(), 10, "the worker to go")
    finally:
        if p.remote_alive():
            os.kill(started.remote_pid, signal.SIGKILL)


def test_killed_worker_status_reaches_the_log(fake_ssh: Path, tmp_path: Path) -> None:
    p = RemoteProcess.start("w", "node-b", ["sleep", "30"], {}, log=tmp_path / "w.log")
    assert p.remote_pid is not None
    os.kill(p.remote_pid, signal.SIGKILL)
    wait_for(lambda: not p.alive(), 10, "the session to end")
    assert p.returncode == -9 and not p.group_alive()


def test_ssh_failures(fake_ssh: Path, tmp_path: Path) -> None:
    with pytest.raises(RemoteError, match="Could not resolve hostname") as e:
        run_remote(ssh_base(), "unreachable", "true")
    assert e.value.hint and "BatchMode=yes unreachable true" in e.value.hint
    t0 = time.monotonic()
    p = RemoteProcess.start("w", "unreachable", ["sleep", "30"], {}, log=tmp_path / "w.log")
    assert time.monotonic() - t0 < 10
    assert not p.started and not p.alive() and not p.group_alive()
    assert "Could not resolve hostname" in (tmp_path / "w.log").read_text()


def test_probe_node(fake_ssh: Path, bin_dir: Path, tmp_path: Path) -> None:
    node = probe_node(ssh_base(), "node-b", str(bin_dir), ("ggml-rpc-server", "rpc-server"))
    assert node.binary == "ggml-rpc-server" and node.binary_path == f"{bin_dir}/ggml-rpc-server"
    assert node.rdma is False and node.hostname
    old = tmp_path / "old"
    old.mkdir()
    (old / "rpc-server").write_bytes(b"\x7fELF ... transport : TCP (RDMA auto-negotiate enabled) RDMA activated")
    (old / "rpc-server").chmod(0o755)
    node = probe_node(ssh_base(), "node-b", str(old), ("ggml-rpc-server", "rpc-server"))
    assert node.binary == "rpc-server" and node.rdma is True
    assert probe_node(ssh_base(), "node-b", str(tmp_path / "none"), ("ggml-rpc-server",)).binary is None
